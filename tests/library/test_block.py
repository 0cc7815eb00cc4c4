"""The transformer block: norms, GELU, FFNs, multi-head attention and the pre/post-norm block.

Checked against PyTorch's own modules (nn.LayerNorm, nn.GELU, F.rms_norm,
nn.MultiheadAttention, nn.TransformerEncoderLayer / DecoderLayer with weights copied in),
between the two backends in float64, and on the properties the chapter teaches.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from transformer_ref import numpy as ref
from transformer_ref import torch as tref

TOL = dict(rtol=1e-10, atol=1e-12)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def t64(a, device="cpu"):
    return torch.as_tensor(np.asarray(a), dtype=torch.float64, device=device)


def close(a, b, **tol):
    if torch.is_tensor(a):
        a = a.detach().cpu().numpy()
    if torch.is_tensor(b):
        b = b.detach().cpu().numpy()
    np.testing.assert_allclose(a, b, **(tol or TOL))


def randomised(params, rng, scale=0.3):
    """Every parameter random (norm gains near 1), so swapped or ignored keys show up."""
    out = {}
    for key, value in params.items():
        if key.endswith("_weight"):
            out[key] = 1.0 + scale * rng.normal(size=value.shape)
        else:
            out[key] = scale * rng.normal(size=value.shape)
    return out


# --- norms and GELU against torch ---------------------------------------------------------------

def test_layer_norm_matches_nn_layernorm(rng, device):
    x = rng.normal(2.0, 3.0, size=(3, 5, 16))
    ln = nn.LayerNorm(16, eps=1e-5, dtype=torch.float64, device=device)
    with torch.no_grad():
        ln.weight.copy_(t64(rng.normal(size=16)))
        ln.bias.copy_(t64(rng.normal(size=16)))
    expected = ln(t64(x, device))
    w, b = ln.weight.detach().cpu().numpy(), ln.bias.detach().cpu().numpy()
    close(ref.layer_norm(x, w, b), expected)
    close(tref.layer_norm(t64(x, device), ln.weight, ln.bias), expected)
    no_bias = F.layer_norm(t64(x), (16,), t64(w), None, 1e-3)
    close(ref.layer_norm(x, w, None, eps=1e-3), no_bias)
    close(tref.layer_norm(t64(x), t64(w), None, eps=1e-3), no_bias)


def test_layer_norm_uses_the_biased_variance(rng):
    x = rng.normal(size=(4, 10))
    y = ref.layer_norm(x, np.ones(10), np.zeros(10), eps=1e-12)
    np.testing.assert_allclose(y.std(axis=-1), 1.0, rtol=1e-9)  # np.std is the biased (1/C) one
    np.testing.assert_allclose(y.mean(axis=-1), 0.0, atol=1e-12)


def test_rms_norm_matches_torch(rng, device):
    x = rng.normal(1.0, 2.0, size=(2, 7, 12))
    w = rng.normal(size=12)
    expected = F.rms_norm(t64(x, device), (12,), t64(w, device), eps=1e-6)
    close(ref.rms_norm(x, w), expected)
    close(tref.rms_norm(t64(x, device), t64(w, device)), expected)
    # no centring: a constant vector c maps to sign(c) * weight (up to eps)
    close(ref.rms_norm(np.full(12, -5.0), w, eps=1e-12), -w)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_nn_gelu(approximate, device):
    x = np.concatenate([np.linspace(-12, 12, 2001), [0.0, -40.0, 40.0, 1e-8, -1e-8]])
    expected = nn.GELU(approximate=approximate)(t64(x, device))
    close(ref.gelu(x, approximate), expected, rtol=0, atol=1e-12)
    close(tref.gelu(t64(x, device), approximate), expected, rtol=0, atol=1e-12)
    assert ref.gelu(x.astype(np.float32), approximate).dtype == np.float32


def test_gelu_exact_known_values():
    # GELU(x) = x * Phi(x); Phi(1) = 0.8413447460685429, Phi(-1) = 0.15865525393145707
    np.testing.assert_allclose(ref.gelu(np.array([1.0, -1.0, 0.0])),
                               [0.8413447460685429, -0.15865525393145707, 0.0], rtol=1e-15)


# --- feed-forward networks ----------------------------------------------------------------------

@pytest.mark.parametrize("activation, module", [("gelu", nn.GELU()), ("gelu_tanh", nn.GELU("tanh")),
                                                ("relu", nn.ReLU())])
def test_feed_forward_matches_torch_mlp(activation, module, rng):
    C, Fh = 8, 20
    mlp = nn.Sequential(nn.Linear(C, Fh), module, nn.Linear(Fh, C)).double()
    params = {"w1": mlp[0].weight.detach().numpy().T, "b1": mlp[0].bias.detach().numpy(),
              "w2": mlp[2].weight.detach().numpy().T, "b2": mlp[2].bias.detach().numpy()}
    x = rng.normal(size=(2, 5, C))
    expected = mlp(t64(x))
    close(ref.feed_forward(x, params, activation), expected)
    close(tref.feed_forward(t64(x), params, activation), expected)


def test_swiglu_matches_llama_style_modules(rng):
    C, Fh = 8, 12
    w1, w2, w3 = (nn.Linear(C, Fh, bias=False).double(), nn.Linear(Fh, C, bias=False).double(),
                  nn.Linear(C, Fh, bias=False).double())
    params = {"w1": w1.weight.detach().numpy().T, "w3": w3.weight.detach().numpy().T,
              "w2": w2.weight.detach().numpy().T}
    x = rng.normal(size=(3, 4, C))
    expected = w2(F.silu(w1(t64(x))) * w3(t64(x)))  # Llama's FeedForward.forward
    close(ref.swiglu_feed_forward(x, params), expected)
    close(tref.swiglu_feed_forward(t64(x), params), expected)


# --- multi-head attention -----------------------------------------------------------------------

def params_from_mha(mha, prefix=""):
    """Our (in, out) layout from nn.MultiheadAttention's stacked (3C, C) in_proj (it computes x W^T)."""
    C = mha.embed_dim
    W = mha.in_proj_weight.detach().cpu().numpy()
    b = mha.in_proj_bias.detach().cpu().numpy()
    return {f"{prefix}wq": W[:C].T, f"{prefix}bq": b[:C], f"{prefix}wk": W[C:2 * C].T, f"{prefix}bk": b[C:2 * C],
            f"{prefix}wv": W[2 * C:].T, f"{prefix}bv": b[2 * C:],
            f"{prefix}wo": mha.out_proj.weight.detach().cpu().numpy().T,
            f"{prefix}bo": mha.out_proj.bias.detach().cpu().numpy()}


