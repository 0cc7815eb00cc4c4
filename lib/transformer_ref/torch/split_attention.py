"""Attention over keys split into blocks, merged by their log-sum-exp, in PyTorch.

Same functions and semantics as :mod:`transformer_ref.numpy.split_attention` (read its
docstring for the merge rule, Flash-Decoding and ring attention). Everything runs on the
inputs' device and is differentiable: a fully masked row or an unseen block has
``lse = -inf`` and gets zero gradients, never NaN. Half-precision inputs compute in float32;
outputs have ``q``'s dtype and ``lse`` is float32 for them, as in :func:`flash_attention`.
"""

import math

import torch

from .._checks import check_flag, check_int, check_mask, check_partials, check_qkv
from .._split_schedule import ring_schedule, split_bounds
from .attention import _check_tensor, _check_tensors, _compute_dtype, _result_dtype, repeat_kv

__all__ = ["merge_attention", "flash_decoding", "ring_attention"]


def _safe_log_total(m, total):
    """``m + log(total)`` where ``total > 0``, else ``-inf``, with finite gradients everywhere."""
    seen = total > 0
    return torch.where(seen, m + torch.log(torch.where(seen, total, torch.ones_like(total))),
                       torch.full_like(total, -math.inf))


def _attention_and_lse(q, k, v, mask, scale):
    """``softmax(q k^T scale + mask) v`` and its per-row log-sum-exp (``-inf`` where a row sees nothing).

    q ``(..., H, T, D)``, k ``(..., H, S_b, D)``, v ``(..., H, S_b, Dv)`` in the compute dtype; mask
    None, boolean or additive, broadcastable to ``(..., H, T, S_b)``; ``S_b = 0`` is allowed."""
    scores = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.to(scores.dtype)
    if scores.shape[-1] == 0:
        m = scores.new_full(scores.shape[:-1], -math.inf)
    else:
        m = scores.amax(dim=-1).detach()  # the max cancels out, no gradient needed
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(scores - m_safe[..., None])
    total = p.sum(dim=-1)
    out = (p @ v) / torch.where(total > 0, total, torch.ones_like(total))[..., None]
    return out, _safe_log_total(m_safe, total)


def merge_attention(outs, lses):
    r"""Merge attention over disjoint key blocks: ``lse = log sum_b exp(lse_b)``, ``out = sum_b exp(lse_b - lse) out_b``.

    ``outs``: ``n >= 1`` partial outputs ``(..., Dv)`` of one shape, each normalised over its own
    keys; ``lses``: their log-sum-exps ``(...,)`` (``-inf`` for a block a row did not see). Returns
    ``(out, lse)`` of attention over the union of the blocks; rows that saw nothing give zeros
    and ``lse = -inf``. Stable: ``w_b = exp(lse_b - max_b lse_b)``, ``out = sum_b w_b out_b / sum_b w_b``.
    Differentiable in every ``out_b`` and ``lse_b``; ``out`` has ``outs[0]``'s dtype, ``lse`` the
    float32-or-wider dtype of the computation.
    """
    outs, lses = list(outs), list(lses)
    for i, out in enumerate(outs):
        _check_tensor(f"outs[{i}]", out)
    for i, lse in enumerate(lses):
        _check_tensor(f"lses[{i}]", lse)
    outs, lses = check_partials(outs, lses)
    device = outs[0].device
    if any(x.device != device for x in outs + lses):
        raise ValueError(f"outs and lses must all be on outs[0]'s device {device}")
    dtype = _compute_dtype(torch.promote_types(outs[0].dtype, lses[0].dtype))
    out_stack = torch.stack([o.to(dtype) for o in outs])  # (n, ..., Dv)
    lse_stack = torch.stack([l.to(dtype) for l in lses])  # (n, ...)
    m = lse_stack.amax(dim=0).detach()
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp(lse_stack - m_safe)  # 0 for blocks a row did not see
    total = w.sum(dim=0)
    out = (w[..., None] * out_stack).sum(dim=0) / torch.where(total > 0, total, torch.ones_like(total))[..., None]
    return out.to(_result_dtype(outs[0])), _safe_log_total(m_safe, total)


