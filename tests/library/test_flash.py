"""FlashAttention tiling and sliding-window attention, both backends.

References are independent of the code under test: the naive SDPA of the
library (one full score matrix, one softmax), ``torch.nn.functional.
scaled_dot_product_attention`` and ``torch.logsumexp`` on the full scores, with
masks built here from index comparisons. Torch tests run on every device of
the ``device`` fixture (tests/conftest.py).
"""

from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_ref import numpy as ref
from transformer_ref import torch as tref
from transformer_ref.measure import traced_peak


def causal_keys(T, S):
    """Bool (T, S), written independently of the library: key j visible iff j <= i + S - T."""
    return np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)


def window_keys(T, S, W):
    """Bool (T, S): query i sees the W keys i + S - T - W < j <= i + S - T."""
    offset = np.arange(S)[None, :] - (np.arange(T)[:, None] + (S - T))
    return (offset <= 0) & (offset > -W)


def naive(q, k, v, mask=None):
    """Full-matrix attention with the KV heads repeated (GQA) by the library's naive SDPA."""
    rep = q.shape[-3] // k.shape[-3]
    return ref.scaled_dot_product_attention(q, np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3), mask)


def qkv(rng, T, S, H=2, H_kv=None, D=8, Dv=None, batch=(2,), dtype=np.float64):
    H_kv = H if H_kv is None else H_kv
    Dv = D if Dv is None else Dv
    q = rng.normal(size=(*batch, H, T, D)).astype(dtype)
    k = rng.normal(size=(*batch, H_kv, S, D)).astype(dtype)
    v = rng.normal(size=(*batch, H_kv, S, Dv)).astype(dtype)
    return q, k, v


def to_torch(*arrays, device="cpu"):
    return [torch.tensor(a, device=device) for a in arrays]


# (T, S, block_q, block_k): multiples, ragged last tiles, block 1, block > T and > S
TILINGS = [
    (16, 16, 4, 4),
    (16, 16, 16, 16),
    (13, 13, 4, 5),
    (13, 29, 3, 7),
    (29, 13, 7, 3),
    (9, 9, 1, 1),
    (7, 11, 64, 64),
    (40, 24, 8, 1),
    (1, 17, 1, 4),
    (17, 1, 4, 1),
]


# ---------------------------------------------------------------- NumPy flash


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,S,bq,bk", TILINGS)
def test_numpy_flash_equals_naive_float64(T, S, bq, bk, causal):
    q, k, v = qkv(np.random.default_rng(T * 100 + S), T, S, Dv=5)
    mask = causal_keys(T, S) if causal else None
    out = ref.flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk)
    assert out.shape == (2, 2, T, 5) and out.dtype == np.float64
    np.testing.assert_allclose(out, naive(q, k, v, mask), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_numpy_flash_float32_default_blocks(causal):
    # float32 statistics: outputs of size ~1 agree with the float64 naive to ~1e-5
    q, k, v = qkv(np.random.default_rng(1), 300, 1100, dtype=np.float32)
    out = ref.flash_attention(q, k, v, causal=causal)
    assert out.dtype == np.float32
    mask = causal_keys(300, 1100) if causal else None
    expected = naive(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask)
    np.testing.assert_allclose(out, expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize("T,S", [(12, 12), (5, 12), (12, 5)])
def test_numpy_lse_equals_logsumexp_of_full_scores(T, S):
    q, k, v = qkv(np.random.default_rng(2), T, S)
    for causal in (False, True):
        _, lse = ref.flash_attention(q, k, v, causal=causal, block_q=5, block_k=3, return_lse=True)
        scores = torch.tensor(q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]))
        if causal:
            scores = scores.masked_fill(~torch.tensor(causal_keys(T, S)), -torch.inf)
        np.testing.assert_allclose(lse, torch.logsumexp(scores, dim=-1).numpy(), rtol=1e-12, atol=1e-12)


