"""Multi-head latent attention (MLA, DeepSeek-V2 §2.1), in PyTorch.

Same function and semantics as :mod:`transformer_ref.numpy.latent_attention` (read its
docstring for the maths). Runs on ``x``'s device and dtype (``params`` may hold tensors or
NumPy arrays, moved to ``x``'s device and dtype when used) and is differentiable; a cache
(:class:`MLACache`) stores detached tensors, as a cache is for inference.
"""

import math

import torch

from .._checks import cache_offset, check_cache_type, check_flag, check_mla_sizes, check_positive_float
from .attention import _check_tensor, grouped_query_attention
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
        q = x @ _param(params, "wq", x, (C, width))
    else:
        wq_a = _param(params, "wq_a", x)
        if wq_a.ndim != 2 or wq_a.shape[0] != C:
            raise ValueError(f"params['wq_a'] must have shape ({C}, r_q), got {tuple(wq_a.shape)}")
        r_q = wq_a.shape[1]
        c_q = rms_norm(x @ wq_a, _param(params, "q_norm_weight", x, (r_q,)), _NORM_EPS)
        q = c_q @ _param(params, "wq_b", x, (r_q, width))
    q = _split_heads(q, sizes.H)  # (..., H, T, d_nope + d_rope)
    return q[..., : sizes.d_nope], q[..., sizes.d_nope :]


def multi_head_latent_attention(x, params, n_heads, *, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                                mask=None, positions=None, rope_base=10000.0, cache=None, layer_idx=0, absorb=False):
    """Multi-head latent attention (DeepSeek-V2 §2.1), naive or absorbed; ``x (..., T, C)`` -> ``(..., T, C)``.

    Taught in chapter 2, section 'Multi-head latent attention: cache a latent, not the heads'.

    Same arguments, ``params`` keys (``wq`` or ``wq_a``/``q_norm_weight``/``wq_b``, ``wkv_a``,
    ``kv_norm_weight``, ``wkv_b``, ``wo``) and formula as
    :func:`transformer_ref.numpy.multi_head_latent_attention`::

        q_h = [q_nope_h | RoPE(q_rope_h)],  c = RMSNorm(x wkv_a[:, :r_kv]),  k_R = RoPE(x wkv_a[:, r_kv:])
        [k_nope_h | v_h] = c wkv_b_h,  out = concat_h softmax(q_h [k_nope_h | k_R]^T / sqrt(d_nope + d_rope)) v_h @ wo

    ``absorb=True``: the same output from scores ``(q_nope_h W_UK_h^T) c^T + RoPE(q_rope_h) k_R^T``
    and head outputs ``(softmax(...) c) W_UV_h``. With an :class:`MLACache` only ``c`` and ``k_R`` are
    stored per token.
    """
    shape = _check_tensor("x", x, 2)
    sizes = check_mla_sizes(n_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
    rope_base = check_positive_float("rope_base", rope_base, minimum=1.0, allow_equal=False)
    absorb = check_flag("absorb", absorb)
    check_cache_type(cache, MLACache)
    offset = cache_offset(cache, layer_idx)
    C, T = shape[-1], shape[-2]
    H, r, d_nope, d_rope, d_v = sizes

    q_nope, q_rope = _queries(x, params, sizes)
    kv = x @ _param(params, "wkv_a", x, (C, r + d_rope))
    c = rms_norm(kv[..., :r], _param(params, "kv_norm_weight", x, (r,)), _NORM_EPS)  # (..., T, r_kv)
    wkv_b = _param(params, "wkv_b", x, (r, H * (d_nope + d_v))).reshape(r, H, d_nope + d_v)
    wo = _param(params, "wo", x, (H * d_v, C))

    if positions is None:
        positions = torch.arange(offset, offset + T, device=x.device)
    positions = torch.as_tensor(positions, device=x.device)
    inv_freq = rope_inv_freq(d_rope, rope_base, dtype=torch.float64)
    k_rope = apply_rope(kv[..., r:], positions, inv_freq)  # (..., T, d_rope), one key for all heads
    q_rope = apply_rope(q_rope, positions.unsqueeze(-2) if positions.ndim > 1 else positions, inv_freq)
    if cache is not None:
        c, k_rope = cache.update(layer_idx, c, k_rope)  # (B, S, r_kv), (B, S, d_rope)
        c, k_rope = c.to(x.dtype), k_rope.to(x.dtype)
    scale = 1.0 / math.sqrt(d_nope + d_rope)

    if absorb:
        w_uk, w_uv = wkv_b[..., :d_nope], wkv_b[..., d_nope:]  # (r_kv, H, d_nope), (r_kv, H, d_v)
        q_latent = torch.einsum("...htn,rhn->...htr", q_nope, w_uk)  # W_UK folded into the query
        q_all = torch.cat([q_latent, q_rope], dim=-1)  # (..., H, T, r_kv + d_rope)
        k_all = torch.cat([c, k_rope], dim=-1).unsqueeze(-3)  # (..., 1, S, r_kv + d_rope)
        o_latent = grouped_query_attention(q_all, k_all, c.unsqueeze(-3), mask, scale=scale)  # (..., H, T, r_kv)
        heads = torch.einsum("...htr,rhv->...htv", o_latent, w_uv)  # W_UV folded into the output
    else:
        kv_heads = _split_heads(c @ wkv_b.reshape(r, -1), H)  # (..., H, S, d_nope + d_v)
        k_nope, v = kv_heads[..., :d_nope], kv_heads[..., d_nope:]
        k_shared = k_rope.unsqueeze(-3).expand(*k_nope.shape[:-1], d_rope)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (..., H, T, d_nope + d_rope)
        k = torch.cat([k_nope, k_shared], dim=-1)  # (..., H, S, d_nope + d_rope)
        heads = grouped_query_attention(q, k, v, mask, scale=scale)  # (..., H, T, d_v)
    return _merge_heads(heads) @ wo
