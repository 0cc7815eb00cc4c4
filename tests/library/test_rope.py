"""RoPE and its scalings: published numbers, the properties the chapter teaches,
independent re-derivations, and NumPy/torch agreement."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from transformer_ref import numpy as ref
from transformer_ref import torch as tref

# --------------------------------------------------------------------------
# Hugging Face's published vectors (tests/utils/test_modeling_rope_utils.py in
# huggingface/transformers). They use LlamaConfig(): head_dim = 4096/32 = 128,
# rope_theta = 10000, max_position_embeddings = 2048, and compare float32
# tensors with torch.testing.assert_close's defaults (rtol 1.3e-6, atol 1e-5).
# --------------------------------------------------------------------------
HF_HEAD_DIM, HF_BASE, HF_MAX_POS = 128, 10000.0, 2048

# fmt: off
HF_DEFAULT = [
    1.0000e+00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01,
    4.2170e-01, 3.6517e-01, 3.1623e-01, 2.7384e-01, 2.3714e-01, 2.0535e-01,
    1.7783e-01, 1.5399e-01, 1.3335e-01, 1.1548e-01, 1.0000e-01, 8.6596e-02,
    7.4989e-02, 6.4938e-02, 5.6234e-02, 4.8697e-02, 4.2170e-02, 3.6517e-02,
    3.1623e-02, 2.7384e-02, 2.3714e-02, 2.0535e-02, 1.7783e-02, 1.5399e-02,
    1.3335e-02, 1.1548e-02, 1.0000e-02, 8.6596e-03, 7.4989e-03, 6.4938e-03,
    5.6234e-03, 4.8697e-03, 4.2170e-03, 3.6517e-03, 3.1623e-03, 2.7384e-03,
    2.3714e-03, 2.0535e-03, 1.7783e-03, 1.5399e-03, 1.3335e-03, 1.1548e-03,
    1.0000e-03, 8.6596e-04, 7.4989e-04, 6.4938e-04, 5.6234e-04, 4.8697e-04,
    4.2170e-04, 3.6517e-04, 3.1623e-04, 2.7384e-04, 2.3714e-04, 2.0535e-04,
    1.7783e-04, 1.5399e-04, 1.3335e-04, 1.1548e-04,
]
# dynamic NTK, factor 10, seq_len 16384 > 2048
HF_DYNAMIC_10_16384 = [
    1.0000e+00, 8.0931e-01, 6.5498e-01, 5.3008e-01, 4.2900e-01, 3.4720e-01,
    2.8099e-01, 2.2741e-01, 1.8404e-01, 1.4895e-01, 1.2055e-01, 9.7558e-02,
    7.8955e-02, 6.3899e-02, 5.1714e-02, 4.1853e-02, 3.3872e-02, 2.7413e-02,
    2.2185e-02, 1.7955e-02, 1.4531e-02, 1.1760e-02, 9.5176e-03, 7.7027e-03,
    6.2339e-03, 5.0451e-03, 4.0831e-03, 3.3045e-03, 2.6744e-03, 2.1644e-03,
    1.7517e-03, 1.4176e-03, 1.1473e-03, 9.2852e-04, 7.5146e-04, 6.0817e-04,
    4.9220e-04, 3.9834e-04, 3.2238e-04, 2.6091e-04, 2.1115e-04, 1.7089e-04,
    1.3830e-04, 1.1193e-04, 9.0585e-05, 7.3312e-05, 5.9332e-05, 4.8018e-05,
    3.8861e-05, 3.1451e-05, 2.5453e-05, 2.0600e-05, 1.6672e-05, 1.3492e-05,
    1.0920e-05, 8.8374e-06, 7.1522e-06, 5.7883e-06, 4.6845e-06, 3.7912e-06,
    3.0683e-06, 2.4832e-06, 2.0097e-06, 1.6265e-06,
]
# YaRN, factor 10, beta_fast 32, beta_slow 1, original length 2048
HF_YARN_10 = [
    1.0000e+00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01,
    4.2170e-01, 3.6517e-01, 3.1623e-01, 2.7384e-01, 2.3714e-01, 2.0535e-01,
    1.7783e-01, 1.5399e-01, 1.3335e-01, 1.1548e-01, 1.0000e-01, 8.3479e-02,
    6.9590e-02, 5.7925e-02, 4.8136e-02, 3.9931e-02, 3.3061e-02, 2.7315e-02,
    2.2515e-02, 1.8512e-02, 1.5177e-02, 1.2403e-02, 1.0101e-02, 8.1924e-03,
    6.6143e-03, 5.3120e-03, 4.2400e-03, 3.3599e-03, 2.6396e-03, 2.0520e-03,
    1.5746e-03, 1.1882e-03, 8.7713e-04, 6.2810e-04, 4.3007e-04, 2.7384e-04,
    2.3714e-04, 2.0535e-04, 1.7783e-04, 1.5399e-04, 1.3335e-04, 1.1548e-04,
    1.0000e-04, 8.6596e-05, 7.4989e-05, 6.4938e-05, 5.6234e-05, 4.8697e-05,
    4.2170e-05, 3.6517e-05, 3.1623e-05, 2.7384e-05, 2.3714e-05, 2.0535e-05,
    1.7783e-05, 1.5399e-05, 1.3335e-05, 1.1548e-05,
]
# Llama 3, factor 10, original length 2048, low_freq_factor 1, high_freq_factor 4
# (test_llama3_rope_numerically in the same file, huggingface/transformers at commit
# 087e800256786f75d7392f947c17dfb5fac2dc3b)
HF_LLAMA3_10 = [
    1.0000e+00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01,
    4.2170e-01, 3.6517e-01, 3.1623e-01, 2.7384e-01, 2.3714e-01, 2.0535e-01,
    1.7783e-01, 1.5399e-01, 1.3335e-01, 1.1548e-01, 1.0000e-01, 8.6596e-02,
    7.4989e-02, 6.4938e-02, 5.6234e-02, 4.8697e-02, 4.2170e-02, 3.6517e-02,
    3.1623e-02, 2.7384e-02, 2.3714e-02, 2.0535e-02, 1.7783e-02, 1.5399e-02,
    1.3335e-02, 1.0730e-02, 7.7785e-03, 5.6009e-03, 3.9991e-03, 2.8248e-03,
    1.9675e-03, 1.3449e-03, 8.9549e-04, 5.7363e-04, 3.4539e-04, 2.7384e-04,
    2.3714e-04, 2.0535e-04, 1.7783e-04, 1.5399e-04, 1.3335e-04, 1.1548e-04,
    1.0000e-04, 8.6596e-05, 7.4989e-05, 6.4938e-05, 5.6234e-05, 4.8697e-05,
    4.2170e-05, 3.6517e-05, 3.1623e-05, 2.7384e-05, 2.3714e-05, 2.0535e-05,
    1.7783e-05, 1.5399e-05, 1.3335e-05, 1.1548e-05,
]
# fmt: on


def assert_hf_close(actual, expected):
    """Hugging Face's tolerance (float32 assert_close defaults), plus a relative check
    at the 5 significant digits the published vectors are printed with."""
    actual = torch.as_tensor(np.asarray(actual, dtype=np.float32))
    expected = torch.tensor(expected, dtype=torch.float32)
    torch.testing.assert_close(actual, expected, rtol=1.3e-6, atol=1e-5)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=0)


BACKENDS = [
    pytest.param(lambda f, *a, **kw: getattr(ref, f)(*a, **kw), id="numpy"),
    pytest.param(lambda f, *a, **kw: getattr(tref, f)(*a, **kw), id="torch"),
]


@pytest.mark.parametrize("call", BACKENDS)
def test_default_matches_hugging_face(call):
    inv_freq = call("rope_inv_freq", HF_HEAD_DIM, HF_BASE)
    assert tuple(inv_freq.shape) == (64,)
    assert_hf_close(inv_freq, HF_DEFAULT)


def test_torch_inv_freq_defaults_to_float32_like_hugging_face(device):
    assert tref.rope_inv_freq(128).dtype == torch.float32
    assert tref.rope_inv_freq(128, dtype=torch.float64).dtype == torch.float64
    assert tref.rope_inv_freq(128, device=device).device.type == device
    inv_freq, _ = tref.yarn_inv_freq(128, 1e4, 4.0, 2048, device=device)
    assert inv_freq.device.type == device and inv_freq.dtype == torch.float32


@pytest.mark.parametrize("call", BACKENDS)
@pytest.mark.parametrize("factor", [2.0, 10.0, 20.0])
def test_linear_scaling_matches_hugging_face(call, factor):
    # HF "linear" = position interpolation: default frequencies divided by the factor
    expected = torch.tensor(HF_DEFAULT) / factor
    actual = torch.as_tensor(np.asarray(call("pi_inv_freq", HF_HEAD_DIM, HF_BASE, factor), dtype=np.float32))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("call", BACKENDS)
def test_dynamic_ntk_matches_hugging_face(call):
    for factor in (2.0, 10.0, 20.0):
        for seq_len in (1, HF_MAX_POS):  # not longer than the training length: no change
            assert_hf_close(call("dynamic_ntk_inv_freq", HF_HEAD_DIM, HF_BASE, factor, seq_len, HF_MAX_POS), HF_DEFAULT)
    inv_freq = call("dynamic_ntk_inv_freq", HF_HEAD_DIM, HF_BASE, 10.0, 16384, HF_MAX_POS)
    assert_hf_close(inv_freq, HF_DYNAMIC_10_16384)
    # ... and it is not simply a linear division by the factor
    assert not np.allclose(np.asarray(inv_freq), np.asarray(HF_DEFAULT) / 10.0, rtol=1e-3)


@pytest.mark.parametrize("call", BACKENDS)
def test_yarn_matches_hugging_face(call):
    for factor in (2.0, 10.0, 20.0):
        _, attention_factor = call("yarn_inv_freq", HF_HEAD_DIM, HF_BASE, factor, HF_MAX_POS)
        assert attention_factor == pytest.approx(0.1 * math.log(factor) + 1.0, rel=1e-12)
    default = np.asarray(HF_DEFAULT)
    inv_freq, _ = call("yarn_inv_freq", HF_HEAD_DIM, HF_BASE, 10.0, HF_MAX_POS, beta_fast=32, beta_slow=1)
    inv_freq = np.asarray(inv_freq, dtype=np.float64)
    # bounded between interpolation (default / factor) and extrapolation (default)
    margin = 1e-4 * default  # the published defaults are rounded to 5 digits
    assert np.all(default / 10.0 - margin <= inv_freq) and np.all(inv_freq <= default + margin)
    assert_hf_close(inv_freq, HF_YARN_10)
    # a huge beta_fast interpolates everything but the first pair, the last ~20 fully
    inv_freq, _ = call("yarn_inv_freq", HF_HEAD_DIM, HF_BASE, 10.0, HF_MAX_POS, beta_fast=1000, beta_slow=1)
    inv_freq = np.asarray(inv_freq, dtype=np.float64)
    assert inv_freq[0] == pytest.approx(1.0)
    assert np.all(inv_freq[1:] < default[1:] * (1 - 1e-4))
    np.testing.assert_allclose(inv_freq[-20:], default[-20:] / 10.0, rtol=1e-4)


@pytest.mark.parametrize("call", BACKENDS)
def test_llama3_matches_hugging_face(call):
    default = np.asarray(HF_DEFAULT)
    inv_freq = np.asarray(call("llama3_inv_freq", HF_HEAD_DIM, HF_BASE, 10.0, HF_MAX_POS, 1.0, 4.0), dtype=np.float64)
    assert inv_freq.shape == (64,)
    assert_hf_close(inv_freq, HF_LLAMA3_10)
    # Hugging Face's checks: bounded by default / factor and default; a huge high_freq_factor
    # leaves no pair in the "high frequency" band, so every pair is scaled
    margin = 1e-4 * default
    assert np.all(default / 10.0 - margin <= inv_freq) and np.all(inv_freq <= default + margin)
    everything = np.asarray(call("llama3_inv_freq", HF_HEAD_DIM, HF_BASE, 10.0, HF_MAX_POS, 1.0, 1000.0))
    assert np.all(everything < default * (1 - 1e-4))


@pytest.mark.parametrize("call", BACKENDS)
def test_longrope_matches_hugging_face(call):
    # Hugging Face's test_longrope_rope_numerically (same file and commit): short factors 2,
    # long factors 1, 2, ..., 64, original length 2048; the attention factor for scale s is
    # sqrt(1 + ln s / ln 2048). Which set applies follows the current length (modeling_rope_utils:
    # long only when seq_len > original_max_position_embeddings).
    short, long = [2.0] * 64, list(np.arange(1.0, 65.0))
    default = torch.tensor(HF_DEFAULT, dtype=torch.float64)
    for scale in (2.0, 10.0, 20.0):
        _, attention_factor = call("longrope_inv_freq", HF_HEAD_DIM, HF_BASE, short, long, 1, HF_MAX_POS, scale)
        assert attention_factor == pytest.approx(math.sqrt(1 + math.log(scale) / math.log(HF_MAX_POS)), rel=1e-12)
    inv_freq, attention_factor = call("longrope_inv_freq", HF_HEAD_DIM, HF_BASE, short, long, HF_MAX_POS, HF_MAX_POS, 1.0)
    assert attention_factor == 1.0
    assert_hf_close(inv_freq, (default / torch.tensor(short, dtype=torch.float64)).tolist())
    inv_freq, _ = call("longrope_inv_freq", HF_HEAD_DIM, HF_BASE, short, long, HF_MAX_POS + 1, HF_MAX_POS, 10.0)
    assert_hf_close(inv_freq, (default / torch.tensor(long, dtype=torch.float64)).tolist())


def test_llama31_configuration_with_base_500000():
    # Llama 3.1 (Meta's llama-models, models/llama3/model.py apply_scaling and args.py):
    # base 500000, factor 8, original context 8192, bands 1 and 4, head size 128
    plain = ref.rope_inv_freq(128, 500000.0)
    scaled = ref.llama3_inv_freq(128, 500000.0, 8.0, 8192)
    wavelength = 2 * math.pi / plain
    kept, divided = wavelength < 8192 / 4, wavelength > 8192
    assert np.array_equal(scaled[kept], plain[kept]) and np.allclose(scaled[divided], plain[divided] / 8, rtol=1e-15)
    assert kept.sum() + divided.sum() < 64  # a band in between is blended
    assert (kept.sum(), divided.sum()) == (int(np.sum(wavelength < 2048)), int(np.sum(wavelength > 8192)))


@pytest.mark.parametrize("scale", [1.0, 4.0, 32.0])
def test_longrope_switches_at_the_original_length(scale):
    short, long = np.linspace(1.0, 2.0, 8), np.linspace(1.0, 32.0, 8)
    plain = ref.rope_inv_freq(16, 1e4)
    for seq_len, factors in [(0, short), (4096, short), (4097, long), (10**6, long)]:
        inv_freq, attention = ref.longrope_inv_freq(16, 1e4, short, long, seq_len, 4096, scale)
        np.testing.assert_allclose(inv_freq, plain / factors, rtol=1e-15)
        assert attention == (1.0 if scale == 1 else pytest.approx(math.sqrt(1 + math.log(scale) / math.log(4096))))


def test_yarn_ramp_worked_example_with_a_long_original_context():
    # D = 16, base = 1e4, L = 65536: pair index at r turns is 16 ln(L / (2 pi r)) / (2 ln 1e4)
    #   r = 32 -> 5.03 -> floor 5;   r = 1 -> 8.03 -> ceil 9
    # The ramp ends past the last pair (7): like Hugging Face (and the YaRN reference code)
    # we clamp at D - 1 = 15, not at D/2 - 1, so the ramp is w = (i - 5) / 4 for i = 5..7.
    plain = ref.rope_inv_freq(16, 1e4)
    inv_freq, factor = ref.yarn_inv_freq(16, 1e4, 4.0, 65536)
    w = np.array([0, 0, 0, 0, 0, 0, 0.25, 0.5])
    np.testing.assert_allclose(inv_freq, (1 - w) * plain + w * plain / 4.0, rtol=1e-14)
    assert factor == pytest.approx(0.1 * math.log(4.0) + 1)


def test_yarn_attention_factor_is_one_without_scaling():
    assert ref.yarn_inv_freq(64, 1e4, 1.0, 4096)[1] == 1.0
    np.testing.assert_allclose(ref.yarn_inv_freq(64, 1e4, 1.0, 4096)[0], ref.rope_inv_freq(64, 1e4), rtol=1e-15)


# --------------------------------------------------------------------------
# The frequency formulas from first principles
# --------------------------------------------------------------------------
head_dims = st.integers(1, 64).map(lambda n: 2 * n)
bases = st.sampled_from([100.0, 10000.0, 500000.0])
scales = st.floats(1.0, 64.0)


@given(head_dim=head_dims, base=bases)
def test_inv_freq_is_a_geometric_sequence_from_one(head_dim, base):
    inv_freq = ref.rope_inv_freq(head_dim, base)
    assert inv_freq.shape == (head_dim // 2,)
    assert inv_freq[0] == 1.0
    # consecutive pairs differ by the constant ratio base^(-2/D); the last is base^(-(D-2)/D)
    np.testing.assert_allclose(inv_freq[1:] / inv_freq[:-1], base ** (-2 / head_dim), rtol=1e-12)
    assert inv_freq[-1] == pytest.approx(base ** (-(head_dim - 2) / head_dim), rel=1e-12)


@given(head_dim=head_dims, base=bases, scale=scales)
def test_position_interpolation_divides_every_frequency(head_dim, base, scale):
    np.testing.assert_allclose(ref.pi_inv_freq(head_dim, base, scale), ref.rope_inv_freq(head_dim, base) / scale, rtol=1e-14)


@given(head_dim=head_dims, base=bases)
def test_ntk_with_scale_one_is_plain_rope(head_dim, base):
    np.testing.assert_allclose(ref.ntk_inv_freq(head_dim, base, 1.0), ref.rope_inv_freq(head_dim, base), rtol=1e-14)


@given(head_dim=st.integers(2, 64).map(lambda n: 2 * n), base=bases, scale=scales)
def test_ntk_keeps_highest_and_divides_lowest_frequency_by_scale(head_dim, base, scale):
    plain = ref.rope_inv_freq(head_dim, base)
    ntk = ref.ntk_inv_freq(head_dim, base, scale)
    assert ntk[0] == pytest.approx(plain[0], rel=1e-14)  # i = 0: unchanged
    assert ntk[-1] == pytest.approx(plain[-1] / scale, rel=1e-10)  # i = D/2 - 1: divided by scale
    ratio = plain / ntk  # each pair slowed by a factor between 1 and scale, growing with i
    assert np.all(ratio >= 1 - 1e-12) and np.all(ratio <= scale * (1 + 1e-12))
    assert np.all(np.diff(ratio) >= -1e-12)


@given(head_dim=st.integers(2, 64).map(lambda n: 2 * n), base=bases, scale=scales,
       factor=st.floats(1.0, 20.0), original=st.sampled_from([512, 2048, 4096]))
def test_dynamic_ntk_is_ntk_with_a_length_dependent_scale(head_dim, base, scale, factor, original):
    seq_len = int(original * factor)
    dynamic = ref.dynamic_ntk_inv_freq(head_dim, base, scale, seq_len, original)
    if seq_len <= original:
        np.testing.assert_allclose(dynamic, ref.rope_inv_freq(head_dim, base), rtol=1e-14)
    else:
        effective = scale * seq_len / original - (scale - 1)
        np.testing.assert_allclose(dynamic, ref.ntk_inv_freq(head_dim, base, effective), rtol=1e-12)


@given(head_dim=st.integers(4, 64).map(lambda n: 2 * n), base=bases, scale=st.floats(1.5, 64.0),
       original=st.sampled_from([256, 2048, 8192]), betas=st.sampled_from([(32, 1), (16, 2), (64, 0.5)]))
def test_yarn_keeps_fast_pairs_and_interpolates_slow_pairs(head_dim, base, scale, original, betas):
    beta_fast, beta_slow = betas
    plain = ref.rope_inv_freq(head_dim, base)
    yarn, attention_factor = ref.yarn_inv_freq(head_dim, base, scale, original, beta_fast, beta_slow)
    turns = original * plain / (2 * math.pi)  # full rotations of each pair over the original context
    fast, slow = turns > beta_fast, turns < beta_slow
    np.testing.assert_allclose(yarn[fast], plain[fast], rtol=1e-14)
    np.testing.assert_allclose(yarn[slow], plain[slow] / scale, rtol=1e-12)
    assert np.all(yarn <= plain * (1 + 1e-12)) and np.all(yarn >= plain / scale * (1 - 1e-12))
    assert attention_factor == pytest.approx(0.1 * math.log(scale) + 1)


def llama3_by_bands(head_dim, base, scale, original, low, high):
    """Meta's apply_scaling written out pair by pair: keep, divide or blend by wavelength band."""
    out = []
    for i in range(head_dim // 2):
        theta = base ** (-2 * i / head_dim)
        wavelength = 2 * math.pi / theta
        if wavelength < original / high:
            out.append(theta)
        elif wavelength > original / low:
            out.append(theta / scale)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append((1 - smooth) * theta / scale + smooth * theta)
    return np.array(out)


@given(head_dim=st.integers(2, 64).map(lambda n: 2 * n), base=bases, scale=scales,
       original=st.sampled_from([2048, 8192]), bands=st.sampled_from([(1.0, 4.0), (2.0, 8.0), (0.5, 32.0)]))
def test_llama3_keeps_short_divides_long_and_blends_in_between(head_dim, base, scale, original, bands):
    low, high = bands
    inv_freq = ref.llama3_inv_freq(head_dim, base, scale, original, low, high)
    np.testing.assert_allclose(inv_freq, llama3_by_bands(head_dim, base, scale, original, low, high), rtol=1e-12)
    plain = ref.rope_inv_freq(head_dim, base)
    ratio = plain / inv_freq  # 1 for short wavelengths, scale for long ones, monotone in between
    assert np.all(ratio >= 1 - 1e-12) and np.all(ratio <= scale * (1 + 1e-12))
    assert np.all(np.diff(ratio) >= -1e-12)


# --------------------------------------------------------------------------
# The rotation itself
# --------------------------------------------------------------------------
def llama_style_rope(x, positions, inv_freq):
    """Independent interleaved RoPE: features (2i, 2i+1) as a complex number times e^{i m theta_i}."""
    z = x[..., 0::2] + 1j * x[..., 1::2]
    z = z * np.exp(1j * positions[:, None] * inv_freq)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def hf_style_rope(x, positions, inv_freq):
    """Independent half-split RoPE: x cos + rotate_half(x) sin, as Hugging Face writes it."""
    angles = np.concatenate([positions[:, None] * inv_freq] * 2, axis=-1)
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(angles) + rotated * np.sin(angles)


def test_apply_rope_matches_independent_formulations(rng):
    x = rng.standard_normal((2, 3, 7, 16))
    positions = np.arange(7) + 5.0
    inv_freq = ref.rope_inv_freq(16, 500.0)
    np.testing.assert_allclose(ref.apply_rope(x, positions, inv_freq), llama_style_rope(x, positions, inv_freq), atol=1e-12)
    np.testing.assert_allclose(
        ref.apply_rope(x, positions, base=500.0, interleaved=False), hf_style_rope(x, positions, inv_freq), atol=1e-12
    )


@given(head_dim=st.integers(1, 16).map(lambda n: 2 * n), m=st.integers(0, 4096), n=st.integers(0, 4096),
       shift=st.integers(-2048, 2048), interleaved=st.booleans(), seed=st.integers(0, 2**16))
def test_scores_depend_only_on_relative_position(head_dim, m, n, shift, interleaved, seed):
    q, k = np.random.default_rng(seed).standard_normal((2, 1, head_dim))
    score = lambda a, b: float(  # noqa: E731
        ref.apply_rope(q, [a], interleaved=interleaved)[0] @ ref.apply_rope(k, [b], interleaved=interleaved)[0]
    )
    assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-9)