def randomise_module(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


@pytest.mark.parametrize("masked", [False, True])
def test_multi_head_attention_matches_nn_multiheadattention(masked, rng):
    C, H, T = 16, 4, 6
    mha = randomise_module(nn.MultiheadAttention(C, H, batch_first=True, dtype=torch.float64))
    params = params_from_mha(mha)
    x = rng.normal(size=(2, T, C))
    mask = ref.causal_mask(T) if masked else None
    expected, _ = mha(t64(x), t64(x), t64(x), attn_mask=None if mask is None else ~torch.as_tensor(mask),
                      need_weights=False)
    close(ref.multi_head_attention(x, params, H, mask=mask), expected)
    close(tref.multi_head_attention(t64(x), params, H, mask=None if mask is None else torch.as_tensor(mask)),
          expected)


def test_gqa_equals_mha_with_repeated_kv_weights(rng):
    # H_kv KV heads shared by groups of H / H_kv query heads == MHA whose K/V weights repeat each
    # KV head's columns for every query head of its group (repeat-interleave over heads)
    C, H, H_kv, T = 24, 6, 2, 5
    D = C // H
    p = randomised(ref.init_block_params(C, H, n_kv_heads=H_kv), rng)
    x = rng.normal(size=(2, T, C))
    full = dict(p)
    for w, b in [("wk", "bk"), ("wv", "bv")]:
        heads = p[w].reshape(C, H_kv, D)
        full[w] = np.repeat(heads, H // H_kv, axis=1).reshape(C, H * D)
        full[b] = np.repeat(p[b].reshape(H_kv, D), H // H_kv, axis=0).reshape(H * D)
    mask = ref.causal_mask(T)
    expected = ref.multi_head_attention(x, full, H, mask=mask)
    close(ref.multi_head_attention(x, p, H, n_kv_heads=H_kv, mask=mask), expected)
    close(ref.multi_head_attention(x, p, H, mask=mask), expected)  # H_kv read off wk
    close(tref.multi_head_attention(t64(x), p, H, H_kv, torch.as_tensor(mask)), expected)


def test_gqa_projection_matches_torch_sdpa_enable_gqa(rng):
    C, H, H_kv, T = 16, 4, 2, 7
    p = randomised(ref.init_block_params(C, H, n_kv_heads=H_kv, bias=False), rng)
    x = t64(rng.normal(size=(3, T, C)))
    q = (x @ t64(p["wq"])).unflatten(-1, (H, C // H)).transpose(1, 2)
    k = (x @ t64(p["wk"])).unflatten(-1, (H_kv, C // H)).transpose(1, 2)
    v = (x @ t64(p["wv"])).unflatten(-1, (H_kv, C // H)).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = out.transpose(1, 2).flatten(-2) @ t64(p["wo"])
    close(tref.multi_head_attention(x, p, H, mask=tref.causal_mask(T)), expected)


def test_rope_attention_depends_only_on_relative_positions(rng):
    C, H, T = 16, 2, 6
    p = randomised(ref.init_block_params(C, H), rng)
    x = rng.normal(size=(2, T, C))
    mask = ref.causal_mask(T)
    base = ref.multi_head_attention(x, p, H, mask=mask, rope=True)
    shifted = ref.multi_head_attention(x, p, H, mask=mask, rope=True, positions=np.arange(T) + 37)
    close(base, shifted, rtol=1e-9, atol=1e-11)
    close(base, ref.multi_head_attention(x, p, H, mask=mask, rope=ref.rope_inv_freq(C // H)))
    assert not np.allclose(base, ref.multi_head_attention(x, p, H, mask=mask))  # RoPE does something
    close(tref.multi_head_attention(t64(x), p, H, mask=torch.as_tensor(mask), rope=True,
                                    positions=torch.arange(T) + 37), base, rtol=1e-9, atol=1e-11)


# --- the block against nn.TransformerEncoderLayer / DecoderLayer ----------------------------------

def params_from_encoder_layer(layer):
    p = params_from_mha(layer.self_attn)
    np_ = lambda t: t.detach().cpu().numpy()  # noqa: E731
    p.update(ln1_weight=np_(layer.norm1.weight), ln1_bias=np_(layer.norm1.bias),
             ln2_weight=np_(layer.norm2.weight), ln2_bias=np_(layer.norm2.bias),
             w1=np_(layer.linear1.weight).T, b1=np_(layer.linear1.bias),
             w2=np_(layer.linear2.weight).T, b2=np_(layer.linear2.bias))
    return p


def params_from_decoder_layer(layer):
    """Decoder layer: norm1 (self-attention) -> our ln1, norm2 (cross) -> ln3, norm3 (FFN) -> ln2."""
    p = params_from_mha(layer.self_attn)
    p.update(params_from_mha(layer.multihead_attn, "cross_"))
    np_ = lambda t: t.detach().cpu().numpy()  # noqa: E731
    p.update(ln1_weight=np_(layer.norm1.weight), ln1_bias=np_(layer.norm1.bias),
             ln3_weight=np_(layer.norm2.weight), ln3_bias=np_(layer.norm2.bias),
             ln2_weight=np_(layer.norm3.weight), ln2_bias=np_(layer.norm3.bias),
             w1=np_(layer.linear1.weight).T, b1=np_(layer.linear1.bias),
             w2=np_(layer.linear2.weight).T, b2=np_(layer.linear2.bias))
    return p


def randomise_norms(layer, seed):
    randomise_module(layer, seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.startswith("norm") and name.endswith("weight"):
                p.add_(1.0)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_block_matches_nn_transformer_encoder_layer(norm_first, activation, rng):
    C, H, Fh, T = 16, 4, 24, 5
    layer = nn.TransformerEncoderLayer(C, H, Fh, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first, dtype=torch.float64)
    randomise_norms(layer, 1)
    layer.eval()
    params = params_from_encoder_layer(layer)
    x = rng.normal(size=(2, T, C))
    mask = ref.causal_mask(T)
    position = "pre" if norm_first else "post"
    for m in (None, mask):
        expected = layer(t64(x), src_mask=None if m is None else ~torch.as_tensor(m))
        close(ref.transformer_block(x, params, H, norm_position=position, mask=m, activation=activation), expected)
        close(tref.transformer_block(t64(x), params, H, norm_position=position, activation=activation,
                                     mask=None if m is None else torch.as_tensor(m)), expected)
        block = tref.TransformerBlock(C, H, Fh, norm_position=position, activation=activation).double()
        block.load_params(params)
        close(block(t64(x), None if m is None else torch.as_tensor(m)), expected)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_block_with_memory_matches_nn_transformer_decoder_layer(norm_first, rng):
    C, H, Fh, T, S = 16, 4, 20, 5, 7
    layer = nn.TransformerDecoderLayer(C, H, Fh, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=norm_first, dtype=torch.float64)
    randomise_norms(layer, 2)
    layer.eval()
    params = params_from_decoder_layer(layer)
    x, memory = rng.normal(size=(2, T, C)), rng.normal(size=(2, S, C))
    lengths = np.array([S, 3])
    expected = layer(t64(x), t64(memory), tgt_mask=~torch.as_tensor(ref.causal_mask(T)),
                     memory_key_padding_mask=~torch.as_tensor(np.arange(S)[None, :] < lengths[:, None]))
    position = "pre" if norm_first else "post"
    got = ref.transformer_block(x, params, H, norm_position=position, mask=ref.causal_mask(T), memory=memory,
                                memory_mask=ref.padding_mask(lengths, S))
    close(got, expected)
    got_t = tref.transformer_block(t64(x), params, H, norm_position=position, mask=tref.causal_mask(T),
                                   memory=t64(memory), memory_mask=tref.padding_mask(torch.as_tensor(lengths), S))
    close(got_t, expected)


# --- properties ----------------------------------------------------------------------------------

@pytest.mark.parametrize("ffn, norm", [("gelu", "layernorm"), ("swiglu", "rmsnorm")])
def test_pre_norm_residual_path_passes_x_unchanged(ffn, norm, rng):
    C, H = 16, 4
    p = randomised(ref.init_block_params(C, H, ffn=ffn, norm=norm, cross_attention=True), rng)
    for key in ("wo", "bo", "cross_wo", "cross_bo", "w2", "b2"):
        p[key] = np.zeros_like(p[key])  # every sublayer now outputs 0
    x = rng.normal(size=(2, 5, C))
    memory = rng.normal(size=(2, 3, C))
    np.testing.assert_array_equal(ref.transformer_block(x, p, H, norm=norm, memory=memory), x)
    np.testing.assert_array_equal(tref.transformer_block(t64(x), p, H, norm=norm, memory=t64(memory)).numpy(), x)
    # the post-norm block, by contrast, normalises x even then
    post = ref.transformer_block(x, p, H, norm=norm, memory=memory, norm_position="post")
    assert not np.allclose(post, x)


@given(B=st.integers(1, 2), T=st.integers(2, 7), heads=st.sampled_from([(4, 4), (4, 2), (4, 1)]),
       t=st.integers(0, 6), norm_position=st.sampled_from(["pre", "post"]), rope=st.booleans())
def test_causal_block_future_tokens_never_change_earlier_outputs(B, T, heads, t, norm_position, rope):
    t = t % T
    H, H_kv = heads
    rng = np.random.default_rng(T * 10 + t)
    p = randomised(ref.init_block_params(16, H, n_kv_heads=H_kv, ffn="swiglu"), rng)
    x = rng.normal(size=(B, T, 16))
    y = x.copy()
    y[:, t + 1:] = rng.normal(size=(B, T - t - 1, 16))  # change every token after t
    kw = dict(mask=ref.causal_mask(T), norm_position=norm_position, rope=True if rope else None)
    out_x, out_y = ref.transformer_block(x, p, H, **kw), ref.transformer_block(y, p, H, **kw)
    np.testing.assert_allclose(out_x[:, : t + 1], out_y[:, : t + 1], rtol=1e-12, atol=1e-12)
    if t + 1 < T:
        assert not np.allclose(out_x[:, t + 1:], out_y[:, t + 1:])
    # without the mask the earlier outputs do change (the block is bidirectional)
    if t + 1 < T:
        kw["mask"] = None
        assert not np.allclose(ref.transformer_block(x, p, H, **kw)[:, 0], ref.transformer_block(y, p, H, **kw)[:, 0])


@given(lead=st.lists(st.integers(1, 3), min_size=0, max_size=2), T=st.integers(1, 6),
       config=st.sampled_from([dict(ffn="gelu", norm="layernorm", bias=True),
                               dict(ffn="swiglu", norm="rmsnorm", bias=False, n_kv_heads=1),
                               dict(ffn="gelu", norm="layernorm", bias=False, n_kv_heads=2, cross_attention=True)]),
       norm_position=st.sampled_from(["pre", "post"]))
def test_numpy_and_torch_blocks_agree_for_all_shapes(lead, T, config, norm_position):
    rng = np.random.default_rng(len(lead) * 7 + T)
    C, H = 8, 4
    p = randomised(ref.init_block_params(C, H, **config), rng)
    x = rng.normal(size=(*lead, T, C))
    kw = dict(norm_position=norm_position, norm=config["norm"], mask=ref.causal_mask(T), rope=True)
    memory = rng.normal(size=(*lead, 3, C)) if config.get("cross_attention") else None
    out = ref.transformer_block(x, p, H, memory=memory, **kw)
    assert out.shape == x.shape
    kw["mask"] = torch.as_tensor(kw["mask"])
    out_t = tref.transformer_block(t64(x), p, H, memory=None if memory is None else t64(memory), **kw)
    close(out, out_t)


def test_numpy_and_torch_agree_function_by_function(rng):
    C, H = 12, 3
    p = randomised(ref.init_block_params(C, H, ffn="swiglu", cross_attention=True), rng)
    g = randomised(ref.init_block_params(C, H), rng)
    x, mem = rng.normal(size=(2, 4, C)), rng.normal(size=(2, 6, C))
    close(ref.layer_norm(x, p["ln1_weight"], p["ln1_bias"]), tref.layer_norm(t64(x), p["ln1_weight"], p["ln1_bias"]))
    close(ref.rms_norm(x, p["ln1_weight"]), tref.rms_norm(t64(x), t64(p["ln1_weight"])))
    for approximate in ("none", "tanh"):
        close(ref.gelu(x, approximate), tref.gelu(t64(x), approximate))
    for activation in ("gelu", "gelu_tanh", "relu"):
        close(ref.feed_forward(x, g, activation), tref.feed_forward(t64(x), g, activation))
    close(ref.swiglu_feed_forward(x, p), tref.swiglu_feed_forward(t64(x), p))
    close(ref.multi_head_attention(x, p, H, rope=True), tref.multi_head_attention(t64(x), p, H, rope=True))
    tp = tref.init_block_params(C, H, ffn="swiglu", cross_attention=True, dtype=torch.float64)
    np_p = ref.init_block_params(C, H, ffn="swiglu", cross_attention=True)
    assert tp.keys() == np_p.keys()
    for key in tp:
        close(tp[key], np_p[key], rtol=0, atol=0)
    close(ref.transformer_block(x, p, H, memory=mem), tref.transformer_block(t64(x), p, H, memory=t64(mem)))


def test_init_block_params_distribution_and_seed():
    p = ref.init_block_params(256, 8, seed=3)
    assert abs(p["w1"].std() - 0.02) < 0.001 and abs(p["w1"].mean()) < 0.001
    np.testing.assert_array_equal(p["ln1_weight"], 1.0)
    np.testing.assert_array_equal(p["bq"], 0.0)
    again = ref.init_block_params(256, 8, seed=3)
    assert all(np.array_equal(p[k], again[k]) for k in p)
    assert not np.array_equal(p["wq"], ref.init_block_params(256, 8, seed=4)["wq"])
    assert p["wq"].dtype == np.float64
    t = tref.init_block_params(16, 4)
    assert all(v.dtype == torch.float32 for v in t.values())


# --- torch specifics -------------------------------------------------------------------------------

def test_gradcheck_tiny_block():
    rng = np.random.default_rng(0)
    p = {k: t64(v).requires_grad_() for k, v in randomised(ref.init_block_params(4, 2, d_ff=6), rng).items()}
    x = t64(rng.normal(size=(1, 3, 4))).requires_grad_()
    mask = tref.causal_mask(3)

    def fn(x, wq, w1, ln1_weight):
        return tref.transformer_block(x, {**p, "wq": wq, "w1": w1, "ln1_weight": ln1_weight}, 2, mask=mask,
                                      rope=True)

    assert torch.autograd.gradcheck(fn, (x, p["wq"], p["w1"], p["ln1_weight"]))


def test_module_gradients_reach_every_parameter():
    torch.manual_seed(0)
    block = tref.TransformerBlock(8, 2, n_kv_heads=1, ffn="swiglu", norm="rmsnorm")
    block(torch.randn(2, 4, 8), tref.causal_mask(4), rope=True).square().sum().backward()
    for name, p in block.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_block_keeps_dtype_and_device(dtype, device):
    p = tref.init_block_params(8, 2, device=device)
    x = torch.randn(2, 3, 8, device=device, dtype=dtype)
    out = tref.transformer_block(x, p, 2, mask=tref.causal_mask(3, device=device), rope=True)
    assert out.dtype == dtype and out.device == x.device
    block = tref.TransformerBlock(8, 2).to(device)
    assert block(torch.randn(2, 3, 8, device=device)).device == x.device


def test_module_params_share_storage_and_load_params_round_trips(rng):
    p = randomised(ref.init_block_params(8, 2, cross_attention=True), rng)
    block = tref.TransformerBlock(8, 2, cross_attention=True).double().load_params(p)
    x, mem = rng.normal(size=(2, 3, 8)), rng.normal(size=(2, 4, 8))
    close(block(t64(x), memory=t64(mem)), ref.transformer_block(x, p, 2, memory=mem))
    with torch.no_grad():
        block.params()["wq"].zero_()
    assert torch.count_nonzero(block.wq) == 0
    assert list(block.params()) == list(p)
    assert [name for name, _ in block.named_parameters()] == list(p)


def test_dropout_only_in_training_mode():
    torch.manual_seed(0)
    block = tref.TransformerBlock(8, 2, dropout=0.5)
    x = torch.randn(2, 3, 8)
    block.eval()
    assert torch.equal(block(x), block(x))
    block.train()
    assert not torch.equal(block(x), block(x))


def test_block_with_kv_cache_equals_full_forward():
    torch.manual_seed(0)
    C, H, H_kv, T = 16, 4, 2, 7
    blocks = [tref.TransformerBlock(C, H, n_kv_heads=H_kv).double() for _ in range(2)]
    x = torch.randn(2, T, C, dtype=torch.float64)

    def run(x, mask, cache=None):
        for i, block in enumerate(blocks):
            x = block(x, mask, rope=True, cache=cache, layer_idx=i)
        return x

    full = run(x, tref.causal_mask(T))
    cache = tref.KVCache(2, 2, H_kv, C // H, T, dtype=torch.float64)
    steps = [run(x[:, :3], tref.causal_mask(3), cache)]  # prefill 3 tokens, then one at a time
    for t in range(3, T):
        steps.append(run(x[:, t:t + 1], tref.causal_mask(1, t + 1), cache))
    close(torch.cat(steps, dim=1), full)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_numpy_block_with_kv_cache_equals_full_forward_and_torch(norm_position, rng):
    C, H, H_kv, T, layers = 16, 4, 2, 7, 2
    params = [randomised(ref.init_block_params(C, H, n_kv_heads=H_kv, seed=i), rng) for i in range(layers)]
    x = rng.normal(size=(2, T, C))
    kw = dict(n_kv_heads=H_kv, rope=True, norm_position=norm_position)

    def run(backend, x, mask, cache=None):
        for i, p in enumerate(params):
            x = backend.transformer_block(x, p, H, mask=mask, cache=cache, layer_idx=i, **kw)
        return x

    full = run(ref, x, ref.causal_mask(T))
    cache = ref.KVCache(layers, 2, H_kv, C // H, T)
    t_cache = tref.KVCache(layers, 2, H_kv, C // H, T, dtype=torch.float64)
    steps, t_steps = [], []
    for t0, t1 in [(0, 3), (3, 4), (4, 6), (6, 7)]:  # a 3-token prefill, then one or two tokens at a time
        steps.append(run(ref, x[:, t0:t1], ref.causal_mask(t1 - t0, t1), cache))
        t_steps.append(run(tref, t64(x[:, t0:t1]), tref.causal_mask(t1 - t0, t1), t_cache))
    assert cache.seq_len == cache.length(layers - 1) == T
    close(np.concatenate(steps, axis=1), full)
    close(torch.cat(t_steps, dim=1), full)
    # multi_head_attention alone: cached positions continue where the cache stopped
    cache.reset()
    mha = [ref.multi_head_attention(x[:, t:t + 1], params[0], H, H_kv, ref.causal_mask(1, t + 1), True,
                                    cache=cache) for t in range(T)]
    close(np.concatenate(mha, axis=1), ref.multi_head_attention(x, params[0], H, H_kv, ref.causal_mask(T), True))


# --- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", [ref, tref], ids=["numpy", "torch"])
def test_bad_input_names_the_argument(backend):
    arr = (lambda a: t64(a)) if backend is tref else np.asarray
    p = ref.init_block_params(8, 2)
    pc = ref.init_block_params(8, 2, cross_attention=True)
    x = arr(np.zeros((2, 3, 8)))
    cases = [
        (lambda: backend.layer_norm(x, arr(np.ones(5)), None), "weight"),
        (lambda: backend.layer_norm(x, arr(np.ones(8)), arr(np.ones(3))), "bias"),
        (lambda: backend.layer_norm(x, arr(np.ones(8)), None, eps=-1.0), "eps"),
        (lambda: backend.rms_norm(x, arr(np.ones(4))), "weight"),
        (lambda: backend.gelu(x, "erf"), "approximate"),
        (lambda: backend.feed_forward(x, p, "swish"), "activation"),
        (lambda: backend.feed_forward(x, {"w1": p["w1"]}), "params is missing the key 'w2'"),
        (lambda: backend.swiglu_feed_forward(x, p), "params is missing the key 'w3'"),
        (lambda: backend.multi_head_attention(x, p, 3), r"x.shape\[-1\] \(8\) must be divisible by n_heads"),
        (lambda: backend.multi_head_attention(x, p, 2, n_kv_heads=3), "n_heads"),
        (lambda: backend.multi_head_attention(x, {**p, "wq": p["wq"][:, :4]}, 2), r"params\['wq'\]"),
        (lambda: backend.multi_head_attention(arr(np.zeros((2, 3, 6))), p, 2), r"params\['wq'\]"),
        (lambda: backend.multi_head_attention(arr(np.zeros(8)), p, 2), "x"),
        (lambda: backend.transformer_block(x, p, 2, norm_position="middle"), "norm_position"),
        (lambda: backend.transformer_block(x, p, 2, norm="batchnorm"), "norm"),
        (lambda: backend.transformer_block(x, p, 2, memory=arr(np.zeros((2, 4, 8)))), "memory"),
        (lambda: backend.transformer_block(x, pc, 2, memory=arr(np.zeros((2, 4, 6)))), "memory"),
        (lambda: backend.transformer_block(x, p, 2, mask=arr(np.ones((4, 4))) > 0), "mask"),
        (lambda: backend.init_block_params(8, 2, seed=-1), "seed"),
        (lambda: backend.init_block_params(8, 3), "d_model"),
        (lambda: backend.init_block_params(8, 2, ffn="moe"), "ffn"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"^{name}"):
            call()


def test_module_validation():
    with pytest.raises(ValueError, match="^dropout"):
        tref.TransformerBlock(8, 2, dropout=1.5)
    with pytest.raises(ValueError, match="^norm_position"):
        tref.TransformerBlock(8, 2, norm_position="sandwich")
    block = tref.TransformerBlock(8, 2)
    with pytest.raises(ValueError, match="^params"):
        block.load_params({"wq": np.zeros((8, 8))})
    with pytest.raises(ValueError, match="^memory"):
        block(torch.zeros(1, 2, 8), memory=torch.zeros(1, 3, 8))
    with pytest.raises(ValueError, match="^memory"):
        tref.TransformerBlock(8, 2, cross_attention=True)(torch.zeros(1, 2, 8))


# --- contracts that once broke: norm weights, half precision, positions layout, integer input -----

@pytest.mark.parametrize("backend, make", [(ref, np.asarray), (tref, torch.as_tensor)], ids=["numpy", "torch"])
@pytest.mark.parametrize("shape", [(5, 16), (2, 5, 16), (1, 16)])
def test_norm_weights_must_be_vectors(backend, make, shape):
    # weight (T, C) used to broadcast silently (or fail with a RuntimeError in torch)
    x = make(np.ones((2, 5, 16)))
    with pytest.raises(ValueError, match="^weight"):
        backend.layer_norm(x, make(np.ones(shape)), None)
    with pytest.raises(ValueError, match="^bias"):
        backend.layer_norm(x, make(np.ones(16)), make(np.ones(shape)))
    with pytest.raises(ValueError, match="^weight"):
        backend.rms_norm(x, make(np.ones(shape)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_norms_do_not_overflow(dtype):
    # |x| = 300: x^2 = 90,000 overflows float16 (max 65,504), so the old fp16 statistics gave
    # rsqrt(inf) = 0 and an all-zero output. nn.LayerNorm / F.rms_norm reduce in float32.
    x = torch.full((2, 4, 16), 300.0, dtype=dtype)
    x[..., ::2] = -300.0
    w, b = torch.linspace(0.5, 1.5, 16), torch.linspace(-1, 1, 16)
    ln = tref.layer_norm(x, w, b)
    rms = tref.rms_norm(x, w)
    assert ln.dtype == dtype and rms.dtype == dtype
    torch.testing.assert_close(ln, F.layer_norm(x.float(), (16,), w, b, 1e-5).to(dtype))
    torch.testing.assert_close(rms, F.rms_norm(x.float(), (16,), w, 1e-6).to(dtype))
    x.requires_grad_(True)
    tref.rms_norm(x, w).float().sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("backend, make", [(ref, np.asarray), (tref, torch.as_tensor)], ids=["numpy", "torch"])
def test_block_positions_follow_x_layout(backend, make, rng):
    # positions (B, T) for x (B, T, C) used to be matched against q's (B, H, T) dims: an error
    # when B != H and, when B == H, sequence b silently rotated with head h = b's positions.
    B = H = 2
    T, C = 5, 16
    params = ref.init_block_params(C, H, seed=3)
    params = {key: value + rng.normal(0.0, 0.1, value.shape) for key, value in params.items()}
    x = rng.standard_normal((B, T, C))
    positions = np.stack([np.arange(T) + 7, np.arange(T) * 3])  # (B, T)
    mask = backend.causal_mask(T)
    for fn in (backend.multi_head_attention, backend.transformer_block):
        kwargs = dict(mask=mask, rope=True)
        both = fn(make(x), params, H, positions=make(positions), **kwargs)
        for b in range(B):
            alone = fn(make(x[b]), params, H, positions=make(positions[b]), **kwargs)
            np.testing.assert_allclose(np.asarray(both[b]), np.asarray(alone), atol=1e-12)


def test_torch_integer_norm_inputs_give_floats_like_numpy():
    # integer x used to be normalised back into integers
    x = np.array([[1, 2, 3, 4], [0, -1, 2, 5]])
    pairs = [
        (tref.layer_norm(torch.tensor(x), np.ones(4), np.zeros(4)), ref.layer_norm(x, np.ones(4), np.zeros(4))),
        (tref.rms_norm(torch.tensor(x), np.ones(4)), ref.rms_norm(x, np.ones(4))),
    ]
    for out, expected in pairs:
        assert out.dtype == torch.float32
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
