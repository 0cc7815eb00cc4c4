"""Attention without the T x S matrix, in PyTorch: FlashAttention-2 forward and backward.

Same algorithm and semantics as :mod:`transformer_ref.numpy.flash` (read its
docstring first). The torch version adds

* a ``torch.autograd.Function`` whose backward pass is FlashAttention-2's:
  it saves only ``q, k, v, out`` and the per-row log-sum-exp, and recomputes
  each probability tile ``P = exp(S - lse)`` when it needs it, so the backward
  pass also stays O(T) in memory besides one tile;
* device-agnostic code (everything runs where ``q`` lives, CUDA included);
* a forward pass whose key tiles cost two matrix products and two passes over the
  score tile (``exp`` and the row sum), with everything it needs allocated once per call:

  - the running max rides along in the first product: with ``K1 = [k * scale, 1]`` and
    ``Q1 = [q, -m]`` (one extra column each), ``K1 Q1^T = S - m``, so no pass subtracts it;
  - ``m`` starts as each query's score with the first key and is then kept, not raised
    tile by tile: ``exp(s - m) / l`` is the same softmax for any ``m`` shared by ``acc`` and
    ``l``, so the result stays exact while a tile needs no row max and no rescale. Only if a
    score exceeds ``m`` by so much that ``exp`` overflows (some ``acc`` or ``l`` is inf or
    nan, checked once per query tile) is that query tile computed again with the running
    max of the loop in :func:`flash_attention` (``exact``), which keeps every
    ``exp(s - m) <= 1``;
  - the score tile is stored transposed, keys down and queries across (``S^T = K1 Q1^T``,
    ``acc^T += V^T P^T``), so the per-query sums run down the columns, across contiguous
    queries;
  - a causal diagonal tile's mask is built once for all the tiles the diagonal crosses at
    the same point, and applied after ``exp`` (future entries set to 0: ``exp(-inf)`` is a
    slow path of the CPU's ``exp``) except where the tile's max is taken;
* float16/bfloat16 inputs: the forward loop runs in float32 (products, statistics,
  ``lse``) and the output keeps the input dtype; the backward pass multiplies in the
  input dtype and accumulates in float32.
"""

import math
from functools import lru_cache, partial

import torch

from .._checks import check_qkv, check_scale, check_tile, check_window
from .attention import _check_tensors, _result_dtype, scaled_dot_product_attention
from .masks import sliding_window_mask

__all__ = ["flash_attention", "sliding_window_attention"]

# Default tiles: 512 queries x 256 keys (a 0.5 MiB float32 tile), the best compromise of the
# shapes measured on the course CPU from T = S = 1024 to 8192, full and causal (D = 64, float32,
# one thread; bench_flash.py --sweep and --ratios, figures in benchmarks/README.md): taller
# query tiles help full attention a little and cost causal attention more (work wasted on
# diagonal tiles); smaller ones pay the per-op overhead more often.
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 256
# Query block of sliding_window_attention (benchmarks/bench_sliding_window.py).
DEFAULT_WINDOW_BLOCK = 128


def _future(n, width, shift, group, device, keys_first):
    """Bool ``(G * n, width)`` mask of a tile: True where column c > row r + shift.

    For the tile of queries ``i0 + r`` and keys ``j0 + c`` with ``shift = i0 + offset - j0``
    it marks the keys after query i's position ``i + offset``; it depends only on the tile's
    shape and where the diagonal crosses it, so a pass reuses it (:func:`_future_masks`).
    ``keys_first``: the transposed mask, ``(width, G * n)``, for a transposed score tile.
    """
    rows = torch.arange(n, device=device)[:, None] + shift
    cols = torch.arange(width, device=device)[None, :]
    mask = (cols > rows).repeat(group, 1)
    return mask.mT.contiguous() if keys_first else mask


def _future_masks(group, device, keys_first=False):
    """``_future`` for one pass, remembering the last four masks.

    With equal tiles a pass crosses the diagonal at one or two shifts, so each mask is built
    once; four boolean masks take the bytes of one float32 score tile, whatever the tiling.
    """
    return lru_cache(maxsize=4)(partial(_future, group=group, device=device, keys_first=keys_first))


def _tile(buffer, *shape):
    """A contiguous ``shape`` view of the first elements of the flat ``buffer``: a tile without allocating."""
    return buffer[: math.prod(shape)].view(shape)


