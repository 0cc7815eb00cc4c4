"""Rotary position embeddings (RoPE) and its long-context scalings, in NumPy.

RoPE (Su et al. 2021, "RoFormer") splits a head vector of even size ``D`` into
``D/2`` pairs and rotates pair ``i`` by the angle ``position * inv_freq[i]`` with

    inv_freq[i] = base ** (-2 i / D),      i = 0, 1, ..., D/2 - 1.

Pair ``i = 0`` turns fastest (one radian per position); pair ``D/2 - 1`` turns
slowest (``base ** (-(D-2)/D)`` radians per position). Because rotations compose,
the score ``<R(m) q, R(n) k>`` depends on the positions only through ``n - m``.

Two layouts of the pairs exist in the wild:

* ``interleaved=True``: pair ``i`` is features ``(2i, 2i+1)`` (the RoFormer paper,
  Meta's Llama reference code);
* ``interleaved=False``: pair ``i`` is features ``(i, i + D/2)`` (Hugging Face's
  ``rotate_half``). The two differ only by a fixed permutation of the features
  of q and k, so they give the same attention scores.

The scalings change only ``inv_freq`` (and, for YaRN, a logit temperature):

* position interpolation (Chen et al. 2023): every frequency divided by ``scale``;
* NTK-aware (bloc97, 2023): a larger base, so high frequencies barely move and
  the lowest is divided by exactly ``scale``;
* dynamic NTK: NTK-aware with a scale that grows with the current length;
* YaRN (Peng et al. 2023): per-pair blend of interpolation and extrapolation,
  plus an attention factor ``0.1 ln(scale) + 1``;
* Llama 3 (Meta's reference code, Hugging Face's ``"llama3"``): fixed wavelength bands,
  kept, blended or divided by ``scale``;
* LongRoPE (Ding et al. 2024; Phi-3, Hugging Face's ``"longrope"``): one searched
  rescale factor per pair, a short set up to the original length and a long set beyond it,
  plus an attention factor ``sqrt(1 + ln(scale) / ln(L))``.

The formulas follow Hugging Face's ``modeling_rope_utils.py`` so that its
published test vectors are reproduced (see ``tests/library/test_rope.py``).
"""

import math

import numpy as np

from .._checks import (check_broadcasts_to, check_even, check_int, check_ndim, check_positive_float,
                       check_rescale_factors)

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


def _check_base(base):
    # base ** (-2i/D) must decrease with i, so the base must exceed 1
    return check_positive_float("base", base, minimum=1.0, allow_equal=False)


def _check_rope_scale(scale):
    # the context is stretched, never shrunk
    return check_positive_float("scale", scale, minimum=1.0)


def _exponents(head_dim):
    """``2i / D`` for ``i = 0..D/2-1`` as a float64 array of shape ``(D/2,)``."""
    return np.arange(0, head_dim, 2, dtype=np.float64) / head_dim


def rope_inv_freq(head_dim, base=10000.0):
    """Plain RoPE frequencies, shape ``(head_dim/2,)``, float64.

    Taught in chapter 1, section 'Frequencies and wavelengths'.

    ``inv_freq[i] = base ** (-2 i / D)`` for ``i = 0..D/2-1`` (``D = head_dim``,
    even and positive; ``base > 1``). ``inv_freq[0] = 1``.
    """
    head_dim = check_even("head_dim", head_dim, " for RoPE")
    base = _check_base(base)
    return base ** -_exponents(head_dim)


def pi_inv_freq(head_dim, base, scale):
    """Position interpolation (Chen et al. 2023), shape ``(head_dim/2,)``.

    Taught in chapter 1, section 'Stretching the context: PI, NTK-aware, dynamic NTK and YaRN'.

    ``inv_freq[i] = base ** (-2 i / D) / scale`` for ``i = 0..D/2-1``: every pair
    turns ``scale`` times slower, which is the same as feeding positions
    ``m / scale``. ``scale >= 1`` (1 gives plain RoPE).
    """
    scale = _check_rope_scale(scale)
    return rope_inv_freq(head_dim, base) / scale


def _ntk_base(head_dim, base, scale):
    """NTK-aware base ``base * scale ** (D / (D - 2))``."""
    if head_dim == 2:
        # with a single pair the only frequency is the (fixed) highest one
        return base
    return base * scale ** (head_dim / (head_dim - 2))


