"""ALiBi, attention with linear biases (Press et al. 2022), in PyTorch.

Same functions and semantics as :mod:`transformer_ref.numpy.alibi` (read its docstring for the
slopes' rule). The slopes are computed once in float64 by the NumPy backend and returned as
tensors; ``dtype`` defaults to float32, ``device`` to the CPU.
"""

import torch

from .. import numpy as _numpy_backend
from .masks import _query_key_offsets

__all__ = ["alibi_slopes", "alibi_bias"]


def alibi_slopes(n_heads, *, dtype=torch.float32, device=None):
    """ALiBi's head slopes, tensor ``(n_heads,)``, largest first (Press et al. 2022).

    ``n_heads`` a power of two: ``m_h = 2 ** (-8 h / n_heads)``, ``h = 1..n_heads`` (8 heads:
    ``1/2 .. 1/256``); otherwise the ``c = 2 ** floor(log2 n_heads)`` slopes of ``c`` heads, then
    ``2 ** (-8 (2j - 1) / (2c))``, ``j = 1..n_heads - c`` (the paper's code, BLOOM).
    """
    return torch.as_tensor(_numpy_backend.alibi_slopes(n_heads), dtype=dtype, device=device)


def alibi_bias(n_heads, T, S=None, *, dtype=torch.float32, device=None):
    """ALiBi's additive bias, ``(n_heads, T, S)``: ``bias[h, i, j] = -m_h * |i + S - T - j|``.

    ``m_h`` = :func:`alibi_slopes`; bottom-right aligned like :func:`causal_mask` (``S`` defaults to
    ``T``); on the keys a causal mask keeps it is the paper's ``-m_h (p_i - j)``. Add it to the
    scores as a float mask (with ``additive_mask(causal_mask(T, S))`` for a decoder).
    """
    slopes = alibi_slopes(n_heads, dtype=torch.float64, device=device)
    distance = _query_key_offsets(T, S, device).abs()  # (T, S): |j - p_i|
    return (-slopes[:, None, None] * distance).to(dtype)