class _FlashAttention(torch.autograd.Function):
    """Tiled attention on grouped tensors q (B, H_kv, G, T, D), k (B, H_kv, S, D), v (B, H_kv, S, Dv)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, bq, bk, scale):
        B, H_kv, G, T, D = q.shape
        S, Dv = v.shape[-2], v.shape[-1]
        BH = B * H_kv  # batch and KV heads in one axis: the batch of the products (bmm)
        # the loop computes in float32 for half inputs, else in the input dtype
        acc_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        new = partial(torch.empty, dtype=acc_dtype, device=q.device)
        out = torch.empty(B, H_kv, G, T, Dv, dtype=q.dtype, device=q.device)
        lse = new(B, H_kv, G, T)
        # K1 = [k * scale, 1] and Q1 = [q, -m]: one product K1 Q1^T gives every score minus its
        # row's running max m, so subtracting m costs no pass over the tile
        k1 = new(BH, S, D + 1)
        torch.mul(k.flatten(0, 1), scale, out=k1[..., :D])
        k1[..., D] = 1.0
        vt = v.flatten(0, 1).to(acc_dtype).mT  # (BH, Dv, S), a view for float32 inputs
        offset = S - T  # causal: query i sees keys j <= i + offset
        future = _future_masks(G, q.device, keys_first=True)  # (n, width, shift) -> bool (width, G*n)
        rows, width = G * min(bq, T), min(bk, S)  # a full tile: queries (the group's heads stacked), keys
        # made once: the views of each key tile, a row of ones (1^T P^T = the column sums of P^T),
        # the transposed score tile (keys x queries), Q1, the accumulator acc^T and l
        key_tiles = [(j0, k1[:, j0 : j0 + bk], vt[:, :, j0 : j0 + bk]) for j0 in range(0, S, bk)]
        ones = torch.ones(BH, 1, width, dtype=acc_dtype, device=q.device)
        scores_buf, q1_buf, acc_buf, l_buf = new(BH * rows * width), new(BH * rows * (D + 1)), new(BH * rows * Dv), new(BH * rows)
        for i0 in range(0, T, bq):
            i1 = min(i0 + bq, T)
            n = i1 - i0
            q1 = _tile(q1_buf, BH, G * n, D + 1)
            q1[..., :D] = q[:, :, :, i0:i1].reshape(BH, G * n, D)
            neg_m = q1[..., D:].mT  # (BH, 1, G*n): -m, the running max, one per query
            acc, l, full_tile = _tile(acc_buf, BH, Dv, G * n), _tile(l_buf, BH, 1, G * n), _tile(scores_buf, BH, width, G * n)
            k_end = min(S, i1 + offset) if causal else S
            # m starts as each query's score with the first key: never above its row's max, so
            # l >= 1 for every query that sees key 0 (causal with T > S: queries i < T - S see no
            # key at all; their P, l and acc stay 0)
            neg_m.zero_()
            torch.neg(torch.bmm(k1[:, :1], q1.mT), out=neg_m)
            # First pass: m stays (no row max, no rescale): any m gives the same softmax
            # exp(s - m) / l, so the result is exact unless a score exceeded m by so much that
            # exp overflowed; then the block is redone with FlashAttention-2's running max
            # (exact=True), which keeps every exp(s - m) <= 1.
            for exact in (False, True):
                acc.zero_(), l.zero_()
                for j0, k_j, vt_j in key_tiles:
                    if j0 >= k_end:  # causal: the rest lies in the future
                        break
                    w = min(bk, k_end - j0)
                    s, ones_j = full_tile, ones
                    if w < width:  # a ragged last tile
                        k_j, vt_j, ones_j, s = k_j[:, :w], vt_j[..., :w], ones[..., :w], _tile(scores_buf, BH, w, G * n)
                    torch.bmm(k_j, q1.mT, out=s)  # S^T - m = scale k.q - m, (BH, keys, queries)
                    mask = future(n, w, i0 + offset - j0) if causal and j0 + w - 1 > i0 + offset else None
                    if exact:  # m_new = max(m, colmax(S^T)); old l and acc rescaled by exp(m - m_new)
                        if mask is not None:
                            s.masked_fill_(mask, -math.inf)
                        rise = torch.amax(s, dim=1, keepdim=True).clamp_(min=0.0)  # m_new - m
                        s.sub_(rise).exp_()  # P = exp(S - m_new)
                        neg_m.sub_(rise)
                        alpha = rise.neg_().exp_()  # exp(m - m_new)
                        l.mul_(alpha)
                        acc.mul_(alpha)
                    else:
                        s.exp_()  # P = exp(S - m)
                        if mask is not None:
                            s.masked_fill_(mask, 0.0)  # future keys weigh nothing (after exp: no exp(-inf))
                    l.baddbmm_(ones_j, s)  # l += colsum(P^T)
                    acc.baddbmm_(vt_j, s)  # acc^T += V_j^T P^T
                if exact or torch.isfinite(l.sum() + acc.sum()):  # an inf or nan anywhere makes the sum one
                    break
            grouped = partial(torch.Tensor.view, size=(B, H_kv, G, n, -1))  # (BH, ., G*n) -> (B, H_kv, G, n, .)
            torch.sub(grouped(l.mT.log()), grouped(neg_m.mT), out=lse[:, :, :, i0:i1, None])  # m + log l; unseen rows: -inf
            if causal and i0 + offset < 0:  # some queries saw no key: acc = 0 stays 0
                l.masked_fill_(l == 0, 1.0)
            torch.div(grouped(acc.mT), grouped(l.mT), out=out[:, :, :, i0:i1])  # the single division
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (causal, bq, bk, scale)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        """FlashAttention-2 backward: key tiles outside, query tiles inside, P recomputed from lse.

        With P = exp(S - lse), dO the incoming gradient and D_i = rowsum(dO_i * O_i):
        dV_j += P^T dO_i,  dP = dO_i V_j^T,  dS = P * (dP - D_i + dlse_i),
        dQ_i += scale dS K_j,  dK_j += scale dS^T Q_i.
        """
        q, k, v, out, lse = ctx.saved_tensors
        causal, bq, bk, scale = ctx.config
        B, H_kv, G, T, D = q.shape
        S, Dv = v.shape[-2], v.shape[-1]
        acc_dtype = lse.dtype
        offset = S - T
        future = _future_masks(G, q.device)  # (n, width, shift) -> bool (G*n, width)
        # D_i - dlse_i: the row term of dS, (B, H_kv, G, T), float32 (unused outputs get zero grads)
        row_term = (d_out.to(acc_dtype) * out.to(acc_dtype)).sum(dim=-1) - d_lse.to(acc_dtype)
        lse_safe = lse.masked_fill(lse == -math.inf, math.inf)  # rows that see nothing: P = 0
        dq = torch.zeros(B, H_kv, G, T, D, dtype=acc_dtype, device=q.device)
        dk = torch.zeros(B, H_kv, S, D, dtype=acc_dtype, device=q.device)
        dv = torch.zeros(B, H_kv, S, Dv, dtype=acc_dtype, device=q.device)
        for j0 in range(0, S, bk):
            j1 = min(j0 + bk, S)
            k_tile, v_tile = k[:, :, j0:j1], v[:, :, j0:j1]
            # causal: the first query that sees key j0 is i = j0 - offset
            i_start = max(0, j0 - offset) // bq * bq if causal else 0
            for i0 in range(i_start, T, bq):
                i1 = min(i0 + bq, T)
                n = i1 - i0
                q_tile = q[:, :, :, i0:i1].reshape(B, H_kv, G * n, D)
                do_tile = d_out[:, :, :, i0:i1].reshape(B, H_kv, G * n, Dv)
                s = (q_tile @ k_tile.transpose(-1, -2)).to(acc_dtype).mul_(scale)
                if causal and j1 - 1 > i0 + offset:
                    s.masked_fill_(future(n, j1 - j0, i0 + offset - j0), -math.inf)
                p = s.sub_(lse_safe[:, :, :, i0:i1].reshape(B, H_kv, G * n, 1)).exp_()  # (B, H_kv, G*n, bk)
                dv[:, :, j0:j1] += (p.transpose(-1, -2).to(q.dtype) @ do_tile).to(acc_dtype)
                dp = (do_tile @ v_tile.transpose(-1, -2)).to(acc_dtype)
                ds = p.mul_(dp.sub_(row_term[:, :, :, i0:i1].reshape(B, H_kv, G * n, 1))).mul_(scale)
                ds_low = ds.to(q.dtype)
                dq[:, :, :, i0:i1] += (ds_low @ k_tile).to(acc_dtype).reshape(B, H_kv, G, n, D)
                dk[:, :, j0:j1] += (ds_low.transpose(-1, -2) @ q_tile).to(acc_dtype)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def flash_attention(q, k, v, *, causal=False, block_q=None, block_k=None, scale=None, return_lse=False):
    """Exact attention ``softmax(q k^T * scale) v`` computed tile by tile, never holding T x S.

    Taught in chapter 6, section 'Tiling: the FlashAttention-2 loop'.

    Shapes: ``q (..., H, T, D)``, ``k (..., H_kv, S, D)``, ``v (..., H_kv, S, Dv)``
    with ``H_kv`` dividing ``H`` (GQA: query head h reads KV head
    ``h // (H / H_kv)``; K and V are never repeated, the query heads of a group
    are stacked instead). Returns ``out (..., H, T, Dv)`` in the input dtype
    and, when ``return_lse``, also ``lse (..., H, T)`` =
    ``log sum_j exp(scale q_i . k_j)`` (natural log, float32 for half inputs).

    FlashAttention-2 loop order: query tiles outside, key tiles inside, running
    max ``m``, running sum ``l``, unnormalised accumulator ``acc``::

        m_new = max(m, rowmax(S_ij));  P = exp(S_ij - m_new)
        l   = exp(m - m_new) * l   + rowsum(P)
        acc = exp(m - m_new) * acc + P @ V_j
        out = acc / l                      (once, after the last key tile)

    The forward pass first keeps ``m`` at each row's score with the first key
    instead of raising it (the factor ``exp(m - m_new)`` is then 1 and the row max
    is never taken; the ratios ``acc / l`` do not depend on ``m``), and runs the
    loop above for a query tile only if that overflowed (module docstring).

    ``causal=True`` is aligned bottom-right (query i sees key j iff
    ``j <= i + S - T``); fully future key tiles are skipped and only diagonal
    tiles are masked; rows that see no key give zeros and ``lse = -inf``.

    Differentiable in ``q``, ``k``, ``v`` (and through ``lse``) with the
    FlashAttention-2 backward pass, which recomputes each probability tile from
    the saved ``lse``. Peak extra memory, forward or backward: O(T) per head
    plus one ``batch * H * block_q * block_k`` float32 score tile (and its
    gradient tile in the backward) and, causal, at most four boolean masks of
    diagonal tiles (the bytes of one more float32 tile).
    ``block_q``/``block_k`` default to 512 and 256 (measured on the course
    CPU) and are clipped to T and S.
    """
    _check_tensors(q, k, v)
    batch, H, H_kv, group, T, S, D, Dv = check_qkv(q, k, v, grouped=True)
    scale = check_scale(scale, D)
    bq = check_tile("block_q", block_q, DEFAULT_BLOCK_Q, T)
    bk = check_tile("block_k", block_k, DEFAULT_BLOCK_K, S)
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if not dtype.is_floating_point:  # integer input computes in float32, like scaled_dot_product_attention
        dtype = torch.float32
    B = math.prod(batch)
    out, lse = _FlashAttention.apply(
        q.to(dtype).reshape(B, H_kv, group, T, D),
        k.to(dtype).reshape(B, H_kv, S, D),
        v.to(dtype).reshape(B, H_kv, S, Dv),
        bool(causal),
        bq,
        bk,
        scale,
    )
    out = out.reshape(*batch, H, T, Dv)
    if return_lse:
        return out, lse.reshape(*batch, H, T)
    return out


def sliding_window_attention(q, k, v, window, *, block=None, scale=None):
    """Causal local attention: query i attends to the ``window`` keys ``i-W+1 .. i``.

    Taught in chapter 6, section 'Sliding-window attention'.

    Shapes as in :func:`flash_attention`: ``q (..., H, T, D)``,
    ``k (..., H_kv, S, D)``, ``v (..., H_kv, S, Dv)`` -> ``(..., H, T, Dv)``,
    ``S >= T``. The window includes the current token (W = 1 returns ``v``
    itself) and is aligned bottom-right: query i sees key j iff
    ``i + S - T - W < j <= i + S - T`` (the mask of ``sliding_window_mask``).

    Queries are processed in blocks of ``block`` rows (default 128); a block
    ``[i0, i1)`` is attended against only its key band
    ``[i0 + S - T - W + 1, i1 + S - T)`` with the band's own sliding-window
    mask: the work is O(T * (W + block)) = O(T * W) and, besides the output,
    one block's ``block x (W + block - 1)`` scores are alive at a time, never T x S.
    Differentiable through ordinary autograd, which keeps every block's
    weights for the backward pass: O(T * (W + block)) in all, still not T x S. ``scale`` defaults to ``1 / sqrt(D)``.
    """
    _check_tensors(q, k, v)
    batch, H, H_kv, group, T, S, D, Dv = check_qkv(q, k, v, grouped=True)
    window = check_window(window, T, S)
    scale = check_scale(scale, D)
    bq = check_tile("block", block, DEFAULT_WINDOW_BLOCK, T)
    # GQA: (B, H_kv, G, T, D) queries against (B, H_kv, 1, S, D) keys (broadcast, no copy)
    B = math.prod(batch)
    qg = q.reshape(B, H_kv, group, T, D)
    kg = k.reshape(B, H_kv, 1, S, D)
    vg = v.reshape(B, H_kv, 1, S, Dv)
    offset = S - T
    out = torch.empty(B, H_kv, group, T, Dv, dtype=_result_dtype(q), device=q.device)  # integer q: float32
    for i0 in range(0, T, bq):
        i1 = min(i0 + bq, T)
        b0, b1 = max(0, i0 + offset - window + 1), i1 + offset  # the band of keys
        # row r of the block and key c of the band are aligned bottom-right,
        # exactly like query i and key j in the full sliding-window mask
        mask = sliding_window_mask(i1 - i0, window, S=b1 - b0, device=q.device)
        out[:, :, :, i0:i1] = scaled_dot_product_attention(  # autograd records the slice copy
            qg[:, :, :, i0:i1], kg[:, :, :, b0:b1], vg[:, :, :, b0:b1], mask, scale=scale
        )
    return out.reshape(*batch, H, T, Dv)
