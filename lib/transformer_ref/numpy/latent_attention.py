"""Multi-head latent attention (MLA, DeepSeek-V2 §2.1), in NumPy.

MLA caches, per token and layer, one compressed latent ``c`` of ``r_kv`` numbers and
one RoPE key of ``d_rope`` numbers shared by all heads, instead of ``2 H D`` keys and
values. Every head's keys and values are up-projections of ``c``::

    c = RMSNorm(x W_DKV),   [k_nope_h | v_h] = c W_UKV_h,   k_h = [k_nope_h | RoPE(k_rope)]

Because ``q_nope_h . k_nope_h = (q_nope_h W_UK_h^T) . c``, the key up-projection can be
folded into the query, and the value up-projection into the output, so that decoding
attends in latent space and never materialises a key or a value (``absorb=True``).
RoPE's rotation would sit between ``W_Q`` and ``W_UK`` if it were applied to ``k_nope``,
which is why the positional part travels in separate, "decoupled" ``d_rope`` dimensions.

Parameter names follow DeepSeek's reference code; weights are ``(in, out)`` as in the
rest of the library.
"""

import math

import numpy as np

from .._checks import cache_offset, check_cache_type, check_flag, check_mla_sizes, check_ndim, check_positive_float
from .attention import grouped_query_attention
from .block import _merge_heads, _param, _split_heads, rms_norm
from .kv_cache import MLACache
from .rope import apply_rope, rope_inv_freq

__all__ = ["multi_head_latent_attention"]

_NORM_EPS = 1e-6  # the RMSNorms on the latents (DeepSeek's RMSNorm default)


def _queries(x, params, sizes):
    """``(q_nope (..., H, T, d_nope), q_rope (..., H, T, d_rope))``, with or without query compression."""
    C, width = x.shape[-1], sizes.H * (sizes.d_nope + sizes.d_rope)
    if "wq" in params:
        if "wq_a" in params:
            raise ValueError("params must hold either wq or (wq_a, q_norm_weight, wq_b), not both")
        q = x @ _param(params, "wq", (C, width))
    else:
        wq_a = _param(params, "wq_a")
        if wq_a.ndim != 2 or wq_a.shape[0] != C:
            raise ValueError(f"params['wq_a'] must have shape ({C}, r_q), got {wq_a.shape}")
        r_q = wq_a.shape[1]
        c_q = rms_norm(x @ wq_a, _param(params, "q_norm_weight", (r_q,)), _NORM_EPS)
        q = c_q @ _param(params, "wq_b", (r_q, width))
    q = _split_heads(q, sizes.H)  # (..., H, T, d_nope + d_rope)
    return q[..., : sizes.d_nope], q[..., sizes.d_nope :]


