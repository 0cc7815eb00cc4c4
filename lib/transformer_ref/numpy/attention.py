"""Scaled dot-product attention, grouped-query attention and a safe softmax, in NumPy.

Shapes: queries ``q (..., H, T, D)``, keys ``k (..., H, S, D)``, values
``v (..., H, S, Dv)``; scores and weights ``(..., H, T, S)``. Masks are boolean
(True = may attend) or additive floats, broadcastable to the scores.
"""

import numpy as np

from .._checks import check_axis, check_int, check_mask, check_ndim, check_qkv, check_scale

__all__ = ["softmax", "scaled_dot_product_attention", "repeat_kv", "grouped_query_attention"]


def softmax(x, axis=-1):
    r"""Numerically stable softmax along ``axis``.

    Taught in chapter 3, section '$-\infty$ before the softmax, exact zeros after it'.

    ``softmax(x)_j = exp(x_j - m) / sum_k exp(x_k - m)`` with ``m = max_k x_k``
    (subtracting the max changes nothing mathematically but keeps ``exp`` from
    overflowing). A slice that is entirely ``-inf`` (a query that may attend to
    nothing) returns zeros instead of ``0/0 = NaN``. Same shape as ``x``.
    """
    x = np.asarray(x)
    axis = check_axis(axis, x.shape)
    if x.size == 0:  # e.g. no keys at all: nothing to normalise (np.max would raise)
        return np.exp(x)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)  # an all -inf slice: exp(-inf - 0) = 0
    e = np.exp(x - m)
    total = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


def scaled_dot_product_attention(q, k, v, mask=None, *, scale=None, return_weights=False):
    r"""``softmax(q k^T * scale + mask) v`` with boolean or additive masks.

    Taught in chapter 3, section '$-\infty$ before the softmax, exact zeros after it'.

    q: ``(..., H, T, D)``, k: ``(..., H, S, D)``, v: ``(..., H, S, Dv)``.
    mask: ``None``, boolean (True = may attend) or float (added to the scores,
    in the scores' dtype), broadcastable to ``(..., H, T, S)``; integer masks are
    rejected. scale: a finite real number, defaults to ``1 / sqrt(D)``.
    Returns ``out (..., H, T, Dv)``, or ``(out, weights)`` with weights
    ``(..., H, T, S)`` if ``return_weights``. A query row with every key masked
    gets zero weights and a zero output.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    check_qkv(q, k, v)
    scale = check_scale(scale, q.shape[-1])
    scores = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., H, T, S)
    if mask is not None:
        mask = np.asarray(mask)
        check_mask(mask, scores.shape)
        if mask.dtype == np.bool_:
            scores = np.where(mask, scores, -np.inf)
        else:
            scores = scores + mask.astype(scores.dtype, copy=False)
    weights = softmax(scores, axis=-1)  # (..., H, T, S)
    out = weights @ v  # (..., H, T, Dv)
    return (out, weights) if return_weights else out


def repeat_kv(x, n_rep):
    """Repeat each KV head ``n_rep`` times: ``(..., H_kv, S, D) -> (..., H_kv * n_rep, S, D)``.

    Taught in chapter 2, section 'The head mapping: repeat-interleave'.

    Repeat-interleave: output head ``h`` is input head ``h // n_rep``, so the
    ``n_rep`` query heads of one group are adjacent (as in Llama and
    ``torch.repeat_interleave``).
    """
    x = np.asarray(x)
    check_ndim("x", x, 3)
    n_rep = check_int("n_rep", n_rep, minimum=1)
    return np.repeat(x, n_rep, axis=-3)


def grouped_query_attention(q, k, v, mask=None, *, scale=None):
    """Grouped-query attention (Ainslie et al. 2023).

    Taught in chapter 2, section 'Three ways to share keys and values'.

    q: ``(..., H_q, T, D)``, k: ``(..., H_kv, S, D)``, v: ``(..., H_kv, S, Dv)``
    (the same batch dims ``...``) with ``H_q`` divisible by ``H_kv``; query head ``h`` uses KV head
    ``h // (H_q / H_kv)``. ``H_kv = H_q`` is multi-head attention, ``H_kv = 1``
    multi-query attention. mask and scale as in
    :func:`scaled_dot_product_attention`. Returns ``(..., H_q, T, Dv)``.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    n_rep = check_qkv(q, k, v, grouped=True).group
    return scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, scale=scale)