@given(head_dim=st.integers(1, 16).map(lambda n: 2 * n), a=st.floats(-1e4, 1e4), b=st.floats(-1e4, 1e4))
def test_rotation_matrices_compose(head_dim, a, b):
    inv_freq = ref.rope_inv_freq(head_dim)
    Ra, Rb = ref.rope_rotation_matrix(a, inv_freq), ref.rope_rotation_matrix(b, inv_freq)
    np.testing.assert_allclose(Ra.T @ Rb, ref.rope_rotation_matrix(b - a, inv_freq), atol=1e-9)
    np.testing.assert_allclose(Ra.T @ Ra, np.eye(head_dim), atol=1e-12)  # orthogonal


def test_rotation_matrix_is_block_diagonal_in_interleaved_pairs():
    inv_freq = np.array([1.0, 0.1, 0.01])
    R = ref.rope_rotation_matrix(2.0, inv_freq)
    for i, theta in enumerate(inv_freq):
        c, s = math.cos(2.0 * theta), math.sin(2.0 * theta)
        np.testing.assert_allclose(R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2], [[c, -s], [s, c]], atol=1e-15)
    off_diagonal = R.copy()
    for i in range(3):
        off_diagonal[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = 0
    assert not off_diagonal.any()


@given(head_dim=st.integers(1, 16).map(lambda n: 2 * n), T=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_apply_rope_is_the_rotation_matrix_and_keeps_norms(head_dim, T, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, T, head_dim))
    positions = rng.integers(0, 10000, size=T)
    inv_freq = ref.rope_inv_freq(head_dim)
    out = ref.apply_rope(x, positions, inv_freq)
    for t, p in enumerate(positions):
        np.testing.assert_allclose(out[:, t], x[:, t] @ ref.rope_rotation_matrix(p, inv_freq).T, atol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)


@given(head_dim=st.integers(1, 16).map(lambda n: 2 * n), T=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_layouts_differ_by_a_feature_permutation(head_dim, T, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 2, T, head_dim))
    positions = rng.integers(0, 1000, size=T)
    # interleaved pair i = (2i, 2i+1)  <->  half-split pair i = (i, i + D/2)
    perm = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    inter = ref.apply_rope(q, positions, interleaved=True)
    half = ref.apply_rope(q[..., perm], positions, interleaved=False)
    np.testing.assert_allclose(half, inter[..., perm], atol=1e-12)
    scores_inter = inter @ np.swapaxes(ref.apply_rope(k, positions), -1, -2)
    scores_half = half @ np.swapaxes(ref.apply_rope(k[..., perm], positions, interleaved=False), -1, -2)
    np.testing.assert_allclose(scores_half, scores_inter, atol=1e-10)


def test_positions_broadcast_per_batch(rng):
    x = rng.standard_normal((2, 3, 4, 8))  # (B, H, T, D)
    positions = np.array([[0, 1, 2, 3], [10, 11, 12, 13]])[:, None, :]  # (B, 1, T)
    out = ref.apply_rope(x, positions)
    np.testing.assert_allclose(out[0], ref.apply_rope(x[0], np.arange(4)), atol=1e-12)
    np.testing.assert_allclose(out[1], ref.apply_rope(x[1], np.arange(4) + 10), atol=1e-12)


def test_rope_angles_shape_and_values():
    angles = ref.rope_angles(np.arange(5)[None, :].repeat(2, 0), ref.rope_inv_freq(8))
    assert angles.shape == (2, 5, 4)
    assert angles[1, 3, 0] == 3.0 and angles[0, 0].sum() == 0


# --------------------------------------------------------------------------
# NumPy vs torch, torch specifics
# --------------------------------------------------------------------------
# The torch frequency functions wrap the NumPy ones (same numbers by construction), so they are
# checked against the formulas themselves, written out here in float64 on the device.
def theta(head_dim, base, device):
    """Plain RoPE frequencies ``base ** (-2i / D)``, ``i = 0 .. D/2 - 1``."""
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)


