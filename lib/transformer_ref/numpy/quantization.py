"""KV-cache quantization: symmetric integer codes with one scale per slice, in NumPy.

A cached key or value is stored as small integers and one floating-point scale shared by a
slice of them (absmax quantization):

    qmax  = 2 ** (bits - 1) - 1                        (127 for int8)
    scale = max |x| / qmax                             over the slice
    codes = clip(round(x / scale), -qmax, qmax)        integers
    x_hat = codes * scale                              |x - x_hat| <= scale / 2

``axis`` is the dimension the scale is shared along. For a cache tensor ``(..., H_kv, S, D)``,
``axis=-1`` gives one scale per token (over its ``D`` channels) and ``axis=-2`` one scale per
channel (over the tokens). KIVI (Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit
Quantization for KV Cache", arXiv:2402.02750) quantizes keys per channel, because a few key
channels carry outliers much larger than the rest, and values per token; it also uses an
asymmetric code (a zero point) and small groups, which this symmetric version leaves out.
With 8 bits the cache takes half the bytes of float16 (plus the scales).
"""

import numpy as np

from .._checks import check_axis, check_broadcasts_to, check_quant_bits, dtype_name

__all__ = ["quantize_kv", "dequantize_kv"]


def _check_real(name, x):
    """Require a real, finite array (booleans and complex numbers have no absmax scale)."""
    if x.dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold real numbers, got dtype {dtype_name(x.dtype)}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise ValueError(f"{name} must be finite, got inf or NaN")


def quantize_kv(x, bits=8, axis=-1):
    """Symmetric absmax quantization of ``x`` with one scale per slice along ``axis``; ``(codes, scale)``.

    ``scale = max |x| / qmax`` over ``axis`` (kept as a dimension of size 1), ``qmax = 2 ** (bits - 1) - 1``;
    ``codes = clip(round(x / scale), -qmax, qmax)`` with ``x``'s shape, int8 for ``bits <= 8``, else
    int16; ``2 <= bits <= 16``. For a cache ``(..., H_kv, S, D)``: ``axis=-1`` is per-token, ``axis=-2``
    per-channel (KIVI, Liu et al. 2024: keys per channel, values per token).
    :func:`dequantize_kv` gives ``x`` back within ``scale / 2`` per entry; a slice of zeros has
    ``scale = 0`` and comes back as zeros. ``scale`` has ``x``'s float dtype (float64 for integers);
    ``x`` must be finite.
    """
    x = np.asarray(x)
    _check_real("x", x)
    bits, qmax, code_dtype = check_quant_bits(bits)
    axis = check_axis(axis, x.shape)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    scale = np.abs(x).max(axis=axis, keepdims=True, initial=0.0) / qmax
    codes = np.rint(x / np.where(scale > 0, scale, 1.0))  # round half to even, as torch.round
    return np.clip(codes, -qmax, qmax).astype(code_dtype), scale


def dequantize_kv(codes, scale):
    """``codes * scale``: the values :func:`quantize_kv` encoded, in ``scale``'s dtype and ``codes``' shape.

    ``codes`` integers, ``scale`` floating and broadcastable to ``codes`` (as :func:`quantize_kv`
    returns it). Each entry is within ``scale / 2`` of the original.
    """
    codes, scale = np.asarray(codes), np.asarray(scale)
    if codes.dtype.kind not in "iu":
        raise ValueError(f"codes must be integers, got dtype {dtype_name(codes.dtype)}")
    if scale.dtype.kind != "f":
        raise ValueError(f"scale must be floating-point, got dtype {dtype_name(scale.dtype)}")
    check_broadcasts_to("scale", scale.shape, codes.shape, "codes")
    return codes.astype(scale.dtype) * scale
