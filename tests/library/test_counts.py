"""Parameter counts, KV-cache bytes and attention cost against published numbers and real modules."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from transformer_ref import counts
from transformer_ref import numpy as ref
from transformer_ref import torch as tref

LLAMA2_70B = dict(vocab_size=32000, d_model=8192, n_layers=80, n_heads=64, d_ff=28672, n_kv_heads=8,
                  bias=False, ffn="swiglu", norm="rmsnorm", tied_embeddings=False)


# --- published figures -------------------------------------------------------------------------

def test_gpt2_small_and_its_block():
    # Radford et al. 2019 / Hugging Face "gpt2": 124,439,808 parameters, 12 identical blocks
    assert counts.block_param_count(768, 12) == 7_087_872
    assert counts.model_param_count(50257, 768, 12, 12, max_positions=1024) == 124_439_808


@pytest.mark.parametrize("d_model, n_layers, n_heads, published", [
    (1024, 24, 16, 354_823_168),    # gpt2-medium
    (1280, 36, 20, 774_030_080),    # gpt2-large
    (1600, 48, 25, 1_557_611_200),  # gpt2-xl
])
def test_larger_gpt2_models(d_model, n_layers, n_heads, published):
    assert counts.model_param_count(50257, d_model, n_layers, n_heads, max_positions=1024) == published


def test_llama2_70b_and_7b():
    assert counts.model_param_count(**LLAMA2_70B) == 68_976_648_192
    # Llama-2-7B: d 4096, 32 layers, 32 heads, d_ff 11008 = Llama's default SwiGLU width for d = 4096
    assert counts.default_d_ff(4096, "swiglu") == 11008
    assert counts.model_param_count(32000, 4096, 32, 32, bias=False, ffn="swiglu", norm="rmsnorm",
                                    tied_embeddings=False) == 6_738_415_616


def test_bert_base():
    # BERT-base (uncased): 109,482,240 with the pooler (768*768 + 768) and 2 token-type embeddings.
    # BERT is post-norm with one LayerNorm on the embeddings: the "final norm" of model_param_count.
    stack = counts.model_param_count(30522, 768, 12, 12, max_positions=512)
    assert stack + 2 * 768 == 108_891_648
    assert stack + 2 * 768 + 768 * 768 + 768 == 109_482_240


def test_kv_cache_llama2_70b():
    assert counts.kv_cache_bytes(80, 8, 128, 1) == 327_680  # fp16, one token, GQA with 8 KV heads
    assert counts.kv_cache_bytes(80, 64, 128, 1) == 2_621_440  # the same model without GQA
    # 4096 tokens for a batch of 8: 10 GiB
    assert counts.kv_cache_bytes(80, 8, 128, 4096, batch_size=8) == 10 * 2**30


def test_attention_score_bytes_and_flops_at_100k_tokens():
    # 10^10 scores per head per layer; 4 bytes each in float32
    assert counts.attention_score_bytes(100_000) == 4 * 10**10
    assert counts.attention_score_bytes(100_000, bytes_per_element=2, n_heads=32) == 32 * 2 * 10**10
    assert counts.attention_flops(100_000, head_dim=128) == 4 * 10**10 * 128


# --- attention cost against brute force ------------------------------------------------------

@given(T=st.integers(0, 12), S=st.integers(0, 12), D=st.integers(1, 8), H=st.integers(0, 3),
       B=st.integers(0, 2))
def test_attention_flops_counts_allowed_pairs(T, S, D, H, B):
    # brute force: count the True entries of a bottom-right causal mask, however T and S compare
    allowed = sum(1 for i in range(T) for j in range(S) if j <= i + S - T)
    assert counts.attention_flops(T, S, D, n_heads=H, batch_size=B, causal=True) == 4 * B * H * D * allowed
    assert counts.attention_flops(T, S, D, n_heads=H, batch_size=B) == 4 * B * H * D * T * S
    assert ref.causal_mask(T, S).sum() == allowed  # the library's mask agrees, S < T included
    assert counts.attention_score_bytes(T, S, n_heads=H, batch_size=B) == 4 * B * H * T * S


def test_attention_flops_match_a_matmul_count():
    # QK^T of (T, D) x (D, S) is T*S*D multiply-adds, PV another T*S*D: 2 FLOPs each
    T, S, D = 5, 7, 3
    assert counts.attention_flops(T, S, D) == 2 * (T * S * D) * 2
    assert counts.attention_flops(T, head_dim=D, causal=True) == 4 * D * T * (T + 1) // 2


# --- counts agree with the arrays and modules ------------------------------------------------

CONFIGS = [
    dict(d_model=16, n_heads=4),
    dict(d_model=16, n_heads=4, n_kv_heads=2, bias=False),
    dict(d_model=24, n_heads=6, n_kv_heads=1, d_ff=40, ffn="swiglu", norm="rmsnorm"),
    dict(d_model=24, n_heads=3, ffn="swiglu", bias=True),
    dict(d_model=8, n_heads=2, norm="rmsnorm", bias=True, cross_attention=True),
    dict(d_model=8, n_heads=2, d_ff=5, bias=False, cross_attention=True),
    dict(d_model=32, n_heads=8, n_kv_heads=4, ffn="swiglu", norm="layernorm", bias=False, cross_attention=True),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_block_count_equals_array_sizes_and_module_numel(config):
    params = ref.init_block_params(**config)
    expected = counts.block_param_count(**config)
    assert sum(p.size for p in params.values()) == expected
    assert {k: v.shape for k, v in params.items()} == counts.block_param_shapes(**config)
    module = tref.TransformerBlock(**config)
    assert sum(p.numel() for p in module.parameters()) == expected


@given(d_head=st.integers(1, 4), n_kv=st.integers(1, 3), group=st.integers(1, 3), d_ff=st.integers(1, 9),
       bias=st.booleans(), ffn=st.sampled_from(["gelu", "swiglu"]), norm=st.sampled_from(["layernorm", "rmsnorm"]),
       cross=st.booleans())
def test_block_count_formula_matches_shapes_for_all_configs(d_head, n_kv, group, d_ff, bias, ffn, norm, cross):
    n_heads = n_kv * group
    config = dict(d_model=n_heads * d_head, n_heads=n_heads, d_ff=d_ff, n_kv_heads=n_kv, bias=bias, ffn=ffn,
                  norm=norm, cross_attention=cross)
    shapes = counts.block_param_shapes(**config)
    assert sum(math.prod(s) for s in shapes.values()) == counts.block_param_count(**config)


def _torch_layer_numel(layer):
    return sum(p.numel() for p in layer.parameters())


def test_counts_match_torch_transformer_layers():
    d, h, f = 64, 4, 96
    enc = nn.TransformerEncoderLayer(d, h, f, dropout=0.0, activation="gelu", batch_first=True)
    dec = nn.TransformerDecoderLayer(d, h, f, dropout=0.0, activation="gelu", batch_first=True)
    assert _torch_layer_numel(enc) == counts.block_param_count(d, h, f)
    assert _torch_layer_numel(dec) == counts.block_param_count(d, h, f, cross_attention=True)
    # the decoder's extra cost: a second attention (4 d^2 + 4 d) and a third LayerNorm (2 d)
    assert _torch_layer_numel(dec) - _torch_layer_numel(enc) == 4 * d * d + 4 * d + 2 * d
    # and with F = 4d an encoder layer is 12 d^2 + 13 d
    enc4 = nn.TransformerEncoderLayer(d, h, 4 * d, dropout=0.0, batch_first=True)
    assert _torch_layer_numel(enc4) == counts.block_param_count(d, h) == 12 * d * d + 13 * d


@pytest.mark.parametrize("options, max_positions", [
    (dict(rope=True), None),
    (dict(rope=False, n_kv_heads=2, bias=False), 20),
    (dict(rope=True, ffn="swiglu", norm="rmsnorm", bias=False, n_kv_heads=1), None),
    (dict(rope=False, norm_position="post", d_ff=48), 20),
])
def test_decoder_only_model_count(options, max_positions):
    model = tref.DecoderOnlyModel(50, 32, 3, 4, 20, **options)
    kwargs = {k: v for k, v in options.items() if k not in ("rope", "norm_position")}
    assert sum(p.numel() for p in model.parameters()) == counts.model_param_count(
        50, 32, 3, 4, max_positions=max_positions, **kwargs)


def test_encoder_only_and_encoder_decoder_counts():
    V, d, L, h, T = 40, 32, 2, 4, 16
    encoder = tref.EncoderOnlyModel(V, d, L, h, T)
    stack = counts.model_param_count(V, d, L, h, max_positions=T)
    assert sum(p.numel() for p in encoder.parameters()) == stack
    classifier = tref.EncoderOnlyModel(V, d, L, h, T, n_classes=3)
    assert sum(p.numel() for p in classifier.parameters()) == stack + d * 3 + 3
    seq2seq = tref.EncoderDecoderModel(V, 30, d, L, h, T)
    cross_extra = counts.block_param_count(d, h, cross_attention=True) - counts.block_param_count(d, h)
    expected = stack + counts.model_param_count(30, d, L, h, max_positions=T) + L * cross_extra
    assert sum(p.numel() for p in seq2seq.parameters()) == expected


def test_untied_embeddings_add_the_head():
    tied = counts.model_param_count(100, 16, 2, 4)
    assert counts.model_param_count(100, 16, 2, 4, tied_embeddings=False) == tied + 100 * 16


def test_default_d_ff():
    assert counts.default_d_ff(768) == 3072
    assert counts.default_d_ff(4096, "swiglu") == 11008
    assert counts.default_d_ff(5120, "swiglu") == 13824  # Llama-2-13B
    assert counts.default_d_ff(96, "swiglu", multiple_of=32) == 256
    assert counts.block_param_count(768, 12) == counts.block_param_count(768, 12, 3072)


def test_both_backends_reexport_counts():
    for name in counts.__all__:
        assert getattr(ref, name) is getattr(counts, name)
        assert getattr(tref, name) is getattr(counts, name)


# --- validation -------------------------------------------------------------------------------

@pytest.mark.parametrize("call, name", [
    (lambda: counts.block_param_count(-8, 2), "d_model"),
    (lambda: counts.block_param_count(10, 4), "d_model"),  # not divisible by n_heads
    (lambda: counts.block_param_count(16, 4, n_kv_heads=3), "n_heads"),
    (lambda: counts.block_param_count(16, 0), "n_heads"),
    (lambda: counts.block_param_count(16, 4, ffn="geglu"), "ffn"),
    (lambda: counts.block_param_count(16, 4, norm="batchnorm"), "norm"),
    (lambda: counts.block_param_count(16, 4, d_ff=0), "d_ff"),
    (lambda: counts.block_param_count(16.0, 4), "d_model"),
    (lambda: counts.model_param_count(0, 16, 2, 4), "vocab_size"),
    (lambda: counts.model_param_count(10, 16, -1, 4), "n_layers"),
    (lambda: counts.model_param_count(10, 16, 1, 4, max_positions=0), "max_positions"),
    (lambda: counts.kv_cache_bytes(-1, 8, 128, 1), "n_layers"),
    (lambda: counts.kv_cache_bytes(80, 8, 128, -5), "seq_len"),
    (lambda: counts.kv_cache_bytes(80, 8, 128, 1, bytes_per_element=0), "bytes_per_element"),
    (lambda: counts.attention_score_bytes(-1), "T"),
    (lambda: counts.attention_score_bytes(4, -2), "S"),
    (lambda: counts.attention_flops(4, 4, 0), "head_dim"),
    (lambda: counts.attention_flops(4, n_heads=-1), "n_heads"),
    (lambda: counts.default_d_ff(16, "swiglu", multiple_of=0), "multiple_of"),
])
def test_bad_arguments_name_the_argument(call, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        call()


def test_counts_are_exact_python_ints():
    total = counts.model_param_count(**LLAMA2_70B)
    assert type(total) is int
    assert type(counts.attention_flops(10**6, head_dim=128, n_heads=64, causal=True)) is int
    assert counts.attention_flops(10**6, head_dim=1, causal=True) == 4 * (10**6 * (10**6 + 1) // 2)
    assert np.int64(total) == total


@pytest.mark.parametrize("call, name", [
    (lambda: counts.model_param_count(100, 64, 2, 4, bias="no"), "bias"),
    (lambda: counts.model_param_count(100, 64, 2, 4, tied_embeddings=None), "tied_embeddings"),
    (lambda: counts.block_param_count(64, 4, cross_attention="yes"), "cross_attention"),
    (lambda: ref.init_block_params(64, 4, bias="False"), "bias"),
    (lambda: counts.attention_flops(8, causal="yes"), "causal"),
])
def test_flags_must_be_booleans(call, name):
    # bias="no" used to count the biases (a truthy string): a silently wrong parameter count
    with pytest.raises(ValueError, match=f"^{name}"):
        call()
