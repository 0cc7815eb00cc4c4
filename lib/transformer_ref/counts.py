"""Backend-free arithmetic: parameter counts, KV-cache bytes (GQA and MLA), attention cost.

Everything here works on plain Python integers (no arrays), so the numbers are
exact at any scale (Llama-2-70B's 68,976,648,192 parameters fit in an ``int``).
Both backends re-export these names::

    from transformer_ref import numpy as ref
    ref.model_param_count(50257, 768, 12, 12, max_positions=1024)   # GPT-2 small: 124,439,808

Notation: ``C = d_model``, ``H`` query heads, ``H_kv`` key/value heads,
``D = C // H`` the head dimension, ``F = d_ff`` the FFN hidden width, ``L`` layers,
``V`` the vocabulary, ``T`` queries, ``S`` keys, ``B`` batch size.
"""

from ._checks import NORM_TYPES, check_choice, check_divisible, check_flag, check_int

__all__ = [
    "default_d_ff",
    "block_param_shapes",
    "block_param_count",
    "model_param_count",
    "kv_cache_bytes",
    "mla_kv_cache_bytes",
    "attention_score_bytes",
    "attention_flops",
]

FFN_TYPES = ("gelu", "swiglu")


def default_d_ff(d_model, ffn="gelu", multiple_of=256):
    """The FFN hidden width ``F`` used when ``d_ff`` is not given.

    Taught in chapter 4, section 'The position-wise feed-forward network'.

    * ``ffn="gelu"``: ``F = 4 C`` (the original Transformer, BERT, GPT-2).
    * ``ffn="swiglu"``: Meta's Llama rule: a SwiGLU FFN has three matrices instead of
      two, so the width is shrunk to ``2/3 * 4C`` to keep the parameter count near
      ``8 C^2``, then rounded *up* to a multiple of ``multiple_of`` (256)::

          F = multiple_of * ceil(int(8 C / 3) / multiple_of)

      e.g. ``C = 4096`` gives 11008 (Llama-2-7B).  Llama-2-70B does *not* follow it
      (it uses an extra multiplier, F = 28672): pass ``d_ff`` explicitly for such models.
    """
    d_model = check_int("d_model", d_model, minimum=1)
    check_choice("ffn", ffn, FFN_TYPES)
    multiple_of = check_int("multiple_of", multiple_of, minimum=1)
    if ffn == "gelu":
        return 4 * d_model
    hidden = int(2 * (4 * d_model) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _block_dims(d_model, n_heads, d_ff, n_kv_heads, ffn, norm):
    """Validate a block configuration; return ``(C, H, H_kv, D, F)``."""
    d_model = check_int("d_model", d_model, minimum=1)
    n_heads = check_int("n_heads", n_heads, minimum=1)
    head_dim = check_divisible("d_model", d_model, "n_heads", n_heads)
    n_kv_heads = n_heads if n_kv_heads is None else check_int("n_kv_heads", n_kv_heads, minimum=1)
    check_divisible("n_heads", n_heads, "n_kv_heads", n_kv_heads)
    check_choice("ffn", ffn, FFN_TYPES)
    check_choice("norm", norm, NORM_TYPES)
    d_ff = default_d_ff(d_model, ffn) if d_ff is None else check_int("d_ff", d_ff, minimum=1)
    return d_model, n_heads, n_kv_heads, head_dim, d_ff


def block_param_shapes(d_model, n_heads, d_ff=None, *, n_kv_heads=None, bias=True, ffn="gelu",
                       norm="layernorm", cross_attention=False):
    """The parameter dict of one block, as ``{key: shape}`` (what ``init_block_params`` fills).

    Taught in chapter 4, section 'Counting the parameters'.

    Keys, in order (``*_bias`` / ``b*`` only when ``bias=True``; no ``ln*_bias`` for RMSNorm):

    * ``ln1_weight (C,)``, ``ln1_bias (C,)``: norm of the self-attention sublayer;
    * ``wq (C, H*D)``, ``bq``, ``wk (C, H_kv*D)``, ``bk``, ``wv (C, H_kv*D)``, ``bv``,
      ``wo (H*D, C)``, ``bo``: self-attention (linear layers compute ``x @ W + b``);
    * with ``cross_attention=True``: ``ln3_weight``, ``ln3_bias`` and ``cross_wq`` ...
      ``cross_bo`` with the same shapes (a decoder block of an encoder-decoder);
    * ``ln2_weight``, ``ln2_bias``: norm of the FFN sublayer;
    * ``ffn="gelu"``: ``w1 (C, F)``, ``b1 (F,)``, ``w2 (F, C)``, ``b2 (C,)``;
      ``ffn="swiglu"``: ``w1 (C, F)`` gate, ``b1``, ``w3 (C, F)`` up, ``b3``, ``w2 (F, C)`` down, ``b2``.
    """
    C, H, H_kv, D, F = _block_dims(d_model, n_heads, d_ff, n_kv_heads, ffn, norm)
    bias, cross_attention = check_flag("bias", bias), check_flag("cross_attention", cross_attention)

    def norm_shapes(name):
        shapes = {f"{name}_weight": (C,)}
        if norm == "layernorm" and bias:
            shapes[f"{name}_bias"] = (C,)
        return shapes

    def attention_shapes(prefix):
        shapes = {}
        for key, (n_in, n_out) in [("q", (C, H * D)), ("k", (C, H_kv * D)),
                                   ("v", (C, H_kv * D)), ("o", (H * D, C))]:
            shapes[f"{prefix}w{key}"] = (n_in, n_out)
            if bias:
                shapes[f"{prefix}b{key}"] = (n_out,)
        return shapes

    def linear(shapes, key, n_in, n_out):
        shapes[f"w{key}"] = (n_in, n_out)
        if bias:
            shapes[f"b{key}"] = (n_out,)

    shapes = {**norm_shapes("ln1"), **attention_shapes("")}
    if cross_attention:
        shapes.update(norm_shapes("ln3"))
        shapes.update(attention_shapes("cross_"))
    shapes.update(norm_shapes("ln2"))
    linear(shapes, "1", C, F)
    if ffn == "swiglu":
        linear(shapes, "3", C, F)
    linear(shapes, "2", F, C)
    return shapes


def block_param_count(d_model, n_heads, d_ff=None, *, n_kv_heads=None, bias=True, ffn="gelu",
                      norm="layernorm", cross_attention=False):
    """Exact number of parameters of one transformer block.

    Taught in chapter 4, section 'Counting the parameters'.

    With ``D = C / H`` (so ``H D = C``) and ``b = 1`` if ``bias`` else ``0``::

        attention = 2 C^2 + 2 C (H_kv D)        (wq, wo; wk, wv)
                  + b (2 C + 2 H_kv D)          (bq, bo; bk, bv)
        ffn gelu   = 2 C F + b (F + C)
        ffn swiglu = 3 C F + b (2 F + C)
        one norm   = C (RMSNorm, or LayerNorm without bias) or 2 C (LayerNorm with bias)
        block      = attention [+ attention + norm if cross_attention] + ffn + 2 norms

    A GPT-2 block (C = 768, H = 12, F = 4C, bias, LayerNorm, GELU) is
    ``12 C^2 + 13 C = 7,087,872``; a Llama-2-70B block (C = 8192, H = 64,
    H_kv = 8, F = 28672, SwiGLU, RMSNorm, no bias) is 855,654,400.
    ``d_ff=None`` means :func:`default_d_ff`.
    """
    C, H, H_kv, D, F = _block_dims(d_model, n_heads, d_ff, n_kv_heads, ffn, norm)
    b = 1 if check_flag("bias", bias) else 0
    check_flag("cross_attention", cross_attention)
    attention = 2 * C * C + 2 * C * (H_kv * D) + b * (2 * C + 2 * H_kv * D)
    if ffn == "gelu":
        feed_forward = 2 * C * F + b * (F + C)
    else:
        feed_forward = 3 * C * F + b * (2 * F + C)
    one_norm = 2 * C if (norm == "layernorm" and bias) else C
    total = attention + feed_forward + 2 * one_norm
    if cross_attention:
        total += attention + one_norm
    return total


def model_param_count(vocab_size, d_model, n_layers, n_heads, d_ff=None, *, n_kv_heads=None,
                      max_positions=None, bias=True, ffn="gelu", norm="layernorm",
                      tied_embeddings=True):
    """Exact parameter count of a stack of identical blocks with embeddings.

    Taught in chapter 4, section 'Counting the parameters'.

    ::

        total = V C                           token embedding
              + P C                           learned positions (P = max_positions; 0 if None, e.g. RoPE)
              + L * block_param_count(...)
              + one norm (C or 2 C)           the final norm (for a post-norm model: the embedding norm)
              + V C if not tied_embeddings    LM head (no bias)

    GPT-2 small ``(50257, 768, 12, 12, max_positions=1024)`` = 124,439,808.
    Llama-2-70B ``(32000, 8192, 80, 64, 28672, n_kv_heads=8, bias=False, ffn="swiglu",
    norm="rmsnorm", tied_embeddings=False)`` = 68,976,648,192.
    BERT-base without its pooler is this count for ``(30522, 768, 12, 12,
    max_positions=512)`` plus its two token-type embeddings (2 C): 108,891,648.
    """
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    n_layers = check_int("n_layers", n_layers, minimum=0)
    block = block_param_count(d_model, n_heads, d_ff, n_kv_heads=n_kv_heads, bias=bias, ffn=ffn,
                              norm=norm)
    positions = 0 if max_positions is None else check_int("max_positions", max_positions, minimum=1)
    final_norm = 2 * d_model if (norm == "layernorm" and bias) else d_model
    head = 0 if check_flag("tied_embeddings", tied_embeddings) else vocab_size * d_model
    return vocab_size * d_model + positions * d_model + n_layers * block + final_norm + head


def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    """Bytes held by a KV cache::

        2 (K and V) * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_element

    Taught in chapter 2, section 'How big is the KV cache?'.

    Llama-2-70B (80 layers, 8 KV heads, D = 128) in fp16: 327,680 bytes per token;
    with 64 KV heads (plain multi-head attention) it would be 2,621,440.
    """
    n_layers = check_int("n_layers", n_layers, minimum=0)
    n_kv_heads = check_int("n_kv_heads", n_kv_heads, minimum=0)
    head_dim = check_int("head_dim", head_dim, minimum=0)
    seq_len = check_int("seq_len", seq_len, minimum=0)
    batch_size = check_int("batch_size", batch_size, minimum=0)
    bytes_per_element = check_int("bytes_per_element", bytes_per_element, minimum=1)
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_element


def mla_kv_cache_bytes(n_layers, kv_lora_rank, rope_head_dim, seq_len, batch_size=1, bytes_per_element=2):
    """Bytes held by the cache of multi-head latent attention (DeepSeek-V2 §2.1.3)::

        n_layers * (kv_lora_rank + rope_head_dim) * seq_len * batch_size * bytes_per_element

    Taught in chapter 2, section 'Multi-head latent attention: cache a latent, not the heads'.

    Per token and layer MLA stores its latent ``c`` (``kv_lora_rank = d_c`` numbers) and the one
    RoPE key shared by all heads (``rope_head_dim = d_h^R``), however many heads there are.
    DeepSeek-V2 and -V3 (``d_c = 512``, ``d_h^R = 64``) store 576 numbers per layer: 34,560
    per token over V2's 60 layers, 70,272 bytes per token in bf16 over V3's 61.
    """
    n_layers = check_int("n_layers", n_layers, minimum=0)
    kv_lora_rank = check_int("kv_lora_rank", kv_lora_rank, minimum=0)
    rope_head_dim = check_int("rope_head_dim", rope_head_dim, minimum=0)
    seq_len = check_int("seq_len", seq_len, minimum=0)
    batch_size = check_int("batch_size", batch_size, minimum=0)
    bytes_per_element = check_int("bytes_per_element", bytes_per_element, minimum=1)
    return n_layers * (kv_lora_rank + rope_head_dim) * seq_len * batch_size * bytes_per_element


def _attention_sizes(T, S, n_heads, batch_size):
    T = check_int("T", T, minimum=0)
    S = T if S is None else check_int("S", S, minimum=0)
    return T, S, check_int("n_heads", n_heads, minimum=0), check_int("batch_size", batch_size, minimum=0)


def attention_score_bytes(T, S=None, *, n_heads=1, batch_size=1, bytes_per_element=4):
    """Bytes of the materialised score (or weight) matrix of naive attention::

        batch_size * n_heads * T * S * bytes_per_element        (S defaults to T)

    Taught in chapter 6, section 'How big is the wall?'.

    A causal mask does not shrink it: the naive kernel still stores all T x S
    entries.  For T = S = 100,000 one head of one layer holds 10^10 scores, 40 GB in float32.
    """
    T, S, n_heads, batch_size = _attention_sizes(T, S, n_heads, batch_size)
    bytes_per_element = check_int("bytes_per_element", bytes_per_element, minimum=1)
    return batch_size * n_heads * T * S * bytes_per_element


def _attended_pairs(T, S, causal):
    """Number of (query, key) pairs computed: ``T S``, or under a bottom-right causal mask
    ``sum_i max(0, i + S - T + 1)`` = ``T (S - T) + T (T + 1) / 2`` if ``S >= T``
    else ``S (S + 1) / 2`` (the first ``T - S`` queries see nothing)."""
    if not causal:
        return T * S
    if S >= T:
        return T * (S - T) + T * (T + 1) // 2
    return S * (S + 1) // 2


def attention_flops(T, S=None, head_dim=64, *, n_heads=1, batch_size=1, causal=False):
    """Floating-point operations of the two attention matmuls (QK^T and PV)::

        4 * batch_size * n_heads * pairs * head_dim

    Taught in chapter 6, section 'How big is the wall?'.

    counting a multiply-add as 2 FLOPs: each (query, key) pair costs ``2 D`` in QK^T and
    ``2 D`` in PV.  ``pairs = T S`` (``S`` defaults to ``T``); with ``causal=True`` only the
    pairs the bottom-right aligned causal mask allows (query ``i`` sees key ``j`` iff
    ``j <= i + S - T``): ``T (S - T) + T (T + 1) / 2`` when ``S >= T``, ``S (S + 1) / 2`` otherwise.
    The softmax and the projections are not included.
    """
    T, S, n_heads, batch_size = _attention_sizes(T, S, n_heads, batch_size)
    head_dim = check_int("head_dim", head_dim, minimum=1)
    return 4 * batch_size * n_heads * _attended_pairs(T, S, check_flag("causal", causal)) * head_dim
