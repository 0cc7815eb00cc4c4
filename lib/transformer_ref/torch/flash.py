"""Attention without the T x S matrix, in PyTorch: FlashAttention-2 forward and backward.

Same algorithm and semantics as :mod:`transformer_ref.numpy.flash` (read its
docstring first). The torch version adds

* a ``torch.autograd.Function`` whose backward pass is FlashAttention-2's:
  it saves only ``q, k, v, out`` and the per-row log-sum-exp, and recomputes
  each probability tile ``P = exp(S - lse)`` when it needs it, so the backward
  pass also stays O(T) in memory besides one tile;
* device-agnostic code (everything runs where ``q`` lives, CUDA included);
* the exponentials in base 2: ``log2(e)`` is folded into the scale of ``Q K^T`` and
  ``exp2(S2 - m)`` gives the same ``P`` as ``exp(S - m)`` at about half the cost on the CPU;
* a forward pass that allocates its tiles once (scores, accumulator, ``m``, ``l``),
  transposes K once, and updates the tiles in place with fused products (``baddbmm``),
  so that each key tile costs two matrix products and four passes over the score tile
  (row max, subtract, ``exp2``, row sum); the causal mask of a diagonal tile is built
  once for all the tiles the diagonal crosses at the same point;
* float16/bfloat16 inputs: the matrix products run in the input dtype, the
  softmax statistics (``m``, ``l``, ``lse``) and the accumulators in float32,
  and the output keeps the input dtype.
"""

import math
from functools import lru_cache, partial

import torch

from .._checks import check_qkv, check_scale, check_tile, check_window
from .attention import _check_tensors, _result_dtype, scaled_dot_product_attention
from .masks import sliding_window_mask

__all__ = ["flash_attention", "sliding_window_attention"]

# Default tiles: the fastest shape on the course CPU at every T = S from 1024 to 8192, full
# and causal (D = 64, float32, one thread; bench_flash.py --sweep and --ratios, figures in
# benchmarks/README.md). Smaller tiles pay the Python and per-op overhead more often; larger
# ones leave the L2 cache and waste more work on causal diagonal tiles. The 1 MiB float32
# tile keeps peak memory < 1 % of the naive version's at T = S = 8192.
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512
# Query block of sliding_window_attention (benchmarks/bench_sliding_window.py).
DEFAULT_WINDOW_BLOCK = 128
LOG2_E = math.log2(math.e)  # exp(x) = exp2(x * LOG2_E)
LN_2 = math.log(2.0)  # log(x) = log2(x) * LN_2


def _future(n, width, shift, group, device):
    """Bool ``(G * n, width)`` mask of a tile: True where column c > row r + shift.

    For the tile of queries ``i0 + r`` and keys ``j0 + c`` with ``shift = i0 + offset - j0``
    it marks the keys after query i's position ``i + offset``; it depends only on the tile's
    shape and where the diagonal crosses it, so a pass reuses it (:func:`_future_masks`).
    """
    rows = torch.arange(n, device=device)[:, None] + shift
    cols = torch.arange(width, device=device)[None, :]
    return (cols > rows).repeat(group, 1)


def _future_masks(group, device):
    """``_future`` for one pass, remembering the last four masks.

    With equal tiles a pass crosses the diagonal at one or two shifts, so each mask is built
    once; four boolean masks take the bytes of one float32 score tile, whatever the tiling.
    """
    return lru_cache(maxsize=4)(partial(_future, group=group, device=device))


def _tile(buffer, *shape):
    """A contiguous ``shape`` view of the first elements of the flat ``buffer``: a tile without allocating."""
    return buffer[: math.prod(shape)].view(shape)


def _baddbmm_(out, a, b, *, beta=1.0, alpha=1.0):
    """``out = beta * out + alpha * (a @ b)`` in place (beta = 0 ignores out's old contents).

    ``out`` holds float32 statistics for half inputs: the product then runs in a's dtype and is
    added in float32; otherwise it is one fused BLAS call writing straight into ``out``.
    """
    if a.dtype == out.dtype:
        return out.baddbmm_(a, b, beta=beta, alpha=alpha)
    product = (a @ b).to(out.dtype)
    return out.copy_(product.mul_(alpha)) if beta == 0 else out.mul_(beta).add_(product, alpha=alpha)


