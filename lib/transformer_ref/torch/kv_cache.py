"""A key/value cache for incremental decoding, in PyTorch.

Same interface as :class:`transformer_ref.numpy.KVCache`: preallocated buffers
``(n_layers, B, H_kv, max_seq_len, D)`` for K and V on ``device``, ``update``
copies the new keys and values into place and returns views of the filled
part. (Its size in bytes for a model is :func:`transformer_ref.counts.kv_cache_bytes`.)
"""

import torch

from .._kv_cache import KVCacheBase

__all__ = ["KVCache"]


class KVCache(KVCacheBase):
    """Preallocated per-layer K and V tensors ``(n_layers, B, H_kv, max_seq_len, D)``.

    Taught in chapter 2, section 'Incremental decoding with a KV cache'.

    ``update(layer, k, v)`` appends ``k, v (B, H_kv, T_new, D)`` and returns
    views ``(B, H_kv, S, D)`` of everything stored for that layer; ``seq_len`` is
    the number of positions stored in layer 0 (the position offset of the next
    token), ``length(layer)`` that of any layer; ``reset()`` empties it; ``nbytes``
    is the buffers' size. ``dtype`` defaults to float32, ``device`` to the CPU.
    Appending past ``max_seq_len``, a wrong shape or a bad ``layer`` raises
    ``ValueError``. The stored tensors are detached from autograd history (a cache
    is for inference).

    Example (one decoder layer, ``T_new`` new tokens)::

        offset = cache.seq_len
        pos = offset + torch.arange(T_new)
        k_all, v_all = cache.update(layer, apply_rope(k, pos), v)
        out = scaled_dot_product_attention(apply_rope(q, pos), k_all, v_all,
                                           causal_mask(T_new, offset + T_new))
    """

    def __init__(self, n_layers, batch_size, n_kv_heads, head_dim, max_seq_len, *, dtype=torch.float32, device=None):
        self.device = torch.device("cpu") if device is None else torch.device(device)
        super().__init__(n_layers, batch_size, n_kv_heads, head_dim, max_seq_len, dtype=dtype)

    def _zeros(self, shape, dtype):
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def _as_array(self, x):
        return torch.as_tensor(x, dtype=self.k.dtype, device=self.device).detach()

    @property
    def nbytes(self):
        """Bytes held by the two preallocated buffers."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()
