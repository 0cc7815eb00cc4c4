"""Attention: agreement with torch's SDPA (masks, GQA, gradients), the causal
property, fully masked rows, dtypes, NumPy/torch agreement."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right

from transformer_ref import numpy as ref
from transformer_ref import torch as tref


def randn(*shape, seed=0, device="cpu", dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(device)


def naive_attention(q, k, v, mask=None):
    """Loop-level attention for one head: independent of any vectorised code path."""
    T, S = q.shape[0], k.shape[0]
    out = np.zeros((T, v.shape[1]))
    for i in range(T):
        allowed = [j for j in range(S) if mask is None or mask[i, j]]
        if not allowed:
            continue
        logits = np.array([q[i] @ k[j] / math.sqrt(q.shape[1]) for j in allowed])
        w = np.exp(logits - logits.max())
        out[i] = sum(wj * v[j] for wj, j in zip(w / w.sum(), allowed))
    return out


# --------------------------------------------------------------------------
# softmax
# --------------------------------------------------------------------------
def test_softmax_is_stable_and_matches_torch(rng):
    x = rng.standard_normal((3, 5)) * 10
    expected = torch.softmax(torch.tensor(x), dim=-1).numpy()
    np.testing.assert_allclose(ref.softmax(x), expected, rtol=1e-13)
    np.testing.assert_allclose(ref.softmax(x + 1000.0), expected, rtol=1e-13)  # no overflow
    np.testing.assert_allclose(ref.softmax(x, axis=0), torch.softmax(torch.tensor(x), dim=0).numpy(), rtol=1e-13)
    np.testing.assert_allclose(tref.softmax(torch.tensor(x) + 1000.0, axis=-1).numpy(), expected, rtol=1e-13)


@pytest.mark.parametrize("backend, make", [(ref, np.array), (tref, torch.tensor)], ids=["numpy", "torch"])
def test_softmax_of_an_all_masked_row_is_zero(backend, make):
    x = make([[0.0, 1.0, -np.inf], [-np.inf, -np.inf, -np.inf]])
    out = np.asarray(backend.softmax(x))
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out[1], 0.0)
    np.testing.assert_allclose(out[0], [1 / (1 + math.e), math.e / (1 + math.e), 0.0], rtol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_softmax_keeps_half_dtype_with_float32_statistics(dtype, device):
    x = randn(4, 300, seed=1, device=device, dtype=torch.float32) * 8
    out = tref.softmax(x.to(dtype), axis=-1)
    assert out.dtype == dtype and out.device.type == device
    # only the final rounding to `dtype` remains: relative error ~ its epsilon
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.float(), torch.softmax(x.to(dtype).float(), dim=-1), rtol=eps, atol=1e-6)


# --------------------------------------------------------------------------
# SDPA against torch and against loops
# --------------------------------------------------------------------------
def test_sdpa_matches_loops(rng):
    q, k, v = rng.standard_normal((3, 4, 6))
    mask = ref.sliding_window_mask(4, 2)
    out = ref.scaled_dot_product_attention(q[None], k[None], v[None], mask)[0]
    np.testing.assert_allclose(out, naive_attention(q, k, v, mask), atol=1e-12)


@pytest.mark.parametrize("T, S", [(5, 5), (3, 8), (1, 6)])
def test_sdpa_matches_torch_with_lower_right_causal_bias(device, T, S):
    q = randn(2, 3, T, 8, seed=1, device=device)
    k, v = randn(2, 3, S, 8, seed=2, device=device), randn(2, 3, S, 5, seed=3, device=device)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T, S))
    mask = tref.causal_mask(T, S, device=device)
    out = tref.scaled_dot_product_attention(q, k, v, mask)
    assert out.device.type == device
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    np_out = ref.scaled_dot_product_attention(q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(), ref.causal_mask(T, S))
    np.testing.assert_allclose(np_out, expected.cpu().numpy(), rtol=1e-10, atol=1e-12)


def test_sdpa_matches_torch_with_padding_mask_scale_and_weights(device):
    B, H, T, D = 3, 2, 6, 4
    q, k, v = (randn(B, H, T, D, seed=s, device=device) for s in range(3))
    mask = tref.padding_mask(torch.tensor([6, 2, 4], device=device), T) & tref.causal_mask(T, device=device)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    out, weights = tref.scaled_dot_product_attention(q, k, v, mask, scale=0.3, return_weights=True)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    assert weights.shape == (B, H, T, T)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T, dtype=torch.float64, device=device))
    assert (weights[~mask.expand(B, H, T, T)] == 0).all()
    np_out, np_w = ref.scaled_dot_product_attention(*(t.cpu().numpy() for t in (q, k, v)), mask.cpu().numpy(),
                                                    scale=0.3, return_weights=True)
    np.testing.assert_allclose(np_out, out.cpu().numpy(), atol=1e-12)
    np.testing.assert_allclose(np_w, weights.cpu().numpy(), atol=1e-12)


def test_additive_mask_equals_boolean_mask(device):
    q, k, v = (randn(2, 5, 4, seed=s, device=device) for s in range(3))
    mask = tref.sliding_window_mask(5, 3, device=device)
    torch.testing.assert_close(tref.scaled_dot_product_attention(q, k, v, tref.additive_mask(mask, dtype=torch.float64)),
                               tref.scaled_dot_product_attention(q, k, v, mask))
    q, k, v = (t.cpu().numpy() for t in (q, k, v))
    np.testing.assert_allclose(ref.scaled_dot_product_attention(q, k, v, ref.additive_mask(mask.cpu().numpy())),
                               ref.scaled_dot_product_attention(q, k, v, mask.cpu().numpy()))


@given(B=st.integers(1, 2), H=st.integers(1, 3), T=st.integers(1, 7), extra=st.integers(0, 5),
       D=st.integers(1, 9), Dv=st.integers(1, 5), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_sdpa_matches_torch_for_any_shape(B, H, T, extra, D, Dv, causal, seed):
    S = T + extra
    q, k, v = randn(B, H, T, D, seed=seed), randn(B, H, S, D, seed=seed + 1), randn(B, H, S, Dv, seed=seed + 2)
    mask = causal_lower_right(T, S) if causal else None
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).numpy()
    np_mask = ref.causal_mask(T, S) if causal else None
    out = ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), np_mask)
    assert out.shape == (B, H, T, Dv)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)
    t_mask = None if np_mask is None else torch.tensor(np_mask)
    np.testing.assert_allclose(tref.scaled_dot_product_attention(q, k, v, t_mask).numpy(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend, make", [(ref, np.asarray), (tref, torch.tensor)], ids=["numpy", "torch"])
def test_fully_masked_rows_give_zeros_not_nan(backend, make, rng):
    q, k, v = (make(a) for a in rng.standard_normal((3, 2, 4, 3)))
    mask = np.ones((4, 4), dtype=bool)
    mask[1] = False  # query 1 may attend to nothing
    out, weights = backend.scaled_dot_product_attention(q, k, v, make(mask), return_weights=True)
    out, weights = np.asarray(out), np.asarray(weights)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out[:, 1], 0.0)
    np.testing.assert_array_equal(weights[:, 1], 0.0)
    np.testing.assert_allclose(out[:, 0], np.asarray(backend.scaled_dot_product_attention(q, k, v))[:, 0])


def test_fully_masked_rows_have_finite_gradients(device):
    q, k, v = (randn(2, 4, 3, seed=s, device=device).requires_grad_() for s in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool, device=device)
    mask[2] = False
    tref.scaled_dot_product_attention(q, k, v, mask).sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, 2] == 0).all()


@pytest.mark.parametrize("backend, make", [(ref, np.asarray), (tref, torch.tensor)], ids=["numpy", "torch"])
def test_causal_outputs_ignore_future_tokens(backend, make, rng):
    T, t = 8, 4
    q, k, v = rng.standard_normal((3, 2, T, 5))
    out = np.asarray(backend.scaled_dot_product_attention(make(q), make(k), make(v), backend.causal_mask(T)))
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for a in (q2, k2, v2):
        a[:, t + 1 :] = rng.standard_normal(a[:, t + 1 :].shape) * 100  # rewrite the future
    out2 = np.asarray(backend.scaled_dot_product_attention(make(q2), make(k2), make(v2), backend.causal_mask(T)))
    np.testing.assert_allclose(out2[:, : t + 1], out[:, : t + 1], atol=1e-12)
    assert not np.allclose(out2[:, t + 1 :], out[:, t + 1 :])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_sdpa_half_precision_keeps_dtype_and_accuracy(dtype, device):
    q, k, v = (randn(2, 4, 16, 32, seed=s, device=device, dtype=torch.float32) for s in range(3))
    mask = tref.causal_mask(16, device=device)
    out = tref.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), mask)
    assert out.dtype == dtype and out.device.type == device
    expected = tref.scaled_dot_product_attention(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), mask)
    tol = 2 * torch.finfo(dtype).eps  # statistics in float32: only the output rounding is lost
    torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)


def test_torch_sdpa_gradients_match_torch(device):
    T, S = 5, 7
    args = [randn(2, 3, T, 4, seed=0, device=device), randn(2, 3, S, 4, seed=1, device=device),
            randn(2, 3, S, 6, seed=2, device=device)]
    mine = [a.clone().requires_grad_() for a in args]
    theirs = [a.clone().requires_grad_() for a in args]
    g = randn(2, 3, T, 6, seed=3, device=device)
    (tref.scaled_dot_product_attention(*mine, tref.causal_mask(T, S, device=device)) * g).sum().backward()
    (F.scaled_dot_product_attention(*theirs, attn_mask=causal_lower_right(T, S)) * g).sum().backward()
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_torch_sdpa_gradcheck(device):
    q, k, v = (randn(1, 2, 3, 4, seed=s, device=device).requires_grad_() for s in range(3))
    mask = tref.causal_mask(3, device=device)
    assert torch.autograd.gradcheck(lambda a, b, c: tref.scaled_dot_product_attention(a, b, c, mask), (q, k, v))


# --------------------------------------------------------------------------
# repeat_kv and GQA
# --------------------------------------------------------------------------
def test_repeat_kv_is_repeat_interleave(rng, device):
    x = rng.standard_normal((2, 3, 4, 5))
    out = ref.repeat_kv(x, 4)
    assert out.shape == (2, 12, 4, 5)
    for h in range(12):
        np.testing.assert_array_equal(out[:, h], x[:, h // 4])
    t_out = tref.repeat_kv(torch.tensor(x, device=device), 4)
    assert t_out.device.type == device
    np.testing.assert_array_equal(t_out.cpu().numpy(), torch.repeat_interleave(torch.tensor(x), 4, dim=1).numpy())
    np.testing.assert_array_equal(ref.repeat_kv(x, 1), x)


@pytest.mark.parametrize("H_q, H_kv", [(8, 2), (6, 3), (4, 1), (4, 4)])
def test_gqa_matches_torch_enable_gqa(H_q, H_kv, device):
    T, S = 4, 6
    q = randn(2, H_q, T, 8, seed=0, device=device)
    k, v = randn(2, H_kv, S, 8, seed=1, device=device), randn(2, H_kv, S, 3, seed=2, device=device)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T, S), enable_gqa=True)
    out = tref.grouped_query_attention(q, k, v, tref.causal_mask(T, S, device=device))
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    np_out = ref.grouped_query_attention(q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(), ref.causal_mask(T, S))
    np.testing.assert_allclose(np_out, expected.cpu().numpy(), rtol=1e-10, atol=1e-12)


def test_gqa_with_as_many_kv_heads_is_mha_and_mqa_shares_one_head(rng):
    q, k, v = rng.standard_normal((3, 2, 4, 5, 6))
    np.testing.assert_allclose(ref.grouped_query_attention(q, k, v), ref.scaled_dot_product_attention(q, k, v))
    # MQA: every query head attends over the same single K/V head
    out = ref.grouped_query_attention(q, k[:, :1], v[:, :1])
    for h in range(4):
        np.testing.assert_allclose(out[:, h], ref.scaled_dot_product_attention(q[:, h], k[:, 0], v[:, 0]))


@given(H_kv=st.integers(1, 3), group=st.integers(1, 3), T=st.integers(1, 5), D=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_gqa_head_h_reads_kv_head_h_div_group(H_kv, group, T, D, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((H_kv * group, T, D))
    k, v = rng.standard_normal((2, H_kv, T, D))
    out = ref.grouped_query_attention(q, k, v, ref.causal_mask(T))
    for h in range(H_kv * group):
        np.testing.assert_allclose(out[h], naive_attention(q[h], k[h // group], v[h // group], ref.causal_mask(T)), atol=1e-12)
    np.testing.assert_allclose(tref.grouped_query_attention(*(torch.tensor(a) for a in (q, k, v)),
                                                            tref.causal_mask(T)).numpy(), out, atol=1e-12)


# --------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend, make", [(ref, np.zeros), (tref, torch.zeros)], ids=["numpy", "torch"])
def test_bad_shapes_name_the_argument(backend, make):
    sdpa, gqa = backend.scaled_dot_product_attention, backend.grouped_query_attention
    cases = [
        (lambda: sdpa(make((2, 4, 8)), make((2, 4, 7)), make((2, 4, 7))), "q and k"),
        (lambda: sdpa(make((2, 4, 8)), make((2, 5, 8)), make((2, 6, 8))), "k and v"),
        (lambda: sdpa(make((2, 4, 8)), make((3, 5, 8)), make((3, 5, 8))), "q and k"),
        (lambda: sdpa(make((2, 4, 8)), make((2, 5, 8)), make((2, 5, 8)), make((4, 4), dtype=bool) if backend is ref
                      else make((4, 4), dtype=torch.bool)), "mask"),
        (lambda: sdpa(make((8,)), make((2, 8)), make((2, 8))), "q"),
        (lambda: gqa(make((6, 4, 8)), make((4, 5, 8)), make((4, 5, 8))), "q heads"),
        (lambda: gqa(make((2, 4, 4, 8)), make((1, 2, 5, 8)), make((1, 2, 5, 8))), "q and k"),
        (lambda: gqa(make((4, 4, 8)), make((2, 5, 8)), make((1, 5, 8))), "k and v"),
        (lambda: backend.repeat_kv(make((2, 3, 4)), 0), "n_rep"),
        (lambda: backend.repeat_kv(make((3, 4)), 2), "x"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"^{name}"):
            call()


# --------------------------------------------------------------------------
# Contracts that once broke: S < T, integer masks, scale, no keys, integer input
# --------------------------------------------------------------------------
BACKENDS = [(ref, np.asarray), (tref, torch.as_tensor)]
IDS = ["numpy", "torch"]


def test_sdpa_with_s_less_than_t_matches_pytorch_lower_right_and_flash(rng):
    q, k, v = (torch.tensor(rng.standard_normal(s)) for s in [(2, 3, 6, 8), (2, 3, 4, 8), (2, 3, 4, 8)])
    out = tref.scaled_dot_product_attention(q, k, v, tref.causal_mask(6, 4))
    assert (out[..., :2, :] == 0).all()  # queries before the first key see nothing: zeros, not NaN
    with pytest.warns(UserWarning):  # PyTorch warns (and gives NaN rows on some kernels) for T > S
        bias = causal_lower_right(6, 4)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(out[..., 2:, :], expected[..., 2:, :])
    torch.testing.assert_close(tref.flash_attention(q, k, v, causal=True), out)
    np.testing.assert_allclose(ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(),
                                                                ref.causal_mask(6, 4)), out.numpy(), atol=1e-12)


@pytest.mark.parametrize("backend, make", BACKENDS, ids=IDS)
def test_integer_masks_are_rejected_not_added(backend, make):
    # An int 0/1 mask used to be *added* to the scores (treated as additive): a silent wrong answer.
    q = make(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="^mask"):
        backend.scaled_dot_product_attention(q, q, q, make(np.tril(np.ones((3, 3), dtype=np.int64))))


@pytest.mark.parametrize("backend, make", BACKENDS, ids=IDS)
@pytest.mark.parametrize("scale", ["0.5", True, float("nan"), None, 0.25])
def test_scale_is_validated(backend, make, scale, rng):
    q = make(rng.standard_normal((2, 3, 4)))
    if scale is None or scale == 0.25:
        out = backend.scaled_dot_product_attention(q, q, q, scale=scale)
        expected = F.scaled_dot_product_attention(*(torch.as_tensor(np.asarray(q)),) * 3, scale=scale)
        np.testing.assert_allclose(np.asarray(out), expected.numpy(), atol=1e-12)
    else:  # a string gave "could not convert string to float" (flash: numpy's TypeError); True meant 1.0
        for call in (backend.scaled_dot_product_attention, backend.flash_attention):
            with pytest.raises(ValueError, match="^scale"):
                call(q, q, q, scale=scale)
        with pytest.raises(ValueError, match="^scale"):
            backend.sliding_window_attention(q, q, q, 2, scale=scale)


@pytest.mark.parametrize("backend, make", BACKENDS, ids=IDS)
def test_no_keys_gives_zero_output(backend, make, rng):
    # S = 0: every query attends to nothing, so the output is zeros (as for a fully masked row).
    # NumPy raised "zero-size array to reduction operation", torch an IndexError.
    q = make(rng.standard_normal((2, 3, 4)))
    k = make(np.zeros((2, 0, 4)))
    out = backend.scaled_dot_product_attention(q, k, make(np.zeros((2, 0, 5))))
    assert tuple(out.shape) == (2, 3, 5) and not np.asarray(out).any()
    assert tuple(backend.softmax(make(np.zeros((3, 0)))).shape) == (3, 0)


def test_numpy_softmax_still_takes_integer_scores():
    np.testing.assert_allclose(ref.softmax(np.array([[1, 2, 3]], dtype=np.int8)),
                               torch.softmax(torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64), -1).numpy())


@pytest.mark.parametrize("backend, make", BACKENDS, ids=IDS)
def test_softmax_bad_axis_is_a_value_error(backend, make):
    # was IndexError (torch), AxisError and TypeError (NumPy) from deep inside the library
    for axis in (2, -3, 1.0, True):
        with pytest.raises(ValueError, match="^axis"):
            backend.softmax(make(np.zeros((2, 3))), axis=axis)
    np.testing.assert_allclose(np.asarray(backend.softmax(make(np.zeros((2, 3))), axis=np.int64(0))), 0.5)


def test_numpy_additive_mask_keeps_float32(rng):
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    add = ref.additive_mask(ref.causal_mask(4))  # float64, as documented
    out = ref.scaled_dot_product_attention(q, q, q, add)
    assert out.dtype == np.float32  # was float64: the additive mask upcast the scores
    np.testing.assert_allclose(out, ref.scaled_dot_product_attention(q, q, q, ref.causal_mask(4)), rtol=1e-6)


def test_torch_integer_inputs_give_floats_like_numpy():
    # tref.softmax(tensor([1, 2, 3])) returned tensor([0, 0, 0]); flash_attention rejected integers
    x = np.array([[[1, 2, 3, 4], [0, -1, 2, 5]]])
    t = torch.tensor(x)
    pairs = [
        (tref.softmax(t), ref.softmax(x)),
        (tref.scaled_dot_product_attention(t, t, t), ref.scaled_dot_product_attention(x, x, x)),
        (tref.flash_attention(t, t, t), ref.flash_attention(x, x, x)),
        (tref.sliding_window_attention(t, t, t, 1), ref.sliding_window_attention(x, x, x, 1)),
    ]
    for out, expected in pairs:
        assert out.dtype == torch.float32
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
