"""KV-cache quantization: symmetric integer codes with one scale per slice, in PyTorch.

Same functions and semantics as :mod:`transformer_ref.numpy.quantization` (read its docstring
for the formula and KIVI's per-channel keys and per-token values). Runs on ``x``'s device.
Rounding has no useful gradient: the codes carry none, while :func:`dequantize_kv` is
differentiable in ``scale``.
"""

import torch

from .._checks import check_axis, check_broadcasts_to, check_quant_bits, dtype_name
from .attention import _check_tensor

__all__ = ["quantize_kv", "dequantize_kv"]


def quantize_kv(x, bits=8, axis=-1):
    """Symmetric absmax quantization with one scale per slice along ``axis``; ``(codes, scale)``.

    ``scale = max |x| / qmax`` over ``axis`` (kept with size 1), ``qmax = 2 ** (bits - 1) - 1``;
    ``codes = clip(round(x / scale), -qmax, qmax)``, int8 for ``bits <= 8`` else int16,
    ``2 <= bits <= 16``. ``axis=-1``: per token, ``axis=-2``: per channel of a ``(..., S, D)`` cache.
    :func:`dequantize_kv` returns ``x`` within ``scale / 2``. ``scale`` is float32 for float16,
    bfloat16 and integer ``x``, else ``x``'s dtype; ``x`` must be finite.
    """
    shape = _check_tensor("x", x)
    if x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"x must hold real numbers, got dtype {dtype_name(x.dtype)}")
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError("x must be finite, got inf or NaN")
    bits, qmax, code_dtype = check_quant_bits(bits)
    axis = check_axis(axis, shape)
    x = x.detach().to(x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32)
    if x.numel() == 0:
        scale = torch.zeros(shape[:axis % len(shape)] + (1,) + shape[axis % len(shape) + 1:], dtype=x.dtype,
                            device=x.device)
    else:
        scale = x.abs().amax(dim=axis, keepdim=True) / qmax
    codes = torch.round(x / torch.where(scale > 0, scale, torch.ones_like(scale)))  # half to even
    return codes.clamp_(-qmax, qmax).to(getattr(torch, code_dtype)), scale


def dequantize_kv(codes, scale):
    """``codes * scale``: the values :func:`quantize_kv` encoded, in ``scale``'s dtype and ``codes``' shape.

    ``codes`` an integer tensor, ``scale`` a floating tensor broadcastable to it; each entry is
    within ``scale / 2`` of the original.
    """
    _check_tensor("codes", codes)
    _check_tensor("scale", scale)
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise ValueError(f"codes must be integers, got dtype {dtype_name(codes.dtype)}")
    if not scale.is_floating_point():
        raise ValueError(f"scale must be floating-point, got dtype {dtype_name(scale.dtype)}")
    check_broadcasts_to("scale", scale.shape, codes.shape, "codes")
    return codes.to(scale.dtype) * scale
