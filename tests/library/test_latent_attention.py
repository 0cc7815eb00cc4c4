"""Multi-head latent attention: against an implementation written here from DeepSeek-V2's
equations (§2.1.2-2.1.3 and Appendix C), absorbed equals naive, cached decoding equals the
full forward, the cache holds only the latent and the shared RoPE key, NumPy and torch
agree, torch differentiates, and bad input names the argument in both backends."""

import math

import numpy as np
import pytest
import torch
from conftest import DEVICES  # tests/ is on sys.path (rootdir conftest, no package)

from transformer_ref import counts
from transformer_ref import numpy as ref
from transformer_ref import torch as tref

pytestmark = pytest.mark.usefixtures("one_torch_thread")

C, H, R_KV, D_NOPE, D_ROPE, D_V, R_Q = 24, 3, 10, 6, 4, 5, 12
SIZES = dict(kv_lora_rank=R_KV, qk_nope_head_dim=D_NOPE, qk_rope_head_dim=D_ROPE, v_head_dim=D_V)


def make_params(seed=0, compressed_queries=False):
    """Random MLA weights, ``(in, out)`` as the library takes them; norm gains away from 1."""
    g = np.random.default_rng(seed)
    w = lambda n_in, n_out: g.standard_normal((n_in, n_out)) / math.sqrt(n_in)  # noqa: E731
    params = {"wkv_a": w(C, R_KV + D_ROPE), "kv_norm_weight": g.uniform(0.5, 1.5, R_KV),
              "wkv_b": w(R_KV, H * (D_NOPE + D_V)), "wo": w(H * D_V, C)}
    if compressed_queries:
        params.update(wq_a=w(C, R_Q), q_norm_weight=g.uniform(0.5, 1.5, R_Q), wq_b=w(R_Q, H * (D_NOPE + D_ROPE)))
    else:
        params["wq"] = w(C, H * (D_NOPE + D_ROPE))
    return params


# --------------------------------------------------------------------------
# An independent MLA, one token and one head at a time, from the paper's equations
# --------------------------------------------------------------------------
def _rms(v, gain, eps=1e-6):
    return v / math.sqrt(float(np.mean(v * v)) + eps) * gain


def _rope(v, position, base=10000.0):
    """Interleaved RoPE of one vector: pair (2i, 2i+1) as a complex number times e^{i m theta_i}."""
    d = v.shape[0]
    theta = base ** (-np.arange(0, d, 2) / d)
    z = (v[0::2] + 1j * v[1::2]) * np.exp(1j * position * theta)
    out = np.empty(d)
    out[0::2], out[1::2] = z.real, z.imag
    return out


def paper_mla(x, params, positions, allowed):
    """x (T, C), positions (T,), allowed (T, S=T) boolean -> (T, C), by eqs. (37)-(47) of DeepSeek-V2.

    The paper writes W x with W of shape (out, in); the library's weights are (in, out), so
    W^DKV h = h @ wkv_a[:, :r_kv] and so on."""
    T = x.shape[0]
    w_dkv, w_kr = params["wkv_a"][:, :R_KV], params["wkv_a"][:, R_KV:]
    w_ukv = params["wkv_b"].reshape(R_KV, H, D_NOPE + D_V)
    latents = [_rms(x[j] @ w_dkv, params["kv_norm_weight"]) for j in range(T)]  # c_j^KV (41), RMS-normed
    shared_keys = [_rope(x[j] @ w_kr, positions[j]) for j in range(T)]  # k_j^R (43)
    out = np.zeros((T, C))
    for t in range(T):
        if "wq" in params:
            q_t = x[t] @ params["wq"]
        else:
            q_t = _rms(x[t] @ params["wq_a"], params["q_norm_weight"]) @ params["wq_b"]  # (37)-(38)
        q_t = q_t.reshape(H, D_NOPE + D_ROPE)
        head_outputs = []
        for i in range(H):
            q_ti = np.concatenate([q_t[i, :D_NOPE], _rope(q_t[i, D_NOPE:], positions[t])])  # (39)-(40)
            scores, values = [], []
            for j in range(T):
                k_nope = latents[j] @ w_ukv[:, i, :D_NOPE]  # (42)
                k_ji = np.concatenate([k_nope, shared_keys[j]])  # (44)
                scores.append(q_ti @ k_ji / math.sqrt(D_NOPE + D_ROPE) if allowed[t, j] else -math.inf)
                values.append(latents[j] @ w_ukv[:, i, D_NOPE:])  # (45)
            weights = np.exp(np.array(scores) - max(scores))
            weights /= weights.sum()
            head_outputs.append(sum(w * v for w, v in zip(weights, values)))  # (46)
        out[t] = np.concatenate(head_outputs) @ params["wo"]  # (47)
    return out


