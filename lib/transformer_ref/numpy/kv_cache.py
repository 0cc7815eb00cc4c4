"""A key/value cache for incremental decoding, in NumPy.

During generation a decoder recomputes nothing for tokens it has already seen:
each layer stores their keys and values and, for every new token, appends one
more row and attends over everything stored. Buffers are preallocated to
``max_seq_len``, so an append is a copy into place, never a reallocation.
:func:`multi_head_attention` and :func:`transformer_block` take the cache as
``cache=``. (The byte count of such a cache is :func:`transformer_ref.counts.kv_cache_bytes`.)
"""

import numpy as np

from .._kv_cache import KVCacheBase

__all__ = ["KVCache"]


class KVCache(KVCacheBase):
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

    def _zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype)

    def _as_array(self, x):
        return np.asarray(x)

    @property
    def nbytes(self):
        """Bytes held by the two preallocated buffers."""
        return self.k.nbytes + self.v.nbytes
