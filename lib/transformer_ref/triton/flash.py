"""FlashAttention-2 as Triton kernels: forward, backward, and the autograd wrapper.

Same algorithm and semantics as :mod:`transformer_ref.numpy.flash` and
:mod:`transformer_ref.torch.flash` (read the NumPy docstring first); what
changes is *who runs the loop*. There, one Python loop walks the query tiles
and, inside it, the key tiles. Here the outer loop disappears: the kernel is
launched on a grid of *program instances*, one per (query tile, batch x head),
which a GPU runs in parallel, each on one streaming multiprocessor; the inner
loop over key tiles stays, inside the kernel.

A program instance keeps its working set on chip (registers and shared memory,
the "SRAM" of the FlashAttention papers) and touches the large HBM only to
load its inputs once and store its outputs once:

* forward (:func:`_fwd_kernel`): its query tile ``Q_i`` (``BLOCK_M x D``, input
  dtype), the running max ``m`` and sum ``l`` (``BLOCK_M`` float32 each) and the
  accumulator ``acc`` (``BLOCK_M x Dv`` float32) for the whole loop; one key
  tile ``K_j`` and value tile ``V_j`` (``BLOCK_N x D``, ``BLOCK_N x Dv``) at a
  time, and the score tile ``S_ij``/``P_ij`` (``BLOCK_M x BLOCK_N`` float32)
  that is never written out. It stores ``O_i`` and ``lse_i = m + log l``.
* backward, keys (:func:`_bwd_dkdv_kernel`): ``K_j``, ``V_j`` and their float32
  gradients ``dK_j``, ``dV_j`` for the whole loop; one ``Q_i``, ``dO_i`` and the
  row statistics ``lse_i``, ``D_i`` at a time. It walks the query tiles of *every
  query head of its GQA group*, so dK and dV are summed over the group in
  registers, without atomics and without repeating K and V in memory.
* backward, queries (:func:`_bwd_dq_kernel`): ``Q_i``, ``dO_i``, ``lse_i``,
  ``D_i`` and the float32 ``dQ_i``; one ``K_j``, ``V_j`` at a time.

The backward kernels do not read a stored probability matrix: there is none.
They recompute ``P_ij = exp(scale Q_i K_j^T - lse_i)`` from the saved ``lse``
(T floats per head instead of T x S), paying one more ``Q K^T`` product per
tile (Dao et al. 2022, FlashAttention, arXiv:2205.14135; Dao 2023,
FlashAttention-2, arXiv:2307.08691).

Numerics: matrix products take input-dtype operands (float32 products use
``input_precision="ieee"``, not TF32) and accumulate in float32; ``m``, ``l``,
``lse`` and all accumulators are float32; outputs and gradients come back in
the input dtype. Under the interpreter, bfloat16 operands of ``tl.dot`` are
widened to float32 first (Triton 3.9's interpreter multiplies bfloat16 bit
patterns as integers, triton-lang/triton#11584); products of bfloat16 values
are exact in float32, so this computes what the GPU's tensor cores compute, up to
the order of the float32 sums.
"""

import contextlib
import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# shape and argument checks only read .shape and Python numbers: shared with NumPy and torch
from .._checks import check_int, check_qkv, check_scale
# this backend takes torch tensors: the torch backend's tensor check, so its messages are torch's
from ..torch.attention import _check_tensors

__all__ = ["flash_attention"]

# Default tiles: 64 x 64. In float16 a forward program instance then holds about
# 56 KiB (D = 64) or 96 KiB (D = 128): the Q tile, one K and one V tile, the float32
# accumulator and score tile; that fits the few hundred KiB of registers and shared
# memory of one streaming multiprocessor. Not tuned on a GPU (the course machine has
# none): measure with benchmarks/bench_flash.py --backend triton before changing. Tiles must be
# powers of two (tl.arange) and at least 16 (the smallest tl.dot).
DEFAULT_BLOCK_Q = 64
DEFAULT_BLOCK_K = 64
MAX_HEAD_DIM = 256  # larger head dimensions would not leave a K/V tile room on chip
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    """``a @ b`` accumulated in float32.

    ``F32``: multiply float32 operands in IEEE float32 (not TF32), widening them
    first (bfloat16 under the interpreter); otherwise half-precision operands go
    to the tensor cores as they are.
    """
    if F32:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


