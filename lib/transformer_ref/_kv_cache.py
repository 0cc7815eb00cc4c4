"""The bookkeeping of the decoding caches, shared by both backends.

What a KV cache is for: :mod:`transformer_ref.numpy.kv_cache`. :class:`LayerCacheBase`
validates, counts and copies into place; :class:`KVCacheBase` (keys and values per KV head)
and :class:`MLACacheBase` (the latent and the shared RoPE key of multi-head latent
attention) say which buffers a layer holds; a backend's mixin says how to allocate
them (``_zeros``), how to take in new entries (``_as_array``) and how big the buffers
are (``_buffer_bytes``).
"""

from ._checks import check_int

__all__ = ["LayerCacheBase", "KVCacheBase", "MLACacheBase"]


class LayerCacheBase:
    """Per-layer buffers preallocated to ``max_seq_len`` positions and the length filled in each layer.

    A subclass sets ``self._layouts``: for each buffer, the ``(label, size)`` pairs of one
    layer's slice, with ``size=None`` on the time axis (``"T_new"``), then calls
    :meth:`_allocate`.
    """

    def _allocate(self, dtype):
        self.lengths = [0] * self.n_layers  # positions stored per layer
        for name, layout in self._layouts.items():
            shape = (self.n_layers,) + tuple(self.max_seq_len if size is None else size for _, size in layout)
            setattr(self, name, self._zeros(shape, dtype))

    def _zeros(self, shape, dtype):
        raise NotImplementedError  # the backend's zero-filled buffer

    def _as_array(self, x):
        raise NotImplementedError  # the backend's array of the buffers' dtype

    def _buffer_bytes(self, buffer):
        raise NotImplementedError  # the backend's size of one buffer in bytes

    @property
    def nbytes(self):
        """Bytes held by the preallocated buffers."""
        return sum(self._buffer_bytes(getattr(self, name)) for name in self._layouts)

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

    def _append(self, layer, **new):
        """Copy ``new`` (one array per buffer, all with ``T_new`` positions) into ``layer``; return views
        of everything stored there, in the buffers' order. A failed append stores nothing."""
        layer = self._check_layer(layer)
        new = {name: self._as_array(x) for name, x in new.items()}
        steps = []
        for name, x in new.items():
            layout = self._layouts[name]
            if x.ndim != len(layout) or any(size is not None and s != size for s, (_, size) in zip(x.shape, layout)):
                described = ", ".join(label if size is None else f"{label}={size}" for label, size in layout)
                raise ValueError(f"{name} must have shape ({described}), got {tuple(x.shape)}")
            time_axis = [size for _, size in layout].index(None)
            steps.append((name, x, time_axis, x.shape[time_axis]))
        (first, _, _, n_new), (second, _, _, n_second) = steps[0], steps[1]
        if n_new != n_second:
            raise ValueError(f"{first} and {second} must hold the same number of new positions, "
                             f"got {n_new} and {n_second}")
        start, stop = self.lengths[layer], self.lengths[layer] + n_new
        if stop > self.max_seq_len:
            raise ValueError(f"{first} adds {n_new} positions to layer {layer}, which holds {start} "
                             f"of max_seq_len={self.max_seq_len}")
        views = []
        for name, x, time_axis, _ in steps:
            before = (slice(None),) * time_axis
            buffer = getattr(self, name)[layer]
            buffer[before + (slice(start, stop),)] = x
            views.append(buffer[before + (slice(0, stop),)])
        self.lengths[layer] = stop
        return tuple(views)


class KVCacheBase(LayerCacheBase):
    """Per-layer K and V buffers ``(n_layers, B, H_kv, max_seq_len, D)`` and the length filled in each layer."""

    def __init__(self, n_layers, batch_size, n_kv_heads, head_dim, max_seq_len, *, dtype):
        self.n_layers = check_int("n_layers", n_layers, minimum=1)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.n_kv_heads = check_int("n_kv_heads", n_kv_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.max_seq_len = check_int("max_seq_len", max_seq_len, minimum=1)
        layout = (("B", self.batch_size), ("H_kv", self.n_kv_heads), ("T_new", None), ("D", self.head_dim))
        self._layouts = {"k": layout, "v": layout}
        self._allocate(dtype)  # self.k, self.v: (n_layers, B, H_kv, max_seq_len, D)

    @property
    def shape(self):
        """Shape of each of the two buffers, ``(n_layers, B, H_kv, max_seq_len, D)``."""
        return (self.n_layers, self.batch_size, self.n_kv_heads, self.max_seq_len, self.head_dim)

    def update(self, layer, k, v):
        """Append ``k, v (B, H_kv, T_new, D)`` to ``layer``; return ``(k_all, v_all)``.

        The returned arrays are views ``(B, H_kv, S, D)`` of everything stored
        for that layer, ``S = previous length + T_new``. A failed update stores nothing.
        """
        return self._append(layer, k=k, v=v)


class MLACacheBase(LayerCacheBase):
    """Per-layer latent ``c (n_layers, B, max_seq_len, r_kv)`` and shared RoPE key
    ``k_rope (n_layers, B, max_seq_len, d_rope)`` of multi-head latent attention."""

    def __init__(self, n_layers, batch_size, kv_lora_rank, rope_head_dim, max_seq_len, *, dtype):
        self.n_layers = check_int("n_layers", n_layers, minimum=1)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.kv_lora_rank = check_int("kv_lora_rank", kv_lora_rank, minimum=1)
        self.rope_head_dim = check_int("rope_head_dim", rope_head_dim, minimum=1)
        self.max_seq_len = check_int("max_seq_len", max_seq_len, minimum=1)
        self._layouts = {"c": (("B", self.batch_size), ("T_new", None), ("r_kv", self.kv_lora_rank)),
                         "k_rope": (("B", self.batch_size), ("T_new", None), ("d_rope", self.rope_head_dim))}
        self._allocate(dtype)  # self.c: (n_layers, B, max_seq_len, r_kv); self.k_rope: (..., d_rope)

    def update(self, layer, c, k_rope):
        """Append the latents ``c (B, T_new, r_kv)`` and the rotated shared keys
        ``k_rope (B, T_new, d_rope)`` to ``layer``; return ``(c_all, k_rope_all)``.

        The returned arrays are views ``(B, S, r_kv)`` and ``(B, S, d_rope)`` of everything
        stored for that layer, ``S = previous length + T_new``. A failed update stores nothing.
        """
        return self._append(layer, c=c, k_rope=k_rope)