def _prepare(q, k, v):
    """Check q, k, v; return their sizes, the output dtype and q, k, v in the compute dtype with K/V
    repeated per query head (query head h reads KV head h // group)."""
    _check_tensors(q, k, v)
    sizes = check_qkv(q, k, v, grouped=True)
    dtype = _compute_dtype(torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype))
    return (sizes, _result_dtype(q), q.to(dtype), repeat_kv(k.to(dtype), sizes.group),
            repeat_kv(v.to(dtype), sizes.group))


def flash_decoding(q, k, v, *, n_splits, mask=None, return_lse=False):
    """Split-K attention (Flash-Decoding, Dao et al. 2023): the keys in ``n_splits`` pieces, attended apart, merged.

    ``q (..., H, T, D)``, ``k (..., H_kv, S, D)``, ``v (..., H_kv, S, Dv)``, ``H_kv`` dividing ``H``;
    ``mask`` None, boolean (True = may attend) or additive, broadcastable to ``(..., H, T, S)``;
    scale ``1 / sqrt(D)``. The keys are cut into ``n_splits >= 1`` contiguous pieces whose sizes
    differ by at most one; each piece's output and log-sum-exp are merged by
    :func:`merge_attention`. Returns ``out (..., H, T, Dv)`` (``q``'s dtype), equal to
    ``scaled_dot_product_attention`` with the same mask, and with ``return_lse`` also ``lse (..., H, T)``.
    """
    (batch, H, _, _, T, S, D, _), out_dtype, q, k, v = _prepare(q, k, v)
    n_splits = check_int("n_splits", n_splits, minimum=1)
    if mask is not None:
        mask = torch.as_tensor(mask, device=q.device)
        check_mask(mask, (*batch, H, T, S))
    scale = 1.0 / math.sqrt(D)
    outs, lses = [], []
    for j0, j1 in split_bounds(S, n_splits):  # on a GPU the pieces run in parallel
        piece_mask = mask if mask is None or mask.ndim == 0 or mask.shape[-1] == 1 else mask[..., j0:j1]
        out, lse = _attention_and_lse(q, k[..., j0:j1, :], v[..., j0:j1, :], piece_mask, scale)
        outs.append(out)
        lses.append(lse)
    out, lse = merge_attention(outs, lses)
    return (out.to(out_dtype), lse) if return_lse else out.to(out_dtype)


def ring_attention(q, k, v, *, n_devices, causal=False):
    """Ring attention (Liu et al. 2023), simulated: ``n_devices`` hold one block each, keys travel round a ring.

    ``q (..., H, T, D)``, ``k (..., H_kv, S, D)``, ``v (..., H_kv, S, Dv)``, ``H_kv`` dividing ``H``;
    scale ``1 / sqrt(D)``. Device ``r`` holds query block ``r`` and key/value block ``r`` (``n_devices
    >= 1`` contiguous blocks whose sizes differ by at most one); at each of ``n_devices`` steps it
    attends its queries to the block it holds, merges into its running ``(out, lse)`` with
    :func:`merge_attention` and passes the block to device ``r + 1``. ``causal=True`` is aligned
    bottom-right (query ``i`` sees key ``j`` iff ``j <= i + S - T``); blocks entirely in a query
    block's future are skipped. Returns ``(..., H, T, Dv)`` (``q``'s dtype), equal to
    ``scaled_dot_product_attention`` (with ``causal_mask(T, S)`` when causal).
    """
    (_, _, _, _, T, S, D, _), out_dtype, q, k, v = _prepare(q, k, v)
    n_devices = check_int("n_devices", n_devices, minimum=1)
    causal = check_flag("causal", causal)
    scale = 1.0 / math.sqrt(D)
    running = [None] * n_devices  # device r's (out, lse) so far
    for r, (i0, i1), (j0, j1) in ring_schedule(T, S, n_devices, causal):
        mask = None
        if causal:  # key j visible to query i iff j <= i + S - T
            mask = (torch.arange(j0, j1, device=q.device)[None, :]
                    <= torch.arange(i0, i1, device=q.device)[:, None] + S - T)
        part = _attention_and_lse(q[..., i0:i1, :], k[..., j0:j1, :], v[..., j0:j1, :], mask, scale)
        running[r] = part if running[r] is None else merge_attention(*zip(running[r], part))
    return torch.cat([out for out, _ in running], dim=-2).to(out_dtype)