def yarn_by_hugging_face_steps(head_dim, base, scale, original, beta_fast, beta_slow, device):
    """Hugging Face's ``_compute_yarn_parameters``: correction range, linear ramp, blend."""
    def correction_dim(rotations):
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), head_dim - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64, device=device) - low) / (high - low)).clamp(0, 1)
    extrapolation_factor = 1 - ramp
    plain = theta(head_dim, base, device)
    return plain / scale * (1 - extrapolation_factor) + plain * extrapolation_factor


CLOSED_FORMS = {
    "rope_inv_freq": ((64, 10000.0), lambda d: theta(64, 10000.0, d)),
    "pi_inv_freq": ((64, 10000.0, 4.0), lambda d: theta(64, 10000.0, d) / 4.0),
    "ntk_inv_freq": ((64, 10000.0, 4.0), lambda d: theta(64, 10000.0 * 4.0 ** (64 / 62), d)),
    # 8192 > 2048: the NTK factor is 4 * 8192 / 2048 - 3 = 13
    "dynamic_ntk_inv_freq": ((64, 10000.0, 4.0, 8192, 2048), lambda d: theta(64, 10000.0 * 13.0 ** (64 / 62), d)),
    "llama3_inv_freq": ((64, 500000.0, 8.0, 8192, 1.0, 4.0),
                        lambda d: torch.as_tensor(llama3_by_bands(64, 500000.0, 8.0, 8192, 1.0, 4.0), device=d)),
}


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_torch_frequencies_are_the_formulas_on_the_device(name, device):
    args, formula = CLOSED_FORMS[name]
    actual = getattr(tref, name)(*args, dtype=torch.float64, device=device)
    assert actual.device.type == device and actual.dtype == torch.float64
    torch.testing.assert_close(actual, formula(device), rtol=1e-13, atol=0)


