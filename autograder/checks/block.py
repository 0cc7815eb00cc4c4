"""Hidden tests of assignment 04-transformer-block (NumPy, float64 inputs).

Parameters come from ``transformer_ref.numpy.init_block_params`` (the course's
dict keys). Tolerances: rtol 1e-7, atol 1e-8 (float64 through a few matmuls and
two normalisations); parameter counts exact; the FFN share rtol 1e-2.
"""

from transformer_ref import numpy as ref

from ._common import assert_close, assert_number, call, hidden_test, rng, to_numpy

F64 = dict(rtol=1e-7, atol=1e-8)
GPT2_SMALL = dict(d_model=768, n_heads=12, d_ff=3072)


@hidden_test
def check_layer_norm(layer_norm):
    """LayerNorm over the last axis (biased variance, eps inside the square root)."""
    g = rng(401)
    for shape, eps, offset in [((5, 8), 1e-5, 0.0), ((2, 3, 16), 1e-5, 100.0),
                               ((4, 6), 0.5, 0.0), ((1, 32), 1e-5, -3.0)]:
        x = offset + g.standard_normal(shape)
        weight, bias = g.standard_normal((2, shape[-1]))
        what = f"layer_norm (x of shape {shape}, eps={eps})"
        out = to_numpy(call(layer_norm, x, weight, bias, eps, what=what), what)
        assert_close(out, ref.layer_norm(x, weight, bias, eps), what, **F64,
                     hint="Normalise each token over its C features with the biased variance "
                          "(divide by C), then multiply by weight and add bias.")


def _params(d_model, n_heads, d_ff, seed, **kwargs):
    return ref.init_block_params(d_model, n_heads, d_ff, seed=seed, **kwargs)


@hidden_test
def check_feed_forward(feed_forward):
    """GELU feed-forward network x @ w1 + b1 -> GELU -> @ w2 + b2."""
    g = rng(402)
    for shape, d_ff, seed in [((5, 8), 32, 1), ((2, 4, 16), 24, 2)]:
        x = g.standard_normal(shape)
        params = _params(shape[-1], 2, d_ff, seed)
        what = f"feed_forward (x of shape {shape}, d_ff={d_ff})"
        out = to_numpy(call(feed_forward, x, params, what=what), what)
        assert_close(out, ref.feed_forward(x, params, activation="gelu"), what, **F64,
                     hint="Use the exact GELU 0.5 * x * (1 + erf(x / sqrt(2))).")


@hidden_test
def check_multi_head_attention(multi_head_attention):
    """Multi-head self-attention with projections, biases, masks and batch dims."""
    g = rng(403)
    for shape, n_heads, causal in [((6, 16), 4, True), ((2, 5, 12), 3, False), ((3, 8), 1, True)]:
        x = g.standard_normal(shape)
        params = _params(shape[-1], n_heads, 4 * shape[-1], 10 + n_heads)
        mask = ref.causal_mask(shape[-2]) if causal else None
        what = f"multi_head_attention (x of shape {shape}, {n_heads} heads)"
        out = to_numpy(call(multi_head_attention, x, params, n_heads, mask, what=what), what)
        expected = ref.multi_head_attention(x, params, n_heads, mask=mask)
        assert_close(out, expected, what, **F64,
                     hint="Project with wq/wk/wv (+ biases), split C into n_heads heads of "
                          "C // n_heads, attend with 1/sqrt(head_dim), merge heads, project with wo.")


def _check_block(transformer_block, norm_position):
    g = rng(404 if norm_position == "pre" else 405)
    for shape, n_heads, causal in [((6, 16), 4, True), ((2, 5, 12), 2, False)]:
        x = g.standard_normal(shape)
        params = _params(shape[-1], n_heads, 4 * shape[-1], 20 + n_heads)
        mask = ref.causal_mask(shape[-2]) if causal else None
        what = f"transformer_block (norm_position={norm_position!r}, x of shape {shape})"
        out = to_numpy(call(transformer_block, x, params, n_heads, norm_position, mask,
                            what=what), what)
        expected = ref.transformer_block(x, params, n_heads, norm_position=norm_position, mask=mask)
        assert_close(out, expected, what, **F64,
                     hint=("Pre-norm: x + attn(ln1(x)), then x + ffn(ln2(x))." if norm_position == "pre"
                           else "Post-norm: ln1(x + attn(x)), then ln2(x + ffn(x))."))


@hidden_test
def check_pre_norm_block(transformer_block):
    _check_block(transformer_block, "pre")


@hidden_test
def check_post_norm_block(transformer_block):
    _check_block(transformer_block, "post")


@hidden_test
def check_block_param_count(block_param_count):
    """Parameter count of a LayerNorm + GELU block, with and without biases."""
    for d_model, n_heads, d_ff, bias in [(768, 12, 3072, True), (16, 4, None, True),
                                         (512, 8, 2048, False), (64, 2, 100, True)]:
        what = f"block_param_count({d_model}, {n_heads}, d_ff={d_ff}, bias={bias})"
        out = call(block_param_count, d_model, n_heads, d_ff, bias, what=what)
        assert_number(out, ref.block_param_count(d_model, n_heads, d_ff, bias=bias), what,
                      integer=True)


@hidden_test
def check_answer_gpt2_block_params(answer):
    assert_number(answer, ref.block_param_count(**GPT2_SMALL), "ANSWER_GPT2_BLOCK_PARAMS",
                  integer=True,
                  hint="Count attention (W_q, W_k, W_v, W_o and their biases), the FFN (two matrices and their biases) and two LayerNorms (a weight and a bias each).")


@hidden_test
def check_answer_ffn_share(answer):
    """Share of a GPT-2 small block's parameters that sit in the FFN."""
    d, f = GPT2_SMALL["d_model"], GPT2_SMALL["d_ff"]
    ffn = d * f + f + f * d + d
    assert_number(answer, ffn / ref.block_param_count(**GPT2_SMALL), "ANSWER_FFN_SHARE", rtol=1e-2,
                  hint="The FFN's parameters (d * d_ff + d_ff + d_ff * d + d) over the whole block's: a fraction between 0 and 1.")
