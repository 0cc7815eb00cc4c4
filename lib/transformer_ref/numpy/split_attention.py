r"""Attention over keys split into blocks, merged by their log-sum-exp, in NumPy.

Attention over keys ``1..S`` is a weighted average, and a weighted average over a union of
blocks can be assembled from the blocks' own averages. If block ``b`` gives the normalised
output ``o_b = sum_{j in b} exp(s_j - lse_b) v_j`` and its log-sum-exp
``lse_b = log sum_{j in b} exp(s_j)``, then over all keys

    lse = log sum_b exp(lse_b)
    o   = sum_b exp(lse_b - lse) o_b

exactly (:func:`merge_attention`; the same rescaling as FlashAttention's online softmax, done
once per block instead of once per tile). Two schedules use it:

* :func:`flash_decoding` (Dao, Haziza, Massa & Sizov 2023, "Flash-Decoding for long-context
  inference", PyTorch blog; ``num_splits`` of the FlashAttention repository's split-KV
  forward): when one query must read a long cache, there is too little work per query to
  fill a GPU, so the keys are cut into ``n_splits`` pieces that are attended in parallel and
  merged in a second, small step;
* :func:`ring_attention` (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise
  Transformers for Near-Infinite Context", arXiv:2310.01889): the sequence is sharded over
  ``n`` devices; each keeps its block of queries and passes its block of keys and values to
  the next device in a ring, so after ``n`` steps every query block has met every key block
  and merged the partial results as they came, without any device holding all the keys.

A block a query may not see at all has ``lse_b = -inf`` and weight ``exp(-inf) = 0``; a query
that sees no key in any block gets zeros and ``lse = -inf``, never NaN.
"""

import math

import numpy as np

from .._checks import check_flag, check_int, check_mask, check_partials, check_qkv
from .._split_schedule import ring_schedule, split_bounds
from .attention import repeat_kv

__all__ = ["merge_attention", "flash_decoding", "ring_attention"]


