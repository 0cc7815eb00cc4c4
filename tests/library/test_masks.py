"""Masks: PyTorch's own causal biases, loop definitions, NumPy/torch agreement."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from transformer_ref import numpy as ref
from transformer_ref import torch as tref


def materialise(bias):
    """A ``CausalBias`` as the boolean (T, S) matrix PyTorch applies."""
    q = torch.eye(bias.seq_len_q, bias.seq_len_q)[None, None]  # one-hot queries, identity values
    k = torch.zeros(1, 1, bias.seq_len_kv, bias.seq_len_q)
    v = torch.eye(bias.seq_len_kv)[None, None]
    # with equal scores the weights are uniform over the allowed keys: > 0 exactly where allowed
    weights = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return (weights[0, 0] > 0).numpy()


sizes = st.integers(0, 12).flatmap(lambda T: st.tuples(st.just(T), st.integers(T, T + 12)))


def test_materialise_helper_sees_what_pytorch_applies():
    np.testing.assert_array_equal(materialise(causal_upper_left(2, 3)), [[1, 0, 0], [1, 1, 0]])
    np.testing.assert_array_equal(materialise(causal_lower_right(2, 3)), [[1, 1, 0], [1, 1, 1]])


@given(sizes=sizes.filter(lambda ts: ts[0] > 0))
def test_causal_mask_is_pytorchs_lower_right_bias(sizes):
    T, S = sizes
    np.testing.assert_array_equal(ref.causal_mask(T, S), materialise(causal_lower_right(T, S)))
    # with T == S bottom-right and top-left alignment coincide
    np.testing.assert_array_equal(ref.causal_mask(T), materialise(causal_upper_left(T, T)))


@given(sizes=sizes)
def test_causal_mask_matches_loop_definition(sizes):
    T, S = sizes
    expected = np.array([[j <= i + S - T for j in range(S)] for i in range(T)], dtype=bool).reshape(T, S)
    mask = ref.causal_mask(T, S)
    assert mask.dtype == np.bool_ and mask.shape == (T, S)
    np.testing.assert_array_equal(mask, expected)
    # the last query (the newest token) sees every key
    if T:
        assert mask[-1].all()


@given(sizes=sizes, window=st.integers(1, 30))
def test_sliding_window_matches_loop_definition(sizes, window):
    T, S = sizes
    expected = np.array(
        [[i + S - T - window < j <= i + S - T for j in range(S)] for i in range(T)], dtype=bool
    ).reshape(T, S)
    mask = ref.sliding_window_mask(T, window, S)
    np.testing.assert_array_equal(mask, expected)
    # every query sees min(window, its position + 1) keys
    np.testing.assert_array_equal(mask.sum(-1), np.minimum(window, np.arange(T) + S - T + 1))
    if window >= S:
        np.testing.assert_array_equal(mask, ref.causal_mask(T, S))


def test_sliding_window_of_one_is_the_diagonal():
    np.testing.assert_array_equal(ref.sliding_window_mask(4, 1), np.eye(4, dtype=bool))
    np.testing.assert_array_equal(ref.sliding_window_mask(2, 1, 4), [[0, 0, 1, 0], [0, 0, 0, 1]])


@given(sizes=sizes, window=st.integers(1, 30), n_sink=st.integers(0, 6))
def test_sink_window_matches_loop_definition(sizes, window, n_sink):
    T, S = sizes
    expected = np.array([[j <= i + S - T and (j < n_sink or j > i + S - T - window) for j in range(S)]
                         for i in range(T)], dtype=bool).reshape(T, S)
    mask = ref.sink_window_mask(T, window, n_sink, S)
    assert mask.dtype == np.bool_ and mask.shape == (T, S)
    np.testing.assert_array_equal(mask, expected)
    # no sinks: the sliding window; sinks and window covering every key: the causal mask
    if n_sink == 0:
        np.testing.assert_array_equal(mask, ref.sliding_window_mask(T, window, S))
    if n_sink + window >= S:
        np.testing.assert_array_equal(mask, ref.causal_mask(T, S))
    # every query sees its window plus the sinks that lie before it, never a future sink
    positions = np.arange(T) + S - T
    in_window = np.minimum(window, positions + 1)
    np.testing.assert_array_equal(mask.sum(-1), in_window + np.clip(np.minimum(n_sink, positions + 1 - in_window), 0, None))


def test_sink_window_while_streaming():
    # StreamingLLM decoding: 4 sinks and a window of 3 over a cache of 10; the new token sees
    # keys 0-3 and 7-9 (itself at 9), while the sinks themselves attend causally at the start
    np.testing.assert_array_equal(ref.sink_window_mask(1, 3, 4, 10), [[1, 1, 1, 1, 0, 0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(ref.sink_window_mask(4, 1, 2), [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0],
                                                                  [1, 1, 0, 1]])


@given(T=st.integers(0, 12), data=st.data())
def test_prefix_lm_matches_loop_definition(T, data):
    prefix_len = data.draw(st.integers(0, T))
    expected = np.array([[j <= i or j < prefix_len for j in range(T)] for i in range(T)], dtype=bool).reshape(T, T)
    np.testing.assert_array_equal(ref.prefix_lm_mask(T, prefix_len), expected)
    if prefix_len <= 1:
        np.testing.assert_array_equal(ref.prefix_lm_mask(T, prefix_len), ref.causal_mask(T))


def test_padding_mask_broadcasts_over_heads_and_queries():
    mask = ref.padding_mask(np.array([3, 0, 5]), 5)
    assert mask.shape == (3, 1, 1, 5)
    np.testing.assert_array_equal(mask[:, 0, 0], [[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    combined = mask & ref.causal_mask(5)  # (B, 1, T, S): pad keys and future keys hidden
    assert combined.shape == (3, 1, 5, 5)
    assert not combined[0, 0, :, 3:].any() and combined[2, 0].sum() == 15


def test_additive_mask_is_zero_or_minus_infinity(rng):
    mask = ref.causal_mask(4, 6)
    add = ref.additive_mask(mask)
    assert add.dtype == np.float64 and add.shape == mask.shape
    assert (add[mask] == 0).all() and np.isneginf(add[~mask]).all()
    # adding it to scores has the effect of the boolean mask on the softmax
    scores = rng.standard_normal((4, 6))
    np.testing.assert_allclose(ref.softmax(scores + add), ref.softmax(np.where(mask, scores, -np.inf)))


MASK_CALLS = [
    ("causal_mask", (5,), {}),
    ("causal_mask", (3, 7), {}),
    ("sliding_window_mask", (6, 2), {}),
    ("sliding_window_mask", (3, 4, 9), {}),
    ("prefix_lm_mask", (6, 3), {}),
    ("sink_window_mask", (7, 2, 3), {}),
    ("sink_window_mask", (3, 4, 1, 12), {}),
]


@pytest.mark.parametrize("name, args, kwargs", MASK_CALLS)
def test_numpy_and_torch_masks_agree(name, args, kwargs, device):
    t_mask = getattr(tref, name)(*args, device=device, **kwargs)
    assert t_mask.dtype == torch.bool and t_mask.device.type == device
    np.testing.assert_array_equal(t_mask.cpu().numpy(), getattr(ref, name)(*args, **kwargs))


def test_numpy_and_torch_padding_and_additive_agree(device):
    lengths = [2, 4, 0]
    t_pad = tref.padding_mask(torch.tensor(lengths, device=device), 4)
    assert t_pad.device.type == device
    np.testing.assert_array_equal(t_pad.cpu().numpy(), ref.padding_mask(np.array(lengths), 4))
    t_add = tref.additive_mask(tref.causal_mask(3, 5, device=device))
    assert t_add.device.type == device and t_add.dtype == torch.float32
    np.testing.assert_array_equal(t_add.cpu().numpy(), ref.additive_mask(ref.causal_mask(3, 5)))


@pytest.mark.parametrize("backend", [ref, tref], ids=["numpy", "torch"])
def test_bad_mask_arguments_name_the_argument(backend):
    cases = [
        (lambda: backend.causal_mask(-1), "T"),
        (lambda: backend.causal_mask(5, -3), "S"),
        (lambda: backend.causal_mask(2.5), "T"),
        (lambda: backend.sliding_window_mask(4, 0), "window"),
        (lambda: backend.sliding_window_mask(4, -2, 6), "window"),
        (lambda: backend.sink_window_mask(4, 0, 2), "window"),
        (lambda: backend.sink_window_mask(4, 2, -1), "n_sink"),
        (lambda: backend.sink_window_mask(4, 2, 1.0), "n_sink"),
        (lambda: backend.prefix_lm_mask(4, 5), "prefix_len"),
        (lambda: backend.prefix_lm_mask(4, -1), "prefix_len"),
        (lambda: backend.padding_mask([3, 7], 5), "lengths"),
        (lambda: backend.padding_mask([[1, 2]], 5), "lengths"),
        (lambda: backend.padding_mask([1.5], 5), "lengths"),
        (lambda: backend.padding_mask([1], -1), "S"),
        (lambda: backend.additive_mask(np.zeros((2, 2)) if backend is ref else torch.zeros(2, 2)), "mask"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"^{name}"):
            call()


@pytest.mark.parametrize("backend", [ref, tref], ids=["numpy", "torch"])
def test_causal_and_window_masks_accept_fewer_keys_than_queries(backend):
    # query i sees key j iff j <= i + S - T, for any T and S. S < T used to raise, so
    # flash_attention(causal=True) with S < T had no reference mask to compare to.
    T, S = 5, 3
    expected = np.array([[j <= i + S - T for j in range(S)] for i in range(T)])
    np.testing.assert_array_equal(np.asarray(backend.causal_mask(T, S)), expected)
    window = np.array([[i + S - T - 2 < j <= i + S - T for j in range(S)] for i in range(T)])
    np.testing.assert_array_equal(np.asarray(backend.sliding_window_mask(T, 2, S)), window)