def test_fully_masked_rows_are_zero_not_nan():
    # T > S, causal: queries 0 .. T-S-1 sit before the first key and see nothing
    T, S = 10, 4
    q, k, v = qkv(np.random.default_rng(3), T, S)
    out, lse = ref.flash_attention(q, k, v, causal=True, block_q=3, block_k=2, return_lse=True)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out[..., : T - S, :], 0.0)
    assert np.isneginf(lse[..., : T - S]).all() and np.isfinite(lse[..., T - S :]).all()
    tout, tlse = tref.flash_attention(*to_torch(q, k, v), causal=True, block_q=3, block_k=2, return_lse=True)
    np.testing.assert_allclose(tout.numpy(), out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tlse.numpy(), lse, rtol=1e-12, atol=1e-12)  # -inf == -inf too


@pytest.mark.parametrize("H,H_kv", [(4, 2), (6, 1), (3, 3)])
def test_numpy_flash_gqa_equals_grouped_query_attention(H, H_kv):
    q, k, v = qkv(np.random.default_rng(4), 11, 14, H=H, H_kv=H_kv)
    for causal in (False, True):
        mask = causal_keys(11, 14) if causal else None
        out = ref.flash_attention(q, k, v, causal=causal, block_q=4, block_k=5)
        np.testing.assert_allclose(out, ref.grouped_query_attention(q, k, v, mask), rtol=1e-12, atol=1e-12)


def test_numpy_flash_scale_and_batch_dims():
    q, k, v = qkv(np.random.default_rng(5), 6, 9, batch=(2, 3))
    out = ref.flash_attention(q, k, v, scale=0.3, block_q=4, block_k=4)
    expected = ref.scaled_dot_product_attention(q, k, v, scale=0.3)
    assert out.shape == (2, 3, 2, 6, 8)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 20),
    S=st.integers(1, 20),
    bq=st.integers(1, 24),
    bk=st.integers(1, 24),
    group=st.sampled_from([(1, 1), (2, 1), (4, 2)]),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_hypothesis_flash_any_shape_any_tiles(T, S, bq, bk, group, causal, seed):
    H, H_kv = group
    q, k, v = qkv(np.random.default_rng(seed), T, S, H=H, H_kv=H_kv, D=4, Dv=3, batch=())
    mask = causal_keys(T, S) if causal else None
    out = ref.flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk)
    np.testing.assert_allclose(out, naive(q, k, v, mask), rtol=1e-11, atol=1e-11)


def test_numpy_flash_never_allocates_a_score_matrix():
    # tracemalloc sees every NumPy buffer; the naive version needs >= T*S*8 bytes at once
    rng = np.random.default_rng(6)
    T = S = 2048
    q, k, v = qkv(rng, T, S, H=1, D=16, batch=())
    full = T * S * 8

    def peak(fn):
        with traced_peak() as traced:
            fn()
        return traced.bytes

    assert peak(lambda: ref.scaled_dot_product_attention(q, k, v)) >= full
    assert peak(lambda: ref.flash_attention(q, k, v, block_q=128, block_k=128)) < full / 32
    assert peak(lambda: ref.flash_attention(q, k, v, causal=True)) < full / 8  # default tiles: 2 MiB
    assert peak(lambda: ref.sliding_window_attention(q, k, v, 64, block=64)) < full / 32


