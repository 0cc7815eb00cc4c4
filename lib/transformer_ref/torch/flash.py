"""Attention without the T x S matrix, in PyTorch: FlashAttention-2 forward and backward.

Same algorithm and semantics as :mod:`transformer_ref.numpy.flash` (read its
docstring first). The torch version adds

* a ``torch.autograd.Function`` whose backward pass is FlashAttention-2's:
  it saves only ``q, k, v, out`` and the per-row log-sum-exp, and recomputes
  each probability tile ``P = exp(S - lse)`` when it needs it, so the backward
  pass also stays O(T) in memory besides one tile;
* device-agnostic code (everything runs where ``q`` lives, CUDA included);
* a forward pass whose key tiles cost two matrix products, one ``exp`` pass over the score
  tile and a product for its column sums, with everything it needs allocated once per call:

  - the running max rides along in the first product: with ``K1 = [k * scale, 1]`` and
    ``Q1 = [q, -m]`` (one extra column each), ``K1 Q1^T = S - m``, so no pass subtracts it;
  - ``m`` starts as each query's score with the first key and is then kept, not raised
    tile by tile: ``exp(s - m) / l`` is the same softmax for any ``m`` shared by ``acc`` and
    ``l``, so the result stays exact while a tile needs no row max and no rescale. Only if a
    score exceeds ``m`` by so much that ``exp`` overflows (an inf or nan in ``out`` or
    ``lse``, checked once per call) is the call computed again with the running max of the
    loop in :func:`flash_attention` (``exact``), which keeps every ``exp(s - m) <= 1``;
  - the score tile is stored transposed, keys down and queries across (``S^T = K1 Q1^T``,
    ``acc^T += V^T P^T``), so the per-query sums run down the columns, across contiguous
    queries; the group's query heads are stacked query-major (column ``r * G + g``), so the
    queries from any row on are a contiguous block of columns;
  - causal: a tile that crosses the diagonal is cut to the queries that see its first key
    and the keys its last query sees, so only a triangle of it is wasted; its 0/1 mask is
    built once for all the tiles the diagonal crosses at the same point, and multiplies
    ``P`` after ``exp`` (``exp(-inf)`` is a slow path of the CPU's ``exp``) except where
    the tile's max is taken;
  - the views of the buffers for a query tile are made once per tile height
    (:class:`_QueryTile`): every op, a view included, has a fixed dispatch cost whatever
    its size, which weighs most at small T;
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


def _visible(n, width, shift, dtype, device, keys_first):
    """0/1 ``(n, width)`` mask of a tile (``dtype``): 1 where key column c <= query row r + shift.

    For the tile of queries ``i0 + r`` and keys ``j0 + c`` with ``shift = i0 + offset - j0``
    it marks the keys query i may see (``j <= i + offset``); it depends only on the tile's
    shape and where the diagonal crosses it, so a pass reuses it (:func:`_visible_masks`).
    ``keys_first``: the transposed mask, ``(width, n, 1)``, for a transposed score tile whose
    query columns hold the group's heads innermost (it broadcasts over them).
    """
    if keys_first:  # rows c, columns r: keep r - c >= -shift
        return torch.ones(width, n, dtype=dtype, device=device).triu_(-shift)[:, :, None]
    return torch.ones(n, width, dtype=dtype, device=device).tril_(shift)  # keep c - r <= shift


def _visible_masks(dtype, device, keys_first=False):
    """``_visible`` for one pass, remembering the last four masks (each at most one score tile)."""
    return lru_cache(maxsize=4)(partial(_visible, dtype=dtype, device=device, keys_first=keys_first))


def _grouped(x, shape):
    """A query-major ``(BH, C, n*G)`` tile as ``(B, H_kv, G, n, C)``: the layout of out and lse."""
    return x.mT.view(*shape, -1).transpose(2, 3)


def _tile(buffer, *shape):
    """A contiguous ``shape`` view of the first elements of the flat ``buffer``: a tile without allocating."""
    return buffer[: math.prod(shape)].view(shape)


class _QueryTile:
    """The forward's views of its buffers for a tile of ``n`` queries, made once per tile height.

    ``buffers`` (flat: score tile S^T, Q1, acc^T, l; and the row of ones) are allocated once
    per call for the tallest tile; ``sizes = (B, H_kv, G, D, Dv, width)``. Q1 is query-major:
    row ``r * G + g`` holds query r of the group's head g, so the queries from r on are the
    rows from ``r * G`` on, and ``part`` (:meth:`_part`, cached) cuts every view to them.
    """

    def __init__(self, buffers, sizes, n):
        scores, q1, acc, l, ones = buffers
        B, H_kv, G, D, Dv, width = sizes
        BH, cols = B * H_kv, n * G
        q1 = _tile(q1, BH, cols, D + 1)
        self.q_in = q1.view(B, H_kv, n, G, D + 1)[..., :D]  # where the tile of q is copied
        self.q_t, self.q1t, self.neg_m = q1[..., :D].mT, q1.mT, q1[..., D:].mT  # Q^T, Q1^T, -m (BH, 1, cols)
        self.acc, self.l = _tile(acc, BH, Dv, cols), _tile(l, BH, 1, cols)  # acc^T, l
        grouped = partial(_grouped, shape=(B, H_kv, n, G))  # in the layout of out and lse
        self.acc_out, self.l_out, self.neg_m_out = grouped(self.acc), grouped(self.l), grouped(self.neg_m)
        self.part = lru_cache(maxsize=None)(partial(self._part, scores, ones, BH, G, n))

    def _part(self, scores, ones, BH, G, n, r, w):
        """The score tile, ones, Q1^T, acc^T and l of queries r.. against w keys (a cut or ragged tile)."""
        c = r * G
        return _tile(scores, BH, w, (n - r) * G), ones[..., :w], self.q1t[..., c:], self.acc[..., c:], self.l[..., c:]


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
        lse = new(B, H_kv, G, T, 1)
        # K1 = [k * scale, 1] and Q1 = [q, -m]: one product K1 Q1^T gives every score minus its
        # query's max m, so subtracting m costs no pass over the tile
        k1 = new(BH, S, D + 1)
        torch.mul(k.flatten(0, 1), scale, out=k1[..., :D])
        k1[..., D] = 1.0
        vt = v.flatten(0, 1).to(acc_dtype).mT  # (BH, Dv, S), a view for float32 inputs
        offset = S - T  # causal: query i sees keys j <= i + offset
        visible = _visible_masks(acc_dtype, q.device, keys_first=True)  # (n, width, shift) -> (width, n, 1)
        rows, width = G * min(bq, T), min(bk, S)  # a full tile: queries (with the group's heads), keys
        # made once: the views of each key tile, a row of ones (1^T P^T = the column sums of P^T),
        # the buffers of the transposed score tile (keys x queries), Q1, acc^T and l, and their
        # views for each height of query tile (the full one and a ragged last one)
        key_tiles = [(j0, k1[:, j0 : j0 + bk], vt[:, :, j0 : j0 + bk]) for j0 in range(0, S, bk)]
        ones = torch.ones(BH, 1, width, dtype=acc_dtype, device=q.device)
        buffers = (new(BH * rows * width), new(BH * rows * (D + 1)), new(BH * rows * Dv), new(BH * rows), ones)
        query_tile = lru_cache(maxsize=2)(partial(_QueryTile, buffers, (B, H_kv, G, D, Dv, width)))
        k0 = k1[:, :1, :D]
        # First pass: m stays (no row max, no rescale): any m gives the same softmax
        # exp(s - m) / l, so the result is exact unless a score exceeded m by so much that exp
        # overflowed (an inf or nan in out or lse); then the call is redone with FlashAttention-2's
        # running max (exact=True), which keeps every exp(s - m) <= 1.
        for exact in (False, True):
            for i0 in range(0, T, bq):
                i1 = min(i0 + bq, T)
                t = query_tile(i1 - i0)
                t.q_in.copy_(q[:, :, :, i0:i1].transpose(2, 3))
                # m starts as each query's score with the first key: never above its max, so
                # l >= 1 for every query that sees key 0 (causal with T > S: queries i < T - S
                # see no key at all; their P, l and acc stay 0)
                torch.bmm(k0, t.q_t, out=t.neg_m).neg_()
                t.acc.zero_(), t.l.zero_()
                k_end = min(S, i1 + offset) if causal else S
                for j0, k_j, vt_j in key_tiles:
                    if j0 >= k_end:  # causal: the rest lies in the future
                        break
                    a, w = i0, k_j.shape[1]
                    if causal and j0 + w - 1 > i0 + offset:  # a diagonal tile: cut to the part seen
                        a = max(i0, j0 - offset)  # the first query that sees key j0
                        if k_end - j0 < w:  # the keys the last query sees
                            w = k_end - j0
                            k_j, vt_j = k_j[:, :w], vt_j[..., :w]
                    s, ones_j, q1t_j, acc_j, l_j = t.part(a - i0, w)
                    torch.bmm(k_j, q1t_j, out=s)  # S^T - m = scale k.q - m, (BH, keys, queries)
                    mask = visible(i1 - a, w, a + offset - j0) if causal and j0 + w - 1 > a + offset else None
                    if exact:  # m_new = max(m, colmax(S^T)); old l and acc rescaled by exp(m - m_new)
                        if mask is not None:
                            s.view(BH, w, i1 - a, G).masked_fill_(mask == 0, -math.inf)
                        rise = torch.amax(s, dim=1, keepdim=True).clamp_(min=0.0)  # m_new - m
                        s.sub_(rise).exp_()  # P = exp(S - m_new)
                        q1t_j[:, D:].sub_(rise)
                        alpha = rise.neg_().exp_()  # exp(m - m_new)
                        l_j.mul_(alpha)
                        acc_j.mul_(alpha)
                    else:
                        s.exp_()  # P = exp(S - m)
                        if mask is not None:  # future keys weigh nothing (after exp: no exp(-inf))
                            s.view(BH, w, i1 - a, G).mul_(mask)
                    l_j.baddbmm_(ones_j, s)  # l += colsum(P^T)
                    acc_j.baddbmm_(vt_j, s)  # acc^T += V_j^T P^T
                torch.sub(torch.log(t.l_out), t.neg_m_out, out=lse[:, :, :, i0:i1])  # m + log l; unseen: -inf
                torch.div(t.acc_out, t.l_out, out=out[:, :, :, i0:i1])  # the single division
            if causal and offset < 0:  # queries that saw no key: 0 / 0 -> 0
                out[:, :, :, :-offset] = 0.0
            if exact or torch.isfinite(out.sum() + lse.amax()):  # an inf or nan anywhere makes the sum one
                break
        lse = lse.squeeze(-1)
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
        visible = _visible_masks(acc_dtype, q.device)  # (n, width, shift) -> 0/1 (n, width)
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
                    s.view(B, H_kv, G, n, -1).masked_fill_(visible(n, j1 - j0, i0 + offset - j0) == 0, -math.inf)
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
    loop above only if that overflowed (module docstring).

    ``causal=True`` is aligned bottom-right (query i sees key j iff
    ``j <= i + S - T``); fully future key tiles are skipped, and a tile that
    crosses the diagonal is cut to the queries and keys that see each other and
    masked there; rows that see no key give zeros and ``lse = -inf``.

    Differentiable in ``q``, ``k``, ``v`` (and through ``lse``) with the
    FlashAttention-2 backward pass, which recomputes each probability tile from
    the saved ``lse``. Peak extra memory, forward or backward: O(T) per head
    plus one ``batch * H * block_q * block_k`` float32 score tile (and its
    gradient tile in the backward) and, causal, at most four 0/1 masks of
    diagonal tiles, each ``block_q x block_k`` at most.
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
