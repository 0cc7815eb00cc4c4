"""KV quantization: the analytic error bound, the code range, per-token vs per-channel scales, both backends."""

import numpy as np
import pytest
import torch

from transformer_ref import numpy as ref
from transformer_ref import torch as tref


@pytest.mark.parametrize("bits", [2, 4, 8, 12, 16])
@pytest.mark.parametrize("axis", [-1, -2, 0])
def test_round_trip_error_is_at_most_half_a_step(rng, bits, axis):
    x = rng.standard_normal((2, 3, 17, 8)) * rng.uniform(0.01, 100, size=(2, 3, 17, 1))
    codes, scale = ref.quantize_kv(x, bits=bits, axis=axis)
    qmax = 2 ** (bits - 1) - 1
    assert codes.dtype == (np.int8 if bits <= 8 else np.int16) and codes.shape == x.shape
    expected_shape = list(x.shape)
    expected_shape[axis] = 1
    assert scale.shape == tuple(expected_shape)
    # scale = max |x| / qmax along the axis, computed here directly
    np.testing.assert_allclose(scale, np.abs(x).max(axis=axis, keepdims=True) / qmax, rtol=1e-15)
    assert np.abs(codes).max() <= qmax
    # the largest entry of each slice lands on +-qmax exactly
    np.testing.assert_array_equal(np.abs(codes).max(axis=axis, keepdims=True), qmax)
    error = np.abs(x - ref.dequantize_kv(codes, scale))
    assert (error <= scale / 2 * (1 + 1e-12)).all()
    # and the bound is tight: some entries fall almost half a step from their code
    assert (error / (scale / 2)).max() > 0.9


def test_codes_are_the_rounded_quotients(rng):
    x = rng.standard_normal((4, 6))
    codes, scale = ref.quantize_kv(x, bits=4)
    for i in range(4):
        s = np.abs(x[i]).max() / 7
        assert scale[i, 0] == pytest.approx(s, rel=1e-15)
        np.testing.assert_array_equal(codes[i], [round(v / s) for v in x[i]])


def test_per_channel_keys_survive_an_outlier_channel(rng):
    # KIVI's observation: a few key channels are much larger than the rest. A per-token scale
    # is set by the outlier and wipes out the other channels; a per-channel scale keeps them.
    keys = rng.standard_normal((64, 16))  # (S, D)
    keys[:, 3] *= 50
    per_token = ref.dequantize_kv(*ref.quantize_kv(keys, bits=4, axis=-1))
    per_channel = ref.dequantize_kv(*ref.quantize_kv(keys, bits=4, axis=-2))
    others = np.arange(16) != 3
    err_token = np.abs(per_token - keys)[:, others].mean()
    err_channel = np.abs(per_channel - keys)[:, others].mean()
    assert err_channel < err_token / 5


def test_attention_with_an_int8_cache_stays_close(rng):
    H, T, S, D = 2, 3, 40, 16
    q, k, v = rng.standard_normal((H, T, D)), rng.standard_normal((H, S, D)), rng.standard_normal((H, S, D))
    k8 = ref.dequantize_kv(*ref.quantize_kv(k, axis=-2))  # keys per channel
    v8 = ref.dequantize_kv(*ref.quantize_kv(v, axis=-1))  # values per token
    exact = ref.scaled_dot_product_attention(q, k, v)
    approx = ref.scaled_dot_product_attention(q, k8, v8)
    error = np.abs(approx - exact).max()
    assert 0 < error < 0.02
    k2 = ref.dequantize_kv(*ref.quantize_kv(k, bits=2, axis=-2))
    assert np.abs(ref.scaled_dot_product_attention(q, k2, v8) - exact).max() > 5 * error


def test_zero_slices_integers_and_empty_input():
    x = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5]])
    codes, scale = ref.quantize_kv(x)
    np.testing.assert_array_equal(scale[:, 0], [0.0, 2 / 127])
    np.testing.assert_array_equal(codes[0], 0)
    np.testing.assert_array_equal(ref.dequantize_kv(codes, scale)[0], 0.0)
    codes, scale = ref.quantize_kv(np.array([[3, -127, 5]]))
    assert scale.dtype == np.float64 and codes.tolist() == [[3, -127, 5]]
    codes, scale = ref.quantize_kv(np.zeros((2, 0)), axis=-1)
    assert codes.shape == (2, 0) and scale.shape == (2, 1)
    t_codes, t_scale = tref.quantize_kv(torch.zeros(2, 0), axis=-1)
    assert t_codes.shape == (2, 0) and t_scale.shape == (2, 1)


def test_int8_codes_take_a_quarter_of_float32():
    x = np.ones((8, 128, 64), dtype=np.float32)
    codes, scale = ref.quantize_kv(x)
    assert codes.nbytes * 4 == x.nbytes and scale.nbytes == x.nbytes // 64
    assert scale.dtype == np.float32


@pytest.mark.parametrize("bits, axis", [(8, -1), (4, -2), (12, 1)])
def test_backends_agree(rng, bits, axis, device):
    x = rng.standard_normal((2, 5, 9))
    codes, scale = ref.quantize_kv(x, bits=bits, axis=axis)
    t_codes, t_scale = tref.quantize_kv(torch.tensor(x, device=device), bits=bits, axis=axis)
    assert t_codes.device.type == device and t_codes.dtype == getattr(torch, str(codes.dtype))
    np.testing.assert_array_equal(t_codes.cpu().numpy(), codes)
    np.testing.assert_allclose(t_scale.cpu().numpy(), scale, rtol=1e-15)
    back = tref.dequantize_kv(t_codes, t_scale)
    assert back.dtype == torch.float64
    np.testing.assert_allclose(back.cpu().numpy(), ref.dequantize_kv(codes, scale), rtol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_half_input_gets_a_float32_scale(dtype, device):
    x = torch.randn(3, 7, 8, device=device).to(dtype)
    codes, scale = tref.quantize_kv(x, axis=-2)
    assert codes.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (3, 1, 8)
    error = (x.float() - tref.dequantize_kv(codes, scale)).abs()
    assert (error <= scale / 2 * (1 + 1e-6)).all()


def test_torch_dequantize_is_differentiable_in_the_scale():
    x = torch.randn(4, 6, dtype=torch.float64)
    codes, scale = tref.quantize_kv(x)
    scale.requires_grad_(True)
    assert not codes.requires_grad
    torch.autograd.gradcheck(lambda s: tref.dequantize_kv(codes, s), (scale,))
