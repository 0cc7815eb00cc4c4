"""Regression tests for defects found by the review of ``transformer_ref`` (one test per defect).

Each test failed before its fix: it states the contract (DESIGN.md) the old code broke.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from transformer_ref import counts
from transformer_ref import numpy as ref
from transformer_ref import torch as tref

BACKENDS = [(ref, np.asarray), (tref, torch.as_tensor)]
IDS = ["numpy", "torch"]


# --- masks: bottom-right causal alignment holds for S < T as well ------------------------------

@pytest.mark.parametrize("backend", [ref, tref], ids=IDS)
def test_causal_and_window_masks_accept_fewer_keys_than_queries(backend):
    # DESIGN: query i sees key j iff j <= i + S - T, for any T and S. Before the fix S < T
    # raised, so flash_attention(causal=True) with S < T had no reference mask to compare to.
    T, S = 5, 3
    expected = np.array([[j <= i + S - T for j in range(S)] for i in range(T)])
    np.testing.assert_array_equal(np.asarray(backend.causal_mask(T, S)), expected)
    window = np.array([[i + S - T - 2 < j <= i + S - T for j in range(S)] for i in range(T)])
    np.testing.assert_array_equal(np.asarray(backend.sliding_window_mask(T, 2, S)), window)


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


# --- attention: masks, scale, empty key axis ---------------------------------------------------

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
    else:  # a string gave "could not convert string to float"; True silently meant 1.0
        with pytest.raises(ValueError, match="^scale"):
            backend.scaled_dot_product_attention(q, q, q, scale=scale)


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


def test_torch_softmax_bad_axis_is_a_value_error():
    with pytest.raises(ValueError, match="^axis"):  # was IndexError from deep inside torch
        tref.softmax(torch.zeros(2, 3), axis=2)
    with pytest.raises(ValueError, match="^axis"):
        tref.softmax(torch.zeros(2, 3), axis=1.0)
    torch.testing.assert_close(tref.softmax(torch.zeros(2, 3), axis=np.int64(0)), torch.full((2, 3), 0.5))


def test_numpy_additive_mask_keeps_float32(rng):
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    add = ref.additive_mask(ref.causal_mask(4))  # float64, as documented
    out = ref.scaled_dot_product_attention(q, q, q, add)
    assert out.dtype == np.float32  # was float64: the additive mask upcast the scores
    np.testing.assert_allclose(out, ref.scaled_dot_product_attention(q, q, q, ref.causal_mask(4)), rtol=1e-6)


# --- norms: exact gain/bias shapes, float32 statistics for half precision ----------------------

@pytest.mark.parametrize("backend, make", BACKENDS, ids=IDS)
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


# --- counts: boolean flags ---------------------------------------------------------------------

@pytest.mark.parametrize("call, name", [
    (lambda: counts.model_param_count(100, 64, 2, 4, bias="no"), "bias"),
    (lambda: counts.model_param_count(100, 64, 2, 4, tied_embeddings=None), "tied_embeddings"),
    (lambda: counts.block_param_count(64, 4, cross_attention="yes"), "cross_attention"),
    (lambda: ref.init_block_params(64, 4, bias="False"), "bias"),
    (lambda: counts.attention_flops(8, causal="yes"), "causal"),
])
def test_flags_must_be_booleans(call, name):
    # bias="no" used to count the biases (a truthy string): a silently wrong parameter count
    with pytest.raises(ValueError, match=f"^{name}"):
        call()


# --- torch models: token ids and head sizes ----------------------------------------------------

def test_models_reject_out_of_vocabulary_tokens():
    torch.manual_seed(0)
    model = tref.DecoderOnlyModel(10, 16, 1, 4, 8)
    for bad in (torch.full((1, 3), 10), torch.full((1, 3), -1)):  # IndexError inside nn.Embedding before
        with pytest.raises(ValueError, match="^tokens"):
            model(bad)
    with pytest.raises(ValueError, match="^prompt"):
        model.generate(torch.full((1, 2), 11), 2)
    seq2seq = tref.EncoderDecoderModel(10, 12, 16, 1, 4, 8)
    with pytest.raises(ValueError, match="^src"):
        seq2seq(torch.full((1, 3), 10), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="^tgt_in"):
        seq2seq(torch.zeros(1, 3, dtype=torch.long), torch.full((1, 2), 12))
    with pytest.raises(ValueError, match="^bos"):
        seq2seq.generate(torch.zeros(1, 3, dtype=torch.long), 12, 2)


def test_decoder_model_names_d_model_when_heads_do_not_divide_it():
    # d_model = 16, n_heads = 3: the error used to read "head_dim must be even for RoPE, got 5"
    with pytest.raises(ValueError, match=r"^d_model \(16\) must be divisible by n_heads \(3\)"):
        tref.DecoderOnlyModel(10, 16, 1, 3, 8)


# --- block: per-sequence RoPE positions in x's layout ------------------------------------------

@pytest.mark.parametrize("backend, make", BACKENDS, ids=IDS)
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


# --- torch: integer input is promoted (like NumPy), not truncated back to integers ---------------

def test_torch_integer_inputs_give_floats_like_numpy():
    # tref.softmax(tensor([1, 2, 3])) returned tensor([0, 0, 0]); apply_rope rounded to integers
    x = np.array([[1, 2, 3, 4], [0, -1, 2, 5]])
    pairs = [
        (tref.softmax(torch.tensor(x)), ref.softmax(x)),
        (tref.apply_rope(torch.tensor(x), torch.arange(2)), ref.apply_rope(x, np.arange(2))),
        (tref.scaled_dot_product_attention(*(torch.tensor(x),) * 3), ref.scaled_dot_product_attention(x, x, x)),
        (tref.layer_norm(torch.tensor(x), np.ones(4), np.zeros(4)), ref.layer_norm(x, np.ones(4), np.zeros(4))),
        (tref.rms_norm(torch.tensor(x), np.ones(4)), ref.rms_norm(x, np.ones(4))),
    ]
    for out, expected in pairs:
        assert out.dtype == torch.float32
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_torch_backend_names_a_numpy_argument():
    # a NumPy array passed to the torch backend failed with "'numpy.ndarray' has no attribute 'to'"
    a = np.zeros((2, 4, 8))
    p = ref.init_block_params(8, 2)
    cases = [
        (lambda: tref.softmax(a), "x"),
        (lambda: tref.scaled_dot_product_attention(torch.zeros(2, 4, 8), a, a), "k"),
        (lambda: tref.grouped_query_attention(a, a, a), "q"),
        (lambda: tref.repeat_kv(a, 2), "x"),
        (lambda: tref.apply_rope(a, np.arange(4)), "x"),
        (lambda: tref.layer_norm(a, p["ln1_weight"], p["ln1_bias"]), "x"),
        (lambda: tref.rms_norm(a, p["ln1_weight"]), "x"),
        (lambda: tref.gelu(a), "x"),
        (lambda: tref.feed_forward(a, p), "x"),
        (lambda: tref.multi_head_attention(a, p, 2), "x"),
        (lambda: tref.transformer_block(a, p, 2), "x"),
        (lambda: tref.cross_attention(torch.zeros(2, 4, 8), a, p, 2), "memory"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"^{name} must be a torch.Tensor"):
            call()