def _attention_and_lse(q, k, v, mask, scale):
    """``softmax(q k^T scale + mask) v`` and its per-row log-sum-exp (``-inf`` where a row sees nothing).

    q ``(..., H, T, D)``, k ``(..., H, S_b, D)``, v ``(..., H, S_b, Dv)``, mask None, boolean or
    additive, broadcastable to ``(..., H, T, S_b)``; ``S_b = 0`` is allowed."""
    scores = (q @ np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == np.bool_ else scores + mask
    m = scores.max(axis=-1, initial=-np.inf)
    m_safe = np.where(np.isneginf(m), 0.0, m)  # a row with nothing to see: exp(-inf - 0) = 0
    p = np.exp(scores - m_safe[..., None])
    l = p.sum(axis=-1)
    seen = l > 0
    out = (p @ v) / np.where(seen, l, 1.0)[..., None]
    lse = np.where(seen, m_safe + np.log(np.where(seen, l, 1.0)), -np.inf)
    return out, lse


def merge_attention(outs, lses):
    r"""Merge attention over disjoint key blocks: ``lse = log sum_b exp(lse_b)``, ``out = sum_b exp(lse_b - lse) out_b``.

    ``outs``: a sequence of ``n >= 1`` partial outputs ``(..., Dv)`` (e.g. ``(..., H, T, Dv)``), each
    normalised over its own block of keys; ``lses``: their log-sum-exps ``(..., )`` (e.g.
    ``(..., H, T)``), as ``flash_attention(..., return_lse=True)`` returns them, ``-inf`` for a block
    a row did not see. Returns ``(out, lse)``, equal to attention over the union of the blocks
    (the log-sum-exp merge of FlashAttention's split-KV kernels and of ring attention). Rows that
    saw no key in any block give zeros and ``lse = -inf``. Computed stably with ``M = max_b lse_b``:
    ``w_b = exp(lse_b - M)``, ``out = sum_b w_b out_b / sum_b w_b``, ``lse = M + log sum_b w_b``.
    """
    outs, lses = check_partials([np.asarray(o) for o in outs], [np.asarray(l) for l in lses])
    out_stack, lse_stack = np.stack(outs), np.stack(lses)  # (n, ..., Dv), (n, ...)
    m = lse_stack.max(axis=0)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    w = np.exp(lse_stack - m_safe)  # (n, ...): 0 for blocks a row did not see
    total = w.sum(axis=0)
    seen = total > 0
    out = (w[..., None] * out_stack).sum(axis=0) / np.where(seen, total, 1.0)[..., None]
    lse = np.where(seen, m_safe + np.log(np.where(seen, total, 1.0)), -np.inf)
    return out, lse


def flash_decoding(q, k, v, *, n_splits, mask=None, return_lse=False):
    """Split-K attention (Flash-Decoding, Dao et al. 2023): the keys in ``n_splits`` pieces, attended apart, merged.

    ``q (..., H, T, D)``, ``k (..., H_kv, S, D)``, ``v (..., H_kv, S, Dv)``, ``H_kv`` dividing ``H``
    (GQA: query head ``h`` reads KV head ``h // (H / H_kv)``); ``mask`` None, boolean (True = may
    attend) or additive, broadcastable to ``(..., H, T, S)``; scale ``1 / sqrt(D)``. The keys are
    cut into ``n_splits >= 1`` contiguous pieces whose sizes differ by at most one (empty pieces,
    when ``n_splits > S``, contribute nothing); each piece gives its normalised output and
    log-sum-exp, and :func:`merge_attention` combines them. Returns ``out (..., H, T, Dv)``, equal to
    ``scaled_dot_product_attention`` with the same mask, and with ``return_lse`` also
    ``lse (..., H, T)`` (``-inf`` for a fully masked row, whose output is zeros).
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    batch, H, H_kv, group, T, S, D, Dv = check_qkv(q, k, v, grouped=True)
    n_splits = check_int("n_splits", n_splits, minimum=1)
    if mask is not None:
        mask = np.asarray(mask)
        check_mask(mask, (*batch, H, T, S))
    k, v = repeat_kv(k, group), repeat_kv(v, group)
    scale = 1.0 / math.sqrt(D)
    outs, lses = [], []
    for j0, j1 in split_bounds(S, n_splits):  # on a GPU the pieces run in parallel
        piece_mask = mask if mask is None or mask.ndim == 0 or mask.shape[-1] == 1 else mask[..., j0:j1]
        out, lse = _attention_and_lse(q, k[..., j0:j1, :], v[..., j0:j1, :], piece_mask, scale)
        outs.append(out)
        lses.append(lse)
    out, lse = merge_attention(outs, lses)
    return (out, lse) if return_lse else out


def ring_attention(q, k, v, *, n_devices, causal=False):
    """Ring attention (Liu et al. 2023), simulated: ``n_devices`` hold one block each, keys travel round a ring.

    ``q (..., H, T, D)``, ``k (..., H_kv, S, D)``, ``v (..., H_kv, S, Dv)`` with ``H_kv`` dividing ``H``;
    scale ``1 / sqrt(D)``. Device ``r`` holds query block ``r`` and key/value block ``r`` (both cut
    into ``n_devices >= 1`` contiguous blocks whose sizes differ by at most one). At each of
    ``n_devices`` steps every device attends its queries to the key/value block it holds, merges
    the result into its running ``(out, lse)`` with :func:`merge_attention`, and passes the block
    on to device ``r + 1``; after the last step device ``r`` has seen every block. ``causal=True``
    is aligned bottom-right (query ``i`` sees key ``j`` iff ``j <= i + S - T``); a block entirely
    in a query block's future is skipped. Returns ``(..., H, T, Dv)``, equal to
    ``scaled_dot_product_attention`` (with ``causal_mask(T, S)`` when causal).
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    batch, H, H_kv, group, T, S, D, Dv = check_qkv(q, k, v, grouped=True)
    n_devices = check_int("n_devices", n_devices, minimum=1)
    causal = check_flag("causal", causal)
    k, v = repeat_kv(k, group), repeat_kv(v, group)
    scale = 1.0 / math.sqrt(D)
    running = [None] * n_devices  # device r's (out, lse) so far
    for r, (i0, i1), (j0, j1) in ring_schedule(T, S, n_devices, causal):
        mask = None
        if causal:  # key j visible to query i iff j <= i + S - T
            mask = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None] + S - T
        part = _attention_and_lse(q[..., i0:i1, :], k[..., j0:j1, :], v[..., j0:j1, :], mask, scale)
        running[r] = part if running[r] is None else merge_attention(*zip(running[r], part))
    return np.concatenate([out for out, _ in running], axis=-2)
