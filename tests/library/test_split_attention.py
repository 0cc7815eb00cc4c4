"""Attention over split keys: the log-sum-exp merge, Flash-Decoding and ring attention equal one pass.

The reference for every output is PyTorch's own ``F.scaled_dot_product_attention`` (GQA through
``enable_gqa``), and for every ``lse`` the log-sum-exp of the full score matrix.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_ref import numpy as ref
from transformer_ref import torch as tref


def qkv(rng, T, S, H=4, H_kv=2, D=8, Dv=6, batch=(2,)):
    return (rng.standard_normal((*batch, H, T, D)), rng.standard_normal((*batch, H_kv, S, D)),
            rng.standard_normal((*batch, H_kv, S, Dv)))


def sdpa(q, k, v, mask=None):
    """PyTorch's attention on float64 copies, as a NumPy array (mask boolean or additive)."""
    q, k, v = (torch.as_tensor(np.asarray(x)) for x in (q, k, v))
    mask = None if mask is None else torch.as_tensor(np.asarray(mask))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).numpy()


def full_lse(q, k, mask=None):
    """log sum_j exp(q . k_j / sqrt(D)) over the visible keys, from the full score matrix."""
    rep = q.shape[-3] // k.shape[-3]
    scores = q @ np.swapaxes(np.repeat(k, rep, axis=-3), -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask
    m = scores.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(scores - m).sum(axis=-1, keepdims=True)))[..., 0]


def causal(T, S):
    """Bool (T, S), written independently of the library: key j visible iff j <= i + S - T."""
    return np.arange(S)[None, :] <= np.arange(T)[:, None] + S - T


# --------------------------------------------------------------------------
# merge_attention
# --------------------------------------------------------------------------
@pytest.mark.parametrize("cuts", [[0, 20], [0, 7, 20], [0, 1, 2, 10, 19, 20], [0, 5, 5, 20]])
def test_merge_of_blocks_equals_one_pass(rng, cuts):
    q, k, v = qkv(rng, 3, 20)
    outs, lses = [], []
    for j0, j1 in zip(cuts, cuts[1:]):  # each block attended on its own by the library's flash_attention
        out, lse = ref.flash_attention(q, k[..., j0:j1, :], v[..., j0:j1, :], return_lse=True)
        outs.append(out)
        lses.append(lse)
    out, lse = ref.merge_attention(outs, lses)
    np.testing.assert_allclose(out, sdpa(q, k, v), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lse, full_lse(q, k), rtol=1e-13)
    # the order of the blocks does not matter, nor merging in two stages
    out_rev, lse_rev = ref.merge_attention(outs[::-1], lses[::-1])
    np.testing.assert_allclose(out_rev, out, rtol=1e-13)
    if len(outs) > 2:
        first = ref.merge_attention(outs[:2], lses[:2])
        staged = ref.merge_attention([first[0], *outs[2:]], [first[1], *lses[2:]])
        np.testing.assert_allclose(staged[0], out, rtol=1e-13)
        np.testing.assert_allclose(staged[1], lse, rtol=1e-13)


def test_merge_weights_by_exp_lse_not_by_block_size():
    # two one-key blocks: values 0 and 1, scores log 1 and log 3 -> weights 1/4 and 3/4
    outs = [np.array([[0.0]]), np.array([[1.0]])]
    lses = [np.array([0.0]), np.array([math.log(3.0)])]
    out, lse = ref.merge_attention(outs, lses)
    np.testing.assert_allclose(out, [[0.75]], rtol=1e-15)
    np.testing.assert_allclose(lse, [math.log(4.0)], rtol=1e-15)
    # huge lses do not overflow
    out, lse = ref.merge_attention(outs, [np.array([1000.0]), np.array([1000.0 + math.log(3.0)])])
    np.testing.assert_allclose(out, [[0.75]], rtol=1e-13)
    np.testing.assert_allclose(lse, [1000.0 + math.log(4.0)], rtol=1e-15)