# ---------------------------------------------------------------- torch flash


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,S,bq,bk", TILINGS)
def test_torch_flash_equals_numpy_float64(T, S, bq, bk, causal, device):
    q, k, v = qkv(np.random.default_rng(T * 7 + S), T, S, H=4, H_kv=2, Dv=6)
    expected, expected_lse = ref.flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk, return_lse=True)
    out, lse = tref.flash_attention(
        *to_torch(q, k, v, device=device), causal=causal, block_q=bq, block_k=bk, return_lse=True
    )
    assert out.device.type == device and out.dtype == torch.float64
    np.testing.assert_allclose(out.cpu().numpy(), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse.cpu().numpy(), expected_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("T,S", [(64, 64), (37, 100), (100, 37)])
def test_torch_flash_matches_sdpa_with_gqa_and_lse(T, S, device):
    torch.manual_seed(0)
    q = torch.randn(2, 4, T, 16, device=device)
    k = torch.randn(2, 2, S, 16, device=device)
    v = torch.randn(2, 2, S, 16, device=device)
    visible = torch.tensor(causal_keys(T, S), device=device)
    out, lse = tref.flash_attention(q, k, v, causal=True, block_q=16, block_k=24, return_lse=True)
    seen = visible.any(dim=-1)  # F.sdpa gives NaN on rows that see nothing; ours gives 0
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=True)
    torch.testing.assert_close(out[..., seen, :], expected[..., seen, :], rtol=1e-5, atol=1e-5)
    assert (out[..., ~seen, :] == 0).all()
    scores = (q @ k.repeat_interleave(2, dim=-3).transpose(-1, -2)) / 4.0
    torch.testing.assert_close(lse, torch.logsumexp(scores.masked_fill(~visible, -torch.inf), dim=-1))


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 20),
    S=st.integers(1, 20),
    bq=st.integers(1, 24),
    bk=st.integers(1, 24),
    group=st.sampled_from([(1, 1), (2, 1), (4, 2)]),
    seed=st.integers(0, 2**16),
)
def test_hypothesis_torch_causal_flash_any_shape_any_tiles(T, S, bq, bk, group, seed):
    # diagonal tiles crossed at every shift (the forward and backward passes reuse a tile's
    # mask for equal shifts): output, lse and gradients against the naive version
    H, H_kv = group
    q, k, v = qkv(np.random.default_rng(seed), T, S, H=H, H_kv=H_kv, D=4, Dv=3, batch=())
    mask = causal_keys(T, S)
    tq, tk, tv = (x.requires_grad_() for x in to_torch(q, k, v))
    out, lse = tref.flash_attention(tq, tk, tv, causal=True, block_q=bq, block_k=bk, return_lse=True)
    np.testing.assert_allclose(out.detach().numpy(), naive(q, k, v, mask), rtol=1e-11, atol=1e-11)
    rep = H // H_kv
    ref_q, ref_k, ref_v = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    k_rep, v_rep = ref_k.repeat_interleave(rep, -3), ref_v.repeat_interleave(rep, -3)
    visible = torch.tensor(mask)
    seen = visible.any(dim=-1)  # F.sdpa gives NaN on rows that see nothing; ours gives 0, lse -inf
    expected = F.scaled_dot_product_attention(ref_q, k_rep, v_rep, attn_mask=visible)
    expected_lse = torch.logsumexp((ref_q @ k_rep.mT / 2.0).masked_fill(~visible, -torch.inf), dim=-1)  # D = 4
    torch.testing.assert_close(lse[..., seen], expected_lse[..., seen], rtol=1e-11, atol=1e-11)
    assert torch.all(lse[..., ~seen] == -torch.inf)
    grads = torch.autograd.grad(out[..., seen, :].sum() + lse[..., seen].sum(), (tq, tk, tv))
    expected_grads = torch.autograd.grad(
        expected[..., seen, :].sum() + expected_lse[..., seen].sum(), (ref_q, ref_k, ref_v)
    )
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("T,S", [(24, 40), (40, 24)])
@pytest.mark.parametrize("dtype,spread", [(torch.float32, 400.0), (torch.float64, 2000.0)])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_flash_scores_far_above_the_first_keys_overflow_nothing(T, S, dtype, spread, causal, device):
    # Scores that rise by far more than exp's range (88 in float32, 709 in float64) after the
    # first keys, in every query tile: a loop that kept the first key's score as the max would
    # give inf / nan; the result must still be exact attention, and lse finite where a row
    # sees a key (causal with T > S: the first T - S rows see none: zeros and -inf).
    torch.manual_seed(4)
    D = 4
    q = torch.rand(1, 2, T, D, dtype=torch.float64) + 1.0  # positive: the scores grow with k
    rising = torch.linspace(-1.0, 1.0, S, dtype=torch.float64)[:, None] * spread / D  # key j's entries
    k = rising + 0.1 * torch.randn(1, 2, S, D, dtype=torch.float64)  # scores rise by >= spread over the keys
    v = torch.randn(1, 2, S, 3, dtype=torch.float64)
    visible = torch.tensor(causal_keys(T, S)) if causal else torch.ones(T, S, dtype=torch.bool)
    seen = visible.any(dim=-1)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    expected_lse = torch.logsumexp((q @ k.mT / D**0.5).masked_fill(~visible, -torch.inf), dim=-1)
    tq, tk, tv = (x.to(dtype=dtype, device=device) for x in (q, k, v))
    out, lse = tref.flash_attention(tq, tk, tv, causal=causal, block_q=5, block_k=7, return_lse=True)
    out, lse = out.cpu().double(), lse.cpu().double()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out[..., seen, :], expected[..., seen, :], rtol=tol, atol=tol)
    torch.testing.assert_close(lse[..., seen], expected_lse[..., seen], rtol=tol, atol=tol)
    assert torch.all(out[..., ~seen, :] == 0) and torch.all(lse[..., ~seen] == -torch.inf)