@triton.jit
def _fwd_kernel(
    Q, K, V, Out, Lse,  # q (B*H, T, D), k (B*H_kv, S, D), v (B*H_kv, S, Dv), out like q, lse (B*H, T)
    T, S, D, DV, GROUP, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, F32: tl.constexpr,
):
    """One program instance: query tile ``pid0`` of head ``pid1``, all key tiles (FlashAttention-2 order).

    On chip for the whole loop: ``q`` (BLOCK_M x BLOCK_D), ``m``, ``l`` (BLOCK_M,
    float32) and ``acc`` (BLOCK_M x BLOCK_DV, float32); per step one ``k``, ``v``
    tile and the BLOCK_M x BLOCK_N scores. With ``S_ij = scale Q_i K_j^T``::

        m_new = max(m, rowmax(S_ij));  P = exp(S_ij - m_new)
        l   = exp(m - m_new) * l   + rowsum(P)
        acc = exp(m - m_new) * acc + P @ V_j
        O_i = acc / l,  lse_i = m + log(l)
    """
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)  # row (b, h) of the flattened batch x heads
    kv = bh // GROUP  # its KV head: query head h reads KV head h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + bh * T * D + offs_m[:, None] * D + offs_d[None, :],
                mask=(offs_m[:, None] < T) & (offs_d[None, :] < D), other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    offset = S - T  # causal, bottom-right: query i sees key j iff j <= i + offset
    if CAUSAL:  # key tiles wholly in the future of this query tile are never loaded
        hi = tl.minimum(S, tl.maximum(start_m + BLOCK_M + offset, 0))
    else:
        hi = S
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + kv * S * D + cols[:, None] * D + offs_d[None, :],
                    mask=(cols[:, None] < S) & (offs_d[None, :] < D), other=0.0)
        v = tl.load(V + kv * S * DV + cols[:, None] * DV + offs_dv[None, :],
                    mask=(cols[:, None] < S) & (offs_dv[None, :] < DV), other=0.0)
        s = _dot(q, tl.trans(k), F32) * scale  # (BLOCK_M, BLOCK_N) float32, stays on chip
        if CAUSAL:
            visible = (cols[None, :] < S) & (cols[None, :] <= offs_m[:, None] + offset)
        else:
            visible = (cols[None, :] < S) & (offs_m[:, None] >= 0)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw only masked keys
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m - m_safe)  # rescales the old statistics; 0 while m = -inf
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(V.dtype.element_ty), v, F32)
        m = m_new
    seen = l > 0.0  # rows that saw no key: output 0, lse -inf (never NaN)
    l_safe = tl.where(seen, l, 1.0)
    out = acc / l_safe[:, None]  # the single division per row
    lse = tl.where(seen, m + tl.log(l_safe), float("-inf"))
    tl.store(Out + bh * T * DV + offs_m[:, None] * DV + offs_dv[None, :], out.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < T) & (offs_dv[None, :] < DV))
    tl.store(Lse + bh * T + offs_m, lse, mask=offs_m < T)


