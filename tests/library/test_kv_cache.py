"""KV cache: incremental decoding reproduces the full causal forward pass, in both backends."""

import numpy as np
import pytest
import torch
from conftest import DEVICES  # tests/ is on sys.path (rootdir conftest, no package)

from transformer_ref import counts
from transformer_ref import numpy as ref
from transformer_ref import torch as tref

B, C, H, H_KV, LAYERS = 2, 16, 4, 2, 3
D = C // H


class Backend:
    """The few array operations the toy decoder needs, for one backend and device."""

    def __init__(self, lib, device=None):
        self.lib, self.device = lib, device

    def array(self, a):
        return a if self.lib is ref else torch.tensor(a, device=self.device)

    def arange(self, n):
        return np.arange(n) if self.lib is ref else torch.arange(n, device=self.device)

    def causal_mask(self, T, S):
        return self.lib.causal_mask(T, S) if self.lib is ref else self.lib.causal_mask(T, S, device=self.device)

    def tanh(self, x):
        return np.tanh(x) if self.lib is ref else torch.tanh(x)

    def new_cache(self, max_seq_len):
        if self.lib is ref:
            return ref.KVCache(LAYERS, B, H_KV, D, max_seq_len)
        return tref.KVCache(LAYERS, B, H_KV, D, max_seq_len, dtype=torch.float64, device=self.device)


def toy_decoder(be, x, weights, cache=None):
    """Residual stack of GQA + RoPE attention layers. x: (B, T, C) -> (B, T, C).

    Without a cache, x is the whole sequence; with one, x holds only the new
    tokens, which sit at positions cache.seq_len, cache.seq_len + 1, ...
    """
    T = x.shape[1]
    offset = 0 if cache is None else cache.seq_len  # read once, before any layer appends
    positions = offset + be.arange(T)
    mask = be.causal_mask(T, offset + T)  # bottom-right: new tokens see the cache and their past
    for layer, (wq, wk, wv, wo) in enumerate(weights):
        q = (x @ wq).reshape(B, T, H, D).swapaxes(1, 2)  # (B, H, T, D)
        k = (x @ wk).reshape(B, T, H_KV, D).swapaxes(1, 2)  # (B, H_kv, T, D)
        v = (x @ wv).reshape(B, T, H_KV, D).swapaxes(1, 2)
        q, k = be.lib.apply_rope(q, positions), be.lib.apply_rope(k, positions)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H_kv, offset + T, D)
        out = be.lib.grouped_query_attention(q, k, v, mask)  # (B, H, T, D)
        x = x + be.tanh(out.swapaxes(1, 2).reshape(B, T, C) @ wo)
    return x


def make_inputs(be, T, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(C, H * D), (C, H_KV * D), (C, H_KV * D), (H * D, C)]
    weights = [[be.array(rng.standard_normal(s) / np.sqrt(C)) for s in shapes] for _ in range(LAYERS)]
    return be.array(rng.standard_normal((B, T, C))), weights


def backends():
    return [pytest.param(Backend(ref), id="numpy")] + [pytest.param(Backend(tref, d), id=f"torch-{d}") for d in DEVICES]


def concat(be, parts):
    return np.concatenate(parts, axis=1) if be.lib is ref else torch.cat(parts, dim=1)


def to_numpy(x):
    return x if isinstance(x, np.ndarray) else x.cpu().numpy()


@pytest.mark.parametrize("be", backends())
@pytest.mark.parametrize("chunks", [[5, 1, 1, 1, 1, 1], [1] * 10, [4, 3, 2, 1]])
def test_incremental_decoding_equals_full_forward(be, chunks):
    T = sum(chunks)
    x, weights = make_inputs(be, T)
    full = to_numpy(toy_decoder(be, x, weights))
    cache = be.new_cache(max_seq_len=T + 2)
    outputs, start = [], 0
    for n in chunks:  # a prompt (prefill), then a few tokens at a time
        outputs.append(toy_decoder(be, x[:, start : start + n], weights, cache))
        start += n
        assert cache.seq_len == start
    np.testing.assert_allclose(to_numpy(concat(be, outputs)), full, rtol=1e-10, atol=1e-12)
    # without the bottom-right offset the new tokens would be misplaced: the check can fail
    assert not np.allclose(to_numpy(toy_decoder(be, x[:, -1:], weights)), full[:, -1:])