@pytest.mark.parametrize("causal", [False, True])
def test_torch_flash_float32_default_blocks(causal, device):
    # T and S larger than and not multiples of the default 512 x 512 tiles
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, n, 32, device=device) for n in (700, 1500, 1500))
    out = tref.flash_attention(q, k, v, causal=causal)
    mask = torch.tensor(causal_keys(700, 1500), device=device) if causal else None
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    torch.testing.assert_close(out, expected.float(), rtol=0, atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,S", [(33, 33), (20, 45)])
def test_torch_flash_gradients_equal_sdpa(T, S, causal, device):
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 4, n, 8, device=device, requires_grad=True) for n in (T, S, S))
    grad_out = torch.randn(2, 4, T, 8, device=device)
    out = tref.flash_attention(q, k, v, causal=causal, block_q=7, block_k=10)
    mask = torch.tensor(causal_keys(T, S), device=device) if causal else None
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    theirs = torch.autograd.grad(expected, (q, k, v), grad_out)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,S,bq,bk", [(13, 29, 4, 8), (29, 13, 8, 4), (21, 21, 21, 5)])
def test_torch_flash_tiles_reused_in_place_read_no_stale_memory(T, S, bq, bk, causal, device, monkeypatch):
    # The forward allocates its tiles (scores, accumulator, m, l) once with torch.empty and reuses
    # them for every query tile, the ragged last ones as shorter views. Filled with NaN here, no
    # uninitialised or stale element may reach out, lse or the gradients.
    q, k, v = qkv(np.random.default_rng(T + 3 * S), T, S, H=4, H_kv=2, Dv=5, batch=(2, 1))
    expected, expected_lse = ref.flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk, return_lse=True)
    tq, tk, tv = (x.requires_grad_() for x in to_torch(q, k, v, device=device))
    empty = torch.empty
    with monkeypatch.context() as patch:
        patch.setattr(torch, "empty", lambda *shape, **kw: empty(*shape, **kw).fill_(torch.nan))
        out, lse = tref.flash_attention(tq, tk, tv, causal=causal, block_q=bq, block_k=bk, return_lse=True)
        grads = torch.autograd.grad(out.sum(), (tq, tk, tv))
    np.testing.assert_allclose(out.detach().cpu().numpy(), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse.detach().cpu().numpy(), expected_lse, rtol=1e-12, atol=1e-12)
    expected_grads = torch.autograd.grad(tref.flash_attention(tq, tk, tv, causal=causal).sum(), (tq, tk, tv))
    for g, e in zip(grads, expected_grads):  # the same function with one tile of everything
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_torch_flash_gradcheck_gqa_lse_and_fully_masked_rows():
    torch.manual_seed(2)
    opts = dict(dtype=torch.float64, requires_grad=True)
    q, k, v = torch.randn(1, 4, 5, 3, **opts), torch.randn(1, 2, 7, 3, **opts), torch.randn(1, 2, 7, 2, **opts)
    for causal in (False, True):  # out and lse are both differentiable outputs
        fn = partial(tref.flash_attention, causal=causal, block_q=2, block_k=3, return_lse=True)
        assert torch.autograd.gradcheck(fn, (q, k, v))
    # T > S: the first rows see nothing (out = 0, constant); only out is checked (lse = -inf there)
    q2 = torch.randn(1, 2, 6, 3, **opts)
    fn = partial(tref.flash_attention, causal=True, block_q=4, block_k=2)
    assert torch.autograd.gradcheck(fn, (q2, k[..., :4, :], v[..., :4, :]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_flash_half_precision_keeps_dtype(dtype, device):
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 50, 16, device=device) for _ in range(3))
    half = [x.to(dtype) for x in (q, k, v)]
    out, lse = tref.flash_attention(*half, causal=True, block_q=16, block_k=16, return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    expected = F.scaled_dot_product_attention(*(x.to(dtype).float() for x in (q, k, v)), is_causal=True)
    tol = 1e-2 if dtype == torch.float16 else 4e-2
    torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)
    # the backward keeps the dtype too, and matches float32 gradients to half precision
    inputs = [x.to(dtype).requires_grad_() for x in (q, k, v)]
    grads = torch.autograd.grad(tref.flash_attention(*inputs, causal=True, block_q=16, block_k=16).sum(), inputs)
    inputs32 = [x.requires_grad_() for x in (q, k, v)]
    grads32 = torch.autograd.grad(F.scaled_dot_product_attention(*inputs32, is_causal=True).sum(), inputs32)
    for g, g32 in zip(grads, grads32):
        assert g.dtype == dtype
        torch.testing.assert_close(g.float(), g32, rtol=5 * tol, atol=5 * tol)


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor (in elements) that any aten op returns while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for x in result if isinstance(result, (tuple, list)) else [result]:
            if isinstance(x, torch.Tensor):
                self.largest = max(self.largest, x.numel())
        return result


