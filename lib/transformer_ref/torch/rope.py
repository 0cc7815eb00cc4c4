"""Rotary position embeddings (RoPE) and its long-context scalings, in PyTorch.

Same functions and semantics as :mod:`transformer_ref.numpy.rope` (read its
docstring for the maths). The frequency vectors are tiny, so they are computed
once in float64 by the NumPy backend and returned as tensors: ``dtype``
defaults to float32 (as Hugging Face stores ``inv_freq``), pass
``dtype=torch.float64`` for full precision. :func:`apply_rope` runs on ``x``'s
device, is differentiable, computes the angles and the rotation in float32 at
least (float64 when ``x`` is float64) and returns ``x.dtype``.
"""

import torch

from .. import numpy as _numpy_backend
from .._checks import check_broadcasts_to, check_even
from .attention import _check_tensor

__all__ = [
    "rope_inv_freq",
    "pi_inv_freq",
    "ntk_inv_freq",
    "dynamic_ntk_inv_freq",
    "yarn_inv_freq",
    "llama3_inv_freq",
    "longrope_inv_freq",
    "rope_angles",
    "rope_rotation_matrix",
    "apply_rope",
]


def rope_inv_freq(head_dim, base=10000.0, *, dtype=torch.float32, device=None):
    """Plain RoPE frequencies ``base ** (-2i/D)``, ``i = 0..D/2-1``; tensor ``(head_dim/2,)``.

    Taught in chapter 1, section 'Frequencies and wavelengths'.

    ``head_dim`` even and positive, ``base > 1``. dtype defaults to float32.
    """
    return torch.as_tensor(_numpy_backend.rope_inv_freq(head_dim, base), dtype=dtype, device=device)


def pi_inv_freq(head_dim, base, scale, *, dtype=torch.float32, device=None):
    """Position interpolation: ``base ** (-2i/D) / scale``, ``i = 0..D/2-1``; ``(head_dim/2,)``.

    Taught in chapter 1, section 'Stretching the context: PI, NTK-aware, dynamic NTK and YaRN'.

    ``scale >= 1``; equivalent to feeding positions ``m / scale``.
    """
    return torch.as_tensor(_numpy_backend.pi_inv_freq(head_dim, base, scale), dtype=dtype, device=device)


def ntk_inv_freq(head_dim, base, scale, *, dtype=torch.float32, device=None):
    """NTK-aware frequencies ``base' ** (-2i/D)``, ``i = 0..D/2-1``, ``base' = base * scale ** (D/(D-2))``.

    Taught in chapter 1, section 'Stretching the context: PI, NTK-aware, dynamic NTK and YaRN'.

    The highest frequency (``i = 0``) is unchanged, the lowest (``i = D/2-1``)
    is divided by exactly ``scale``; ``scale = 1`` is plain RoPE. ``(head_dim/2,)``.
    """
    return torch.as_tensor(_numpy_backend.ntk_inv_freq(head_dim, base, scale), dtype=dtype, device=device)


def dynamic_ntk_inv_freq(head_dim, base, scale, seq_len, original_max_len, *, dtype=torch.float32, device=None):
    """Dynamic NTK (Hugging Face ``"dynamic"``): plain RoPE while ``seq_len <= original_max_len``.

    Taught in chapter 1, section 'Stretching the context: PI, NTK-aware, dynamic NTK and YaRN'.

    Beyond it, ``base' = base * (scale * seq_len / original_max_len - (scale - 1)) ** (D/(D-2))``
    and ``inv_freq[i] = base' ** (-2i/D)``, ``i = 0..D/2-1``. Tensor ``(head_dim/2,)``.
    """
    inv_freq = _numpy_backend.dynamic_ntk_inv_freq(head_dim, base, scale, seq_len, original_max_len)
    return torch.as_tensor(inv_freq, dtype=dtype, device=device)


def yarn_inv_freq(head_dim, base, scale, original_max_len, beta_fast=32, beta_slow=1, *, dtype=torch.float32, device=None):
    """YaRN: ``(inv_freq (head_dim/2,), attention_factor)``.

    Taught in chapter 1, section 'Stretching the context: PI, NTK-aware, dynamic NTK and YaRN'.

    ``inv_freq[i] = (1 - w[i]) theta[i] + w[i] theta[i] / scale`` for
    ``i = 0..D/2-1`` with ``w`` a linear ramp from 0 (pairs turning more than
    ``beta_fast`` times in ``original_max_len`` positions) to 1 (fewer than
    ``beta_slow`` times); ``attention_factor = 0.1 ln(scale) + 1`` (1 if
    ``scale <= 1``). See :func:`transformer_ref.numpy.yarn_inv_freq`.
    """
    inv_freq, attention_factor = _numpy_backend.yarn_inv_freq(head_dim, base, scale, original_max_len, beta_fast, beta_slow)
    return torch.as_tensor(inv_freq, dtype=dtype, device=device), attention_factor


def llama3_inv_freq(head_dim, base, scale, original_max_len, low_freq_factor=1.0, high_freq_factor=4.0, *,
                    dtype=torch.float32, device=None):
    """Llama 3's frequencies (Hugging Face ``"llama3"``): tensor ``(head_dim/2,)``.

    Taught in chapter 1, section 'Fixed bands and searched factors: Llama 3 and LongRoPE'.

    Pairs with wavelength ``lambda_i = 2 pi / theta_i`` below ``original_max_len / high_freq_factor``
    keep ``theta_i``, those above ``original_max_len / low_freq_factor`` get ``theta_i / scale``, and
    in between ``(1 - g_i) theta_i / scale + g_i theta_i`` with
    ``g_i = (original_max_len / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``,
    ``i = 0..D/2-1``. See :func:`transformer_ref.numpy.llama3_inv_freq`.
    """
    inv_freq = _numpy_backend.llama3_inv_freq(head_dim, base, scale, original_max_len, low_freq_factor,
                                              high_freq_factor)
    return torch.as_tensor(inv_freq, dtype=dtype, device=device)


