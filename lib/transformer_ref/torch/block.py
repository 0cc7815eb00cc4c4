"""The transformer block in PyTorch: same functions and semantics as :mod:`transformer_ref.numpy.block`.

Everything runs on the input's device, keeps the input's dtype and is differentiable
(for float16/bfloat16 inputs the norms, like the softmax, compute their statistics in float32).
``params`` may hold tensors or NumPy arrays (e.g. straight from
:func:`transformer_ref.numpy.init_block_params`); each parameter is moved to ``x``'s
device and dtype when used.  :class:`TransformerBlock` wraps the same functional
code as an ``nn.Module`` with dropout and a KV cache for incremental decoding.

Pre-norm: ``x = x + Attn(N1(x)); x = x + FFN(N2(x))``.
Post-norm: ``x = N1(x + Attn(x)); x = N2(x + FFN(x))``.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import numpy as _numpy_backend
from .._checks import (ACTIVATIONS, cache_offset, check_cache_type, check_choice, check_divisible, check_int, check_memory, check_norm_eps,
                       check_positive_float, check_vector, cross_attention_params)
from .attention import _check_tensor, _compute_dtype, _result_dtype, grouped_query_attention
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
    "TransformerBlock",
]


def _tensor(value, like):
    """``value`` (tensor or array) as a tensor on ``like``'s device with ``like``'s dtype."""
    return torch.as_tensor(value).to(device=like.device, dtype=like.dtype)


def _param(params, key, like, shape=None):
    """``params[key]`` on ``like``'s device/dtype, checking its shape; ``ValueError`` if absent."""
    if key not in params:
        raise ValueError(f"params is missing the key {key!r}")
    value = _tensor(params[key], like)
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise ValueError(f"params[{key!r}] must have shape {tuple(shape)}, got {tuple(value.shape)}")
    return value


def _linear(x, params, w_key, b_key):
    """``x @ W + b`` (the bias is skipped when absent from ``params``)."""
    w = _param(params, w_key, x)
    if w.ndim != 2 or w.shape[0] != x.shape[-1]:
        raise ValueError(f"params[{w_key!r}] must have shape ({x.shape[-1]}, out), got {tuple(w.shape)}")
    y = x @ w
    if b_key in params:
        y = y + _param(params, b_key, x, (w.shape[1],))
    return y


def layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm over the last axis with the biased variance: ``x (..., C)``, ``weight, bias (C,)``.

    Taught in chapter 4, section 'LayerNorm and RMSNorm'.

    ``y = (x - mean) / sqrt(mean((x - mean)^2) + eps) * weight + bias`` (``bias`` may be None).
    """
    _check_tensor("x", x, 1)
    eps = check_positive_float("eps", eps)
    xc = x.to(_compute_dtype(x.dtype))  # fp16/bf16: statistics in float32 ((x - mean)^2 overflows fp16)
    weight = _tensor(weight, xc)
    check_vector("weight", weight.shape, x.shape[-1])
    mean = xc.mean(dim=-1, keepdim=True)
    var = ((xc - mean) ** 2).mean(dim=-1, keepdim=True)
    y = (xc - mean) / torch.sqrt(var + eps) * weight
    if bias is not None:
        bias = _tensor(bias, xc)
        check_vector("bias", bias.shape, x.shape[-1])
        y = y + bias
    return y.to(_result_dtype(x))


def rms_norm(x, weight, eps=1e-6):
    """RMSNorm over the last axis: ``y = x / sqrt(mean(x^2) + eps) * weight``; ``x (..., C)``, ``weight (C,)``.

    Taught in chapter 4, section 'LayerNorm and RMSNorm'.
    """
    _check_tensor("x", x, 1)
    eps = check_positive_float("eps", eps)
    xc = x.to(_compute_dtype(x.dtype))  # fp16/bf16: mean(x^2) in float32 (x^2 overflows fp16 beyond 256)
    weight = _tensor(weight, xc)
    check_vector("weight", weight.shape, x.shape[-1])
    return (xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps) * weight).to(_result_dtype(x))


def gelu(x, approximate="none"):
    """GELU, elementwise: ``x/2 (1 + erf(x/sqrt 2))`` (``"none"``) or the ``"tanh"`` approximation
    ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

    Taught in chapter 4, section 'The position-wise feed-forward network'.
    """
    check_choice("approximate", approximate, ("none", "tanh"))
    _check_tensor("x", x)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _activation(x, activation):
    check_choice("activation", activation, ACTIVATIONS)
    if activation == "relu":
        return torch.relu(x)
    return gelu(x, "tanh" if activation == "gelu_tanh" else "none")


def feed_forward(x, params, activation="gelu"):
    """Position-wise FFN ``act(x @ w1 + b1) @ w2 + b2``; ``x (..., T, C)`` -> ``(..., T, C)``.

    Taught in chapter 4, section 'The position-wise feed-forward network'.

    ``activation``: ``"gelu"`` (exact), ``"gelu_tanh"`` or ``"relu"``; biases optional.
    """
    _check_tensor("x", x, 1)
    return _linear(_activation(_linear(x, params, "w1", "b1"), activation), params, "w2", "b2")


def swiglu_feed_forward(x, params):
    """SwiGLU FFN ``(silu(x @ w1) * (x @ w3)) @ w2`` (gate ``w1``, up ``w3``, down ``w2``; biases optional).

    Taught in chapter 4, section 'The position-wise feed-forward network'.
    """
    _check_tensor("x", x, 1)
    gate = F.silu(_linear(x, params, "w1", "b1"))
    return _linear(gate * _linear(x, params, "w3", "b3"), params, "w2", "b2")


def _split_heads(x, n_heads):
    """``(..., T, H*D) -> (..., H, T, D)``."""
    return x.unflatten(-1, (n_heads, x.shape[-1] // n_heads)).transpose(-2, -3)


def _merge_heads(x):
    """``(..., H, T, D) -> (..., T, H*D)``."""
    return x.transpose(-2, -3).flatten(-2)


def _attention_heads(params, n_heads, n_kv_heads, like):
    """Validate the head counts against ``wq`` / ``wk``; return ``(H_kv, D)``."""
    d_model = like.shape[-1]
    n_heads = check_int("n_heads", n_heads, minimum=1)
    head_dim = check_divisible("x.shape[-1]", d_model, "n_heads", n_heads)
    if n_kv_heads is None:  # infer from wk: (C, H_kv * D)
        n_kv_heads = _param(params, "wk", like).shape[-1] // head_dim
    n_kv_heads = check_int("n_kv_heads", n_kv_heads, minimum=1)
    check_divisible("n_heads", n_heads, "n_kv_heads", n_kv_heads)
    for key, shape in [("wq", (d_model, n_heads * head_dim)), ("wk", (d_model, n_kv_heads * head_dim)),
                       ("wv", (d_model, n_kv_heads * head_dim)), ("wo", (n_heads * head_dim, d_model))]:
        _param(params, key, like, shape)
    return n_kv_heads, head_dim


def _attend(x, source, params, n_heads, n_kv_heads, mask, rope=None, positions=None, cache=None, layer_idx=0):
    """Queries from ``x (..., T, C)``, keys/values from ``source (..., S, C)``.

    With ``rope`` (self-attention only) queries and keys are rotated at ``positions``;
    with a ``cache`` this step's keys/values are appended and all cached ones attended to."""
    n_kv_heads, _ = _attention_heads(params, n_heads, n_kv_heads, x)
    q = _split_heads(_linear(x, params, "wq", "bq"), n_heads)  # (..., H, T, D)
    k = _split_heads(_linear(source, params, "wk", "bk"), n_kv_heads)  # (..., H_kv, S, D)
    v = _split_heads(_linear(source, params, "wv", "bv"), n_kv_heads)  # (..., H_kv, S, D)
    if rope is not None and rope is not False:
        inv_freq = None if rope is True else rope  # None: base 10000, computed in float64
        positions = torch.as_tensor(positions, device=x.device)
        if positions.ndim > 1:  # (..., T) in x's layout: add the head axis of q and k
            positions = positions.unsqueeze(-2)
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
    return torch.arange(offset, offset + x.shape[-2], device=x.device) if positions is None else positions


