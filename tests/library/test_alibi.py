"""ALiBi: the published slopes, the authors' rule for other head counts, the bias and its alignment."""

import math

import numpy as np
import pytest
import torch

from transformer_ref import numpy as ref
from transformer_ref import torch as tref


def paper_code_slopes(n):
    """The recursion of ``get_slopes`` in the authors' repository (ofirpress/attention_with_linear_biases),
    written from its description: a power of two starts at and multiplies by ``2 ** (-8 / n)``; otherwise
    the slopes of the largest power of two below, then every other slope of twice that many heads."""
    if math.log2(n).is_integer():
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    closest = 2 ** math.floor(math.log2(n))
    return paper_code_slopes(closest) + paper_code_slopes(2 * closest)[0::2][: n - closest]


def test_published_slopes():
    # Press et al. 2022, Section 3: 8 heads use the geometric sequence 1/2, 1/2^2, ..., 1/2^8;
    # 16 heads the geometric means of consecutive pairs as well, 1/2^0.5, 1/2^1, ..., 1/2^8
    np.testing.assert_array_equal(ref.alibi_slopes(8), [1 / 2**i for i in range(1, 9)])
    np.testing.assert_allclose(ref.alibi_slopes(16), [2 ** -(i / 2) for i in range(1, 17)], rtol=1e-15)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 12, 20, 40, 96, 112])
def test_slopes_follow_the_authors_rule_for_any_head_count(n):
    # 112: BLOOM-176B's head count, whose slopes Hugging Face's build_alibi_tensor builds by this rule
    slopes = ref.alibi_slopes(n)
    assert slopes.shape == (n,) and slopes.dtype == np.float64
    np.testing.assert_allclose(slopes, paper_code_slopes(n), rtol=1e-14)
    assert len(set(slopes)) == n and (slopes > 0).all() and (slopes < 1).all()


def test_bias_is_minus_slope_times_distance():
    H, T, S = 3, 4, 7
    bias = ref.alibi_bias(H, T, S)
    slopes = paper_code_slopes(H)
    expected = [[[-slopes[h] * abs(i + S - T - j) for j in range(S)] for i in range(T)] for h in range(H)]
    assert bias.shape == (H, T, S)
    np.testing.assert_allclose(bias, expected, rtol=1e-15)
    # bottom-right: T new tokens after a cache are the last T rows of the full square bias
    np.testing.assert_array_equal(bias, ref.alibi_bias(H, S)[:, -T:])
    np.testing.assert_array_equal(ref.alibi_bias(H, 5), ref.alibi_bias(H, 5, 5))


def test_causal_alibi_attention_equals_blooms_key_position_form(rng):
    # BLOOM (Hugging Face build_alibi_tensor) adds m_h * j, the key's position, instead of
    # -m_h (i - j): the two differ by m_h * i, constant along a row, which the softmax ignores
    H, T, S, D = 4, 5, 9, 8
    q, k, v = rng.standard_normal((H, T, D)), rng.standard_normal((H, S, D)), rng.standard_normal((H, S, D))
    causal = ref.additive_mask(ref.causal_mask(T, S))
    ours = ref.scaled_dot_product_attention(q, k, v, ref.alibi_bias(H, T, S) + causal)
    bloom = ref.alibi_slopes(H)[:, None, None] * np.arange(S)[None, None, :]
    np.testing.assert_allclose(ours, ref.scaled_dot_product_attention(q, k, v, bloom + causal), rtol=1e-12)
    # and the bias matters: without it the result differs
    assert not np.allclose(ours, ref.scaled_dot_product_attention(q, k, v, causal))


def test_steeper_heads_look_more_locally():
    # equal content scores: the weights decay geometrically with distance, exp(-m) per step
    H, S = 8, 12
    weights = ref.softmax(ref.alibi_bias(H, 1, S), axis=-1)[:, 0]  # the newest token's row per head
    ratios = weights[:, 1:] / weights[:, :-1]
    np.testing.assert_allclose(ratios, np.exp(ref.alibi_slopes(H))[:, None] * np.ones((1, S - 1)), rtol=1e-12)
    assert (np.diff(weights[:, -1]) < 0).all()  # the weight on itself falls as the slope does


def test_backends_agree(device):
    np.testing.assert_allclose(tref.alibi_slopes(12, dtype=torch.float64).numpy(), ref.alibi_slopes(12), rtol=0)
    bias = tref.alibi_bias(6, 3, 8, device=device)
    assert bias.dtype == torch.float32 and bias.device.type == device and bias.shape == (6, 3, 8)
    np.testing.assert_allclose(bias.cpu().numpy(), ref.alibi_bias(6, 3, 8), rtol=1e-6)
    slopes = tref.alibi_slopes(4, dtype=torch.float64, device=device)
    assert slopes.dtype == torch.float64 and slopes.device.type == device
    # fewer keys than queries, as the masks allow
    np.testing.assert_allclose(tref.alibi_bias(2, 4, 2, dtype=torch.float64).numpy(), ref.alibi_bias(2, 4, 2))
