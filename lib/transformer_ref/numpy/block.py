"""The transformer block in NumPy: norms, GELU, the two FFNs, multi-head attention, the block.

Shapes: block inputs are ``(..., T, C)`` (any leading batch dims), attention tensors
``(..., H, T, D)`` with ``D = C // H``.  Parameters are a flat dict (keys documented in
:func:`transformer_ref.counts.block_param_shapes`); linear layers compute ``x @ W + b``
with ``W`` of shape ``(in, out)``.

The pre-norm block (GPT-2, Llama)::

    x = x + Attention(Norm1(x))
    x = x + FFN(Norm2(x))

and the post-norm block of the original Transformer and BERT::

    x = Norm1(x + Attention(x))
    x = Norm2(x + FFN(x))
"""

import math

import numpy as np

from .._checks import (ACTIVATIONS, cache_offset, check_cache_type, check_choice, check_divisible, check_int, check_memory, check_ndim,
                       check_norm_eps, check_positive_float, check_vector, cross_attention_params)
from ..counts import block_param_shapes
from .attention import grouped_query_attention
from .kv_cache import KVCache
from .rope import apply_rope

__all__ = [
    "layer_norm",
    "rms_norm",
    "gelu",
    "feed_forward",
    "swiglu_feed_forward",
    "multi_head_attention",
    "transformer_block",
    "init_block_params",
]

_erf = np.frompyfunc(math.erf, 1, 1)  # NumPy has no erf; math.erf is correctly rounded-ish (< 1 ulp)


def _param(params, key, shape=None):
    """``params[key]`` as an array, checking its shape; ``ValueError`` naming the key if absent."""
    if key not in params:
        raise ValueError(f"params is missing the key {key!r}")
    value = np.asarray(params[key])
    if shape is not None and value.shape != tuple(shape):
        raise ValueError(f"params[{key!r}] must have shape {tuple(shape)}, got {value.shape}")
    return value


def _linear(x, params, w_key, b_key):
    """``x @ W + b`` (the bias is skipped when absent from ``params``)."""
    w = _param(params, w_key)
    if w.ndim != 2 or w.shape[0] != x.shape[-1]:
        raise ValueError(f"params[{w_key!r}] must have shape ({x.shape[-1]}, out), got {w.shape}")
    y = x @ w
    if b_key in params:
        y = y + _param(params, b_key, (w.shape[1],))
    return y


def layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm over the last axis, with the biased (1/C) variance as in PyTorch.

    Taught in chapter 4, section 'LayerNorm and RMSNorm'.

    ``x (..., C)``, ``weight (C,)``, ``bias (C,)`` or ``None``::

        y = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * weight + bias
    """
    x = np.asarray(x)
    check_ndim("x", x, 1)
    eps = check_positive_float("eps", eps)
    weight = np.asarray(weight)
    check_vector("weight", weight.shape, x.shape[-1])
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps) * weight
    if bias is not None:
        bias = np.asarray(bias)
        check_vector("bias", bias.shape, x.shape[-1])
        y = y + bias
    return y


def rms_norm(x, weight, eps=1e-6):
    """RMSNorm (Zhang & Sennrich 2019; Llama) over the last axis: no centring, no bias.

    Taught in chapter 4, section 'LayerNorm and RMSNorm'.

    ``x (..., C)``, ``weight (C,)``::

        y = x / sqrt(mean(x^2) + eps) * weight
    """
    x = np.asarray(x)
    check_ndim("x", x, 1)
    eps = check_positive_float("eps", eps)
    weight = np.asarray(weight)
    check_vector("weight", weight.shape, x.shape[-1])
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def gelu(x, approximate="none"):
    """Gaussian Error Linear Unit (Hendrycks & Gimpel 2016), elementwise, any shape.

    Taught in chapter 4, section 'The position-wise feed-forward network'.

    * ``approximate="none"``: ``x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2)))`` (exact);
    * ``approximate="tanh"``: ``x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))`` (GPT-2).
    """
    check_choice("approximate", approximate, ("none", "tanh"))
    x = np.asarray(x)
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    if approximate == "tanh":
        return (0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))).astype(dtype)
    erf = _erf(x.astype(np.float64) / math.sqrt(2.0)).astype(np.float64)
    return (0.5 * x * (1.0 + erf)).astype(dtype)


def _activation(x, activation):
    check_choice("activation", activation, ACTIVATIONS)
    if activation == "relu":
        return np.maximum(x, 0.0)
    return gelu(x, "tanh" if activation == "gelu_tanh" else "none")


def feed_forward(x, params, activation="gelu"):
    """Position-wise FFN: ``act(x @ w1 + b1) @ w2 + b2``.

    Taught in chapter 4, section 'The position-wise feed-forward network'.

    ``x (..., T, C)``, ``w1 (C, F)``, ``w2 (F, C)`` (biases optional); ``activation`` is
    ``"gelu"`` (exact), ``"gelu_tanh"`` or ``"relu"``.  Returns ``(..., T, C)``.
    """
    x = np.asarray(x)
    check_ndim("x", x, 1)
    hidden = _activation(_linear(x, params, "w1", "b1"), activation)
    return _linear(hidden, params, "w2", "b2")


def _silu(x):
    return x / (1.0 + np.exp(-x))


def swiglu_feed_forward(x, params):
    """SwiGLU FFN (Shazeer 2020; Llama): ``(silu(x @ w1) * (x @ w3)) @ w2``.

    Taught in chapter 4, section 'The position-wise feed-forward network'.

    ``x (..., T, C)``, ``w1 (C, F)`` gate, ``w3 (C, F)`` up, ``w2 (F, C)`` down (biases
    ``b1, b3, b2`` optional); ``silu(z) = z * sigmoid(z)``.  Returns ``(..., T, C)``.
    """
    x = np.asarray(x)
    check_ndim("x", x, 1)
    gate = _silu(_linear(x, params, "w1", "b1"))
    return _linear(gate * _linear(x, params, "w3", "b3"), params, "w2", "b2")


def _split_heads(x, n_heads):
    """``(..., T, H*D) -> (..., H, T, D)``."""
    *lead, T, width = x.shape
    return np.swapaxes(x.reshape(*lead, T, n_heads, width // n_heads), -2, -3)


def _merge_heads(x):
    """``(..., H, T, D) -> (..., T, H*D)``."""
    x = np.swapaxes(x, -2, -3)
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def _attention_heads(params, n_heads, n_kv_heads, d_model):
    """Validate the head counts against ``wq`` / ``wk``; return ``(H_kv, D)``."""
    n_heads = check_int("n_heads", n_heads, minimum=1)
    head_dim = check_divisible("x.shape[-1]", d_model, "n_heads", n_heads)
    kv_width = _param(params, "wk").shape[-1]
    if n_kv_heads is None:  # infer from wk: (C, H_kv * D)
        n_kv_heads = kv_width // head_dim
    n_kv_heads = check_int("n_kv_heads", n_kv_heads, minimum=1)
    check_divisible("n_heads", n_heads, "n_kv_heads", n_kv_heads)
    _param(params, "wq", (d_model, n_heads * head_dim))
    _param(params, "wk", (d_model, n_kv_heads * head_dim))
    _param(params, "wv", (d_model, n_kv_heads * head_dim))
    _param(params, "wo", (n_heads * head_dim, d_model))
    return n_kv_heads, head_dim


def _attend(x, source, params, n_heads, n_kv_heads, mask, rope=None, positions=None, cache=None, layer_idx=0):
    """Queries from ``x (..., T, C)``, keys/values from ``source (..., S, C)``.

    With ``rope`` (self-attention only) queries and keys are rotated at ``positions``;
    with a ``cache`` this step's keys/values are appended and all cached ones attended to."""
    n_kv_heads, _ = _attention_heads(params, n_heads, n_kv_heads, x.shape[-1])
    q = _split_heads(_linear(x, params, "wq", "bq"), n_heads)  # (..., H, T, D)
    k = _split_heads(_linear(source, params, "wk", "bk"), n_kv_heads)  # (..., H_kv, S, D)
    v = _split_heads(_linear(source, params, "wv", "bv"), n_kv_heads)  # (..., H_kv, S, D)
    if rope is not None and rope is not False:
        inv_freq = None if rope is True else rope  # None: rope_inv_freq(D), base 10000
        positions = np.asarray(positions)
        if positions.ndim > 1:  # (..., T) in x's layout: add the head axis of q and k
            positions = positions[..., None, :]
        q = apply_rope(q, positions, inv_freq)
        k = apply_rope(k, positions, inv_freq)
    if cache is not None:
        k, v = cache.update(layer_idx, k, v)  # (B, H_kv, S_cached, D)
    out = grouped_query_attention(q, k, v, mask)  # (..., H, T, D)
    return _linear(_merge_heads(out), params, "wo", "bo")