def test_torch_yarn_is_hugging_faces_steps(device):
    actual, factor = tref.yarn_inv_freq(64, 10000.0, 8.0, 2048, 16, 2, dtype=torch.float64, device=device)
    assert actual.device.type == device
    torch.testing.assert_close(actual, yarn_by_hugging_face_steps(64, 10000.0, 8.0, 2048, 16, 2, device),
                               rtol=1e-13, atol=0)
    assert factor == pytest.approx(0.1 * math.log(8.0) + 1, rel=1e-15)


def test_torch_longrope_divides_by_the_factors_of_the_current_length_and_takes_tensors(device):
    short, long = torch.linspace(1.0, 2.0, 32, dtype=torch.float64), torch.linspace(1.0, 16.0, 32, dtype=torch.float64)
    for seq_len, factors in ((100, short), (4096, short), (4097, long)):
        actual, factor = tref.longrope_inv_freq(64, 1e4, short.to(device), long.to(device), seq_len, 4096, 16.0,
                                                dtype=torch.float64, device=device)
        assert actual.device.type == device
        torch.testing.assert_close(actual, theta(64, 1e4, device) / factors.to(device), rtol=1e-13, atol=0)
        assert factor == pytest.approx(math.sqrt(1 + math.log(16.0) / math.log(4096)), rel=1e-15)
    assert tref.longrope_inv_freq(64, 1e4, short, long, 1, 4096, 2.0)[0].dtype == torch.float32


