"""Every name DESIGN.md makes binding exists in both backends, with the same signature."""

import inspect

import pytest

from transformer_ref import numpy as ref
from transformer_ref import torch as tref

BINDING = [
    # RoPE
    "rope_inv_freq", "pi_inv_freq", "ntk_inv_freq", "dynamic_ntk_inv_freq", "yarn_inv_freq",
    "rope_angles", "rope_rotation_matrix", "apply_rope",
    # attention
    "softmax", "scaled_dot_product_attention", "repeat_kv", "grouped_query_attention",
    # masks
    "causal_mask", "sliding_window_mask", "prefix_lm_mask", "padding_mask", "additive_mask",
    # KV cache
    "kv_cache_bytes",
    # block
    "layer_norm", "rms_norm", "gelu", "feed_forward", "swiglu_feed_forward",
    "multi_head_attention", "transformer_block", "init_block_params",
    "block_param_count", "model_param_count",
    # families
    "cross_attention",
    # O(N^2)
    "flash_attention", "sliding_window_attention", "attention_score_bytes", "attention_flops",
]

# Parameters that must exist, by name, exactly as DESIGN.md spells them.
REQUIRED_PARAMS = {
    "rope_inv_freq": ["head_dim", "base"],
    "pi_inv_freq": ["head_dim", "base", "scale"],
    "ntk_inv_freq": ["head_dim", "base", "scale"],
    "dynamic_ntk_inv_freq": ["head_dim", "base", "scale", "seq_len", "original_max_len"],
    "yarn_inv_freq": ["head_dim", "base", "scale", "original_max_len", "beta_fast", "beta_slow"],
    "rope_angles": ["positions", "inv_freq"],
    "rope_rotation_matrix": ["position", "inv_freq"],
    "apply_rope": ["x", "positions", "inv_freq", "base", "interleaved"],
    "softmax": ["x", "axis"],
    "scaled_dot_product_attention": ["q", "k", "v", "mask", "scale", "return_weights"],
    "repeat_kv": ["x", "n_rep"],
    "grouped_query_attention": ["q", "k", "v", "mask", "scale"],
    "causal_mask": ["T", "S"],
    "sliding_window_mask": ["T", "window", "S"],
    "prefix_lm_mask": ["T", "prefix_len"],
    "padding_mask": ["lengths", "S"],
    "additive_mask": ["mask"],
    "kv_cache_bytes": ["n_layers", "n_kv_heads", "head_dim", "seq_len", "batch_size", "bytes_per_element"],
    "layer_norm": ["x", "weight", "bias", "eps"],
    "rms_norm": ["x", "weight", "eps"],
    "gelu": ["x", "approximate"],
    "feed_forward": ["x", "params", "activation"],
    "swiglu_feed_forward": ["x", "params"],
    "multi_head_attention": ["x", "params", "n_heads", "n_kv_heads", "mask", "rope"],
    "transformer_block": ["x", "params", "n_heads", "norm_position", "mask"],
    "init_block_params": ["d_model", "n_heads", "d_ff", "n_kv_heads", "bias", "ffn", "norm", "seed"],
    "block_param_count": ["d_model", "n_heads", "d_ff", "n_kv_heads", "bias", "ffn", "norm", "cross_attention"],
    "model_param_count": ["vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "n_kv_heads",
                          "max_positions", "bias", "ffn", "norm", "tied_embeddings"],
    "cross_attention": ["x", "memory", "params", "n_heads", "memory_mask"],
    "flash_attention": ["q", "k", "v", "causal", "block_q", "block_k", "scale", "return_lse"],
    "sliding_window_attention": ["q", "k", "v", "window", "block"],
}


@pytest.mark.parametrize("backend", [ref, tref], ids=["numpy", "torch"])
@pytest.mark.parametrize("name", BINDING)
def test_binding_name_exists(backend, name):
    fn = getattr(backend, name, None)
    assert callable(fn), f"{backend.__name__}.{name} is missing"
    assert name in backend.__all__
    assert fn.__doc__ and len(fn.__doc__.strip()) > 40, f"{name} needs a docstring with shapes and formula"


@pytest.mark.parametrize("name", sorted(REQUIRED_PARAMS))
def test_signatures_match_design_and_each_other(name):
    for backend in (ref, tref):
        params = inspect.signature(getattr(backend, name)).parameters
        missing = [p for p in REQUIRED_PARAMS[name] if p not in params]
        assert not missing, f"{backend.__name__}.{name} lacks parameters {missing}"
    np_params = list(inspect.signature(getattr(ref, name)).parameters)
    t_params = list(inspect.signature(getattr(tref, name)).parameters)
    # the torch backend may add trailing keyword-only extras (dtype, device)
    assert t_params[: len(np_params)] == np_params, (name, np_params, t_params)


def test_torch_modules_exist():
    import torch

    for name in ["KVCache", "TransformerBlock", "EncoderOnlyModel", "DecoderOnlyModel", "EncoderDecoderModel"]:
        obj = getattr(tref, name, None)
        assert obj is not None, f"transformer_ref.torch.{name} is missing"
    for name in ["TransformerBlock", "EncoderOnlyModel", "DecoderOnlyModel", "EncoderDecoderModel"]:
        assert issubclass(getattr(tref, name), torch.nn.Module)
