"""ALiBi, attention with linear biases (Press et al. 2022), in NumPy.

ALiBi gives a transformer no position embedding at all. Instead, head ``h`` adds to the
score of query position ``p`` and key position ``j`` a penalty linear in their distance,

    bias[h, p, j] = -m_h * (p - j),          j <= p,

with a fixed, head-specific slope ``m_h`` (Press, Smith & Lewis 2022, "Train Short, Test
Long: Attention with Linear Biases Enables Input Length Extrapolation", ICLR 2022,
arXiv:2108.12409, Section 3). For ``n`` heads, ``n`` a power of two, the slopes are the
geometric sequence

    m_h = 2 ** (-8 h / n),                   h = 1, ..., n

(8 heads: 1/2, 1/4, ..., 1/256). For other ``n`` the authors' code
(``get_slopes`` in ofirpress/attention_with_linear_biases, and BLOOM's
``build_alibi_tensor`` in Hugging Face transformers) takes the ``c = 2 ** floor(log2 n)``
slopes of ``c`` heads, then the first ``n - c`` odd-numbered slopes of ``2c`` heads:

    m_h = 2 ** (-8 h / c),                   h = 1, ..., c
    m_{c+j} = 2 ** (-8 (2j - 1) / (2c)),     j = 1, ..., n - c.

Because the bias depends on ``p - j`` only, it stays defined for any length: the paper trains
at one sequence length and evaluates the same model on longer ones, changing nothing.
"""

import numpy as np

from .._checks import check_int
from .masks import _query_key_offsets

__all__ = ["alibi_slopes", "alibi_bias"]


def alibi_slopes(n_heads):
    """ALiBi's head slopes, float64 ``(n_heads,)``, largest first (Press et al. 2022).

    ``n_heads`` a power of two: ``m_h = 2 ** (-8 h / n_heads)``, ``h = 1..n_heads``
    (8 heads: ``1/2, 1/4, ..., 1/256``). Otherwise, with ``c = 2 ** floor(log2 n_heads)``,
    the ``c`` slopes of ``c`` heads followed by ``2 ** (-8 (2j - 1) / (2c))``,
    ``j = 1..n_heads - c`` (the rule of the paper's code and of BLOOM). ``n_heads >= 1``.
    """
    n_heads = check_int("n_heads", n_heads, minimum=1)
    c = 1 << (n_heads.bit_length() - 1)  # the largest power of two <= n_heads
    first = 2.0 ** (-8.0 * np.arange(1, c + 1) / c)
    rest = 2.0 ** (-8.0 * (2 * np.arange(1, n_heads - c + 1) - 1) / (2 * c))
    return np.concatenate([first, rest])


def alibi_bias(n_heads, T, S=None):
    """ALiBi's additive bias, float64 ``(n_heads, T, S)``: ``bias[h, i, j] = -m_h * |p_i - j|``.

    ``m_h`` = :func:`alibi_slopes`, ``p_i = i + S - T`` the absolute position of query ``i``
    (bottom-right aligned like :func:`causal_mask`, so the last of ``T`` new tokens after a
    cache of ``S - T`` sits at ``S - 1``; ``S`` defaults to ``T``). On the keys a causal mask
    lets through (``j <= p_i``) this is the paper's ``-m_h (p_i - j)``; future keys get the
    same penalty by distance. Add it to the scores as a float mask, e.g.
    ``scaled_dot_product_attention(q, k, v, alibi_bias(H, T, S) + additive_mask(causal_mask(T, S)))``;
    it broadcasts against scores ``(..., H, T, S)``.
    """
    slopes = alibi_slopes(n_heads)
    distance = np.abs(_query_key_offsets(T, S))  # (T, S): |j - p_i|
    return -slopes[:, None, None] * distance
