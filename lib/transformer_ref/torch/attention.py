"""Scaled dot-product attention, grouped-query attention and a safe softmax, in PyTorch.

Same semantics as :mod:`transformer_ref.numpy.attention`. Everything runs on the
inputs' device and is differentiable. For float16/bfloat16 inputs the scores,
the softmax statistics (max and sum) and the weighted sum are computed in
float32 and the result is cast back to the input dtype.
"""

import torch

from .._checks import check_axis, check_int, check_mask, check_ndim, check_qkv, check_scale

__all__ = ["softmax", "scaled_dot_product_attention", "repeat_kv", "grouped_query_attention"]


def _check_tensor(name, x, minimum=0):
    """Require a ``torch.Tensor`` with at least ``minimum`` dimensions; return its shape.

    (A NumPy array would otherwise fail deep inside with an AttributeError.)"""
    if not torch.is_tensor(x):
        raise ValueError(f"{name} must be a torch.Tensor (use transformer_ref.numpy for arrays), "
                         f"got {type(x).__name__}")
    return check_ndim(name, x, minimum)


def _check_tensors(q, k, v):
    """q, k and v are tensors on one device (their shapes are checked by :func:`check_qkv`)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x)
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"k and v must be on q's device {q.device}, got {k.device} and {v.device}")


def _compute_dtype(dtype):
    """Half precisions (and integers) compute in float32; float32/float64 stay as they are."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _result_dtype(x):
    """``x.dtype`` for floating ``x``; integer input gives float32 (NumPy's backend gives float64)."""
    return x.dtype if x.is_floating_point() else torch.float32


def softmax(x, axis=-1):
    r"""Numerically stable softmax along ``axis``; an all ``-inf`` slice gives zeros, not NaN.

    Taught in chapter 3, section '$-\infty$ before the softmax, exact zeros after it'.

    ``softmax(x)_j = exp(x_j - m) / sum_k exp(x_k - m)``, ``m = max_k x_k``.
    fp16/bf16 inputs are reduced in float32; the result has ``x``'s dtype.
    """
    axis = check_axis(axis, _check_tensor("x", x))
    if x.shape[axis] == 0:  # nothing to normalise over (no keys)
        return x.clone()
    xc = x.to(_compute_dtype(x.dtype))
    m = xc.amax(dim=axis, keepdim=True).detach()  # the max cancels out, no gradient needed
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # all -inf slice: exp(-inf - 0) = 0
    e = torch.exp(xc - m)
    total = e.sum(dim=axis, keepdim=True)
    return (e / torch.where(total == 0, torch.ones_like(total), total)).to(_result_dtype(x))


def scaled_dot_product_attention(q, k, v, mask=None, *, scale=None, return_weights=False):
    r"""``softmax(q k^T * scale + mask) v`` with boolean (True = attend) or additive masks.

    Taught in chapter 3, section '$-\infty$ before the softmax, exact zeros after it'.

    q: ``(..., H, T, D)``, k: ``(..., H, S, D)``, v: ``(..., H, S, Dv)``; mask boolean
    or floating (integer masks are rejected), broadcastable to ``(..., H, T, S)``;
    scale a finite real number, default ``1 / sqrt(D)``.
    Returns ``out (..., H, T, Dv)`` (``q``'s dtype), or ``(out, weights)`` with
    weights ``(..., H, T, S)`` if ``return_weights``. Fully masked rows give zeros.
    """
    _check_tensors(q, k, v)
    check_qkv(q, k, v)
    scale = check_scale(scale, q.shape[-1])
    dtype = _compute_dtype(q.dtype)
    scores = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * scale  # (..., H, T, S)
    if mask is not None:
        mask = torch.as_tensor(mask, device=scores.device)
        check_mask(mask, scores.shape)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(dtype)
    weights = softmax(scores, axis=-1)  # (..., H, T, S), float32 or float64
    out = (weights @ v.to(dtype)).to(_result_dtype(q))  # (..., H, T, Dv)
    return (out, weights.to(_result_dtype(q))) if return_weights else out


def repeat_kv(x, n_rep):
    """``(..., H_kv, S, D) -> (..., H_kv * n_rep, S, D)``, repeat-interleave (head ``h`` reads ``h // n_rep``).

    Taught in chapter 2, section 'The head mapping: repeat-interleave'.
    """
    _check_tensor("x", x, 3)
    n_rep = check_int("n_rep", n_rep, minimum=1)
    return x if n_rep == 1 else torch.repeat_interleave(x, n_rep, dim=-3)


def grouped_query_attention(q, k, v, mask=None, *, scale=None):
    """Grouped-query attention: query head ``h`` reads KV head ``h // (H_q / H_kv)``.

    Taught in chapter 2, section 'Three ways to share keys and values'.

    q: ``(..., H_q, T, D)``, k: ``(..., H_kv, S, D)``, v: ``(..., H_kv, S, Dv)``
    (the same batch dims ``...``), ``H_q`` divisible by ``H_kv`` (``H_kv = 1``: multi-query attention).
    Returns ``(..., H_q, T, Dv)``; mask and scale as in
    :func:`scaled_dot_product_attention`.
    """
    _check_tensors(q, k, v)
    n_rep = check_qkv(q, k, v, grouped=True).group
    return scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, scale=scale)