@pytest.mark.parametrize("backend", [ref, tref], ids=["numpy", "torch"])
def test_merge_ignores_unseen_blocks_and_never_makes_nan(backend):
    arr = np.asarray if backend is ref else torch.tensor
    outs = [arr([[1.0, 2.0], [0.0, 0.0]]), arr([[0.0, 0.0], [0.0, 0.0]])]
    lses = [arr([0.5, -np.inf]), arr([-np.inf, -np.inf])]
    out, lse = backend.merge_attention(outs, lses)
    np.testing.assert_array_equal(np.asarray(out), [[1.0, 2.0], [0.0, 0.0]])
    np.testing.assert_array_equal(np.asarray(lse), [0.5, -np.inf])
    # a stacked array is a sequence of blocks too
    out2, _ = backend.merge_attention(arr(np.stack([np.asarray(o) for o in outs])),
                                      arr(np.stack([np.asarray(x) for x in lses])))
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))


def test_torch_merge_gradients_are_finite_and_match_one_pass():
    rng = np.random.default_rng(3)
    q, k, v = (torch.tensor(x, requires_grad=True) for x in qkv(rng, 4, 9))
    halves = [tref.flash_attention(q, k[..., s, :], v[..., s, :], return_lse=True)
              for s in (slice(0, 4), slice(4, 9))]
    out, lse = tref.merge_attention([h[0] for h in halves], [h[1] for h in halves])
    (out.sum() + lse.sum()).backward()
    merged = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    one_out, one_lse = tref.flash_attention(q, k, v, return_lse=True)
    (one_out.sum() + one_lse.sum()).backward()
    for got, want in zip(merged, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    # an unseen block: zero gradient into its lse and output, not NaN
    o = torch.zeros(1, 2, requires_grad=True)
    l_seen = torch.tensor([0.3], requires_grad=True)
    l_unseen = torch.tensor([-math.inf], requires_grad=True)
    out, lse = tref.merge_attention([torch.ones(1, 2), o], [l_seen, l_unseen])
    (out.sum() + lse.sum()).backward()
    assert torch.isfinite(l_unseen.grad).all() and torch.isfinite(o.grad).all() and (o.grad == 0).all()


# --------------------------------------------------------------------------
# flash_decoding
# --------------------------------------------------------------------------
@pytest.mark.parametrize("T, S, n_splits", [(1, 37, 1), (1, 37, 4), (1, 37, 37), (1, 5, 9), (3, 30, 7), (6, 4, 3)])
def test_flash_decoding_equals_sdpa(rng, T, S, n_splits):
    q, k, v = qkv(rng, T, S)
    out, lse = ref.flash_decoding(q, k, v, n_splits=n_splits, return_lse=True)
    np.testing.assert_allclose(out, sdpa(q, k, v), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lse, full_lse(q, k), rtol=1e-13)
    if T <= S:  # a cache: the T new queries see everything before them
        mask = causal(T, S)
        out = ref.flash_decoding(q, k, v, n_splits=n_splits, mask=mask)
        np.testing.assert_allclose(out, sdpa(q, k, v, mask), rtol=1e-12, atol=1e-14)


def test_flash_decoding_with_additive_padding_and_alibi_masks(rng):
    q, k, v = qkv(rng, 2, 24, H=4, H_kv=4)
    pad = ref.padding_mask(np.array([24, 10]), 24)  # (B, 1, 1, S): the second sequence has 10 keys
    np.testing.assert_allclose(ref.flash_decoding(q, k, v, n_splits=5, mask=pad), sdpa(q, k, v, pad),
                               rtol=1e-12, atol=1e-14)
    bias = ref.alibi_bias(4, 2, 24) + ref.additive_mask(ref.causal_mask(2, 24))  # float (H, T, S)
    np.testing.assert_allclose(ref.flash_decoding(q, k, v, n_splits=3, mask=bias), sdpa(q, k, v, bias),
                               rtol=1e-12, atol=1e-14)
    # a mask that broadcasts over the keys (last dimension 1) is applied to every piece
    one = np.ones((2, 1, 2, 1), dtype=bool)
    np.testing.assert_allclose(ref.flash_decoding(q, k, v, n_splits=4, mask=one), sdpa(q, k, v), rtol=1e-12)
    for backend, arr in [(ref, np.asarray), (tref, torch.tensor)]:  # and a 0-d mask, which broadcasts too
        out = backend.flash_decoding(arr(q), arr(k), arr(v), n_splits=4, mask=arr(np.array(True)))
        np.testing.assert_allclose(np.asarray(out), sdpa(q, k, v), rtol=1e-12)


@pytest.mark.parametrize("backend", [ref, tref], ids=["numpy", "torch"])
def test_split_attention_rows_that_see_nothing_are_zero(backend):
    arr = np.asarray if backend is ref else torch.tensor
    q, k, v = (arr(x) for x in qkv(np.random.default_rng(1), 4, 3, batch=()))
    mask = arr(causal(4, 3))  # the first query sees no key
    out, lse = backend.flash_decoding(q, k, v, n_splits=2, mask=mask, return_lse=True)
    out, lse = np.asarray(out), np.asarray(lse)
    assert not np.isnan(out).any() and (out[:, 0] == 0).all() and np.isneginf(lse[:, 0]).all()
    ring = np.asarray(backend.ring_attention(q, k, v, n_devices=3, causal=True))
    assert not np.isnan(ring).any() and (ring[:, 0] == 0).all()
    np.testing.assert_allclose(ring[:, 1:], out[:, 1:], rtol=1e-12)
    empty = backend.flash_decoding(q, k[..., :0, :], v[..., :0, :], n_splits=2)  # no keys at all
    assert tuple(empty.shape) == (4, 4, 6) and (np.asarray(empty) == 0).all()


# --------------------------------------------------------------------------
# ring_attention
# --------------------------------------------------------------------------
@pytest.mark.parametrize("causal_", [False, True])
@pytest.mark.parametrize("T, S, n_devices", [(16, 16, 1), (16, 16, 4), (17, 17, 5), (5, 5, 8), (4, 13, 3), (13, 4, 3)])
def test_ring_attention_equals_sdpa(rng, T, S, n_devices, causal_):
    q, k, v = qkv(rng, T, S)
    mask = causal(T, S) if causal_ else None
    out = ref.ring_attention(q, k, v, n_devices=n_devices, causal=causal_)
    expected = sdpa(q, k, v, mask)
    if causal_ and T > S:  # rows with no visible key: zeros here, NaN in PyTorch's SDPA
        assert (out[..., : T - S, :] == 0).all()
        out, expected = out[..., T - S:, :], expected[..., T - S:, :]
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("T, S, n", [(16, 16, 4), (7, 7, 3), (4, 13, 3), (13, 4, 3), (3, 3, 5)])
def test_ring_schedule_meets_every_block_once_in_ring_order(T, S, n):
    from transformer_ref._split_schedule import ring_schedule, split_bounds

    q_blocks, kv_blocks = split_bounds(T, n), split_bounds(S, n)
    full = list(ring_schedule(T, S, n, causal=False))
    assert len(full) == n * n
    for index, (r, rows, keys) in enumerate(full):  # step t = index // n: device r holds block (r - t) mod n
        step = index // n
        assert (rows, keys) == (q_blocks[r], kv_blocks[(r - step) % n])

    # causal: only blocks with no visible key are left out, and never a device's first step
    def sees_nothing(rows, keys):  # written from the mask: no query of the block sees a key of the block
        return not causal(T, S)[rows[0]:rows[1], keys[0]:keys[1]].any()

    def nonempty(pairs):
        return [(r, rows, keys) for r, rows, keys in pairs if rows[1] > rows[0] and keys[1] > keys[0]]

    causal_pairs = list(ring_schedule(T, S, n, causal=True))
    kept = [pair for index, pair in enumerate(full) if index < n or not sees_nothing(pair[1], pair[2])]
    # the same order, the first step whole, only blocks with nothing to see left out
    assert nonempty(causal_pairs) == nonempty(kept)
    if T == S and n <= T:
        assert len(full) - len(kept) == n * (n - 1) // 2  # the blocks above the diagonal


def test_ring_attention_needs_every_step(rng, monkeypatch):
    # with the merge of each step replaced by "keep the newest block" the result is wrong:
    # the test above would catch a ring that forgot to accumulate
    from transformer_ref.numpy import split_attention

    q, k, v = qkv(rng, 8, 8)
    monkeypatch.setattr(split_attention, "merge_attention", lambda outs, lses: (outs[-1], lses[-1]))
    assert not np.allclose(split_attention.ring_attention(q, k, v, n_devices=4), sdpa(q, k, v))


# --------------------------------------------------------------------------
# torch: same numbers, device, dtype, gradients
# --------------------------------------------------------------------------
def test_torch_backend_equals_numpy(rng, device):
    q, k, v = qkv(rng, 5, 23)
    mask = causal(5, 23)
    tq, tk, tv = (torch.tensor(x, device=device) for x in (q, k, v))
    out, lse = tref.flash_decoding(tq, tk, tv, n_splits=4, mask=torch.tensor(mask, device=device), return_lse=True)
    assert out.device.type == device and out.dtype == torch.float64
    want_out, want_lse = ref.flash_decoding(q, k, v, n_splits=4, mask=mask, return_lse=True)
    np.testing.assert_allclose(out.cpu().numpy(), want_out, rtol=1e-12)
    np.testing.assert_allclose(lse.cpu().numpy(), want_lse, rtol=1e-12)
    ring = tref.ring_attention(tq[..., :5, :], tk[..., :5, :], tv[..., :5, :], n_devices=2, causal=True)
    assert ring.device.type == device
    np.testing.assert_allclose(ring.cpu().numpy(),
                               ref.ring_attention(q, k[..., :5, :], v[..., :5, :], n_devices=2, causal=True),
                               rtol=1e-12)


@pytest.mark.parametrize("fn", ["flash_decoding", "ring_attention"])
def test_torch_gradients_equal_sdpa(fn):
    rng = np.random.default_rng(2)
    inputs = [torch.tensor(x, requires_grad=True) for x in qkv(rng, 7, 7)]
    if fn == "flash_decoding":
        out = tref.flash_decoding(*inputs, n_splits=3, mask=torch.tensor(causal(7, 7)))
    else:
        out = tref.ring_attention(*inputs, n_devices=3, causal=True)
    grads = torch.autograd.grad(out.square().sum(), inputs)
    expected = F.scaled_dot_product_attention(*inputs, is_causal=True, enable_gqa=True)
    for got, want in zip(grads, torch.autograd.grad(expected.square().sum(), inputs)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_torch_fully_masked_rows_have_zero_gradients():
    rng = np.random.default_rng(4)
    inputs = [torch.tensor(x, requires_grad=True) for x in qkv(rng, 5, 3, batch=())]
    out = tref.ring_attention(*inputs, n_devices=2, causal=True)  # queries 0 and 1 see no key
    grads = torch.autograd.grad(out.sum(), inputs)
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[0][:, :2] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_half_precision_keeps_dtype(dtype, device):
    rng = np.random.default_rng(5)
    q, k, v = (torch.tensor(x, device=device).to(dtype) for x in qkv(rng, 2, 40))
    out, lse = tref.flash_decoding(q, k, v, n_splits=4, return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ring = tref.ring_attention(q, k, v, n_devices=2)
    assert ring.dtype == dtype
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    tol = 1e-2 if dtype == torch.float16 else 5e-2
    torch.testing.assert_close(out.float(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(ring.float(), want, rtol=tol, atol=tol)
