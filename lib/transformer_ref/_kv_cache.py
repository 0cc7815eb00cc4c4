"""The bookkeeping of a key/value cache, shared by both backends' ``KVCache``.

What a KV cache is for: :mod:`transformer_ref.numpy.kv_cache`. This base class
validates and counts; a backend's subclass says how to allocate
the buffers (``_zeros``), how to take in new keys and values (``_as_array``) and
how big the buffers are (``nbytes``).
"""

from ._checks import check_int

__all__ = ["KVCacheBase"]


class KVCacheBase:
    """Per-layer K and V buffers ``(n_layers, B, H_kv, max_seq_len, D)`` and the length filled in each layer."""

    def __init__(self, n_layers, batch_size, n_kv_heads, head_dim, max_seq_len, *, dtype):
        self.n_layers = check_int("n_layers", n_layers, minimum=1)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.n_kv_heads = check_int("n_kv_heads", n_kv_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.max_seq_len = check_int("max_seq_len", max_seq_len, minimum=1)
        self.k = self._zeros(self.shape, dtype)  # (n_layers, B, H_kv, max_seq_len, D)
        self.v = self._zeros(self.shape, dtype)
        self.lengths = [0] * self.n_layers  # positions stored per layer

    def _zeros(self, shape, dtype):
        raise NotImplementedError  # the backend's zero-filled buffer

    def _as_array(self, x):
        raise NotImplementedError  # the backend's array of the buffers' dtype

    @property
    def shape(self):
        """Shape of each of the two buffers, ``(n_layers, B, H_kv, max_seq_len, D)``."""
        return (self.n_layers, self.batch_size, self.n_kv_heads, self.max_seq_len, self.head_dim)

    @property
    def seq_len(self):
        """Number of positions stored in layer 0 (the position offset of the next token)."""
        return self.lengths[0]

    def length(self, layer):
        """Number of positions stored in ``layer`` (the position of its next token)."""
        return self.lengths[self._check_layer(layer)]

    def reset(self):
        """Forget everything stored (the buffers are kept and reused)."""
        self.lengths = [0] * self.n_layers

    def _check_layer(self, layer):
        layer = check_int("layer", layer, minimum=0)
        if layer >= self.n_layers:
            raise ValueError(f"layer must be < n_layers={self.n_layers}, got {layer}")
        return layer

    def update(self, layer, k, v):
        """Append ``k, v (B, H_kv, T_new, D)`` to ``layer``; return ``(k_all, v_all)``.

        The returned arrays are views ``(B, H_kv, S, D)`` of everything stored
        for that layer, ``S = previous length + T_new``. A failed update stores nothing.
        """
        layer = self._check_layer(layer)
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
            raise ValueError(f"k adds {k.shape[2]} positions to layer {layer}, which holds {start} "
                             f"of max_seq_len={self.max_seq_len}")
        self.k[layer, :, :, start:stop] = k
        self.v[layer, :, :, start:stop] = v
        self.lengths[layer] = stop
        return self.k[layer, :, :, :stop], self.v[layer, :, :, :stop]
