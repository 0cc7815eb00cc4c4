"""Caches for incremental decoding, in NumPy.

During generation a decoder recomputes nothing for tokens it has already seen:
each layer stores their keys and values and, for every new token, appends one
more row and attends over everything stored. Buffers are preallocated to
``max_seq_len``, so an append is a copy into place, never a reallocation.
:func:`multi_head_attention` and :func:`transformer_block` take a :class:`KVCache`
as ``cache=``; :func:`multi_head_latent_attention` takes an :class:`MLACache`, which
stores only the compressed latent and the one shared RoPE key per token. (The byte
counts are :func:`transformer_ref.counts.kv_cache_bytes` and
:func:`transformer_ref.counts.mla_kv_cache_bytes`.)
"""

import numpy as np

from .._kv_cache import KVCacheBase, MLACacheBase

__all__ = ["KVCache", "MLACache"]


class _NumpyBuffers:
    """How the NumPy caches allocate, take in and measure their buffers."""

    def _zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype)

    def _as_array(self, x):
        return np.asarray(x)

    def _buffer_bytes(self, buffer):
        return buffer.nbytes


class KVCache(_NumpyBuffers, KVCacheBase):
    """Preallocated per-layer K and V buffers ``(n_layers, B, H_kv, max_seq_len, D)``.

    Taught in chapter 2, section 'Incremental decoding with a KV cache'.

    Usage in a decoder step (``T_new`` new tokens)::

        offset = cache.seq_len                       # positions already stored
        q, k = apply_rope(q, offset + arange(T_new)), apply_rope(k, offset + arange(T_new))
        k_all, v_all = cache.update(layer, k, v)     # (B, H_kv, offset + T_new, D)
        out = attention(q, k_all, v_all, causal_mask(T_new, offset + T_new))

    ``seq_len`` is the number of positions stored in layer 0, ``length(layer)``
    that of any layer, ``reset()`` empties the cache, ``nbytes`` is the size of
    the two buffers (``dtype`` float64 by default). Appending past
    ``max_seq_len``, a wrong shape or a bad ``layer`` raises ``ValueError``; a
    failed update stores nothing.
    """

    def __init__(self, n_layers, batch_size, n_kv_heads, head_dim, max_seq_len, *, dtype=np.float64):
        super().__init__(n_layers, batch_size, n_kv_heads, head_dim, max_seq_len, dtype=dtype)


class MLACache(_NumpyBuffers, MLACacheBase):
    """Preallocated per-layer latents ``c (n_layers, B, max_seq_len, r_kv)`` and shared RoPE keys
    ``k_rope (n_layers, B, max_seq_len, d_rope)`` of multi-head latent attention.

    Taught in chapter 2, section 'Multi-head latent attention: cache a latent, not the heads'.

    Per token and layer it stores ``r_kv + d_rope`` numbers, whatever the number of heads
    (DeepSeek-V2 §2.1.3): ``update(layer, c, k_rope)`` appends ``c (B, T_new, r_kv)`` and
    ``k_rope (B, T_new, d_rope)`` and returns views ``(B, S, r_kv)``, ``(B, S, d_rope)`` of
    everything stored for that layer. ``seq_len``, ``length(layer)`` and ``reset()`` are those
    of :class:`KVCache`; ``nbytes``, the size of the two buffers (``dtype`` float64 by
    default), equals ``mla_kv_cache_bytes(n_layers, r_kv, d_rope, max_seq_len, B, itemsize)``.
    Appending past ``max_seq_len``, a wrong shape or a bad ``layer`` raises ``ValueError``;
    a failed update stores nothing.
    """

    def __init__(self, n_layers, batch_size, kv_lora_rank, rope_head_dim, max_seq_len, *, dtype=np.float64):
        super().__init__(n_layers, batch_size, kv_lora_rank, rope_head_dim, max_seq_len, dtype=dtype)
