"""The API contract of both backends, as the package docstring of ``transformer_ref`` states it.

* the same public names, and for every shared function the same parameters: names,
  kinds and defaults (torch adds only the keyword-only ``dtype``/``device`` listed in
  ``TORCH_EXTRAS``);
* the same bad input raises the same ``ValueError``, with the same message, in both;
* neither backend imports the other's private helpers;
* every public name is taught by a chapter section its docstring names, or used by a chapter;
* the optional Triton backend offers only names of the others, with their signatures, and
  rejects what the torch backend rejects with the torch backend's message (its own kernel
  limits, which torch does not have, raise ``ValueError`` naming the argument); the book's API
  page can import it with triton mocked, as Sphinx does where triton is not installed.
"""

import ast
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import transformer_ref
from transformer_ref import numpy as ref
from transformer_ref import torch as tref

NUMPY_ARRAY, TORCH_TENSOR = np.asarray, torch.as_tensor
BACKENDS = [(ref, NUMPY_ARRAY), (tref, TORCH_TENSOR)]
IDS = ["numpy", "torch"]
TORCH_MODULES = {"TransformerBlock", "EncoderOnlyModel", "DecoderOnlyModel", "EncoderDecoderModel"}
TORCH_ONLY = TORCH_MODULES | {"PagedKVCache"}
SHARED = sorted(ref.__all__)

# The names the chapters, the exercises and the autograder call: they must exist in both backends.
BINDING = [
    # RoPE
    "rope_inv_freq", "pi_inv_freq", "ntk_inv_freq", "dynamic_ntk_inv_freq", "yarn_inv_freq",
    "llama3_inv_freq", "longrope_inv_freq", "rope_angles", "rope_rotation_matrix", "apply_rope",
    # attention
    "softmax", "scaled_dot_product_attention", "repeat_kv", "grouped_query_attention",
    # masks
    "causal_mask", "sliding_window_mask", "prefix_lm_mask", "padding_mask", "additive_mask",
    # KV cache
    "KVCache", "kv_cache_bytes",
    # multi-head latent attention
    "multi_head_latent_attention", "MLACache", "mla_kv_cache_bytes",
    # block
    "layer_norm", "rms_norm", "gelu", "feed_forward", "swiglu_feed_forward",
    "multi_head_attention", "transformer_block", "init_block_params",
    "block_param_count", "model_param_count",
    # families
    "cross_attention",
    # O(N^2)
    "flash_attention", "sliding_window_attention", "attention_score_bytes", "attention_flops",
    # serving
    "alibi_slopes", "alibi_bias", "sink_window_mask", "quantize_kv", "dequantize_kv", "merge_attention",
    "flash_decoding", "ring_attention",
]
# Torch-only names the chapters, the exercises and the autograder call.
TORCH_BINDING = ["PagedKVCache"]