def call(backend, x, params, **kwargs):
    return backend.multi_head_latent_attention(x, params, H, **SIZES, **kwargs)


@pytest.mark.parametrize("compressed_queries", [False, True])
@pytest.mark.parametrize("absorb", [False, True])
def test_matches_the_papers_equations(compressed_queries, absorb, rng):
    T = 6
    params = make_params(1, compressed_queries)
    x = rng.standard_normal((2, T, C))
    positions = np.array([3, 4, 5, 9, 10, 30])  # not 0..T-1: RoPE must use them
    allowed = ref.causal_mask(T)
    out = call(ref, x, params, mask=allowed, positions=positions, absorb=absorb)
    assert out.shape == (2, T, C)
    for b in range(2):
        np.testing.assert_allclose(out[b], paper_mla(x[b], params, positions, allowed), rtol=1e-10, atol=1e-12)
    # the check can fail: the default positions 0..T-1 give something else
    assert not np.allclose(call(ref, x, params, mask=allowed, absorb=absorb)[0], paper_mla(x[0], params, positions, allowed))


# --------------------------------------------------------------------------
# Absorbed equals naive
# --------------------------------------------------------------------------
def _masks(T, S):
    g = np.random.default_rng(7)
    random = g.random((H, T, S)) < 0.5
    random[..., 0] = True
    return {"none": None, "causal": ref.causal_mask(T, S), "per head": random,
            "padding": ref.padding_mask(np.array([S, 2]), S),  # (B, 1, 1, S)
            "additive": np.where(ref.causal_mask(T, S), 0.0, -1e9)}


@pytest.mark.parametrize("mask_name", ["none", "causal", "per head", "padding", "additive"])
def test_absorbed_equals_naive(mask_name, rng):
    x = rng.standard_normal((2, 5, C))
    params = make_params(2, compressed_queries=True)
    mask = _masks(5, 5)[mask_name]
    naive = call(ref, x, params, mask=mask)
    absorbed = call(ref, x, params, mask=mask, absorb=True)
    np.testing.assert_allclose(absorbed, naive, rtol=1e-10, atol=1e-12)


def test_fully_masked_rows_give_zeros_in_both_paths(rng):
    x = rng.standard_normal((4, C))
    mask = ref.causal_mask(4).copy()
    mask[1] = False
    for absorb in (False, True):
        out = call(ref, x, make_params(3), mask=mask, absorb=absorb)
        assert np.all(out[1] == 0) and np.all(np.isfinite(out)) and np.abs(out[[0, 2, 3]]).min() > 0


# --------------------------------------------------------------------------
# Cached decoding equals the full forward; the cache holds only c and k_R
# --------------------------------------------------------------------------
def backends():
    return [pytest.param((ref, None), id="numpy")] + [pytest.param((tref, d), id=f"torch-{d}") for d in DEVICES]


def _array(lib, device, a):
    return a if lib is ref else torch.tensor(a, device=device)


def _numpy(a):
    return a if isinstance(a, np.ndarray) else a.detach().cpu().numpy()


def _new_cache(lib, device, n_layers, batch, max_len):
    if lib is ref:
        return ref.MLACache(n_layers, batch, R_KV, D_ROPE, max_len)
    return tref.MLACache(n_layers, batch, R_KV, D_ROPE, max_len, dtype=torch.float64, device=device)


def _causal(lib, device, T, S):
    return ref.causal_mask(T, S) if lib is ref else tref.causal_mask(T, S, device=device)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("absorb", [False, True])
def test_cached_decoding_equals_full_forward(backend, absorb, rng):
    lib, device = backend
    T, chunks, layers = 9, [4, 1, 2, 1, 1], 2
    params = [make_params(10 + layer, compressed_queries=layer == 1) for layer in range(layers)]
    x = rng.standard_normal((2, T, C))

    def stack(x, cache=None):
        """Two residual MLA layers; with a cache, x holds only the new tokens."""
        offset = 0 if cache is None else cache.seq_len
        mask = _causal(lib, device, x.shape[1], offset + x.shape[1])
        for layer in range(layers):
            x = x + call(lib, x, params[layer], mask=mask, cache=cache, layer_idx=layer, absorb=absorb)
        return x

    full = _numpy(stack(_array(lib, device, x)))
    cache = _new_cache(lib, device, layers, 2, T)
    pieces, start = [], 0
    for n in chunks:  # a prompt, then a few tokens at a time
        pieces.append(_numpy(stack(_array(lib, device, x[:, start:start + n]), cache)))
        start += n
        assert cache.seq_len == start == cache.length(1)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, rtol=1e-10, atol=1e-12)

    # what is stored: the RMS-normed latent and the rotated shared key of layer 0's input, nothing else
    latent = ref.rms_norm(x @ params[0]["wkv_a"][..., :R_KV], params[0]["kv_norm_weight"])
    k_rope = ref.apply_rope(x @ params[0]["wkv_a"][..., R_KV:], np.arange(T))
    np.testing.assert_allclose(_numpy(cache.c[0]), latent, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_numpy(cache.k_rope[0]), k_rope, rtol=1e-12, atol=1e-12)
    assert {name for name, value in vars(cache).items() if hasattr(value, "shape")} == {"c", "k_rope"}