@pytest.mark.parametrize("interleaved", [True, False])
def test_numpy_and_torch_apply_rope_agree(rng, device, interleaved):
    x = rng.standard_normal((2, 3, 9, 16))
    positions = rng.integers(0, 5000, size=9)
    inv_freq = ref.ntk_inv_freq(16, 10000.0, 3.0)
    expected = ref.apply_rope(x, positions, inv_freq, interleaved=interleaved)
    actual = tref.apply_rope(torch.tensor(x, device=device), torch.tensor(positions, device=device),
                             torch.tensor(inv_freq), interleaved=interleaved)
    assert actual.device.type == device and actual.dtype == torch.float64
    np.testing.assert_allclose(actual.cpu().numpy(), expected, atol=1e-12)
    default = tref.apply_rope(torch.tensor(x, device=device), torch.tensor(positions, device=device),
                              base=500.0, interleaved=interleaved)
    np.testing.assert_allclose(default.cpu().numpy(), ref.apply_rope(x, positions, base=500.0, interleaved=interleaved),
                               atol=1e-12)


def test_numpy_and_torch_angles_and_matrix_agree(device):
    inv_freq = ref.rope_inv_freq(8)
    t_inv = torch.tensor(inv_freq, device=device)
    positions = np.arange(6).reshape(2, 3)
    np.testing.assert_allclose(tref.rope_angles(torch.tensor(positions), t_inv).cpu().numpy(),
                               ref.rope_angles(positions, inv_freq), rtol=1e-15)
    np.testing.assert_allclose(tref.rope_rotation_matrix(7, t_inv).cpu().numpy(),
                               ref.rope_rotation_matrix(7, inv_freq), atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_torch_apply_rope_keeps_dtype_and_accuracy(device, dtype):
    x = torch.randn(2, 4, 33, 64, generator=torch.Generator().manual_seed(0)).to(device)
    positions = torch.arange(1000, 1033, device=device)
    reference = tref.apply_rope(x.double(), positions)
    out = tref.apply_rope(x.to(dtype), positions)
    assert out.dtype == dtype and out.device.type == device
    # errors: rounding the input and output to `dtype`, and float32 angles
    # (position 1000 * 2^-24 ~ 6e-5 rad), as in Hugging Face's float32 inv_freq
    tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 2e-4}[dtype]
    torch.testing.assert_close(out.double(), reference, rtol=tol, atol=tol)