def ntk_inv_freq(head_dim, base, scale):
    """NTK-aware scaled frequencies, shape ``(head_dim/2,)``.

    Taught in chapter 1, section 'Stretching the context: PI, NTK-aware, dynamic NTK and YaRN'.

    The base is enlarged to ``base' = base * scale ** (D / (D - 2))`` and then

        inv_freq[i] = base' ** (-2 i / D),    i = 0, 1, ..., D/2 - 1.

    So ``inv_freq[i] = base ** (-2i/D) * scale ** (-2i / (D - 2))``: the highest
    frequency (``i = 0``) is unchanged and the lowest (``i = D/2 - 1``, exponent
    ``(D-2)/D``) is divided by exactly ``scale``; the pairs in between are divided
    by ``scale ** (2i / (D-2))``, a geometric interpolation between 1 and ``scale``.
    ``scale >= 1``; ``scale = 1`` gives plain RoPE. (For ``D = 2`` there is only
    the ``i = 0`` pair, which is left unchanged.)
    """
    head_dim = check_even("head_dim", head_dim, " for RoPE")
    base = _check_base(base)
    scale = _check_rope_scale(scale)
    return rope_inv_freq(head_dim, _ntk_base(head_dim, base, scale))


def dynamic_ntk_inv_freq(head_dim, base, scale, seq_len, original_max_len):
    """Dynamic NTK scaling (as in Hugging Face's ``"dynamic"`` rope type).

    Taught in chapter 1, section 'Stretching the context: PI, NTK-aware, dynamic NTK and YaRN'.

    If ``seq_len <= original_max_len`` this is plain RoPE. Otherwise the base is

        base' = base * (scale * seq_len / original_max_len - (scale - 1)) ** (D / (D - 2))

    and ``inv_freq[i] = base' ** (-2 i / D)`` for ``i = 0..D/2-1``. The effective
    NTK factor ``scale * seq_len / L - (scale - 1)`` is 1 at ``seq_len = L`` and
    grows linearly with the length, so short prompts keep the trained frequencies.
    Shape ``(head_dim/2,)``.
    """
    head_dim = check_even("head_dim", head_dim, " for RoPE")
    base = _check_base(base)
    scale = _check_rope_scale(scale)
    seq_len = check_int("seq_len", seq_len, minimum=0)
    original_max_len = check_int("original_max_len", original_max_len, minimum=1)
    if seq_len <= original_max_len:
        return rope_inv_freq(head_dim, base)
    effective = scale * seq_len / original_max_len - (scale - 1)
    return rope_inv_freq(head_dim, _ntk_base(head_dim, base, effective))


def _yarn_ramp(head_dim, base, original_max_len, beta_fast, beta_slow):
    """YaRN's per-pair weight of the *interpolated* frequency, shape ``(D/2,)``.

    A pair with wavelength ``2 pi / inv_freq[i] = 2 pi base ** (2i/D)`` makes
    ``r = L / (2 pi base ** (2i/D))`` full turns over the original context ``L``.
    Solving for the pair index gives ``i(r) = D ln(L / (2 pi r)) / (2 ln base)``.
    Pairs that turn more than ``beta_fast`` times (``i < floor(i(beta_fast))``)
    are kept (weight 0); pairs that turn fewer than ``beta_slow`` times
    (``i > ceil(i(beta_slow))``) are fully interpolated (weight 1); a linear ramp
    joins them. Like Hugging Face we clamp the range to ``[0, D - 1]``.
    """

    def pair_index(rotations):
        return head_dim * math.log(original_max_len / (2 * math.pi * rotations)) / (2 * math.log(base))

    low = max(math.floor(pair_index(beta_fast)), 0)
    high = min(math.ceil(pair_index(beta_slow)), head_dim - 1)
    if high == low:
        high += 0.001  # avoid 0/0 when the ramp collapses to a step (as Hugging Face)
    ramp = (np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low)
    return np.clip(ramp, 0.0, 1.0)