class _FlashAttention(torch.autograd.Function):
    """Tiled attention on grouped tensors q (B, H_kv, G, T, D), k (B, H_kv, S, D), v (B, H_kv, S, Dv)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, bq, bk, scale):
        B, H_kv, G, T, D = q.shape
        S, Dv = v.shape[-2], v.shape[-1]
        BH = B * H_kv  # batch and KV heads in one axis: the batch of the fused products (baddbmm)
        # statistics and accumulators: float32 for half inputs, else the input dtype
        acc_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        new = partial(torch.empty, dtype=acc_dtype, device=q.device)
        out = torch.empty(B, H_kv, G, T, Dv, dtype=q.dtype, device=q.device)
        lse = new(B, H_kv, G, T)
        # K transposed once, (BH, D, S) contiguous: every Q K_j^T product reads its columns in order
        kt, vf = k.flatten(0, 1).mT.contiguous(), v.flatten(0, 1)  # (BH, D, S), (BH, S, Dv)
        offset = S - T  # causal: query i sees keys j <= i + offset
        future = _future_masks(G, q.device)  # (n, width, shift) -> bool (G*n, width)
        # Base 2: with S2 = S * log2(e), exp(S - m) = exp2(S2 - m2), and exp2 is about twice as
        # fast as exp on the CPU (FlashAttention's CUDA kernels do the same); m is in base-2 units.
        scale2 = scale * LOG2_E
        # every tile is allocated once and reused: scores S/P, accumulator acc, statistics m, l, alpha
        rows = G * min(bq, T)  # query rows of a full tile, the group's heads stacked
        scores_buf, acc_buf = new(BH * rows * min(bk, S)), new(BH * rows * Dv)
        m_buf, m_new_buf, l_buf, rowsum_buf, alpha_buf = new(5, BH * rows)
        for i0 in range(0, T, bq):
            i1 = min(i0 + bq, T)
            n = i1 - i0
            q_tile = q[:, :, :, i0:i1].reshape(BH, G * n, D)  # the group's heads stacked
            acc = _tile(acc_buf, BH, G * n, Dv).zero_()  # (BH, G*n, Dv), unnormalised output
            m, m_new, l, rowsum, alpha = (_tile(b, BH, G * n, 1) for b in (m_buf, m_new_buf, l_buf, rowsum_buf, alpha_buf))
            m.fill_(-math.inf)
            l.zero_()
            k_end = min(S, i1 + offset) if causal else S
            # causal with T > S: rows i < T - S see no key at all, their max stays -inf
            unseen_rows = causal and i0 + offset < 0
            for j0 in range(0, max(k_end, 0), bk):
                j1 = min(j0 + bk, k_end)
                s = _tile(scores_buf, BH, G * n, j1 - j0)  # (BH, G*n, j1-j0)
                _baddbmm_(s, q_tile, kt[:, :, j0:j1], beta=0, alpha=scale2)  # S2 = Q_i K_j^T scale log2(e)
                if causal and j1 - 1 > i0 + offset:  # only tiles crossing the diagonal are masked
                    s.masked_fill_(future(n, j1 - j0, i0 + offset - j0), -math.inf)
                torch.maximum(m, torch.amax(s, dim=-1, keepdim=True, out=m_new), out=m_new)  # max(m, rowmax)
                if unseen_rows:
                    m_new.masked_fill_(m_new == -math.inf, 0.0)  # exp2(-inf - 0) = 0: P and l stay 0
                s.sub_(m_new).exp2_()  # P = exp2(S2 - m_new), in place
                torch.sub(m, m_new, out=alpha).exp2_()  # alpha = exp2(m - m_new) rescales the old l and acc
                torch.addcmul(torch.sum(s, dim=-1, keepdim=True, out=rowsum), alpha, l, out=l)  # rowsum(P) + alpha l
                _baddbmm_(acc.mul_(alpha), s.to(v.dtype), vf[:, j0:j1])  # acc = alpha acc + P V_j
                m, m_new = m_new, m  # the new max becomes the running one (no copy)
            acc.div_(torch.where(l > 0, l, 1.0))  # the single division; rows that saw nothing stay 0
            out[:, :, :, i0:i1] = acc.view(B, H_kv, G, n, Dv)
            lse[:, :, :, i0:i1] = ((m + torch.log2(l)) * LN_2).view(B, H_kv, G, n)  # unseen rows: -inf
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

    ``causal=True`` is aligned bottom-right (query i sees key j iff
    ``j <= i + S - T``); fully future key tiles are skipped and only diagonal
    tiles are masked; rows that see no key give zeros and ``lse = -inf``.

    Differentiable in ``q``, ``k``, ``v`` (and through ``lse``) with the
    FlashAttention-2 backward pass, which recomputes each probability tile from
    the saved ``lse``. Peak extra memory, forward or backward: O(T) per head
    plus one ``batch * H * block_q * block_k`` float32 score tile (and its
    gradient tile in the backward) and, causal, at most four boolean masks of
    diagonal tiles (the bytes of one more float32 tile).
    ``block_q``/``block_k`` default to 512 and 512 (fastest measured on the
    course CPU) and are clipped to T and S.
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
