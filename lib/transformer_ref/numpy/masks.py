"""Attention masks in NumPy.

Every mask is boolean with ``True`` = "this query may attend to this key" and is
broadcastable to the score shape ``(..., T, S)`` (``T`` queries, ``S`` keys).
Causal masks are aligned **bottom-right**: when the ``T`` queries are the last
``T`` of ``S`` positions (a KV cache holding ``S - T`` earlier tokens), query
``i`` sits at absolute position ``i + S - T`` and may see key ``j`` iff
``j <= i + S - T``. With ``T == S`` this is the usual lower triangle; with
``S < T`` the first ``T - S`` queries see no key at all (all-False rows, which
attention turns into zero outputs), as in ``torch.nn.attention.bias.causal_lower_right``.
"""

import numpy as np

from .._checks import check_boolean, check_int, check_lengths

__all__ = [
    "causal_mask", "sliding_window_mask", "sink_window_mask", "prefix_lm_mask", "padding_mask", "additive_mask",
]


def _query_key_offsets(T, S):
    """``(T, S)`` int array of ``j - (i + S - T)``: key index minus the query's absolute position."""
    T = check_int("T", T, minimum=0)
    S = T if S is None else check_int("S", S, minimum=0)
    return np.arange(S)[None, :] - (np.arange(T)[:, None] + S - T)


def causal_mask(T, S=None):
    """Bottom-right causal mask, bool ``(T, S)``: ``mask[i, j] = j <= i + S - T``.

    Taught in chapter 3, section 'What a decoder must not see'.

    ``S`` defaults to ``T`` (the lower triangle incl. the diagonal). If ``S < T``
    the first ``T - S`` rows are all False.
    """
    return _query_key_offsets(T, S) <= 0


def sliding_window_mask(T, window, S=None):
    """Causal sliding-window mask, bool ``(T, S)``.

    Taught in chapter 6, section 'Sliding-window attention'.

    Query ``i`` (absolute position ``p = i + S - T``) sees the ``window`` keys
    ``p - window < j <= p``, itself included; ``window >= 1``. With
    ``window >= S`` this is :func:`causal_mask`.
    """
    window = check_int("window", window, minimum=1)
    offsets = _query_key_offsets(T, S)
    return (offsets <= 0) & (offsets > -window)


def sink_window_mask(T, window, n_sink, S=None):
    """Attention sinks plus a causal sliding window (StreamingLLM), bool ``(T, S)``.

    Query ``i`` (absolute position ``p = i + S - T``) sees key ``j`` iff ``j <= p`` and
    (``j < n_sink`` or ``p - window < j``): the first ``n_sink`` keys of the sequence, which
    StreamingLLM keeps in the cache for ever because trained models park much of their
    attention there (Xiao et al. 2024, "Efficient Streaming Language Models with Attention
    Sinks", arXiv:2309.17453, use 4), and the ``window`` most recent keys, itself included.
    ``window >= 1``, ``n_sink >= 0``; ``n_sink = 0`` is :func:`sliding_window_mask`, and with
    ``window + n_sink >= S`` every row is the :func:`causal_mask` row. Aligned bottom-right
    like the other masks (``S`` defaults to ``T``).
    """
    window = check_int("window", window, minimum=1)
    n_sink = check_int("n_sink", n_sink, minimum=0)
    offsets = _query_key_offsets(T, S)
    sink = np.arange(offsets.shape[1])[None, :] < n_sink
    return (offsets <= 0) & ((offsets > -window) | sink)


def prefix_lm_mask(T, prefix_len):
    """Prefix-LM mask, bool ``(T, T)``: ``mask[i, j] = (j <= i) or (j < prefix_len)``.

    Taught in chapter 5, section 'Who may attend to whom'.

    The first ``prefix_len`` positions attend to each other bidirectionally and
    every position sees the whole prefix; the rest is causal.
    ``0 <= prefix_len <= T``; ``prefix_len = 0`` gives the causal mask.
    """
    T = check_int("T", T, minimum=0)
    prefix_len = check_int("prefix_len", prefix_len, minimum=0)
    if prefix_len > T:
        raise ValueError(f"prefix_len must be <= T, got prefix_len={prefix_len}, T={T}")
    j = np.arange(T)[None, :]
    return causal_mask(T) | (j < prefix_len)


def padding_mask(lengths, S):
    """Key-padding mask, bool ``(B, 1, 1, S)``: ``mask[b, 0, 0, j] = j < lengths[b]``.

    Taught in chapter 3, section 'Padding masks, and rows with nothing to see'.

    lengths: ``(B,)`` integers in ``[0, S]``, the number of real (non-pad) keys of
    each sequence, padding on the right. The two singleton axes make it broadcast
    against scores ``(B, H, T, S)`` (every head, every query); combine it with a
    causal mask by ``&``.
    """
    lengths = np.asarray(lengths)
    S = check_int("S", S, minimum=0)
    check_lengths(lengths, S)
    return (np.arange(S)[None, :] < lengths[:, None])[:, None, None, :]


def additive_mask(mask):
    r"""Turn a boolean mask into an additive one: ``0.0`` where True, ``-inf`` where False.

    Taught in chapter 3, section '$-\infty$ before the softmax, exact zeros after it'.

    Adding it to the scores before the softmax has the same effect as the boolean
    mask. Returns float64 of ``mask``'s shape.
    """
    mask = np.asarray(mask)
    check_boolean("mask", mask)
    return np.where(mask, 0.0, -np.inf)