def yarn_inv_freq(head_dim, base, scale, original_max_len, beta_fast=32, beta_slow=1):
    """YaRN frequencies and attention factor (Peng et al. 2023).

    Taught in chapter 1, section 'Stretching the context: PI, NTK-aware, dynamic NTK and YaRN'.

    Returns ``(inv_freq, attention_factor)`` with ``inv_freq`` of shape
    ``(head_dim/2,)``:

        inv_freq[i] = (1 - w[i]) * theta[i] + w[i] * theta[i] / scale,   i = 0..D/2-1

    where ``theta = rope_inv_freq(D, base)`` and ``w[i]`` ramps linearly from 0
    (pairs that turn more than ``beta_fast`` times within ``original_max_len``
    positions: extrapolated, i.e. untouched) to 1 (pairs that turn fewer than
    ``beta_slow`` times: interpolated, divided by ``scale``); the ramp ends are
    ``floor``/``ceil`` of ``D ln(L / (2 pi r)) / (2 ln base)`` for ``r = beta_fast``
    and ``beta_slow``, clamped to ``[0, D - 1]`` as in Hugging Face.
    ``attention_factor = 0.1 ln(scale) + 1`` (1 when ``scale <= 1``); the
    logits are meant to be multiplied by ``attention_factor ** 2`` (in practice
    cos and sin are multiplied by it). Requires ``beta_fast > beta_slow > 0``.
    """
    head_dim = check_even("head_dim", head_dim, " for RoPE")
    base = _check_base(base)
    scale = _check_rope_scale(scale)
    original_max_len = check_int("original_max_len", original_max_len, minimum=1)
    beta_fast = check_positive_float("beta_fast", beta_fast)
    beta_slow = check_positive_float("beta_slow", beta_slow)
    if beta_fast <= beta_slow:
        raise ValueError(f"beta_fast must be > beta_slow, got beta_fast={beta_fast}, beta_slow={beta_slow}")
    theta = rope_inv_freq(head_dim, base)
    w = _yarn_ramp(head_dim, base, original_max_len, beta_fast, beta_slow)
    inv_freq = (1.0 - w) * theta + w * theta / scale
    attention_factor = 0.1 * math.log(scale) + 1.0 if scale > 1 else 1.0
    return inv_freq, attention_factor


def llama3_inv_freq(head_dim, base, scale, original_max_len, low_freq_factor=1.0, high_freq_factor=4.0):
    """Llama 3's scaled frequencies (Meta's ``apply_scaling``; Hugging Face's ``"llama3"``), shape ``(head_dim/2,)``.

    Taught in chapter 1, section 'Fixed bands and searched factors: Llama 3 and LongRoPE'.

    With ``theta = rope_inv_freq(D, base)``, wavelengths ``lambda_i = 2 pi / theta_i`` for
    ``i = 0..D/2-1``, ``L = original_max_len`` and the smoothing weight
    ``g_i = (L / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``::

        inv_freq[i] = theta_i                                  if lambda_i < L / high_freq_factor
                    = theta_i / scale                          if lambda_i > L / low_freq_factor
                    = (1 - g_i) theta_i / scale + g_i theta_i  otherwise

    Short wavelengths are kept, long ones divided by ``scale`` (as in position interpolation),
    and ``g_i`` falls linearly in ``1 / lambda_i`` from 1 to 0 across the band in between, so
    the factor is continuous. Llama 3.1 uses ``base = 500000``, ``scale = 8``, ``L = 8192``,
    ``low_freq_factor = 1``, ``high_freq_factor = 4``. Requires ``scale >= 1`` and
    ``0 < low_freq_factor < high_freq_factor``. float64.
    """
    head_dim = check_even("head_dim", head_dim, " for RoPE")
    base = _check_base(base)
    scale = _check_rope_scale(scale)
    original_max_len = check_int("original_max_len", original_max_len, minimum=1)
    low_freq_factor = check_positive_float("low_freq_factor", low_freq_factor)
    high_freq_factor = check_positive_float("high_freq_factor", high_freq_factor)
    if high_freq_factor <= low_freq_factor:
        raise ValueError(f"high_freq_factor must be > low_freq_factor, got high_freq_factor={high_freq_factor}, "
                         f"low_freq_factor={low_freq_factor}")
    theta = rope_inv_freq(head_dim, base)
    wavelength = 2 * math.pi / theta
    smooth = (original_max_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1.0 - smooth) * theta / scale + smooth * theta
    inv_freq = np.where(wavelength > original_max_len / low_freq_factor, theta / scale, blended)
    return np.where(wavelength < original_max_len / high_freq_factor, theta, inv_freq)


