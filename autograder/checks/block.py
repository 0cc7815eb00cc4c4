"""Hidden tests of assignment 04-transformer-block (NumPy, float64 inputs).

Parameters come from ``transformer_ref.numpy.init_block_params`` (the course's
dict keys). Tolerances: rtol 1e-7, atol 1e-8 (float64 through a few matmuls and
two normalisations); parameter counts exact; the FFN share rtol 1e-2.
"""

import numpy as np
from transformer_ref import numpy as ref

from ._common import (CheckFailure, Mistake, answer_cascade, assert_close, assert_number, call, cascade, diagnosis, hidden_test,
                      hinted, rng, suspects, to_numpy, wrong_answers)

F64 = dict(rtol=1e-7, atol=1e-8)
GPT2_SMALL = dict(d_model=768, n_heads=12, d_ff=3072)


def _mha(x, params, n_heads, mask, scale=None):
    """Multi-head self-attention with the scores scaled by ``scale`` (default 1 / sqrt(head_dim))."""
    head_dim = x.shape[-1] // n_heads

    def split(name):
        t = x @ params[f"w{name}"] + params[f"b{name}"]
        return np.swapaxes(t.reshape(*t.shape[:-1], n_heads, head_dim), -2, -3)

    out = ref.scaled_dot_product_attention(split("q"), split("k"), split("v"), mask, scale=scale)
    return np.swapaxes(out, -2, -3).reshape(x.shape) @ params["wo"] + params["bo"]


def _block(x, params, n_heads, norm_position, mask, *, ln=ref.layer_norm, mha=ref.multi_head_attention,
           ffn=ref.feed_forward, ffn_residual=True):
    """One block as ``transformer_block`` computes it from ``ln``, ``mha`` and ``ffn`` (each possibly
    a known mistake's); ``ffn_residual=False``: the pre-norm FFN's residual left out."""
    def norm(h, name):
        return ln(h, params[f"{name}_weight"], params[f"{name}_bias"], 1e-5)

    def attention(h):
        return mha(h, params, n_heads, mask=mask) if mha is ref.multi_head_attention else mha(h, params, n_heads, mask)

    if norm_position == "pre":
        x = x + attention(norm(x, "ln1"))
        return (x if ffn_residual else 0.0) + ffn(norm(x, "ln2"), params)
    x = norm(x + attention(x), "ln1")
    return norm(x + ffn(x, params), "ln2")


def _param_count(d_model, n_heads, d_ff=None, bias=True, *, norm_bias=True):
    """block_param_count; ``norm_bias=False``: the LayerNorms' biases left out (the known mistake)."""
    count = ref.block_param_count(d_model, n_heads, d_ff, bias=bias)
    return count - (2 * d_model if bias and not norm_bias else 0)


# The typical wrong versions of each function (chapter 4's warnings): what each returns on the
# check's inputs, so that a verdict can name the mistake. The test suite plants every one.
MISTAKES = {
    "layer_norm": (
        Mistake("layernorm-unbiased", "the variance is the unbiased one (divided by C - 1).",
                "LayerNorm uses the biased variance: the mean of (x - mean)**2 over the C features (ddof=0).",
                lambda x, w, b, eps: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, ddof=1, keepdims=True) + eps)
                * w + b),
    ),
    "feed_forward": (
        Mistake("ffn-relu", "the activation is ReLU, not GELU.",
                "Use the exact GELU 0.5 * x * (1 + erf(x / sqrt(2))).",
                lambda x, params: ref.feed_forward(x, params, activation="relu")),
        Mistake("ffn-gelu-tanh", "the activation is the tanh approximation of GELU.",
                "Use the exact GELU 0.5 * x * (1 + erf(x / sqrt(2))), not the tanh approximation.",
                lambda x, params: ref.feed_forward(x, params, activation="gelu_tanh")),
    ),
    "multi_head_attention": (
        Mistake("mha-scale-by-width", "the scores are divided by sqrt(C), the model width, not by sqrt(head_dim).",
                "Each head's dot products run over head_dim = C // n_heads features: scale by 1 / sqrt(head_dim).",
                lambda x, params, n_heads, mask: _mha(x, params, n_heads, mask, scale=1 / np.sqrt(x.shape[-1]))),
        Mistake("mha-no-scale", "the scores are not divided by sqrt(head_dim).",
                "Scale each head's scores by 1 / sqrt(head_dim) before the softmax.",
                lambda x, params, n_heads, mask: _mha(x, params, n_heads, mask, scale=1.0)),
    ),
    "transformer_block": (
        Mistake("block-post-as-pre", "norm_position='post' does not give the post-norm block "
                "(it is rejected, or computed as pre-norm).",
                "Post-norm normalises after each residual: x = ln1(x + attn(x)), then ln2(x + ffn(x)).",
                lambda x, params, n_heads, norm_position, mask: _block(x, params, n_heads, "pre", mask)
                if norm_position == "post" else None),
        Mistake("block-pre-missing-residual", "the FFN sublayer's residual is missing: the block returns ffn(ln2(x)).",
                "Each sublayer adds to its input: x = x + attn(ln1(x)), then return x + ffn(ln2(x)).",
                lambda x, params, n_heads, norm_position, mask: _block(x, params, n_heads, norm_position, mask,
                                                                       ffn_residual=False)
                if norm_position == "pre" else None),
    ),
    "block_param_count": (
        Mistake("params-no-norm-bias", "the LayerNorms are counted with a weight only; each has a bias too.",
                "Each of the two LayerNorms has a weight and a bias of d_model each (when bias is True).",
                lambda *args: _param_count(*args, norm_bias=False)),
    ),
}
# transformer_block calls layer_norm, multi_head_attention and feed_forward
MISTAKES["transformer_block"] += (
    cascade(MISTAKES["layer_norm"], "layer_norm",
            lambda produce: lambda *args: _block(*args, ln=produce))
    + cascade(MISTAKES["multi_head_attention"], "multi_head_attention",
              lambda produce: lambda *args: _block(*args, mha=produce))
    + cascade(MISTAKES["feed_forward"], "feed_forward",
              lambda produce: lambda *args: _block(*args, ffn=produce)))