@pytest.mark.parametrize("interleaved", [True, False])
def test_torch_apply_rope_gradcheck(interleaved, device):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 6, dtype=torch.float64, generator=gen).to(device).requires_grad_()
    positions = torch.arange(5, device=device) * 3
    assert torch.autograd.gradcheck(lambda t: tref.apply_rope(t, positions, interleaved=interleaved), (x,))
    # the rotation is orthogonal, so the gradient of a dot product is rotated back: d<Rx, g>/dx = R^T g
    g = torch.randn(2, 5, 6, dtype=torch.float64, generator=gen).to(device)
    (tref.apply_rope(x, positions, interleaved=interleaved) * g).sum().backward()
    back = tref.apply_rope(g, -positions, interleaved=interleaved)
    torch.testing.assert_close(x.grad, back)


# --------------------------------------------------------------------------
# Bad input names the argument
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", [ref, tref], ids=["numpy", "torch"])
def test_bad_arguments_raise_value_errors_naming_them(backend):
    cases = [
        (lambda: backend.rope_inv_freq(7), "head_dim"),
        (lambda: backend.rope_inv_freq(0), "head_dim"),
        (lambda: backend.rope_inv_freq(-4), "head_dim"),
        (lambda: backend.rope_inv_freq(8, base=1.0), "base"),
        (lambda: backend.rope_inv_freq(8, base=-3.0), "base"),
        (lambda: backend.pi_inv_freq(8, 1e4, 0.5), "scale"),
        (lambda: backend.ntk_inv_freq(9, 1e4, 2.0), "head_dim"),
        (lambda: backend.ntk_inv_freq(8, 1e4, 0.0), "scale"),
        (lambda: backend.dynamic_ntk_inv_freq(8, 1e4, 2.0, -1, 2048), "seq_len"),
        (lambda: backend.dynamic_ntk_inv_freq(8, 1e4, 2.0, 10, 0), "original_max_len"),
        (lambda: backend.yarn_inv_freq(8, 1e4, 2.0, 0), "original_max_len"),
        (lambda: backend.yarn_inv_freq(8, 1e4, 2.0, 2048, beta_fast=1, beta_slow=32), "beta_fast"),
        (lambda: backend.yarn_inv_freq(8, 1e4, 2.0, 2048, beta_slow=0), "beta_slow"),
        (lambda: backend.rope_rotation_matrix([1, 2], backend.rope_inv_freq(4)), "position"),
        (lambda: backend.llama3_inv_freq(8, 1e4, 0.5, 2048), "scale"),
        (lambda: backend.llama3_inv_freq(8, 1e4, 8.0, 0), "original_max_len"),
        (lambda: backend.llama3_inv_freq(8, 1e4, 8.0, 2048, 4.0, 1.0), "high_freq_factor"),
        (lambda: backend.llama3_inv_freq(8, 1e4, 8.0, 2048, 0.0, 4.0), "low_freq_factor"),
        (lambda: backend.longrope_inv_freq(8, 1e4, [1.0] * 3, [1.0] * 4, 10, 2048, 2.0), "short_factor"),
        (lambda: backend.longrope_inv_freq(8, 1e4, [1.0] * 4, [1.0, 2.0, -1.0, 3.0], 10, 2048, 2.0), "long_factor"),
        (lambda: backend.longrope_inv_freq(8, 1e4, [1.0] * 4, [[1.0] * 4], 10, 2048, 2.0), "long_factor"),
        (lambda: backend.longrope_inv_freq(8, 1e4, [1.0] * 4, [1.0] * 4, -1, 2048, 2.0), "seq_len"),
        (lambda: backend.longrope_inv_freq(8, 1e4, [1.0] * 4, [1.0] * 4, 10, 1, 2.0), "original_max_len"),
        (lambda: backend.longrope_inv_freq(8, 1e4, [1.0] * 4, [1.0] * 4, 10, 2048, 0.9), "scale"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"^{name}"):
            call()


@pytest.mark.parametrize("backend, make", [(ref, np.zeros), (tref, torch.zeros)], ids=["numpy", "torch"])
def test_apply_rope_rejects_bad_shapes(backend, make):
    with pytest.raises(ValueError, match="^x"):
        backend.apply_rope(make((2, 4, 7)), np.arange(4))  # odd head size
    with pytest.raises(ValueError, match="^x"):
        backend.apply_rope(make((8,)), np.arange(1))  # no time axis
    with pytest.raises(ValueError, match="^positions"):
        backend.apply_rope(make((2, 4, 8)), np.arange(5))
    with pytest.raises(ValueError, match="^positions"):
        backend.apply_rope(make((2, 4, 8)), np.zeros((3, 2, 4), dtype=int))  # would grow the batch
    with pytest.raises(ValueError, match="^inv_freq"):
        backend.apply_rope(make((2, 4, 8)), np.arange(4), np.ones(3))


def test_torch_apply_rope_of_integers_gives_floats_like_numpy():
    # integer x used to be rotated and rounded back to integers
    x = np.array([[1, 2, 3, 4], [0, -1, 2, 5]])
    out = tref.apply_rope(torch.tensor(x), torch.arange(2))
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), ref.apply_rope(x, np.arange(2)), rtol=1e-5, atol=1e-6)