@pytest.mark.parametrize("backend", backends())
def test_cache_bytes_are_mla_kv_cache_bytes(backend):
    lib, device = backend
    cache = _new_cache(lib, device, 3, 2, 16)
    assert cache.nbytes == counts.mla_kv_cache_bytes(3, R_KV, D_ROPE, 16, batch_size=2, bytes_per_element=8)
    assert cache.nbytes == 3 * 2 * 16 * (R_KV + D_ROPE) * 8
    # and a GQA cache holding the heads' keys and values would be larger
    assert cache.nbytes < counts.kv_cache_bytes(3, H, D_NOPE + D_ROPE, 16, batch_size=2, bytes_per_element=8)


def test_torch_cache_lives_on_its_device_and_defaults_to_float32(device):
    cache = tref.MLACache(2, 1, R_KV, D_ROPE, 8, device=device)
    assert cache.c.device.type == device and cache.c.dtype == torch.float32
    assert cache.nbytes == counts.mla_kv_cache_bytes(2, R_KV, D_ROPE, 8, bytes_per_element=4)
    c_all, k_all = cache.update(1, torch.ones(1, 3, R_KV, device=device), torch.ones(1, 3, D_ROPE, device=device))
    assert tuple(c_all.shape) == (1, 3, R_KV) and tuple(k_all.shape) == (1, 3, D_ROPE)
    assert c_all.device.type == device and cache.length(1) == 3 and cache.seq_len == 0  # seq_len follows layer 0


@pytest.mark.parametrize("cls", [ref.MLACache, tref.MLACache], ids=["numpy", "torch"])
def test_bad_cache_updates_name_the_argument(cls):
    cache = cls(1, 2, R_KV, D_ROPE, 4)
    ok_c, ok_k = np.zeros((2, 3, R_KV)), np.zeros((2, 3, D_ROPE))
    cache.update(0, ok_c, ok_k)
    with pytest.raises(ValueError, match=r"^c adds 2 positions .* max_seq_len=4"):
        cache.update(0, np.zeros((2, 2, R_KV)), np.zeros((2, 2, D_ROPE)))
    assert cache.seq_len == 3  # a failed update stores nothing
    with pytest.raises(ValueError, match=r"^c must have shape \(B=2, T_new, r_kv=10\)"):
        cache.update(0, np.zeros((2, 1, R_KV + 1)), np.zeros((2, 1, D_ROPE)))
    with pytest.raises(ValueError, match=r"^k_rope must have shape \(B=2, T_new, d_rope=4\)"):
        cache.update(0, np.zeros((2, 1, R_KV)), np.zeros((1, 1, D_ROPE)))
    with pytest.raises(ValueError, match="^c and k_rope must hold the same number of new positions"):
        cache.update(0, np.zeros((2, 1, R_KV)), np.zeros((2, 0, D_ROPE)))
    with pytest.raises(ValueError, match="^layer"):
        cache.update(1, ok_c[:, :1], ok_k[:, :1])
    cache.reset()
    assert cache.seq_len == 0


# --------------------------------------------------------------------------
# NumPy and torch agree; torch differentiates
# --------------------------------------------------------------------------
@pytest.mark.parametrize("absorb", [False, True])
def test_numpy_and_torch_agree(device, absorb, rng):
    params = make_params(4, compressed_queries=True)
    x = rng.standard_normal((2, 3, 5, C))  # two leading batch axes
    positions = np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])[:, None, :]  # (2, 1, T): per-sequence offsets
    mask = ref.causal_mask(5)
    expected = call(ref, x, params, mask=mask, positions=positions, absorb=absorb)
    t_params = {k: torch.tensor(v, device=device) for k, v in params.items()}
    out = call(tref, torch.tensor(x, device=device), t_params, mask=torch.tensor(mask, device=device),
               positions=torch.tensor(positions, device=device), absorb=absorb)
    assert out.device.type == device and out.dtype == torch.float64
    np.testing.assert_allclose(out.cpu().numpy(), expected, rtol=1e-10, atol=1e-12)
    # NumPy parameters are accepted too, moved to x's device and dtype
    out32 = call(tref, torch.tensor(x, device=device, dtype=torch.float32), params, mask=torch.tensor(mask, device=device),
                 positions=torch.tensor(positions, device=device), absorb=absorb)
    assert out32.dtype == torch.float32
    np.testing.assert_allclose(out32.cpu().double().numpy(), expected, rtol=1e-4, atol=1e-5)