def _positions(x, positions, cache, layer_idx):
    """``positions``, by default ``offset + arange(T)`` with ``offset`` what the cache holds for ``layer_idx``."""
    check_cache_type(cache, KVCache)  # an MLACache belongs to multi_head_latent_attention
    offset = cache_offset(cache, layer_idx)  # 0 without a cache; also validates layer_idx against the cache
    return np.arange(offset, offset + x.shape[-2]) if positions is None else positions


def multi_head_attention(x, params, n_heads, n_kv_heads=None, mask=None, rope=None, *, positions=None,
                         cache=None, layer_idx=0):
    """Multi-head self-attention with optional GQA/MQA, RoPE and a KV cache.

    Taught in chapter 2, section 'Incremental decoding with a KV cache'.

    ``x (..., T, C)``; ``params`` holds ``wq (C, H*D)``, ``wk, wv (C, H_kv*D)``,
    ``wo (H*D, C)`` and optional biases ``bq, bk, bv, bo``.  ``n_kv_heads=None`` reads
    ``H_kv`` off ``wk``.  ``mask`` is boolean (True = may attend), broadcastable to the
    scores ``(..., H, T, S)`` (e.g. ``causal_mask(T)`` or ``padding_mask(lengths, T)``).
    ``rope``: ``None`` (no rotation), ``True`` (``rope_inv_freq(D)``, base 10000) or an
    ``inv_freq`` array ``(D/2,)``; queries and keys are rotated at ``positions``:
    ``(T,)`` (default ``arange(T)``, offset by what the cache holds for ``layer_idx``) or
    ``(..., T)`` in ``x``'s layout, e.g. ``(B, T)`` for per-sequence offsets::

        Q = x wq + bq,  K = x wk + bk,  V = x wv + bv          split into heads
        out = concat_h softmax(Q_h K_{g(h)}^T / sqrt(D)) V_{g(h)} @ wo + bo,  g(h) = h // (H / H_kv)

    With ``cache`` (a :class:`KVCache`, ``x`` of shape ``(B, T, C)``) the rotated keys and
    values are appended to layer ``layer_idx`` and the queries attend to all
    ``S = cache.length(layer_idx)`` cached positions; pass the bottom-right
    ``causal_mask(T, S)`` for a multi-token step.  Returns ``(..., T, C)``.
    RoPE rotates the interleaved pairs of :func:`apply_rope`: pair ``i`` of a head is its
    features ``2i, 2i+1``.  Hugging Face's Llama checkpoints use the half-split layout
    (pair ``i`` = features ``i, i + D/2``): permute each head's ``D`` columns of ``wq`` and
    ``wk`` first (chapter 1, section 'Two layouts of the pairs, one set of scores').
    """
    x = np.asarray(x)
    check_ndim("x", x, 2)
    positions = _positions(x, positions, cache, layer_idx)
    return _attend(x, x, params, n_heads, n_kv_heads, mask, rope, positions, cache, layer_idx)


def _norm(x, params, name, norm, eps):
    if norm == "rmsnorm":
        return rms_norm(x, _param(params, f"{name}_weight"), eps)
    return layer_norm(x, _param(params, f"{name}_weight"), params.get(f"{name}_bias"), eps)