def multi_head_latent_attention(x, params, n_heads, *, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                                mask=None, positions=None, rope_base=10000.0, cache=None, layer_idx=0, absorb=False):
    """Multi-head latent attention (DeepSeek-V2 §2.1), naive or with the up-projections absorbed.

    Taught in chapter 2, section 'Multi-head latent attention: cache a latent, not the heads'.

    ``x (..., T, C)``; ``H = n_heads``, ``r_kv = kv_lora_rank``, ``d_nope``, ``d_rope`` (even),
    ``d_v`` the head sizes. ``params`` (weights ``(in, out)``):

    * queries: ``wq (C, H*(d_nope+d_rope))``, or with query compression ``wq_a (C, r_q)``,
      ``q_norm_weight (r_q,)`` and ``wq_b (r_q, H*(d_nope+d_rope))``;
    * ``wkv_a (C, r_kv + d_rope)``: the latent (first ``r_kv``) and the shared RoPE key (last ``d_rope``);
    * ``kv_norm_weight (r_kv,)``: RMSNorm (eps 1e-6) on the latent;
    * ``wkv_b (r_kv, H*(d_nope+d_v))``: per head, in head-major order, ``[k_nope | v]``;
    * ``wo (H*d_v, C)``.

    With ``theta = rope_inv_freq(d_rope, rope_base)`` (interleaved pairs) at ``positions``
    (``(T,)`` or ``(..., T)``; default ``offset + arange(T)``, ``offset`` what the cache holds)::

        q_h = [q_nope_h | RoPE(q_rope_h)]              (from wq, or wq_b(RMSNorm(x wq_a)))
        c = RMSNorm(x wkv_a[:, :r_kv]),   k_R = RoPE(x wkv_a[:, r_kv:])
        [k_nope_h | v_h] = c wkv_b_h,     k_h = [k_nope_h | k_R]
        out = concat_h softmax(q_h k_h^T / sqrt(d_nope + d_rope) + mask) v_h  @ wo

    ``absorb=True`` computes the same output in latent space, as at decode time: with
    ``W_UK_h, W_UV_h`` the ``(r_kv, d_nope)`` and ``(r_kv, d_v)`` blocks of ``wkv_b``, the scores are
    ``(q_nope_h W_UK_h^T) c^T + RoPE(q_rope_h) k_R^T`` and the head output is
    ``(softmax(...) c) W_UV_h``: attention over one shared ``(r_kv + d_rope)``-sized key and
    ``r_kv``-sized value, like multi-query attention. ``mask`` as in :func:`multi_head_attention`
    (boolean, True = may attend, or additive; broadcastable to ``(..., H, T, S)``). With ``cache``
    (an :class:`MLACache`, ``x`` of shape ``(B, T, C)``) only ``c`` and ``k_R`` of the new tokens are
    appended to layer ``layer_idx``, and the queries attend to all ``S`` cached positions; pass the
    bottom-right ``causal_mask(T, S)``. Returns ``(..., T, C)`` (float64 unless ``x`` is another float type).
    """
    x = np.asarray(x)
    shape = check_ndim("x", x, 2)
    sizes = check_mla_sizes(n_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
    rope_base = check_positive_float("rope_base", rope_base, minimum=1.0, allow_equal=False)
    absorb = check_flag("absorb", absorb)
    check_cache_type(cache, MLACache)
    offset = cache_offset(cache, layer_idx)
    C, T = shape[-1], shape[-2]
    H, r, d_nope, d_rope, d_v = sizes

    q_nope, q_rope = _queries(x, params, sizes)
    kv = x @ _param(params, "wkv_a", (C, r + d_rope))
    c = rms_norm(kv[..., :r], _param(params, "kv_norm_weight", (r,)), _NORM_EPS)  # (..., T, r_kv)
    wkv_b = _param(params, "wkv_b", (r, H * (d_nope + d_v))).reshape(r, H, d_nope + d_v)
    wo = _param(params, "wo", (H * d_v, C))

    positions = np.arange(offset, offset + T) if positions is None else np.asarray(positions)
    inv_freq = rope_inv_freq(d_rope, rope_base)
    k_rope = apply_rope(kv[..., r:], positions, inv_freq)  # (..., T, d_rope), one key for all heads
    q_rope = apply_rope(q_rope, positions[..., None, :] if positions.ndim > 1 else positions, inv_freq)
    if cache is not None:
        c, k_rope = cache.update(layer_idx, c, k_rope)  # (B, S, r_kv), (B, S, d_rope)
    scale = 1.0 / math.sqrt(d_nope + d_rope)

    if absorb:
        w_uk, w_uv = wkv_b[..., :d_nope], wkv_b[..., d_nope:]  # (r_kv, H, d_nope), (r_kv, H, d_v)
        q_latent = np.einsum("...htn,rhn->...htr", q_nope, w_uk)  # W_UK folded into the query
        q_all = np.concatenate([q_latent, q_rope], axis=-1)  # (..., H, T, r_kv + d_rope)
        k_all = np.concatenate([c, k_rope], axis=-1)[..., None, :, :]  # (..., 1, S, r_kv + d_rope)
        o_latent = grouped_query_attention(q_all, k_all, c[..., None, :, :], mask, scale=scale)  # (..., H, T, r_kv)
        heads = np.einsum("...htr,rhv->...htv", o_latent, w_uv)  # W_UV folded into the output
    else:
        kv_heads = _split_heads(c @ wkv_b.reshape(r, -1), H)  # (..., H, S, d_nope + d_v)
        k_nope, v = kv_heads[..., :d_nope], kv_heads[..., d_nope:]
        k_shared = np.broadcast_to(k_rope[..., None, :, :], (*k_nope.shape[:-1], d_rope))
        q = np.concatenate([q_nope, q_rope], axis=-1)  # (..., H, T, d_nope + d_rope)
        k = np.concatenate([k_nope, k_shared], axis=-1)  # (..., H, S, d_nope + d_rope)
        heads = grouped_query_attention(q, k, v, mask, scale=scale)  # (..., H, T, d_v)
    return _merge_heads(heads) @ wo