# Known wrong answers of the conceptual questions: Part 5's mistake through the answer cell (it
# calls block_param_count), and the parts of the count most often left out.
_GPT2_ATTENTION = 4 * 768 * 768 + 4 * 768
_GPT2_FFN = 2 * 768 * 3072 + 3072 + 768
WRONG_ANSWERS = {
    "ANSWER_GPT2_BLOCK_PARAMS": (
        Mistake("gpt2-params-no-biases", "the count leaves out every bias.",
                "GPT-2's linear layers and LayerNorms all have biases: count them.",
                lambda: ref.block_param_count(**GPT2_SMALL, bias=False)),
        Mistake("gpt2-params-no-norms", "the count leaves out the two LayerNorms.",
                "Add the two LayerNorms: a weight and a bias of d_model each.",
                lambda: ref.block_param_count(**GPT2_SMALL) - 4 * 768),
        *answer_cascade(MISTAKES["block_param_count"], "block_param_count",
                 lambda produce: lambda: produce(768, 12, 3072, True)),
    ),
    "ANSWER_FFN_SHARE": (
        Mistake("ffn-share-percent", "the share is in percent; the question asks for a fraction between 0 and 1.",
                "Give a fraction between 0 and 1 (0.5, not 50).",
                lambda: 100 * _GPT2_FFN / ref.block_param_count(**GPT2_SMALL)),
        Mistake("ffn-share-over-attention", "the answer divides the FFN's parameters by the attention's, not by the "
                "whole block's.", "Divide by the whole block's parameters (attention, FFN and norms).",
                lambda: _GPT2_FFN / _GPT2_ATTENTION),
        Mistake("ffn-share-attention", "the answer is the attention's share, not the FFN's.",
                "The FFN's parameters are its two matrices and their biases: d * d_ff + d_ff + d_ff * d + d.",
                lambda: _GPT2_ATTENTION / ref.block_param_count(**GPT2_SMALL)),
    ),
}


@hidden_test
def check_layer_norm(layer_norm):
    """LayerNorm over the last axis (biased variance, eps inside the square root)."""
    g = rng(401)
    for shape, eps, offset in [((5, 8), 1e-5, 0.0), ((2, 3, 16), 1e-5, 100.0),
                               ((4, 6), 0.5, 0.0), ((1, 32), 1e-5, -3.0)]:
        x = offset + g.standard_normal(shape)
        weight, bias = g.standard_normal((2, shape[-1]))
        what = f"layer_norm (x of shape {shape}, eps={eps})"
        hint = ("Normalise each token over its C features with the biased variance "
                "(divide by C), then multiply by weight and add bias.")
        with hinted(hint):
            out = to_numpy(call(layer_norm, x, weight, bias, eps, what=what), what)
            assert_close(out, ref.layer_norm(x, weight, bias, eps), what, **F64, hint=hint,
                         mistakes=suspects(MISTAKES["layer_norm"], x, weight, bias, eps))


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
        hint = "GELU(x @ w1 + b1) @ w2 + b2, with the exact GELU 0.5 * x * (1 + erf(x / sqrt(2)))."
        with hinted(hint):
            out = to_numpy(call(feed_forward, x, params, what=what), what)
            assert_close(out, ref.feed_forward(x, params, activation="gelu"), what, **F64, hint=hint,
                         mistakes=suspects(MISTAKES["feed_forward"], x, params))