@triton.jit
def _bwd_delta_kernel(Out, DOut, DLse, Delta, T, DV, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Row term of dS for one query tile: ``Delta_i = rowsum(dO_i * O_i) - dlse_i`` (float32)."""
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    ptrs = bh * T * DV + offs_m[:, None] * DV + offs_dv[None, :]
    inside = (offs_m[:, None] < T) & (offs_dv[None, :] < DV)
    o = tl.load(Out + ptrs, mask=inside, other=0.0).to(tl.float32)
    do = tl.load(DOut + ptrs, mask=inside, other=0.0).to(tl.float32)
    dlse = tl.load(DLse + bh * T + offs_m, mask=offs_m < T, other=0.0)
    tl.store(Delta + bh * T + offs_m, tl.sum(o * do, 1) - dlse, mask=offs_m < T)


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DOut, Lse, Delta, DK, DV_,  # DV_: the gradient of v (DV is its width)
    T, S, D, DV, GROUP, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, F32: tl.constexpr,
):
    """One program instance: key tile ``pid0`` of KV head ``pid1``; loops over the group's query heads and tiles.

    With ``P = exp(S_ij - lse_i)`` recomputed from the saved lse::

        dV_j += P^T dO_i,  dP = dO_i V_j^T,  dS = P * (dP - Delta_i),  dK_j += scale dS^T Q_i
    """
    start_n = tl.program_id(0) * BLOCK_N
    kv = tl.program_id(1).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k = tl.load(K + kv * S * D + cols[:, None] * D + offs_d[None, :],
                mask=(cols[:, None] < S) & (offs_d[None, :] < D), other=0.0)
    v = tl.load(V + kv * S * DV + cols[:, None] * DV + offs_dv[None, :],
                mask=(cols[:, None] < S) & (offs_dv[None, :] < DV), other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    offset = S - T
    if CAUSAL:  # the first query that sees key start_n is i = start_n - offset
        lo = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
    else:
        lo = 0
    for g in range(0, GROUP):  # every query head of the group reads this K/V tile
        bh = kv * GROUP + g
        for start_m in range(lo, T, BLOCK_M):
            rows = start_m + offs_m
            q = tl.load(Q + bh * T * D + rows[:, None] * D + offs_d[None, :],
                        mask=(rows[:, None] < T) & (offs_d[None, :] < D), other=0.0)
            do = tl.load(DOut + bh * T * DV + rows[:, None] * DV + offs_dv[None, :],
                         mask=(rows[:, None] < T) & (offs_dv[None, :] < DV), other=0.0)
            lse = tl.load(Lse + bh * T + rows, mask=rows < T, other=float("inf"))
            delta = tl.load(Delta + bh * T + rows, mask=rows < T, other=0.0)
            lse = tl.where(lse == float("-inf"), float("inf"), lse)  # rows that see nothing: P = 0
            s = _dot(q, tl.trans(k), F32) * scale
            if CAUSAL:
                visible = (cols[None, :] < S) & (cols[None, :] <= rows[:, None] + offset)
            else:
                visible = (cols[None, :] < S) & (rows[:, None] >= 0)
            p = tl.exp(tl.where(visible, s, float("-inf")) - lse[:, None])  # (BLOCK_M, BLOCK_N)
            dv += _dot(tl.trans(p.to(DOut.dtype.element_ty)), do, F32)
            dp = _dot(do, tl.trans(v), F32)
            ds = p * (dp - delta[:, None])
            dk += _dot(tl.trans(ds.to(Q.dtype.element_ty)), q, F32)
    dk = dk * scale
    tl.store(DK + kv * S * D + cols[:, None] * D + offs_d[None, :], dk.to(DK.dtype.element_ty),
             mask=(cols[:, None] < S) & (offs_d[None, :] < D))
    tl.store(DV_ + kv * S * DV + cols[:, None] * DV + offs_dv[None, :], dv.to(DV_.dtype.element_ty),
             mask=(cols[:, None] < S) & (offs_dv[None, :] < DV))


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DOut, Lse, Delta, DQ,
    T, S, D, DV, GROUP, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, F32: tl.constexpr,
):
    """One program instance: query tile ``pid0`` of head ``pid1``, all key tiles: ``dQ_i = scale sum_j dS_ij K_j``."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    kv = bh // GROUP
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + bh * T * D + rows[:, None] * D + offs_d[None, :],
                mask=(rows[:, None] < T) & (offs_d[None, :] < D), other=0.0)
    do = tl.load(DOut + bh * T * DV + rows[:, None] * DV + offs_dv[None, :],
                 mask=(rows[:, None] < T) & (offs_dv[None, :] < DV), other=0.0)
    lse = tl.load(Lse + bh * T + rows, mask=rows < T, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    delta = tl.load(Delta + bh * T + rows, mask=rows < T, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    offset = S - T
    if CAUSAL:
        hi = tl.minimum(S, tl.maximum(start_m + BLOCK_M + offset, 0))
    else:
        hi = S
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + kv * S * D + cols[:, None] * D + offs_d[None, :],
                    mask=(cols[:, None] < S) & (offs_d[None, :] < D), other=0.0)
        v = tl.load(V + kv * S * DV + cols[:, None] * DV + offs_dv[None, :],
                    mask=(cols[:, None] < S) & (offs_dv[None, :] < DV), other=0.0)
        s = _dot(q, tl.trans(k), F32) * scale
        if CAUSAL:
            visible = (cols[None, :] < S) & (cols[None, :] <= rows[:, None] + offset)
        else:
            visible = (cols[None, :] < S) & (rows[:, None] >= 0)
        p = tl.exp(tl.where(visible, s, float("-inf")) - lse[:, None])
        dp = _dot(do, tl.trans(v), F32)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(K.dtype.element_ty), k, F32)
    dq = dq * scale
    tl.store(DQ + bh * T * D + rows[:, None] * D + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=(rows[:, None] < T) & (offs_d[None, :] < D))


