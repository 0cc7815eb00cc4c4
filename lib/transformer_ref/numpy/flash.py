"""Attention without the T x S matrix: FlashAttention tiling and sliding-window attention.

``flash_attention`` computes exactly ``softmax(q k^T * scale) v`` (optionally
causal) but walks the score matrix tile by tile with an *online softmax*
(Milakov & Gimelshein 2018, arXiv:1805.02867; Dao et al. 2022,
FlashAttention, arXiv:2205.14135; Dao 2023, FlashAttention-2, arXiv:2307.08691). For every query row it keeps three running quantities while
the key tiles go by:

* ``m``   the largest score seen so far,
* ``l``   ``sum_j exp(s_j - m)`` over the keys seen so far,
* ``acc`` ``sum_j exp(s_j - m) v_j`` (unnormalised output).

When a new tile raises the maximum from ``m_old`` to ``m_new``, the old ``l``
and ``acc`` are multiplied by ``exp(m_old - m_new)``; after the last tile the
output is ``acc / l`` (one division per row) and ``lse = m + log(l)``.

``sliding_window_attention`` is causal local attention: each query block is
attended against only the band of keys its rows can see, so work and memory are
O(T * W) instead of O(T * S).
"""

import math

import numpy as np

from .._checks import check_qkv, check_scale, check_tile, check_window
from .attention import scaled_dot_product_attention
from .masks import sliding_window_mask

__all__ = ["flash_attention", "sliding_window_attention"]

# Default tiles, measured on the course machine (T = S = 8192, D = 64, float32;
# see benchmarks/README.md): 256 x 1024 and larger tiles all ran ~3-4x faster
# than the naive version (which streams four 256 MiB arrays through memory);
# the 1 MiB float32 tile fits in the L2 cache, keeps peak memory < 1 % of the
# naive version's and wastes little work on causal diagonal tiles.
DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 1024
# Query block of sliding_window_attention (benchmarks/bench_sliding_window.py).
DEFAULT_WINDOW_BLOCK = 128