@hidden_test
def check_multi_head_attention(multi_head_attention):
    """Multi-head self-attention with projections, biases, masks and batch dims."""
    g = rng(403)
    for shape, n_heads, causal in [((6, 16), 4, True), ((2, 5, 12), 3, False), ((3, 8), 1, True)]:
        x = g.standard_normal(shape)
        params = _params(shape[-1], n_heads, 4 * shape[-1], 10 + n_heads)
        mask = ref.causal_mask(shape[-2]) if causal else None
        what = f"multi_head_attention (x of shape {shape}, {n_heads} heads)"
        hint = ("Project with wq/wk/wv (+ biases), split C into n_heads heads of "
                "C // n_heads, attend with 1/sqrt(head_dim), merge heads, project with wo.")
        with hinted(hint):
            out = to_numpy(call(multi_head_attention, x, params, n_heads, mask, what=what), what)
            expected = ref.multi_head_attention(x, params, n_heads, mask=mask)
            assert_close(out, expected, what, **F64, hint=hint,
                         mistakes=suspects(MISTAKES["multi_head_attention"], x, params, n_heads, mask))


def _check_block(transformer_block, norm_position):
    g = rng(404 if norm_position == "pre" else 405)
    for shape, n_heads, causal in [((6, 16), 4, True), ((2, 5, 12), 2, False)]:
        x = g.standard_normal(shape)
        params = _params(shape[-1], n_heads, 4 * shape[-1], 20 + n_heads)
        mask = ref.causal_mask(shape[-2]) if causal else None
        what = f"transformer_block (norm_position={norm_position!r}, x of shape {shape})"
        hint = ("Pre-norm: x + attn(ln1(x)), then x + ffn(ln2(x))." if norm_position == "pre"
                else "Post-norm: ln1(x + attn(x)), then ln2(x + ffn(x)).")
        known = suspects(MISTAKES["transformer_block"], x, params, n_heads, norm_position, mask)
        with hinted(hint):
            try:
                out = to_numpy(call(transformer_block, x, params, n_heads, norm_position, mask, what=what),
                               what)
            except CheckFailure as failure:  # 'post' rejected: the post-norm branch is never taken
                if norm_position == "post" and f"{what} raised ValueError" in str(failure):
                    raise CheckFailure(f"{failure} {diagnosis(MISTAKES['transformer_block'][0])}") from None
                raise
            expected = ref.transformer_block(x, params, n_heads, norm_position=norm_position, mask=mask)
            assert_close(out, expected, what, **F64, hint=hint, mistakes=known)


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
        hint = ("Attention: 4 d_model x d_model matrices (+ 4 biases of d_model); FFN: d_model x d_ff and d_ff x "
                "d_model (+ biases of d_ff and d_model); two LayerNorms (a weight, and with bias a bias, of d_model "
                "each); d_ff defaults to 4 * d_model.")
        with hinted(hint):
            out = call(block_param_count, d_model, n_heads, d_ff, bias, what=what)
            assert_number(out, ref.block_param_count(d_model, n_heads, d_ff, bias=bias), what, integer=True,
                          hint=hint, wrong=wrong_answers(MISTAKES["block_param_count"], d_model, n_heads, d_ff, bias))


@hidden_test
def check_answer_gpt2_block_params(answer):
    assert_number(answer, ref.block_param_count(**GPT2_SMALL), "ANSWER_GPT2_BLOCK_PARAMS",
                  integer=True, wrong=wrong_answers(WRONG_ANSWERS["ANSWER_GPT2_BLOCK_PARAMS"]),
                  hint="Count attention (W_q, W_k, W_v, W_o and their biases), the FFN (two matrices and their biases) and two LayerNorms (a weight and a bias each).")


@hidden_test
def check_answer_ffn_share(answer):
    """Share of a GPT-2 small block's parameters that sit in the FFN."""
    d, f = GPT2_SMALL["d_model"], GPT2_SMALL["d_ff"]
    ffn = d * f + f + f * d + d
    assert_number(answer, ffn / ref.block_param_count(**GPT2_SMALL), "ANSWER_FFN_SHARE", rtol=1e-2,
                  wrong=wrong_answers(WRONG_ANSWERS["ANSWER_FFN_SHARE"]),
                  hint="The FFN's parameters (d * d_ff + d_ff + d_ff * d + d) over the whole block's: a fraction between 0 and 1.")