# Interpreted only if triton.language's own jit functions are too (TRITON_INTERPRET=1 before
# triton was first imported); a kernel interpreted while tl.zeros stays compiled cannot run.
# (`type(...) is`, not isinstance: the book's API page imports this module with triton replaced
# by Sphinx's mock objects, which isinstance refuses as a second argument.)
INTERPRETED = type(_fwd_kernel) is InterpretedFunction and type(tl.zeros) is InterpretedFunction
"""True when the kernels run under Triton's interpreter (CPU tensors), False when compiled (CUDA)."""


def _tile(name, value, default, length):
    """A tile size: a power of two >= 16 (Triton's shapes), not much larger than the axis it tiles.

    What the torch backend rejects (not an integer, < 1) is rejected first, with its message."""
    size = default if value is None else check_int(name, value, minimum=1)
    if size < 16 or size & (size - 1):
        raise ValueError(f"{name} must be a power of two >= 16 (a Triton tile shape), got {size}")
    return min(size, max(16, triton.next_power_of_2(length)))


def _launch_config(q, *dims):
    """The padded head widths, the float32-products flag of :func:`_dot` and the GPU's warps per program."""
    widths = [max(16, triton.next_power_of_2(d)) for d in dims]
    f32 = q.dtype == torch.float32 or (INTERPRETED and q.dtype == torch.bfloat16)
    warps = 4 if max(widths) <= 64 else 8
    return widths, f32, warps


def _on_device(q):
    """Launch on q's GPU (Triton launches on the current CUDA device)."""
    return torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext()


