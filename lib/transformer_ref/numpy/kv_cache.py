"""A key/value cache for incremental decoding, in NumPy.

During generation a decoder recomputes nothing for tokens it has already seen:
each layer stores their keys and values and, for every new token, appends one
more row and attends over everything stored. Buffers are preallocated to
``max_seq_len``, so an append is a copy into place, never a reallocation.
(The byte count of such a cache is :func:`transformer_ref.counts.kv_cache_bytes`.)
"""

import numpy as np

from .._checks import check_int

__all__ = ["KVCache"]


class KVCache:
    """Preallocated per-layer K and V buffers ``(n_layers, B, H_kv, max_seq_len, D)``.

    Usage in a decoder step (``T_new`` new tokens)::

        offset = cache.seq_len                       # positions already stored
        q, k = apply_rope(q, offset + arange(T_new)), apply_rope(k, offset + arange(T_new))
        k_all, v_all = cache.update(layer, k, v)     # (B, H_kv, offset + T_new, D)
        out = attention(q, k_all, v_all, causal_mask(T_new, offset + T_new))

    ``seq_len`` is the number of positions stored in layer 0, ``reset()``
    empties the cache, ``nbytes`` is the size of the two buffers (``dtype``
    float64 by default). Appending past ``max_seq_len``, a wrong shape or a bad
    ``layer`` raises ``ValueError``; a failed update stores nothing.
    """

    def __init__(self, n_layers, batch_size, n_kv_heads, head_dim, max_seq_len, *, dtype=np.float64):
        self.n_layers = check_int("n_layers", n_layers, minimum=1)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.n_kv_heads = check_int("n_kv_heads", n_kv_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.max_seq_len = check_int("max_seq_len", max_seq_len, minimum=1)
        self.k = self._zeros(self.shape, dtype)  # (n_layers, B, H_kv, max_seq_len, D)
        self.v = self._zeros(self.shape, dtype)
        self.lengths = [0] * self.n_layers  # positions stored per layer

    @property
    def shape(self):
        """Shape of each of the two buffers, ``(n_layers, B, H_kv, max_seq_len, D)``."""
        return (self.n_layers, self.batch_size, self.n_kv_heads, self.max_seq_len, self.head_dim)

    @staticmethod
    def _zeros(shape, dtype):
        return np.zeros(shape, dtype=dtype)

    @staticmethod
    def _as_array(x):
        return np.asarray(x)

    @property
    def seq_len(self):
        """Number of positions stored in layer 0 (the position offset of the next token)."""
        return self.lengths[0]

    @property
    def nbytes(self):
        """Bytes held by the two preallocated buffers."""
        return self.k.nbytes + self.v.nbytes

    def reset(self):
        """Forget everything stored (the buffers are kept and reused)."""
        self.lengths = [0] * self.n_layers

    def update(self, layer, k, v):
        """Append ``k, v (B, H_kv, T_new, D)`` to ``layer``; return ``(k_all, v_all)``.

        The returned arrays are views ``(B, H_kv, S, D)`` of everything stored
        for that layer, ``S = previous length + T_new``.
        """
        layer = check_int("layer", layer, minimum=0)
        if layer >= self.n_layers:
            raise ValueError(f"layer must be < n_layers={self.n_layers}, got {layer}")
        k, v = self._as_array(k), self._as_array(v)
        expected = (self.batch_size, self.n_kv_heads, None, self.head_dim)
        for name, x in (("k", k), ("v", v)):
            if x.ndim != 4 or any(e is not None and s != e for s, e in zip(x.shape, expected)):
                raise ValueError(
                    f"{name} must have shape (B={self.batch_size}, H_kv={self.n_kv_heads}, T_new, "
                    f"D={self.head_dim}), got {tuple(x.shape)}"
                )
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        start, stop = self.lengths[layer], self.lengths[layer] + k.shape[2]
        if stop > self.max_seq_len:
            raise ValueError(
                f"max_seq_len={self.max_seq_len} exceeded: layer {layer} holds {start} positions, cannot add {k.shape[2]}"
            )
        self.k[layer, :, :, start:stop] = k
        self.v[layer, :, :, start:stop] = v
        self.lengths[layer] = stop
        return self.k[layer, :, :, :stop], self.v[layer, :, :, :stop]