def multi_head_attention(x, params, n_heads, n_kv_heads=None, mask=None, rope=None, *, positions=None,
                         cache=None, layer_idx=0):
    """Multi-head self-attention with optional GQA/MQA, RoPE and a KV cache (see the NumPy version).

    Taught in chapter 2, section 'Incremental decoding with a KV cache'.

    ``x (..., T, C)`` -> ``(..., T, C)``.  ``n_kv_heads=None`` reads ``H_kv`` off ``wk``;
    ``mask`` boolean, broadcastable to ``(..., H, T, S)``; ``rope``: None, True (base 10000)
    or ``inv_freq (D/2,)``; ``positions`` ``(T,)`` or ``(..., T)`` in ``x``'s layout, default
    ``arange(T)`` offset by what the cache holds for ``layer_idx``.  With ``cache`` (a
    :class:`KVCache`, ``x`` of shape ``(B, T, C)``) the rotated keys and values are appended
    to layer ``layer_idx`` and the queries attend to all ``S = cache.length(layer_idx)``
    cached positions; pass the bottom-right ``causal_mask(T, S)`` for a multi-token step.
    RoPE rotates the interleaved pairs of :func:`apply_rope`: pair ``i`` of a head is its
    features ``2i, 2i+1``.  Hugging Face's Llama checkpoints use the half-split layout
    (pair ``i`` = features ``i, i + D/2``): permute each head's ``D`` columns of ``wq`` and
    ``wk`` first (chapter 1, section 'Two layouts of the pairs, one set of scores').
    """
    _check_tensor("x", x, 2)
    positions = _positions(x, positions, cache, layer_idx)
    return _attend(x, x, params, n_heads, n_kv_heads, mask, rope, positions, cache, layer_idx)


def _norm(x, params, name, norm, eps):
    if norm == "rmsnorm":
        return rms_norm(x, _param(params, f"{name}_weight", x), eps)
    return layer_norm(x, _param(params, f"{name}_weight", x), params.get(f"{name}_bias"), eps)


def _cross_attention(x, memory, params, n_heads, memory_mask=None):
    """Queries from ``x (..., T, C)``, keys and values from ``memory (..., S, C)``
    (the body of :func:`transformer_ref.torch.cross_attention`, used by the block)."""
    _check_tensor("memory", memory)
    check_memory(memory, x.shape[-1])
    return _attend(x, memory.to(x.dtype), params, n_heads, None, memory_mask)


def transformer_block(x, params, n_heads, *, norm_position="pre", mask=None, n_kv_heads=None,
                      norm="layernorm", rope=None, positions=None, memory=None, memory_mask=None,
                      eps=None, activation="gelu", cache=None, layer_idx=0):
    """One transformer block, pre-norm (default) or post-norm; ``x (..., T, C)`` -> ``(..., T, C)``.

    Taught in chapter 4, section 'Two ways to put the pieces together'.

    Same arguments and semantics as :func:`transformer_ref.numpy.transformer_block`::

        pre:   x = x + SelfAttn(N1(x));  x = x + CrossAttn(N3(x), memory);  x = x + FFN(N2(x))
        post:  x = N1(x + SelfAttn(x));  x = N3(x + CrossAttn(x, memory));  x = N2(x + FFN(x))

    (cross-attention only when ``memory`` is given; SwiGLU FFN when ``w3`` is in ``params``;
    ``cache``/``layer_idx`` for incremental decoding as in :func:`multi_head_attention`).
    Dropout is a training matter: :class:`TransformerBlock` adds it.
    ``rope`` uses the interleaved pair layout, as :func:`multi_head_attention` says: Hugging
    Face's Llama weights need each head's columns of ``wq`` and ``wk`` permuted first.
    """
    return _block(x, params, n_heads, norm_position=norm_position, mask=mask, n_kv_heads=n_kv_heads, norm=norm,
                  rope=rope, positions=positions, memory=memory, memory_mask=memory_mask, eps=eps,
                  activation=activation, cache=cache, layer_idx=layer_idx, dropout=0.0)


def _block(x, params, n_heads, *, norm_position, mask, n_kv_heads, norm, rope, positions, memory, memory_mask,
           eps, activation, cache, layer_idx, dropout):
    """:func:`transformer_block` with ``dropout``: the probability of zeroing each element of a
    sublayer's output before it is added to the residual stream (0 = off)."""
    _check_tensor("x", x, 2)
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
            x = x + F.dropout(sublayer(_norm(x, params, name, norm, eps)), dropout)
        else:
            x = _norm(x + F.dropout(sublayer(x), dropout), params, name, norm, eps)
    return x


