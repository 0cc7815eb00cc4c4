"""Pieces specific to the three transformer families, in NumPy: cross-attention.

Encoder-only models (BERT) stack bidirectional blocks, decoder-only models (GPT,
Llama) causal ones; an encoder-decoder (the 2017 Transformer, T5) adds to each
decoder block a cross-attention sublayer whose queries come from the decoder and
whose keys and values come from the encoder's output, the *memory*.  The full
models are torch modules (:mod:`transformer_ref.torch.families`); the block with
cross-attention is :func:`transformer_ref.numpy.transformer_block` with ``memory=``.
"""

import numpy as np

from .._checks import check_ndim
from .block import _cross_attention

__all__ = ["cross_attention"]


def cross_attention(x, memory, params, n_heads, memory_mask=None):
    """Multi-head cross-attention: queries from ``x (..., T, C)``, keys and values from
    ``memory (..., S, C)``.

    Taught in chapter 5, section 'Cross-attention'.

    ``params`` holds the unprefixed ``wq (C, H*D)``, ``wk, wv (C, H_kv*D)``, ``wo (H*D, C)``
    and optional ``bq, bk, bv, bo`` (a block stores them as ``cross_wq``...); ``H_kv`` is
    read off ``wk``.  ``memory_mask``: boolean (True = may attend), broadcastable to
    ``(..., H, T, S)``, e.g. ``padding_mask(src_lengths, S)``; no causal mask (every target
    position may read the whole source) and no RoPE::

        out = concat_h softmax((x wq)_h (memory wk)_h^T / sqrt(D)) (memory wv)_h @ wo

    Returns ``(..., T, C)``.
    """
    x = np.asarray(x)
    check_ndim("x", x, 2)
    return _cross_attention(x, memory, params, n_heads, memory_mask)