def longrope_inv_freq(head_dim, base, short_factor, long_factor, seq_len, original_max_len, scale):
    """LongRoPE frequencies and attention factor (Ding et al. 2024; Hugging Face's ``"longrope"``, Phi-3).

    Taught in chapter 1, section 'Fixed bands and searched factors: Llama 3 and LongRoPE'.

    Returns ``(inv_freq, attention_factor)``, ``inv_freq`` of shape ``(head_dim/2,)``::

        inv_freq[i] = base ** (-2 i / D) / f[i],    i = 0..D/2-1
        f = short_factor  if seq_len <= original_max_len,  else long_factor
        attention_factor = sqrt(1 + ln(scale) / ln(original_max_len))   (1 if scale == 1)

    ``short_factor`` and ``long_factor`` hold ``D/2`` positive rescale factors, one per pair
    (LongRoPE finds them by an evolutionary search); ``seq_len`` is the current sequence length
    and ``scale >= 1`` the extension ratio (for Phi-3, ``max_position_embeddings /
    original_max_position_embeddings``). cos and sin are meant to be multiplied by
    ``attention_factor``. float64.
    """
    head_dim = check_even("head_dim", head_dim, " for RoPE")
    base = _check_base(base)
    short_factor = check_rescale_factors("short_factor", short_factor, head_dim // 2)
    long_factor = check_rescale_factors("long_factor", long_factor, head_dim // 2)
    seq_len = check_int("seq_len", seq_len, minimum=0)
    original_max_len = check_int("original_max_len", original_max_len, minimum=2)  # ln(1) = 0 below
    scale = _check_rope_scale(scale)
    factors = np.asarray(short_factor if seq_len <= original_max_len else long_factor, dtype=np.float64)
    attention_factor = math.sqrt(1 + math.log(scale) / math.log(original_max_len)) if scale > 1 else 1.0
    return rope_inv_freq(head_dim, base) / factors, attention_factor


def rope_angles(positions, inv_freq):
    """Rotation angles ``positions[..., None] * inv_freq``.

    Taught in chapter 1, section 'Rotating one pair of features'.

    positions: ``(..., T)`` (integers or floats); inv_freq: ``(D/2,)``.
    Returns ``(..., T, D/2)`` float64.
    """
    positions = np.asarray(positions, dtype=np.float64)
    inv_freq = np.asarray(inv_freq, dtype=np.float64)
    if inv_freq.ndim != 1:
        raise ValueError(f"inv_freq must be 1-D (D/2,), got shape {inv_freq.shape}")
    return positions[..., None] * inv_freq


def rope_rotation_matrix(position, inv_freq):
    """The ``(D, D)`` RoPE matrix ``R(position)`` in the interleaved layout.

    Taught in chapter 1, section 'The score depends only on the offset'.

    Block-diagonal with ``D/2`` blocks; block ``i`` acts on features
    ``(2i, 2i+1)`` and is ``[[cos a, -sin a], [sin a, cos a]]`` with
    ``a = position * inv_freq[i]``. ``apply_rope(x, [position])`` equals
    ``x @ R(position).T`` (i.e. ``R @ x`` for a column vector).
    """
    position = np.asarray(position, dtype=np.float64)
    if position.ndim != 0:
        raise ValueError(f"position must be a scalar, got shape {position.shape}")
    angles = rope_angles(position, inv_freq)  # (D/2,)
    cos, sin = np.cos(angles), np.sin(angles)
    half = angles.shape[0]
    R = np.zeros((2 * half, 2 * half))
    i = np.arange(half)
    R[2 * i, 2 * i] = cos
    R[2 * i, 2 * i + 1] = -sin
    R[2 * i + 1, 2 * i] = sin
    R[2 * i + 1, 2 * i + 1] = cos
    return R


def apply_rope(x, positions, inv_freq=None, *, base=10000.0, interleaved=True):
    """Rotate the last dimension of ``x`` by RoPE.

    Taught in chapter 1, section 'Rotating one pair of features'.

    x: ``(..., T, D)`` (e.g. ``(B, H, T, D)``), D even.
    positions: ``(T,)`` or any shape broadcastable to ``x.shape[:-1]`` (e.g.
    ``(B, 1, T)`` for per-sequence offsets).
    inv_freq: ``(D/2,)``; ``None`` means ``rope_inv_freq(D, base)``.
    interleaved: pair ``i`` is features ``(2i, 2i+1)`` if True, ``(i, i + D/2)``
    if False (Hugging Face ``rotate_half``). For a pair ``(x1, x2)`` with angle
    ``a = positions[t] * inv_freq[i]``::

        x1' = x1 cos a - x2 sin a
        x2' = x1 sin a + x2 cos a

    Returns an array of ``x``'s shape (float64 unless ``x`` is another float type).
    """
    x = np.asarray(x)
    shape = check_ndim("x", x, 2)
    D = check_even("x.shape[-1]", shape[-1], " for RoPE")
    if inv_freq is None:
        inv_freq = rope_inv_freq(D, base)
    inv_freq = np.asarray(inv_freq, dtype=np.float64)
    if inv_freq.shape != (D // 2,):
        raise ValueError(f"inv_freq must have shape ({D // 2},) for head size {D}, got {inv_freq.shape}")
    positions = np.asarray(positions)
    check_broadcasts_to("positions", positions.shape, shape[:-1], "x.shape[:-1] =")
    angles = rope_angles(positions, inv_freq)  # (..., T, D/2)
    cos, sin = np.cos(angles), np.sin(angles)
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty(shape, dtype=dtype)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(dtype, copy=False)