def flash_attention(q, k, v, *, causal=False, block_q=None, block_k=None, scale=None, return_lse=False):
    """Exact attention ``softmax(q k^T * scale) v`` computed tile by tile, never holding T x S.

    Taught in chapter 6, section 'Tiling: the FlashAttention-2 loop'.

    Shapes: ``q (..., H, T, D)``, ``k (..., H_kv, S, D)``, ``v (..., H_kv, S, Dv)``
    with ``H_kv`` dividing ``H`` (GQA: query head h reads KV head
    ``h // (H / H_kv)``; K and V are never repeated, the query heads of a group
    are stacked instead). Returns ``out (..., H, T, Dv)`` and, when
    ``return_lse``, also ``lse (..., H, T)`` = ``log sum_j exp(scale q_i . k_j)``
    (natural log, over the keys row i may see).

    FlashAttention-2 loop order: query tiles outside, key tiles inside, for
    each row a running max ``m``, running sum ``l`` and unnormalised
    accumulator ``acc``::

        m_new = max(m, rowmax(S_ij));  P = exp(S_ij - m_new)
        l   = exp(m - m_new) * l   + rowsum(P)
        acc = exp(m - m_new) * acc + P @ V_j
        out = acc / l                      (once, after the last key tile)

    ``causal=True`` is aligned bottom-right: query i sees key j iff
    ``j <= i + S - T``. Key tiles that lie entirely in the future of a query
    tile are skipped, only tiles crossing the diagonal are masked. Rows that see
    no key (possible when T > S) return zeros and ``lse = -inf``.

    Memory: besides the output and ``lse`` (``batch * H * T`` rows), the
    largest intermediate is one score tile of ``batch * H * block_q * block_k``
    elements (all heads of a query tile at once), allocated once and reused;
    ``P = exp(S - m)`` overwrites it in place. ``block_q``/``block_k`` default to
    256 and 1024 (fastest measured for NumPy on the course machine) and are
    clipped to T and S.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    batch, H, H_kv, group, T, S, D, Dv = check_qkv(q, k, v, grouped=True)
    scale = check_scale(scale, D)
    bq = check_tile("block_q", block_q, DEFAULT_BLOCK_Q, T)
    bk = check_tile("block_k", block_k, DEFAULT_BLOCK_K, S)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)

    # Fold batch dims into one axis and the query heads of a GQA group next to
    # their KV head: q (B, H_kv, G, T, D), k (B, H_kv, S, D), v (B, H_kv, S, Dv).
    B = math.prod(batch)
    qg = q.reshape(B, H_kv, group, T, D)
    kf = k.reshape(B, H_kv, S, D).astype(dtype, copy=False)
    vf = v.reshape(B, H_kv, S, Dv).astype(dtype, copy=False)

    out = np.empty((B, H_kv, group, T, Dv), dtype=dtype)
    lse = np.empty((B, H_kv, group, T), dtype=dtype)
    offset = S - T  # causal: row i sees keys j <= i + offset
    # the one score tile, reused for every (query tile, key tile) pair
    scores = np.empty((B, H_kv, group * min(bq, T), min(bk, S)), dtype=dtype)
    for i0 in range(0, T, bq):
        i1 = min(i0 + bq, T)
        n = i1 - i0
        # the query tile of every head of a group, stacked: (B, H_kv, G * n, D)
        q_tile = (qg[:, :, :, i0:i1].astype(dtype) * scale).reshape(B, H_kv, group * n, D)
        m = np.full((B, H_kv, group * n), -np.inf, dtype=dtype)
        l = np.zeros((B, H_kv, group * n), dtype=dtype)
        acc = np.zeros((B, H_kv, group * n, Dv), dtype=dtype)
        # causal: the last key any row of this tile sees is (i1 - 1) + offset
        k_end = min(S, i1 + offset) if causal else S
        for j0 in range(0, max(k_end, 0), bk):
            j1 = min(j0 + bk, k_end)
            s = scores[..., : group * n, : j1 - j0]  # (B, H_kv, G*n, j1-j0)
            np.matmul(q_tile, kf[:, :, j0:j1].swapaxes(-1, -2), out=s)
            if causal and j1 - 1 > i0 + offset:  # the tile crosses the diagonal
                rows = np.arange(i0, i1)[:, None] + offset
                cols = np.arange(j0, j1)[None, :]
                future = np.tile(cols > rows, (group, 1))  # (G*n, j1-j0)
                np.copyto(s, -np.inf, where=future)  # in place, no index arrays
            m_new = np.maximum(m, s.max(axis=-1))
            # rows that have seen only masked keys keep m = -inf; shift them by 0
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new).astype(dtype, copy=False)
            s -= m_safe[..., None]
            np.exp(s, out=s)  # s is now P = exp(S - m_new), in place
            alpha = np.exp(m - m_safe)  # rescales the old statistics
            l = alpha * l + s.sum(axis=-1)
            acc *= alpha[..., None]
            acc += s @ vf[:, :, j0:j1]
            m = m_new
        acc /= np.where(l > 0, l, 1.0)[..., None]  # the single division; zeros stay zeros
        with np.errstate(divide="ignore"):
            tile_lse = m + np.log(l)  # rows that saw nothing: -inf + log 0 = -inf
        out[:, :, :, i0:i1] = acc.reshape(B, H_kv, group, n, Dv)
        lse[:, :, :, i0:i1] = tile_lse.reshape(B, H_kv, group, n)

    out = out.reshape(*batch, H, T, Dv)
    if return_lse:
        return out, lse.reshape(*batch, H, T)
    return out


def sliding_window_attention(q, k, v, window, *, block=None, scale=None):
    """Causal local attention: query i attends to the ``window`` keys ``i-W+1 .. i``.

    Taught in chapter 6, section 'Sliding-window attention'.

    Shapes as in :func:`flash_attention`: ``q (..., H, T, D)``,
    ``k (..., H_kv, S, D)``, ``v (..., H_kv, S, Dv)`` -> ``(..., H, T, Dv)``.
    ``S >= T`` (the queries are the last T of S positions, as after a KV
    cache). The window includes the current token (W = 1 returns ``v`` itself)
    and is aligned bottom-right: query i sees key j iff
    ``i + S - T - W < j <= i + S - T`` (the mask of ``sliding_window_mask``).

    Queries are processed in blocks of ``block`` rows (default 128); a block
    ``[i0, i1)`` is attended against only its key band
    ``[i0 + S - T - W + 1, i1 + S - T)`` with the band's own sliding-window
    mask: the work is O(T * (W + block)) = O(T * W) and, besides the output,
    one block's ``block x (W + block - 1)`` scores are alive at a time, never T x S.
    ``scale`` defaults to ``1 / sqrt(D)``.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    batch, H, H_kv, group, T, S, D, Dv = check_qkv(q, k, v, grouped=True)
    window = check_window(window, T, S)
    scale = check_scale(scale, D)
    bq = check_tile("block", block, DEFAULT_WINDOW_BLOCK, T)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    # GQA: (B, H_kv, G, T, D) queries against (B, H_kv, 1, S, D) keys (broadcast, no copy)
    B = math.prod(batch)
    qg = q.reshape(B, H_kv, group, T, D)
    kg = k.reshape(B, H_kv, 1, S, D)
    vg = v.reshape(B, H_kv, 1, S, Dv)
    out = np.empty((B, H_kv, group, T, Dv), dtype=dtype)
    offset = S - T
    for i0 in range(0, T, bq):
        i1 = min(i0 + bq, T)
        b0, b1 = max(0, i0 + offset - window + 1), i1 + offset  # the band of keys
        # row r of the block and key c of the band are aligned bottom-right,
        # exactly like query i and key j in the full sliding-window mask
        mask = sliding_window_mask(i1 - i0, window, S=b1 - b0)
        out[:, :, :, i0:i1] = scaled_dot_product_attention(
            qg[:, :, :, i0:i1], kg[:, :, :, b0:b1], vg[:, :, :, b0:b1], mask, scale=scale
        )
    return out.reshape(*batch, H, T, Dv)