def test_torch_gradients_flow_and_agree_between_the_two_paths():
    g = torch.Generator().manual_seed(0)
    params = {k: torch.tensor(v, requires_grad=True) for k, v in make_params(5).items()}
    x = torch.randn(1, 4, C, dtype=torch.float64, generator=g, requires_grad=True)
    mask = tref.causal_mask(4)
    assert torch.autograd.gradcheck(lambda t: call(tref, t, params, mask=mask), (x,))
    weights = torch.randn(1, 4, C, dtype=torch.float64, generator=g)
    grads = []
    for absorb in (False, True):
        (call(tref, x, params, mask=mask, absorb=absorb) * weights).sum().backward()
        grads.append({"x": x.grad.clone(), **{k: p.grad.clone() for k, p in params.items()}})
        x.grad = None
        for p in params.values():
            p.grad = None
    for key in grads[0]:
        assert grads[0][key].abs().max() > 0, key  # every parameter receives a gradient
        torch.testing.assert_close(grads[1][key], grads[0][key])


# --------------------------------------------------------------------------
# Bad input: a ValueError naming the argument, the same message in both backends
# --------------------------------------------------------------------------
def _bad_calls(lib, arr):
    x, p = arr(np.zeros((2, 4, C))), make_params(6)
    cache_cls = ref.KVCache if lib is ref else tref.KVCache
    both = {**p, **make_params(6, compressed_queries=True)}
    return [
        ("kv_lora_rank", lambda: lib.multi_head_latent_attention(x, p, H, **{**SIZES, "kv_lora_rank": 0})),
        ("qk_rope_head_dim", lambda: lib.multi_head_latent_attention(x, p, H, **{**SIZES, "qk_rope_head_dim": 3})),
        ("n_heads", lambda: lib.multi_head_latent_attention(x, p, 0, **SIZES)),
        ("params['wkv_b']", lambda: lib.multi_head_latent_attention(x, {**p, "wkv_b": p["wkv_b"][:, :-1]}, H, **SIZES)),
        ("params is missing the key 'wo'", lambda: lib.multi_head_latent_attention(
            x, {k: v for k, v in p.items() if k != "wo"}, H, **SIZES)),
        ("params must hold either wq", lambda: lib.multi_head_latent_attention(x, both, H, **SIZES)),
        ("rope_base", lambda: lib.multi_head_latent_attention(x, p, H, **SIZES, rope_base=1.0)),
        ("absorb", lambda: lib.multi_head_latent_attention(x, p, H, **SIZES, absorb="yes")),
        ("cache", lambda: lib.multi_head_latent_attention(x, p, H, **SIZES, cache=cache_cls(1, 2, H, 4, 8))),
        ("layer_idx", lambda: lib.multi_head_latent_attention(
            x, p, H, **SIZES, cache=lib.MLACache(1, 2, R_KV, D_ROPE, 8), layer_idx=1)),
        ("positions", lambda: lib.multi_head_latent_attention(x, p, H, **SIZES, positions=np.arange(3))),
        ("mask", lambda: lib.multi_head_latent_attention(x, p, H, **SIZES, mask=arr(np.ones((3, 4), dtype=bool)))),
        ("x", lambda: lib.multi_head_latent_attention(arr(np.zeros(C)), p, H, **SIZES)),
    ]


def test_bad_input_raises_the_same_value_error_in_both_backends():
    numpy_calls, torch_calls = _bad_calls(ref, np.asarray), _bad_calls(tref, torch.as_tensor)
    for (argument, numpy_call), (_, torch_call) in zip(numpy_calls, torch_calls):
        messages = []
        for bad in (numpy_call, torch_call):
            with pytest.raises(ValueError) as info:
                bad()
            messages.append(str(info.value))
        assert messages[0] == messages[1], messages
        assert messages[0].startswith(argument), messages[0]


@pytest.mark.parametrize("lib", [ref, tref], ids=["numpy", "torch"])
def test_multi_head_attention_refuses_a_latent_cache(lib):
    x = np.zeros((1, 4, 8)) if lib is ref else torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="^cache must be a KVCache .*got MLACache"):
        lib.multi_head_attention(x, ref.init_block_params(8, 2), 2, cache=lib.MLACache(1, 1, 4, 2, 8))


def test_torch_backend_names_a_numpy_x():
    with pytest.raises(ValueError, match="^x must be a torch.Tensor"):
        call(tref, np.zeros((2, 4, C)), make_params(0))