# Parameters those callers pass by name: renaming one in both backends at once must be deliberate.
PINNED_PARAMS = {
    "rope_inv_freq": ["head_dim", "base"],
    "pi_inv_freq": ["head_dim", "base", "scale"],
    "ntk_inv_freq": ["head_dim", "base", "scale"],
    "dynamic_ntk_inv_freq": ["head_dim", "base", "scale", "seq_len", "original_max_len"],
    "yarn_inv_freq": ["head_dim", "base", "scale", "original_max_len", "beta_fast", "beta_slow"],
    "llama3_inv_freq": ["head_dim", "base", "scale", "original_max_len", "low_freq_factor", "high_freq_factor"],
    "longrope_inv_freq": ["head_dim", "base", "short_factor", "long_factor", "seq_len", "original_max_len", "scale"],
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
    "mla_kv_cache_bytes": ["n_layers", "kv_lora_rank", "rope_head_dim", "seq_len", "batch_size", "bytes_per_element"],
    "multi_head_latent_attention": ["x", "params", "n_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                    "v_head_dim", "mask", "positions", "rope_base", "cache", "layer_idx", "absorb"],
    "layer_norm": ["x", "weight", "bias", "eps"],
    "rms_norm": ["x", "weight", "eps"],
    "gelu": ["x", "approximate"],
    "feed_forward": ["x", "params", "activation"],
    "swiglu_feed_forward": ["x", "params"],
    "multi_head_attention": ["x", "params", "n_heads", "n_kv_heads", "mask", "rope", "positions", "cache",
                             "layer_idx"],
    "transformer_block": ["x", "params", "n_heads", "norm_position", "mask", "cache", "layer_idx"],
    "init_block_params": ["d_model", "n_heads", "d_ff", "n_kv_heads", "bias", "ffn", "norm", "seed"],
    "block_param_count": ["d_model", "n_heads", "d_ff", "n_kv_heads", "bias", "ffn", "norm", "cross_attention"],
    "model_param_count": ["vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "n_kv_heads",
                          "max_positions", "bias", "ffn", "norm", "tied_embeddings"],
    "cross_attention": ["x", "memory", "params", "n_heads", "memory_mask"],
    "flash_attention": ["q", "k", "v", "causal", "block_q", "block_k", "scale", "return_lse"],
    "sliding_window_attention": ["q", "k", "v", "window", "block", "scale"],
    "alibi_slopes": ["n_heads"],
    "alibi_bias": ["n_heads", "T", "S"],
    "sink_window_mask": ["T", "window", "n_sink", "S"],
    "quantize_kv": ["x", "bits", "axis"],
    "dequantize_kv": ["codes", "scale"],
    "merge_attention": ["outs", "lses"],
    "flash_decoding": ["q", "k", "v", "n_splits", "mask", "return_lse"],
    "ring_attention": ["q", "k", "v", "n_devices", "causal"],
}
# The torch-only paged cache: its constructor's and methods' parameters, by name.
PINNED_TORCH_PARAMS = {
    "PagedKVCache": ["n_layers", "n_kv_heads", "head_dim", "block_size", "n_blocks", "dtype", "device"],
    "PagedKVCache.update": ["layer", "k", "v", "seq"],
    "PagedKVCache.gather": ["layer", "seq"],
    "PagedKVCache.length": ["layer", "seq"],
    "PagedKVCache.block_table": ["seq"],
    "PagedKVCache.free": ["seq"],
    "PagedKVCache.fork": ["seq", "new_seq"],
}

# The only parameters torch may add: keyword-only, last, where the function creates tensors.
TORCH_EXTRAS = {
    **{name: ("dtype", "device") for name in
       ["rope_inv_freq", "pi_inv_freq", "ntk_inv_freq", "dynamic_ntk_inv_freq", "yarn_inv_freq", "llama3_inv_freq",
        "longrope_inv_freq", "init_block_params", "alibi_slopes", "alibi_bias"]},
    **{name: ("device",) for name in ["causal_mask", "sliding_window_mask", "sink_window_mask", "prefix_lm_mask",
                                      "padding_mask"]},
    "additive_mask": ("dtype",),
    "KVCache": ("device",),
    "MLACache": ("device",),
}
# Defaults that differ by backend, by design: each backend's float dtype.
BACKEND_DEFAULTS = {("KVCache", "dtype"): (np.float64, torch.float32), ("MLACache", "dtype"): (np.float64, torch.float32)}


# --------------------------------------------------------------------------
# Same names, same signatures
# --------------------------------------------------------------------------
def test_backends_export_the_same_names():
    assert set(tref.__all__) - set(ref.__all__) == TORCH_ONLY
    assert set(ref.__all__) <= set(tref.__all__)
    assert len(ref.__all__) == len(set(ref.__all__)) and len(tref.__all__) == len(set(tref.__all__))


@pytest.mark.parametrize("backend", [ref, tref], ids=IDS)
@pytest.mark.parametrize("name", BINDING)
def test_binding_name_exists(backend, name):
    obj = getattr(backend, name, None)
    assert callable(obj), f"{backend.__name__}.{name} is missing"
    assert name in backend.__all__
    assert obj.__doc__ and len(obj.__doc__.strip()) > 40, f"{name} needs a docstring with shapes and formula"


@pytest.mark.parametrize("name", sorted(PINNED_PARAMS))
def test_pinned_parameters_exist(name):
    for backend in (ref, tref):
        params = inspect.signature(getattr(backend, name)).parameters
        missing = [p for p in PINNED_PARAMS[name] if p not in params]
        assert not missing, f"{backend.__name__}.{name} lacks parameters {missing}"


@pytest.mark.parametrize("name", TORCH_BINDING)
def test_torch_binding_name_exists(name):
    obj = getattr(tref, name, None)
    assert callable(obj) and name in tref.__all__ and name in TORCH_ONLY
    assert obj.__doc__ and len(obj.__doc__.strip()) > 40


@pytest.mark.parametrize("qualname", sorted(PINNED_TORCH_PARAMS))
def test_pinned_torch_parameters_exist(qualname):
    obj = tref
    for part in qualname.split("."):
        obj = getattr(obj, part)
    params = inspect.signature(obj).parameters
    missing = [p for p in PINNED_TORCH_PARAMS[qualname] if p not in params]
    assert not missing, f"tref.{qualname} lacks parameters {missing}"


def _callables(name):
    """``(qualified name, numpy callable, torch callable)`` for a shared function, or a class's
    constructor and public methods."""
    np_obj, t_obj = getattr(ref, name), getattr(tref, name)
    if not inspect.isclass(np_obj):
        return [(name, np_obj, t_obj)]
    public = sorted(attr for attr in dir(np_obj) if not attr.startswith("_"))
    assert public == sorted(attr for attr in dir(t_obj) if not attr.startswith("_")), name
    methods = [attr for attr in public if inspect.isfunction(getattr(np_obj, attr))]
    return [(name, np_obj.__init__, t_obj.__init__)] + [
        (f"{name}.{attr}", getattr(np_obj, attr), getattr(t_obj, attr)) for attr in methods]


def _parameters(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", SHARED)
def test_shared_signatures_are_identical_up_to_listed_torch_extras(name):
    for qualname, np_fn, t_fn in _callables(name):
        np_params, t_params = _parameters(np_fn), _parameters(t_fn)
        extras = TORCH_EXTRAS.get(qualname, ())
        if extras:
            tail = t_params[-len(extras):]
            assert [p[0] for p in tail] == list(extras), (qualname, t_params)
            assert all(p[1] is inspect.Parameter.KEYWORD_ONLY for p in tail), qualname
            t_params = t_params[:-len(extras)]
        assert [p[:2] for p in t_params] == [p[:2] for p in np_params], (qualname, np_params, t_params)
        for (param, _, np_default), (_, _, t_default) in zip(np_params, t_params):
            expected = BACKEND_DEFAULTS.get((qualname, param), (np_default, np_default))
            assert (np_default, t_default) == expected, (qualname, param, np_default, t_default)


def test_extras_and_backend_defaults_name_real_parameters():
    for qualname, extras in TORCH_EXTRAS.items():
        fn = getattr(tref, qualname)
        assert set(extras) <= set(inspect.signature(fn).parameters), qualname
    for qualname, param in BACKEND_DEFAULTS:
        assert param in inspect.signature(getattr(ref, qualname)).parameters


# --------------------------------------------------------------------------
# The same bad input gives the same ValueError in both backends
# --------------------------------------------------------------------------
_Z = np.zeros((2, 4, 8))
_P = ref.init_block_params(8, 2)
# multi-head latent attention of width 8: 2 heads, latent 4, head parts 2 (nope), 2 (RoPE), 3 (values)
_MLA = dict(kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=3)
_MLA_P = {"wq": np.zeros((8, 8)), "wkv_a": np.zeros((8, 6)), "kv_norm_weight": np.ones(4),
          "wkv_b": np.zeros((4, 10)), "wo": np.zeros((6, 8))}

# (shared name, the argument the message must start with, call(backend, arr));
# arr turns a NumPy array into the backend's array type
BAD_INPUTS = [
    # RoPE
    ("rope_inv_freq", "head_dim", lambda b, a: b.rope_inv_freq(7)),
    ("rope_inv_freq", "base", lambda b, a: b.rope_inv_freq(8, base="x")),
    ("pi_inv_freq", "scale", lambda b, a: b.pi_inv_freq(8, 1e4, 0.5)),
    ("ntk_inv_freq", "scale", lambda b, a: b.ntk_inv_freq(8, 1e4, float("nan"))),
    ("dynamic_ntk_inv_freq", "seq_len", lambda b, a: b.dynamic_ntk_inv_freq(8, 1e4, 2.0, -1, 2048)),
    ("yarn_inv_freq", "beta_fast", lambda b, a: b.yarn_inv_freq(8, 1e4, 2.0, 2048, beta_fast=1, beta_slow=32)),
    ("rope_angles", "inv_freq", lambda b, a: b.rope_angles(np.arange(4), np.ones((2, 4)))),
    ("rope_rotation_matrix", "position", lambda b, a: b.rope_rotation_matrix([1, 2], np.ones(2))),
    ("llama3_inv_freq", "high_freq_factor", lambda b, a: b.llama3_inv_freq(8, 1e4, 8.0, 8192, 4.0, 4.0)),
    ("longrope_inv_freq", "long_factor", lambda b, a: b.longrope_inv_freq(8, 1e4, [1.0] * 4, [1.0] * 3, 10, 4096, 2.0)),
    ("apply_rope", "x.shape[-1]", lambda b, a: b.apply_rope(a(np.zeros((2, 4, 7))), np.arange(4))),
    ("apply_rope", "positions", lambda b, a: b.apply_rope(a(_Z), np.arange(5))),
    ("apply_rope", "inv_freq", lambda b, a: b.apply_rope(a(_Z), np.arange(4), np.ones(3))),
    # attention
    ("softmax", "axis", lambda b, a: b.softmax(a(_Z), axis=5)),
    ("softmax", "axis", lambda b, a: b.softmax(a(_Z), axis=1.0)),
    ("scaled_dot_product_attention", "scale", lambda b, a: b.scaled_dot_product_attention(
        a(_Z), a(_Z), a(_Z), scale="x")),
    ("scaled_dot_product_attention", "q", lambda b, a: b.scaled_dot_product_attention(a(_Z), a(_Z[..., :3]), a(_Z))),
    ("scaled_dot_product_attention", "q", lambda b, a: b.scaled_dot_product_attention(
        a(np.zeros((3, 4, 8))), a(_Z), a(_Z))),
    ("scaled_dot_product_attention", "mask", lambda b, a: b.scaled_dot_product_attention(
        a(_Z), a(_Z), a(_Z), a(np.ones((4, 4), dtype=np.int64)))),
    ("scaled_dot_product_attention", "mask", lambda b, a: b.scaled_dot_product_attention(
        a(_Z), a(_Z), a(_Z), a(np.ones((3, 4), dtype=bool)))),
    ("repeat_kv", "n_rep", lambda b, a: b.repeat_kv(a(_Z), 0)),
    ("grouped_query_attention", "q", lambda b, a: b.grouped_query_attention(a(np.zeros((3, 4, 8))), a(_Z), a(_Z))),
    ("grouped_query_attention", "k", lambda b, a: b.grouped_query_attention(a(_Z), a(_Z), a(_Z[:, :3]))),
    # masks
    ("causal_mask", "T", lambda b, a: b.causal_mask(2.5)),
    ("sliding_window_mask", "window", lambda b, a: b.sliding_window_mask(4, 0)),
    ("prefix_lm_mask", "prefix_len", lambda b, a: b.prefix_lm_mask(4, 5)),
    ("padding_mask", "lengths", lambda b, a: b.padding_mask(a(np.array([3, 7])), 5)),
    ("padding_mask", "lengths", lambda b, a: b.padding_mask(a(np.array([[1, 2]])), 5)),
    ("padding_mask", "lengths", lambda b, a: b.padding_mask(a(np.array([1.5])), 5)),
    ("additive_mask", "mask", lambda b, a: b.additive_mask(a(np.zeros((2, 2))))),
    # KV cache
    ("KVCache", "n_kv_heads", lambda b, a: b.KVCache(2, 1, 0, 4, 8)),
    ("KVCache", "k", lambda b, a: b.KVCache(1, 1, 1, 4, 4).update(0, a(np.zeros((1, 1, 1, 5))), a(np.zeros((1, 1, 1, 5))))),
    ("KVCache", "k", lambda b, a: b.KVCache(1, 1, 1, 4, 1).update(0, a(np.zeros((1, 1, 2, 4))), a(np.zeros((1, 1, 2, 4))))),
    ("KVCache", "layer", lambda b, a: b.KVCache(2, 1, 1, 4, 4).length(2)),
    ("kv_cache_bytes", "seq_len", lambda b, a: b.kv_cache_bytes(80, 8, 128, -5)),
    # multi-head latent attention
    ("MLACache", "kv_lora_rank", lambda b, a: b.MLACache(2, 1, 0, 64, 8)),
    ("MLACache", "k_rope", lambda b, a: b.MLACache(1, 1, 4, 2, 4).update(0, a(np.zeros((1, 1, 4))), a(np.zeros((1, 1, 3))))),
    ("mla_kv_cache_bytes", "rope_head_dim", lambda b, a: b.mla_kv_cache_bytes(61, 512, -64, 1)),
    ("multi_head_latent_attention", "qk_rope_head_dim", lambda b, a: b.multi_head_latent_attention(
        a(_Z), _MLA_P, 2, **{**_MLA, "qk_rope_head_dim": 3})),
    ("multi_head_latent_attention", "params", lambda b, a: b.multi_head_latent_attention(
        a(_Z), {**_MLA_P, "wo": np.zeros((5, 8))}, 2, **_MLA)),
    ("multi_head_latent_attention", "cache", lambda b, a: b.multi_head_latent_attention(
        a(_Z), _MLA_P, 2, **_MLA, cache=b.KVCache(1, 2, 2, 4, 8))),
    # block
    ("layer_norm", "weight", lambda b, a: b.layer_norm(a(_Z), a(np.ones(5)), None)),
    ("layer_norm", "eps", lambda b, a: b.layer_norm(a(_Z), a(np.ones(8)), None, eps="x")),
    ("rms_norm", "weight", lambda b, a: b.rms_norm(a(_Z), a(np.ones((4, 8))))),
    ("gelu", "approximate", lambda b, a: b.gelu(a(_Z), "erf")),
    ("feed_forward", "activation", lambda b, a: b.feed_forward(a(_Z), _P, "swish")),
    ("feed_forward", "params", lambda b, a: b.feed_forward(a(_Z), {**_P, "w1": _P["w1"][:4]})),
    ("swiglu_feed_forward", "params", lambda b, a: b.swiglu_feed_forward(a(_Z), _P)),
    ("multi_head_attention", "x.shape[-1]", lambda b, a: b.multi_head_attention(a(_Z), _P, 3)),
    ("multi_head_attention", "positions", lambda b, a: b.multi_head_attention(a(_Z), _P, 2, rope=True,
                                                                 positions=np.arange(3))),
    ("multi_head_attention", "layer_idx", lambda b, a: b.multi_head_attention(a(_Z), _P, 2,
                                                                 cache=b.KVCache(1, 2, 2, 4, 8), layer_idx=1)),
    ("transformer_block", "norm", lambda b, a: b.transformer_block(a(_Z), _P, 2, norm="batchnorm")),
    ("transformer_block", "eps", lambda b, a: b.transformer_block(a(_Z), _P, 2, eps=-1.0)),
    ("transformer_block", "memory", lambda b, a: b.transformer_block(a(_Z), _P, 2, memory=a(_Z))),
    ("init_block_params", "bias", lambda b, a: b.init_block_params(8, 2, bias="False")),
    ("block_param_shapes", "ffn", lambda b, a: b.block_param_shapes(8, 2, ffn="moe")),
    ("block_param_count", "d_model", lambda b, a: b.block_param_count(10, 4)),
    ("model_param_count", "vocab_size", lambda b, a: b.model_param_count(0, 16, 2, 4)),
    ("default_d_ff", "multiple_of", lambda b, a: b.default_d_ff(16, "swiglu", multiple_of=0)),
    # families
    ("cross_attention", "memory", lambda b, a: b.cross_attention(a(_Z), a(np.zeros((2, 3, 4))), _P, 2)),
    ("cross_attention", "params", lambda b, a: b.cross_attention(a(_Z), a(_Z), {"wq": _P["wq"]}, 2)),
    # O(N^2)
    ("flash_attention", "scale", lambda b, a: b.flash_attention(a(_Z), a(_Z), a(_Z), scale="x")),
    ("flash_attention", "block_q", lambda b, a: b.flash_attention(a(_Z), a(_Z), a(_Z), block_q=0)),
    ("flash_attention", "q", lambda b, a: b.flash_attention(a(np.zeros((1, 2, 4, 8))), a(np.zeros((2, 2, 4, 8))),
                                                       a(np.zeros((2, 2, 4, 8))))),
    ("sliding_window_attention", "scale", lambda b, a: b.sliding_window_attention(a(_Z), a(_Z), a(_Z), 2, scale="x")),
    ("sliding_window_attention", "k", lambda b, a: b.sliding_window_attention(a(_Z), a(_Z[:, :2]), a(_Z[:, :2]), 2)),
    ("attention_score_bytes", "T", lambda b, a: b.attention_score_bytes(-1)),
    ("attention_flops", "causal", lambda b, a: b.attention_flops(8, causal="yes")),
    # serving
    ("alibi_slopes", "n_heads", lambda b, a: b.alibi_slopes(0)),
    ("alibi_bias", "S", lambda b, a: b.alibi_bias(4, 3, S=-1)),
    ("sink_window_mask", "n_sink", lambda b, a: b.sink_window_mask(4, 2, -1)),
    ("sink_window_mask", "window", lambda b, a: b.sink_window_mask(4, 0, 1)),
    ("quantize_kv", "bits", lambda b, a: b.quantize_kv(a(_Z), bits=32)),
    ("quantize_kv", "bits", lambda b, a: b.quantize_kv(a(_Z), bits=1)),
    ("quantize_kv", "axis", lambda b, a: b.quantize_kv(a(_Z), axis=3)),
    ("quantize_kv", "x", lambda b, a: b.quantize_kv(a(np.array([1.0, np.inf])))),
    ("quantize_kv", "x", lambda b, a: b.quantize_kv(a(np.zeros(3, dtype=bool)))),
    ("dequantize_kv", "codes", lambda b, a: b.dequantize_kv(a(_Z), a(np.ones((2, 4, 1))))),
    ("dequantize_kv", "scale", lambda b, a: b.dequantize_kv(a(np.zeros((2, 4), dtype=np.int8)), a(np.ones((3, 1))))),
    ("merge_attention", "outs", lambda b, a: b.merge_attention([], [])),
    ("merge_attention", "outs", lambda b, a: b.merge_attention([a(_Z)], [a(_Z[..., 0]), a(_Z[..., 0])])),
    ("merge_attention", "outs[1]", lambda b, a: b.merge_attention([a(_Z), a(_Z[:1])], [a(_Z[..., 0])] * 2)),
    ("merge_attention", "lses[0]", lambda b, a: b.merge_attention([a(_Z)], [a(_Z)])),
    ("flash_decoding", "n_splits", lambda b, a: b.flash_decoding(a(_Z), a(_Z), a(_Z), n_splits=0)),
    ("flash_decoding", "mask", lambda b, a: b.flash_decoding(a(_Z), a(_Z), a(_Z), n_splits=2,
                                                             mask=a(np.ones((3, 4), dtype=bool)))),
    ("flash_decoding", "k", lambda b, a: b.flash_decoding(a(_Z), a(_Z[:, :3]), a(_Z), n_splits=2)),
    ("ring_attention", "n_devices", lambda b, a: b.ring_attention(a(_Z), a(_Z), a(_Z), n_devices=1.5)),
    ("ring_attention", "causal", lambda b, a: b.ring_attention(a(_Z), a(_Z), a(_Z), n_devices=2, causal=1)),
    ("ring_attention", "q", lambda b, a: b.ring_attention(a(np.zeros((3, 4, 8))), a(_Z), a(_Z), n_devices=2)),
]


def test_bad_inputs_cover_every_shared_name():
    assert {name for name, _, _ in BAD_INPUTS} == set(SHARED)


def _raised(call, backend, make):
    with pytest.raises(ValueError) as info:
        call(backend, make)
    return str(info.value)


@pytest.mark.parametrize("name, argument, call", BAD_INPUTS,
                         ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(BAD_INPUTS)])
def test_same_bad_input_same_value_error_in_both_backends(name, argument, call):
    numpy_message, torch_message = (_raised(call, backend, make) for backend, make in BACKENDS)
    assert numpy_message == torch_message
    assert re.match(rf"{re.escape(argument)}(?!\w)", numpy_message), numpy_message


def test_torch_backend_names_a_numpy_argument():
    # a NumPy array passed to the torch backend failed with "'numpy.ndarray' has no attribute 'to'"
    a = np.zeros((2, 4, 8))
    p = ref.init_block_params(8, 2)
    cases = [
        (lambda: tref.softmax(a), "x"),
        (lambda: tref.scaled_dot_product_attention(torch.zeros(2, 4, 8), a, a), "k"),
        (lambda: tref.grouped_query_attention(a, a, a), "q"),
        (lambda: tref.repeat_kv(a, 2), "x"),
        (lambda: tref.apply_rope(a, np.arange(4)), "x"),
        (lambda: tref.layer_norm(a, p["ln1_weight"], p["ln1_bias"]), "x"),
        (lambda: tref.rms_norm(a, p["ln1_weight"]), "x"),
        (lambda: tref.gelu(a), "x"),
        (lambda: tref.feed_forward(a, p), "x"),
        (lambda: tref.multi_head_attention(a, p, 2), "x"),
        (lambda: tref.transformer_block(a, p, 2), "x"),
        (lambda: tref.cross_attention(torch.zeros(2, 4, 8), a, p, 2), "memory"),
        (lambda: tref.flash_attention(torch.zeros(2, 4, 8), torch.zeros(2, 4, 8), a), "v"),
        (lambda: tref.sliding_window_attention(a, a, a, 2), "q"),
        (lambda: tref.multi_head_latent_attention(a, _MLA_P, 2, **_MLA), "x"),
        (lambda: tref.quantize_kv(a), "x"),
        (lambda: tref.dequantize_kv(np.zeros((2, 4), dtype=np.int8), torch.ones(2, 1)), "codes"),
        (lambda: tref.merge_attention([torch.zeros(2, 4, 8), a], [torch.zeros(2, 4)] * 2), "outs\\[1\\]"),
        (lambda: tref.merge_attention([torch.zeros(2, 4, 8)], [a[..., 0]]), "lses\\[0\\]"),
        (lambda: tref.flash_decoding(a, a, a, n_splits=2), "q"),
        (lambda: tref.ring_attention(torch.zeros(2, 4, 8), a, a, n_devices=2), "k"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"^{name} must be a torch.Tensor"):
            call()


def test_torch_modules_exist():
    for name in sorted(TORCH_MODULES):
        assert issubclass(getattr(tref, name), torch.nn.Module), name


# --------------------------------------------------------------------------
# Neither backend imports the other's private helpers
# --------------------------------------------------------------------------
PACKAGE = Path(transformer_ref.__file__).parent


def _private_uses(backend, other, package=PACKAGE):
    """``(file, name)`` for every private name of the ``other`` backend that ``backend``'s modules use."""
    other_pkg = f"transformer_ref.{other}"
    for path in sorted((package / backend).glob("*.py")):
        tree = ast.parse(path.read_text())
        aliases = set()  # local names bound to the other backend or to one of its modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                # the module's package is transformer_ref.<backend>; level 1 is that package, level 2 its parent
                parts = ["transformer_ref", backend][: 3 - node.level] if node.level else []
                module = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    if not (full == other_pkg or full.startswith(other_pkg + ".")):
                        continue
                    if alias.name.startswith("_"):
                        yield path.name, full
                    elif full == other_pkg or (package / other / f"{alias.name}.py").exists():
                        aliases.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                aliases.update(alias.asname or alias.name for alias in node.names if alias.name.startswith(other_pkg))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                chain, root = [node.attr], node.value
                while isinstance(root, ast.Attribute):
                    chain.append(root.attr)
                    root = root.value
                if isinstance(root, ast.Name) and root.id in aliases and any(a.startswith("_") for a in chain):
                    yield path.name, f"{root.id}.{'.'.join(reversed(chain))}"


@pytest.mark.parametrize("backend, other", [("torch", "numpy"), ("numpy", "torch")])
def test_no_backend_imports_the_other_backends_private_helpers(backend, other):
    assert list(_private_uses(backend, other)) == []


def test_private_use_detector_sees_the_old_imports(tmp_path):
    # the detector itself, on the forms torch/ used before the shared checks moved to _checks.py
    for sub in ("numpy", "torch"):
        (tmp_path / sub).mkdir()
    (tmp_path / "numpy" / "block.py").write_text("")
    (tmp_path / "torch" / "a.py").write_text("from ..numpy.attention import _check_qkv\n")
    (tmp_path / "torch" / "b.py").write_text("from ..numpy import block as _np_block\n_np_block._check_vector(1)\n")
    (tmp_path / "torch" / "c.py").write_text("from .. import numpy as ref\nref.rope_inv_freq(8)\nref.block._prefixed\n")
    assert list(_private_uses("torch", "numpy", tmp_path)) == [
        ("a.py", "transformer_ref.numpy.attention._check_qkv"),
        ("b.py", "_np_block._check_vector"),
        ("c.py", "ref.block._prefixed"),
    ]


# --------------------------------------------------------------------------
# Every public name is taught by a chapter, or used by one
# --------------------------------------------------------------------------
CHAPTERS = Path(__file__).resolve().parents[2] / "chapters"
TAUGHT = re.compile(r"Taught in chapter (\d+), section '(.+?)'(?=[\s.,;:)]|$)")


def _chapter(number):
    (path,) = CHAPTERS.glob(f"{int(number):02d}-*.md")
    return path


def _headings_and_code(path):
    """The headings (outside code blocks) and the code-cell source of a MyST chapter."""
    headings, code, fence = set(), [], None
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line
            continue
        if fence is None:
            match = re.match(r"#+ (.+)", line)
            if match:
                headings.add(match.group(1).strip())
        elif fence.startswith("```{code-cell}"):
            code.append(line)
    return headings, "\n".join(code)


def test_teaching_citation_parser():
    doc = "x.\n\n    Taught in chapter 6, section 'The library's `flash_attention`: exact, and measured'.\n"
    assert TAUGHT.findall(doc) == [("6", "The library's `flash_attention`: exact, and measured")]
    headings, code = _headings_and_code(_chapter(6))
    assert "The library's `flash_attention`: exact, and measured" in headings
    assert "ref.flash_attention(" in code and "## " not in code


# The serving functions come before the chapter on serving long contexts that will teach them;
# each name leaves this set the moment a chapter cites or uses it (the test below insists).
AWAITING_THEIR_CHAPTER = {"alibi_slopes", "alibi_bias", "sink_window_mask", "quantize_kv", "dequantize_kv",
                          "merge_attention", "flash_decoding", "ring_attention", "PagedKVCache"}


def _taught_or_used(backend, name, chapters, all_code):
    """The problems with ``name``'s teaching citation (empty when a chapter section it names teaches
    it, or no citation but a chapter uses it); ``None`` when it is neither cited nor used."""
    cited = TAUGHT.findall(inspect.getdoc(getattr(backend, name)) or "")
    problems = [f"{name}: chapter {number} has no section {section!r}"
                for number, section in cited if section not in chapters[_chapter(number)][0]]
    if not cited and not re.search(rf"\b{name}\b", all_code):
        return None
    return problems


@pytest.mark.parametrize("backend", [ref, tref], ids=IDS)
def test_every_public_name_is_taught_or_used_by_a_chapter(backend):
    chapters = {path: _headings_and_code(path) for path in sorted(CHAPTERS.glob("0*.md"))}
    all_code = "\n".join(code for _, code in chapters.values())
    problems = []
    for name in backend.__all__:
        found = _taught_or_used(backend, name, chapters, all_code)
        if name in AWAITING_THEIR_CHAPTER:
            if found is not None:
                problems.append(f"{name}: a chapter teaches or uses it now, take it out of AWAITING_THEIR_CHAPTER")
        elif found is None:
            problems.append(f"{name}: no 'Taught in chapter N, section ...' in its docstring, and no chapter uses it")
        else:
            problems += found
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------
# The Triton backend: same signatures, same errors as the torch backend
# --------------------------------------------------------------------------
# find_spec, not importorskip at import time: importing triton before transformer_ref.triton
# decides on its interpreter would leave the kernels unusable on CPU (see its docstring)
TRITON_MISSING = importlib.util.find_spec("triton") is None
needs_triton = pytest.mark.skipif(TRITON_MISSING,
                                  reason="Triton backend not installed: pip install -r requirements-triton.lock")


@pytest.fixture(scope="module")
def fref():
    """The Triton backend (its input checks run before any kernel launch: no GPU needed)."""
    from transformer_ref import triton

    return triton


def _qkv(H=4, H_kv=2, T=8, S=8, D=16, Dv=16, batch=(1,), dtype=torch.float32):
    return (torch.zeros(*batch, H, T, D, dtype=dtype), torch.zeros(*batch, H_kv, S, D, dtype=dtype),
            torch.zeros(*batch, H_kv, S, Dv, dtype=dtype))


def _flash_args(**changes):
    """``(q, k, v, keyword arguments)`` of a valid float32 call, with ``changes`` applied."""
    q, k, v = _qkv()
    args = {"q": q, "k": k, "v": v, **changes}
    return (args.pop("q"), args.pop("k"), args.pop("v")), args


# Bad input both backends reject: float32 tensors, so only the named defect is wrong.
TRITON_SHARED_BAD = {
    "q-numpy": _flash_args(q=np.zeros((1, 4, 8, 16), dtype=np.float32)),
    "v-list": _flash_args(v=[[0.0]]),
    "q-rank-2": _flash_args(q=torch.zeros(8, 16)),
    "k-rank-2": _flash_args(k=torch.zeros(8, 16)),
    "head-size": _flash_args(k=torch.zeros(1, 2, 8, 12)),
    "keys-k-v": _flash_args(v=torch.zeros(1, 2, 9, 16)),
    "kv-heads-k-v": _flash_args(v=torch.zeros(1, 1, 8, 16)),
    "batch-q-k": _flash_args(q=torch.zeros(2, 4, 8, 16)),
    "gqa-not-divisible": _flash_args(q=torch.zeros(1, 3, 8, 16)),
    "k-other-device": _flash_args(k=torch.zeros(1, 2, 8, 16, device="meta")),
    "scale-nan": _flash_args(scale=float("nan")),
    "scale-str": _flash_args(scale="x"),
    "scale-bool": _flash_args(scale=True),
    "block_q-zero": _flash_args(block_q=0),
    "block_k-negative": _flash_args(block_k=-64),
    "block_q-float": _flash_args(block_q=32.0),
    "block_k-bool": _flash_args(block_k=True),
}
# Input only the Triton kernels refuse (the torch backend computes it): the argument named first.
TRITON_ONLY_BAD = {
    "block_q-not-power-of-two": (_flash_args(block_q=24), "block_q must be a power of two >= 16"),
    "block_k-below-16": (_flash_args(block_k=8), "block_k must be a power of two >= 16"),
    "float64": (((*_qkv(dtype=torch.float64),), {}), "q, k and v must be float32, float16 or bfloat16"),
    "head-size-300": (((*_qkv(D=300, Dv=300),), {}), "q head dimension must be <= 256"),
    "value-size-300": (((*_qkv(Dv=300),), {}), "v head dimension must be <= 256"),
}


@needs_triton
def test_triton_offers_only_shared_names_with_identical_signatures(fref):
    assert fref.__all__ and set(fref.__all__) <= set(ref.__all__), fref.__all__
    for name in fref.__all__:
        triton_params = _parameters(getattr(fref, name))
        assert triton_params == _parameters(getattr(tref, name)), name
        assert triton_params == _parameters(getattr(ref, name)), name


@needs_triton
def test_every_triton_name_has_bad_inputs_here(fref):
    assert set(fref.__all__) == {"flash_attention"} == {name for name, _, _ in BAD_INPUTS if name in fref.__all__}


def _error(call):
    """The exception a call raises, as (type, message)."""
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


@needs_triton
@pytest.mark.parametrize("case", sorted(TRITON_SHARED_BAD))
def test_triton_rejects_what_torch_rejects_with_the_same_error(fref, case):
    args, kwargs = TRITON_SHARED_BAD[case]
    torch_error = _error(lambda: tref.flash_attention(*args, **kwargs))
    assert torch_error[0] is ValueError, torch_error
    assert _error(lambda: fref.flash_attention(*args, **kwargs)) == torch_error


@needs_triton
@pytest.mark.parametrize("name, argument, call", [case for case in BAD_INPUTS if case[0] == "flash_attention"])
def test_triton_gives_the_shared_bad_inputs_the_torch_message(fref, name, argument, call):
    assert _raised(call, fref, TORCH_TENSOR) == _raised(call, tref, TORCH_TENSOR)


@needs_triton
@pytest.mark.parametrize("case", sorted(TRITON_ONLY_BAD))
def test_triton_kernel_limits_name_the_argument_and_torch_has_none(fref, case):
    (args, kwargs), message = TRITON_ONLY_BAD[case]
    assert tref.flash_attention(*args, **kwargs).shape == (*args[0].shape[:-1], args[2].shape[-1])
    with pytest.raises(ValueError) as info:
        fref.flash_attention(*args, **kwargs)
    assert str(info.value).startswith(message), str(info.value)


def test_triton_backend_imports_with_triton_mocked_as_the_book_does():
    # api.md documents transformer_ref.triton with autodoc_mock_imports: [triton] (_config.yml):
    # the package must import, and show the real signature and docstring, with triton absent
    code = """if True:
        import inspect, sys
        from sphinx.ext.autodoc.mock import mock
        with mock(["triton"]):  # Sphinx's mock is found first, triton installed or not
            from transformer_ref import triton as fref
            from transformer_ref import torch as tref
            print(type(sys.modules["triton"]).__name__, fref.__all__, fref.INTERPRETED)
        for name in fref.__all__:
            fn = getattr(fref, name)
            assert inspect.signature(fn) == inspect.signature(getattr(tref, name)), name
            assert "Triton kernels" in fn.__doc__, name
    """
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "_MockModule ['flash_attention'] False"
    config = (Path(__file__).resolve().parents[2] / "_config.yml").read_text()
    assert re.search(r"^\s+autodoc_mock_imports: \[triton\]$", config, re.M)
    assert ".. automodule:: transformer_ref.triton" in (CHAPTERS.parent / "api.md").read_text()