def _factors_in(factors):
    """Rescale factors as NumPy (a tensor on any device is copied to the CPU), for the shared checks."""
    return factors.detach().cpu().double().numpy() if torch.is_tensor(factors) else factors


def longrope_inv_freq(head_dim, base, short_factor, long_factor, seq_len, original_max_len, scale, *,
                      dtype=torch.float32, device=None):
    """LongRoPE (Hugging Face ``"longrope"``, Phi-3): ``(inv_freq (head_dim/2,), attention_factor)``.

    Taught in chapter 1, section 'Fixed bands and searched factors: Llama 3 and LongRoPE'.

    ``inv_freq[i] = base ** (-2i/D) / f[i]``, ``i = 0..D/2-1``, with ``f = short_factor`` while
    ``seq_len <= original_max_len`` and ``long_factor`` beyond; ``attention_factor =
    sqrt(1 + ln(scale) / ln(original_max_len))`` (1 if ``scale == 1``). The factors may be
    sequences, arrays or tensors. See :func:`transformer_ref.numpy.longrope_inv_freq`.
    """
    inv_freq, attention_factor = _numpy_backend.longrope_inv_freq(
        head_dim, base, _factors_in(short_factor), _factors_in(long_factor), seq_len, original_max_len, scale)
    return torch.as_tensor(inv_freq, dtype=dtype, device=device), attention_factor


def _compute_dtype(dtype):
    """float64 stays float64; everything else (fp16, bf16, float32, ints) computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rope_angles(positions, inv_freq):
    """Rotation angles ``positions[..., None] * inv_freq``: ``(..., T)`` x ``(D/2,)`` -> ``(..., T, D/2)``.

    Taught in chapter 1, section 'Rotating one pair of features'.

    Computed in float64 if ``inv_freq`` is float64, else float32, on ``inv_freq``'s device.
    """
    inv_freq = torch.as_tensor(inv_freq)
    if inv_freq.ndim != 1:
        raise ValueError(f"inv_freq must be 1-D (D/2,), got shape {tuple(inv_freq.shape)}")
    dtype = _compute_dtype(inv_freq.dtype)
    positions = torch.as_tensor(positions, device=inv_freq.device).to(dtype)
    return positions[..., None] * inv_freq.to(dtype)


def rope_rotation_matrix(position, inv_freq):
    """The ``(D, D)`` RoPE matrix ``R(position)`` (interleaved layout).

    Taught in chapter 1, section 'The score depends only on the offset'.

    Block ``i`` acts on features ``(2i, 2i+1)`` and is ``[[cos a, -sin a], [sin a, cos a]]``
    with ``a = position * inv_freq[i]``; ``apply_rope(x, [position]) == x @ R.T``.
    """
    angles = rope_angles(position, inv_freq)
    if angles.ndim != 1:
        raise ValueError(f"position must be a scalar, got shape {tuple(angles.shape[:-1])}")
    cos, sin = torch.cos(angles), torch.sin(angles)
    # each pair's 2x2 block, then place the blocks on the diagonal
    blocks = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # (D/2, 2, 2)
    return torch.block_diag(*blocks.unbind(0))


def apply_rope(x, positions, inv_freq=None, *, base=10000.0, interleaved=True):
    """Rotate the last dimension of ``x (..., T, D)`` by RoPE (see the NumPy version).

    Taught in chapter 1, section 'Rotating one pair of features'.

    positions: ``(T,)`` or broadcastable to ``x.shape[:-1]`` (e.g. ``(B, 1, T)``).
    inv_freq: ``(D/2,)``; ``None`` means ``rope_inv_freq(D, base)``.
    interleaved: pairs ``(2i, 2i+1)`` if True, ``(i, i + D/2)`` if False; each
    pair ``(x1, x2)`` becomes ``(x1 cos a - x2 sin a, x1 sin a + x2 cos a)`` with
    ``a = positions[t] * inv_freq[i]``. Returns ``x.dtype`` (float32 for integer ``x``) on ``x.device``.
    For float64 ``x`` pass a float64 ``inv_freq`` (or ``None``), else the angles
    inherit float32 rounding (about ``position * 6e-8`` radians).
    """
    shape = _check_tensor("x", x, 2)
    D = check_even("x.shape[-1]", shape[-1], " for RoPE")
    dtype = _compute_dtype(x.dtype)
    if inv_freq is None:
        inv_freq = rope_inv_freq(D, base, dtype=torch.float64)
    inv_freq = torch.as_tensor(inv_freq).to(device=x.device, dtype=dtype)
    if tuple(inv_freq.shape) != (D // 2,):
        raise ValueError(f"inv_freq must have shape ({D // 2},) for head size {D}, got {tuple(inv_freq.shape)}")
    positions = torch.as_tensor(positions, device=x.device)
    check_broadcasts_to("positions", positions.shape, shape[:-1], "x.shape[:-1] =")
    angles = rope_angles(positions, inv_freq)  # (..., T, D/2)
    cos, sin = torch.cos(angles), torch.sin(angles)
    xc = x.to(dtype)
    if interleaved:
        x1, x2 = xc[..., 0::2], xc[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
    else:
        x1, x2 = xc[..., : D // 2], xc[..., D // 2 :]
        out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.to(x.dtype) if x.is_floating_point() else out  # integer x: float32, like NumPy's float64