def init_block_params(d_model, n_heads, d_ff=None, *, n_kv_heads=None, bias=True, ffn="gelu",
                      norm="layernorm", seed=0, cross_attention=False, dtype=torch.float32, device=None):
    """:func:`transformer_ref.numpy.init_block_params` as tensors (``dtype``, default float32,
    on ``device``): the same keys and, for the same ``seed``, the same values.

    Taught in chapter 4, section 'Two ways to put the pieces together'.
    """
    params = _numpy_backend.init_block_params(d_model, n_heads, d_ff, n_kv_heads=n_kv_heads, bias=bias, ffn=ffn,
                                         norm=norm, seed=seed, cross_attention=cross_attention)
    return {key: torch.as_tensor(value, dtype=dtype, device=device) for key, value in params.items()}


class TransformerBlock(nn.Module):
    """A transformer block as an ``nn.Module``; its parameters are the flat dict of
    :func:`init_block_params`, registered under the same names (``block.wq``, ``block.ln1_weight``...).

    Taught in chapter 4, section 'Pre-norm versus post-norm, measured'.

    ``forward(x (B, T, C), mask=None, *, rope=None, positions=None, memory=None,
    memory_mask=None, cache=None, layer_idx=0) -> (B, T, C)`` is :func:`transformer_block`
    plus dropout on each sublayer's output (before it joins the residual stream), active in
    training mode only.  With a
    :class:`KVCache`, this step's keys/values are appended to layer ``layer_idx`` and
    attended over, for incremental decoding.  ``params()`` returns the parameters as a
    dict sharing storage; ``load_params(d)`` copies a dict (tensors or NumPy arrays) in.
    Initialisation follows :func:`init_block_params` with a seed drawn from torch's RNG,
    so ``torch.manual_seed`` makes it reproducible.
    """

    def __init__(self, d_model, n_heads, d_ff=None, *, n_kv_heads=None, bias=True, ffn="gelu",
                 norm="layernorm", norm_position="pre", cross_attention=False, dropout=0.0, eps=None,
                 activation="gelu"):
        super().__init__()
        check_choice("norm_position", norm_position, ("pre", "post"))
        check_choice("activation", activation, ACTIVATIONS)
        self.dropout = check_positive_float("dropout", dropout, minimum=0.0)
        if self.dropout >= 1.0:
            raise ValueError(f"dropout must be < 1, got {dropout}")
        self.n_heads, self.n_kv_heads = n_heads, n_heads if n_kv_heads is None else n_kv_heads
        self.norm, self.norm_position, self.eps, self.activation = norm, norm_position, eps, activation
        self.cross_attention = cross_attention
        seed = int(torch.randint(0, 2**31 - 1, ()))
        init = init_block_params(d_model, n_heads, d_ff, n_kv_heads=n_kv_heads, bias=bias, ffn=ffn, norm=norm,
                                 seed=seed, cross_attention=cross_attention)
        self._keys = list(init)
        for key, value in init.items():
            self.register_parameter(key, nn.Parameter(value))

    def params(self):
        """The parameters as the flat dict of :func:`init_block_params` (same storage)."""
        return {key: getattr(self, key) for key in self._keys}

    @torch.no_grad()
    def load_params(self, params):
        """Copy ``params`` (tensors or NumPy arrays, exactly this block's keys and shapes) in."""
        if set(params) != set(self._keys):
            raise ValueError(f"params keys {sorted(params)} differ from the block's {sorted(self._keys)}")
        for key in self._keys:
            target = getattr(self, key)
            value = torch.as_tensor(params[key])
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"params[{key!r}] must have shape {tuple(target.shape)}, got {tuple(value.shape)}")
            target.copy_(value)
        return self

    def forward(self, x, mask=None, *, rope=None, positions=None, memory=None, memory_mask=None, cache=None,
                layer_idx=0):
        if (memory is not None) != self.cross_attention:
            raise ValueError("memory must be given exactly when the block has cross_attention=True")
        return _block(
            x, self.params(), self.n_heads, norm_position=self.norm_position, mask=mask,
            n_kv_heads=self.n_kv_heads, norm=self.norm, rope=rope, positions=positions, memory=memory,
            memory_mask=memory_mask, eps=self.eps, activation=self.activation, cache=cache,
            layer_idx=layer_idx, dropout=self.dropout if self.training else 0.0)
