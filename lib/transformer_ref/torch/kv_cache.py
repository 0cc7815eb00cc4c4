"""Caches for incremental decoding, in PyTorch.

Same interface as :class:`transformer_ref.numpy.KVCache` and
:class:`transformer_ref.numpy.MLACache`: buffers preallocated on ``device``, ``update``
copies the new entries into place and returns views of the filled part. (Their sizes
in bytes for a model are :func:`transformer_ref.counts.kv_cache_bytes` and
:func:`transformer_ref.counts.mla_kv_cache_bytes`.)
"""

import torch

from .._kv_cache import KVCacheBase, MLACacheBase

__all__ = ["KVCache", "MLACache"]


class _TorchBuffers:
    """How the torch caches allocate, take in (detached, on their device) and measure their buffers."""

    def _zeros(self, shape, dtype):
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def _as_array(self, x):
        return torch.as_tensor(x, dtype=self._dtype, device=self.device).detach()

    def _buffer_bytes(self, buffer):
        return buffer.numel() * buffer.element_size()


class KVCache(_TorchBuffers, KVCacheBase):
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
        self._dtype = dtype
        super().__init__(n_layers, batch_size, n_kv_heads, head_dim, max_seq_len, dtype=dtype)


class MLACache(_TorchBuffers, MLACacheBase):
    """Preallocated per-layer latents ``c (n_layers, B, max_seq_len, r_kv)`` and shared RoPE keys
    ``k_rope (n_layers, B, max_seq_len, d_rope)`` (see :class:`transformer_ref.numpy.MLACache`).

    Taught in chapter 2, section 'Multi-head latent attention: cache a latent, not the heads'.

    ``update(layer, c, k_rope)`` appends ``c (B, T_new, r_kv)`` and ``k_rope (B, T_new, d_rope)``
    and returns views ``(B, S, r_kv)``, ``(B, S, d_rope)``; ``seq_len``, ``length(layer)``,
    ``reset()`` and ``nbytes`` as in :class:`KVCache`. ``dtype`` defaults to float32,
    ``device`` to the CPU; stored tensors are detached from autograd history.
    """

    def __init__(self, n_layers, batch_size, kv_lora_rank, rope_head_dim, max_seq_len, *, dtype=torch.float32,
                 device=None):
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self._dtype = dtype
        super().__init__(n_layers, batch_size, kv_lora_rank, rope_head_dim, max_seq_len, dtype=dtype)
