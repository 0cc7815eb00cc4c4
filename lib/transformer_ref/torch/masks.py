"""Attention masks in PyTorch (see :mod:`transformer_ref.numpy.masks` for the conventions).

Boolean, ``True`` = may attend, broadcastable to the scores ``(..., T, S)``;
causal masks bottom-right aligned (query ``i`` sees key ``j`` iff
``j <= i + S - T``). Every constructor takes ``device=``.
"""

import torch

from .._checks import check_boolean, check_int, check_lengths

__all__ = [
    "causal_mask", "sliding_window_mask", "sink_window_mask", "prefix_lm_mask", "padding_mask", "additive_mask",
]


def _query_key_offsets(T, S, device):
    """``(T, S)`` tensor of ``j - (i + S - T)``: key index minus the query's absolute position."""
    T = check_int("T", T, minimum=0)
    S = T if S is None else check_int("S", S, minimum=0)
    return torch.arange(S, device=device)[None, :] - (torch.arange(T, device=device)[:, None] + S - T)


def causal_mask(T, S=None, *, device=None):
    """Bottom-right causal mask, bool ``(T, S)``: ``mask[i, j] = j <= i + S - T``; ``S`` defaults to ``T``.

    Taught in chapter 3, section 'What a decoder must not see'.

    Same as ``torch.nn.attention.bias.causal_lower_right(T, S)`` materialised (for
    ``S < T`` the first ``T - S`` rows are all False).
    """
    return _query_key_offsets(T, S, device) <= 0


def sliding_window_mask(T, window, S=None, *, device=None):
    """Causal sliding window, bool ``(T, S)``: ``i + S - T - window < j <= i + S - T``.

    Taught in chapter 6, section 'Sliding-window attention'.

    Each query sees ``window >= 1`` keys, itself included.
    """
    window = check_int("window", window, minimum=1)
    offsets = _query_key_offsets(T, S, device)
    return (offsets <= 0) & (offsets > -window)


def sink_window_mask(T, window, n_sink, S=None, *, device=None):
    """Attention sinks plus a causal sliding window (StreamingLLM, Xiao et al. 2024), bool ``(T, S)``.

    Query ``i`` (position ``p = i + S - T``) sees key ``j`` iff ``j <= p`` and
    (``j < n_sink`` or ``p - window < j``): the first ``n_sink >= 0`` keys and the
    ``window >= 1`` most recent ones, itself included (see the NumPy version).
    """
    window = check_int("window", window, minimum=1)
    n_sink = check_int("n_sink", n_sink, minimum=0)
    offsets = _query_key_offsets(T, S, device)
    sink = torch.arange(offsets.shape[1], device=device)[None, :] < n_sink
    return (offsets <= 0) & ((offsets > -window) | sink)


def prefix_lm_mask(T, prefix_len, *, device=None):
    """Prefix-LM mask, bool ``(T, T)``: ``mask[i, j] = (j <= i) or (j < prefix_len)``, ``0 <= prefix_len <= T``.

    Taught in chapter 5, section 'Who may attend to whom'.
    """
    T = check_int("T", T, minimum=0)
    prefix_len = check_int("prefix_len", prefix_len, minimum=0)
    if prefix_len > T:
        raise ValueError(f"prefix_len must be <= T, got prefix_len={prefix_len}, T={T}")
    j = torch.arange(T, device=device)[None, :]
    return causal_mask(T, device=device) | (j < prefix_len)


def padding_mask(lengths, S, *, device=None):
    """Key-padding mask, bool ``(B, 1, 1, S)``: ``mask[b, 0, 0, j] = j < lengths[b]``.

    Taught in chapter 3, section 'Padding masks, and rows with nothing to see'.

    lengths: ``(B,)`` integers in ``[0, S]`` (right padding). Broadcasts against
    scores ``(B, H, T, S)``. ``device`` defaults to ``lengths``' device.
    """
    lengths = torch.as_tensor(lengths, device=device)
    S = check_int("S", S, minimum=0)
    check_lengths(lengths, S)
    return (torch.arange(S, device=lengths.device)[None, :] < lengths[:, None])[:, None, None, :]


def additive_mask(mask, *, dtype=torch.float32):
    r"""Boolean mask -> additive float mask: ``0`` where True, ``-inf`` where False (same shape and device).

    ``dtype`` defaults to float32.

    Taught in chapter 3, section '$-\infty$ before the softmax, exact zeros after it'.
    """
    mask = torch.as_tensor(mask)
    check_boolean("mask", mask)
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.full((), float("-inf"), dtype=dtype, device=mask.device))