@pytest.mark.parametrize("be", backends())
def test_reset_forgets_and_the_cache_is_reusable(be):
    x, weights = make_inputs(be, 6)
    cache = be.new_cache(max_seq_len=6)
    first = to_numpy(toy_decoder(be, x, weights, cache))
    cache.reset()
    assert cache.seq_len == 0
    np.testing.assert_allclose(to_numpy(toy_decoder(be, x, weights, cache)), first, rtol=1e-12)


@pytest.mark.parametrize("be", backends())
def test_update_returns_views_of_everything_stored(be):
    cache = be.new_cache(max_seq_len=8)
    rng = np.random.default_rng(1)
    k1, v1 = (be.array(rng.standard_normal((B, H_KV, 3, D))) for _ in range(2))
    k2, v2 = (be.array(rng.standard_normal((B, H_KV, 2, D))) for _ in range(2))
    cache.update(1, k1, v1)
    assert cache.seq_len == 0  # seq_len follows layer 0
    k_all, v_all = cache.update(1, k2, v2)
    assert tuple(k_all.shape) == (B, H_KV, 5, D)
    np.testing.assert_array_equal(to_numpy(k_all), np.concatenate([to_numpy(k1), to_numpy(k2)], axis=2))
    np.testing.assert_array_equal(to_numpy(v_all), np.concatenate([to_numpy(v1), to_numpy(v2)], axis=2))
    # a view into the preallocated buffer, not a copy
    if be.lib is ref:
        assert np.shares_memory(k_all, cache.k)
    else:
        assert k_all.untyped_storage().data_ptr() == cache.k.untyped_storage().data_ptr()


@pytest.mark.parametrize("be", backends())
def test_nbytes_is_the_preallocated_size(be):
    cache = be.new_cache(max_seq_len=32)
    # 2 (K and V) * layers * batch * KV heads * max length * head size * 8 bytes (float64)
    assert cache.nbytes == 2 * LAYERS * B * H_KV * 32 * D * 8
    assert cache.nbytes == counts.kv_cache_bytes(LAYERS, H_KV, D, 32, batch_size=B, bytes_per_element=8)


def test_torch_cache_lives_on_its_device_and_dtype(device):
    cache = tref.KVCache(2, 1, 2, 4, 8, device=device)
    assert cache.k.device.type == device and cache.k.dtype == torch.float32
    assert cache.nbytes == 2 * 2 * 1 * 2 * 8 * 4 * 4
    k_all, _ = cache.update(0, torch.ones(1, 2, 3, 4, device=device), torch.ones(1, 2, 3, 4, device=device))
    assert k_all.device.type == device and cache.seq_len == 3


@pytest.mark.parametrize("be", backends())
def test_bad_updates_name_the_argument(be):
    cache = be.new_cache(max_seq_len=4)
    ok = be.array(np.zeros((B, H_KV, 3, D)))
    cache.update(0, ok, ok)
    with pytest.raises(ValueError, match="^k adds 2 positions .* max_seq_len=4"):
        cache.update(0, be.array(np.zeros((B, H_KV, 2, D))), be.array(np.zeros((B, H_KV, 2, D))))
    assert cache.seq_len == 3  # a failed update stores nothing
    with pytest.raises(ValueError, match="^layer"):
        cache.update(LAYERS, ok, ok)
    with pytest.raises(ValueError, match="^layer"):
        cache.update(-1, ok, ok)
    with pytest.raises(ValueError, match="^k"):
        cache.update(1, be.array(np.zeros((B + 1, H_KV, 1, D))), be.array(np.zeros((B + 1, H_KV, 1, D))))
    with pytest.raises(ValueError, match="^v"):
        cache.update(1, be.array(np.zeros((B, H_KV, 1, D))), be.array(np.zeros((B, H_KV, 1, D + 1))))
    with pytest.raises(ValueError, match="^k and v"):
        cache.update(1, be.array(np.zeros((B, H_KV, 1, D))), be.array(np.zeros((B, H_KV, 2, D))))


@pytest.mark.parametrize("cls", [ref.KVCache, tref.KVCache], ids=["numpy", "torch"])
def test_bad_sizes_name_the_argument(cls):
    for i, name in enumerate(["n_layers", "batch_size", "n_kv_heads", "head_dim", "max_seq_len"]):
        sizes = [2, 1, 2, 4, 8]
        sizes[i] = 0
        with pytest.raises(ValueError, match=f"^{name}"):
            cls(*sizes)