def test_torch_flash_forward_and_backward_never_hold_a_score_matrix():
    T = S = 512
    D = 2  # so that the largest legitimate tensors (q, k, v, out: T x D) are smaller than a tile
    q, k, v = (torch.randn(1, 1, T, D, requires_grad=True) for _ in range(3))

    def largest(fn):
        with LargestTensor() as probe:
            out = fn()
            torch.autograd.grad(out.sum(), (q, k, v))
        return probe.largest

    assert largest(lambda: tref.scaled_dot_product_attention(q, k, v)) >= T * S  # the probe sees T x S
    assert largest(lambda: tref.flash_attention(q, k, v, causal=True, block_q=64, block_k=32)) == 64 * 32
    assert largest(lambda: tref.sliding_window_attention(q, k, v, 32, block=32)) < T * S / 64


class ScoreEntries(TorchDispatchMode):
    """Counts the entries of the score tiles the forward computes (``bmm`` outputs with more than one row)."""

    def __init__(self):
        super().__init__()
        self.entries = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func.overloadpacket is torch.ops.aten.bmm and result.shape[-2] > 1:
            self.entries += result.numel()
        return result


@pytest.mark.parametrize("group", [1, 2])
def test_torch_causal_flash_computes_only_the_triangle_and_the_diagonal_tiles_halves(group):
    # A key tile that crosses the diagonal is cut to the queries that see its first key and
    # the keys its last query sees: beyond the T (T + 1) / 2 visible scores, each of the T / bk
    # diagonal tiles wastes only its strict upper triangle, bk (bk - 1) / 2 entries. A loop that
    # computed whole diagonal tiles (here 2560 scores per head instead of 2304) fails.
    T = S = 64
    bq, bk = 16, 8
    q, k, v = torch.randn(1, 2 * group, T, 4), torch.randn(1, 2, S, 4), torch.randn(1, 2, S, 4)
    with ScoreEntries() as probe:
        out = tref.flash_attention(q, k, v, causal=True, block_q=bq, block_k=bk)
    per_head = T * (T + 1) // 2 + (T // bk) * bk * (bk - 1) // 2
    assert probe.entries == 2 * group * per_head
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                                                   v.repeat_interleave(group, 1), is_causal=True))