class _FlashAttention(torch.autograd.Function):
    """Triton kernels on contiguous q (B, H, T, D), k (B, H_kv, S, D), v (B, H_kv, S, Dv)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, bq, bk, scale):
        B, H, T, D = q.shape
        H_kv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
        group = H // H_kv
        out = torch.empty(B, H, T, Dv, dtype=q.dtype, device=q.device)
        lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
        (bd, bdv), f32, warps = _launch_config(q, D, Dv)
        if B * H * T:
            with _on_device(q):
                _fwd_kernel[(triton.cdiv(T, bq), B * H)](
                    q, k, v, out, lse, T, S, D, Dv, group, scale,
                    CAUSAL=causal, BLOCK_M=bq, BLOCK_N=bk, BLOCK_D=bd, BLOCK_DV=bdv, F32=f32,
                    num_warps=warps,
                )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (causal, bq, bk, scale)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        """FlashAttention-2 backward: Delta, then dK/dV per key tile, then dQ per query tile, P recomputed."""
        q, k, v, out, lse = ctx.saved_tensors
        causal, bq, bk, scale = ctx.config
        B, H, T, D = q.shape
        H_kv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
        group = H // H_kv
        d_out = d_out.to(q.dtype).contiguous()
        d_lse = d_lse.to(torch.float32).contiguous()
        delta = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        (bd, bdv), f32, warps = _launch_config(q, D, Dv)
        common = dict(CAUSAL=causal, BLOCK_M=bq, BLOCK_N=bk, BLOCK_D=bd, BLOCK_DV=bdv, F32=f32,
                      num_warps=warps)
        with _on_device(q):
            if B * H * T:
                _bwd_delta_kernel[(triton.cdiv(T, bq), B * H)](
                    out, d_out, d_lse, delta, T, Dv, BLOCK_M=bq, BLOCK_DV=bdv, num_warps=warps
                )
                _bwd_dq_kernel[(triton.cdiv(T, bq), B * H)](
                    q, k, v, d_out, lse, delta, dq, T, S, D, Dv, group, scale, **common
                )
            else:
                dq.zero_()
            if B * H_kv * S:
                _bwd_dkdv_kernel[(triton.cdiv(S, bk), B * H_kv)](
                    q, k, v, d_out, lse, delta, dk, dv, T, S, D, Dv, group, scale, **common
                )
        return dq, dk, dv, None, None, None, None


def flash_attention(q, k, v, *, causal=False, block_q=None, block_k=None, scale=None, return_lse=False):
    """Exact attention ``softmax(q k^T * scale) v`` by Triton kernels, never holding T x S.

    Shapes: ``q (..., H, T, D)``, ``k (..., H_kv, S, D)``, ``v (..., H_kv, S, Dv)``
    with ``H_kv`` dividing ``H`` (GQA: query head h reads KV head
    ``h // (H / H_kv)``; the kernels index the shared KV head, K and V are never
    repeated). Returns ``out (..., H, T, Dv)`` in the input dtype and, when
    ``return_lse``, also ``lse (..., H, T)`` = ``log sum_j exp(scale q_i . k_j)``
    (natural log, float32).

    The forward kernel runs one program instance per (query tile, batch x
    head); each walks the key tiles in FlashAttention-2 order with a running
    max ``m``, running sum ``l`` and unnormalised accumulator ``acc``::

        m_new = max(m, rowmax(S_ij));  P = exp(S_ij - m_new)
        l   = exp(m - m_new) * l   + rowsum(P)
        acc = exp(m - m_new) * acc + P @ V_j
        out = acc / l,  lse = m + log(l)   (once, after the last key tile)

    On chip per program instance: the ``block_q x D`` query tile, ``m`` and
    ``l`` (``block_q`` float32 each), ``acc`` (``block_q x Dv`` float32), one
    ``block_k x D`` key and ``block_k x Dv`` value tile at a time and the
    ``block_q x block_k`` float32 score tile; only ``out`` and ``lse`` go back to
    memory.

    ``causal=True`` is aligned bottom-right (query i sees key j iff
    ``j <= i + S - T``); key tiles wholly in the future are skipped; rows that
    see no key give zeros and ``lse = -inf``. T and S need not be multiples of
    the tiles (the last tile is masked).

    Differentiable in ``q``, ``k``, ``v`` (and through ``lse``): the backward
    kernels recompute each probability tile ``P = exp(S - lse)`` from the saved
    ``lse``, so only O(T) per head is stored, never the T x S weights; dK and dV
    are summed over the query heads of a GQA group inside one program instance.

    dtypes: float32, float16 or bfloat16 (mixed inputs are promoted, integers
    compute in float32); products
    accumulate in float32, float32 products in IEEE precision (not TF32).
    ``block_q``/``block_k`` (powers of two >= 16) default to 64 and are clipped
    to the padded lengths. CUDA tensors run compiled kernels; CPU tensors need
    Triton's interpreter (see :mod:`transformer_ref.triton`), which is slow and
    meant for testing.
    """
    _check_tensors(q, k, v)
    batch, H, H_kv, group, T, S, D, Dv = check_qkv(q, k, v, grouped=True)
    scale = check_scale(scale, D)
    bq = _tile("block_q", block_q, DEFAULT_BLOCK_Q, T)
    bk = _tile("block_k", block_k, DEFAULT_BLOCK_K, S)
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if not dtype.is_floating_point:  # integer input computes in float32, as in the torch backend
        dtype = torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"q, k and v must be float32, float16 or bfloat16 for the Triton kernels, "
                         f"got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, width in (("q", D), ("v", Dv)):
        if width > MAX_HEAD_DIM:
            raise ValueError(f"{name} head dimension must be <= {MAX_HEAD_DIM} for the Triton kernels, got {width}")
    if q.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "transformer_ref.triton: CPU tensors need Triton's interpreter, but its kernels are compiled for "
            "the GPU: TRITON_INTERPRET was not 1 when triton was first imported (torch.compile and "
            "torch._dynamo import triton too). Move q, k and v to CUDA, or start Python with "
            "TRITON_INTERPRET=1 in the environment."
        )
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q must be a CUDA tensor (or a CPU tensor under the interpreter), got device {q.device}")
    B = math.prod(batch)
    out, lse = _FlashAttention.apply(
        q.to(dtype).reshape(B, H, T, D).contiguous(),
        k.to(dtype).reshape(B, H_kv, S, D).contiguous(),
        v.to(dtype).reshape(B, H_kv, S, Dv).contiguous(),
        bool(causal),
        bq,
        bk,
        scale,
    )
    out = out.reshape(*batch, H, T, Dv)
    if return_lse:
        return out, lse.reshape(*batch, H, T)
    return out