def transformer_block(x, params, n_heads, *, norm_position="pre", mask=None, n_kv_heads=None,
                      norm="layernorm", rope=None, positions=None, memory=None, memory_mask=None,
                      eps=None, activation="gelu", cache=None, layer_idx=0):
    """One transformer block, pre-norm (default) or post-norm.

    Taught in chapter 4, section 'Two ways to put the pieces together'.

    ``x (..., T, C)``; ``params`` as from :func:`init_block_params`.  Sublayers:
    self-attention (``mask``, ``n_kv_heads``, ``rope``, ``positions``, ``cache``,
    ``layer_idx`` as in :func:`multi_head_attention`), then, when ``memory (..., S, C)``
    is given, cross-attention to it (keys ``cross_*``, norm ``ln3``; ``memory_mask``
    broadcastable to ``(..., H, T, S)``), then the FFN (SwiGLU if ``w3`` is in
    ``params``, else :func:`feed_forward` with ``activation``)::

        pre:   x = x + SelfAttn(N1(x));  x = x + CrossAttn(N3(x), memory);  x = x + FFN(N2(x))
        post:  x = N1(x + SelfAttn(x));  x = N3(x + CrossAttn(x, memory));  x = N2(x + FFN(x))

    ``norm`` is ``"layernorm"`` or ``"rmsnorm"``; ``eps`` defaults to 1e-5 for LayerNorm and
    1e-6 for RMSNorm.  Returns ``(..., T, C)``.
    ``rope`` uses the interleaved pair layout, as :func:`multi_head_attention` says: Hugging
    Face's Llama weights need each head's columns of ``wq`` and ``wk`` permuted first.
    """
    x = np.asarray(x)
    check_ndim("x", x, 2)
    check_choice("norm_position", norm_position, ("pre", "post"))
    eps = check_norm_eps(norm, eps)
    cross_params = cross_attention_params(params, memory)
    positions = _positions(x, positions, cache, layer_idx)

    def self_attention(h):
        return _attend(h, h, params, n_heads, n_kv_heads, mask, rope, positions, cache, layer_idx)

    def cross(h):
        return _cross_attention(h, memory, cross_params, n_heads, memory_mask)

    def ffn(h):
        return swiglu_feed_forward(h, params) if "w3" in params else feed_forward(h, params, activation)

    sublayers = [("ln1", self_attention)] + ([("ln3", cross)] if memory is not None else []) + [("ln2", ffn)]
    for name, sublayer in sublayers:
        if norm_position == "pre":
            x = x + sublayer(_norm(x, params, name, norm, eps))
        else:
            x = _norm(x + sublayer(x), params, name, norm, eps)
    return x


def _cross_attention(x, memory, params, n_heads, memory_mask=None):
    """Queries from ``x (..., T, C)``, keys and values from ``memory (..., S, C)``
    (the body of :func:`transformer_ref.numpy.cross_attention`, used by the block)."""
    memory = np.asarray(memory)
    check_memory(memory, x.shape[-1])
    return _attend(x, memory, params, n_heads, None, memory_mask)


def init_block_params(d_model, n_heads, d_ff=None, *, n_kv_heads=None, bias=True, ffn="gelu",
                      norm="layernorm", seed=0, cross_attention=False):
    """Random parameters of one block as a dict of float64 arrays (GPT-2-style init).

    Taught in chapter 4, section 'Two ways to put the pieces together'.

    Weight matrices ~ Normal(0, 0.02); biases 0; norm weights 1 and norm biases 0.
    Keys and shapes: :func:`transformer_ref.counts.block_param_shapes` (``ln1_*``,
    ``wq..bo``, [``ln3_*``, ``cross_wq..cross_bo``], ``ln2_*``, ``w1, b1, [w3, b3], w2, b2``).
    ``d_ff=None`` means ``4 C`` (GELU) or Llama's rule (SwiGLU), see
    :func:`transformer_ref.counts.default_d_ff`.  The same ``seed`` gives the same arrays.
    """
    shapes = block_param_shapes(d_model, n_heads, d_ff, n_kv_heads=n_kv_heads, bias=bias, ffn=ffn,
                                norm=norm, cross_attention=cross_attention)
    seed = check_int("seed", seed, minimum=0)
    rng = np.random.default_rng(seed)
    params = {}
    for key, shape in shapes.items():
        if key.endswith("_weight"):  # norm gains
            params[key] = np.ones(shape)
        elif len(shape) == 1:  # norm and linear biases
            params[key] = np.zeros(shape)
        else:
            params[key] = rng.normal(0.0, 0.02, size=shape)
    return params