# ---------------------------------------------------------------- sliding window


@pytest.mark.parametrize("backend", [ref, tref], ids=["numpy", "torch"])
@pytest.mark.parametrize("T,S,block", [(20, 20, 6), (13, 30, 4), (16, 16, 1), (9, 9, 50)])
def test_sliding_window_with_large_window_is_causal_attention(backend, T, S, block):
    q, k, v = qkv(np.random.default_rng(T + S), T, S, H=4, H_kv=2)
    expected = ref.flash_attention(q, k, v, causal=True)
    np.testing.assert_allclose(naive(q, k, v, causal_keys(T, S)), expected, rtol=1e-12, atol=1e-12)
    args = (q, k, v) if backend is ref else to_torch(q, k, v)
    for W in (S, S + 5):  # W >= number of keys: nothing is cut off
        out = backend.sliding_window_attention(*args, W, block=block)
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    T=st.integers(1, 40),
    extra=st.integers(0, 10),
    W=st.integers(1, 45),
    block=st.integers(1, 16),
    seed=st.integers(0, 2**16),
)
def test_sliding_window_equals_masked_naive(T, extra, W, block, seed):
    S = T + extra
    q, k, v = qkv(np.random.default_rng(seed), T, S, H=2, H_kv=1, D=4, batch=())
    expected = naive(q, k, v, ref.sliding_window_mask(T, W, S))
    np.testing.assert_allclose(naive(q, k, v, window_keys(T, S, W)), expected, rtol=1e-12, atol=1e-12)
    out = ref.sliding_window_attention(q, k, v, W, block=block)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    tout = tref.sliding_window_attention(*to_torch(q, k, v), W, block=block)
    np.testing.assert_allclose(tout.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_sliding_window_of_one_returns_v(device):
    q, k, v = qkv(np.random.default_rng(7), 10, 10, Dv=3)
    np.testing.assert_allclose(ref.sliding_window_attention(q, k, v, 1, block=3), v, rtol=1e-15, atol=0)
    tout = tref.sliding_window_attention(*to_torch(q, k, v, device=device), 1, block=3)
    np.testing.assert_allclose(tout.cpu().numpy(), v, rtol=1e-15, atol=0)


def test_torch_sliding_window_float32_gradients_equal_sdpa(device):
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 2, 70, 8, device=device, requires_grad=True) for _ in range(3))
    mask = torch.tensor(window_keys(70, 70, 16), device=device)
    out = tref.sliding_window_attention(q, k, v, 16, block=12)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    grad_out = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad_out), torch.autograd.grad(expected, (q, k, v), grad_out)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("backend", [ref, tref], ids=["numpy", "torch"])
def test_bad_input_names_the_argument(backend):
    q, k, v = qkv(np.random.default_rng(8), 6, 6, H=4, H_kv=2)
    if backend is tref:
        q, k, v = to_torch(q, k, v)
    cases = [
        (lambda: backend.flash_attention(q, k, v, block_q=0), "block_q"),
        (lambda: backend.flash_attention(q, k, v, block_k=2.5), "block_k"),
        (lambda: backend.flash_attention(q, k[..., :3], v), "q and k"),  # head dim differs from q's
        (lambda: backend.flash_attention(q, k, v[..., :5, :]), "k and v"),  # S differs from k's
        (lambda: backend.flash_attention(q[:, :3], k, v), "q heads"),  # 3 query heads, 2 KV heads
        (lambda: backend.flash_attention(q, k, v, scale=float("nan")), "scale"),
        (lambda: backend.flash_attention(q[0, 0], k, v), "q"),  # fewer than 3 dims
        (lambda: backend.sliding_window_attention(q, k, v, 0), "window"),
        (lambda: backend.sliding_window_attention(q, k, v, 3, block=0), "block"),
        (lambda: backend.sliding_window_attention(q, k[..., :4, :], v[..., :4, :], 3), "k"),  # S < T
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"^{name}"):
            call()
