"""The three transformer families as small PyTorch models, all built from :class:`TransformerBlock`.

* :class:`EncoderOnlyModel` (BERT-like): bidirectional self-attention with a key-padding
  mask; per-token logits, or a pooled classifier with ``n_classes``.
* :class:`DecoderOnlyModel` (GPT/Llama-like): causal self-attention, RoPE by default,
  tied LM head, KV-cached :meth:`~DecoderOnlyModel.generate`.
* :class:`EncoderDecoderModel` (the 2017 Transformer, T5-like): a bidirectional encoder,
  and a causal decoder whose blocks cross-attend to the encoder output (the *memory*).

Shapes: token ids ``(B, T)`` (int64), hidden states ``(B, T, C)``, logits ``(B, T, V)``.
Every model is pre-norm by default (``norm_position="pre"``, a final norm after the last
block); with ``norm_position="post"`` that extra norm is applied to the embeddings
instead (as BERT does), so in both cases a stack has exactly one norm outside its blocks,
and a decoder-only model's parameter count is
:func:`transformer_ref.counts.model_param_count` (tied embeddings; ``max_positions =
max_len`` for learned positions, ``None`` for RoPE).  Block options (``d_ff``,
``n_kv_heads``, ``bias``, ``ffn``, ``norm``, ``activation``, ``dropout``, ``eps``) are
passed through to :class:`TransformerBlock`.  Embeddings start as Normal(0, 0.02).
"""

import torch
import torch.nn.functional as F
from torch import nn

from .. import numpy as _numpy_backend
from .._checks import check_divisible, check_int, check_norm_eps
from .attention import _check_tensor
from .block import TransformerBlock, _cross_attention, layer_norm, rms_norm
from .kv_cache import KVCache
from .masks import causal_mask, padding_mask

__all__ = ["cross_attention", "EncoderOnlyModel", "DecoderOnlyModel", "EncoderDecoderModel"]


def cross_attention(x, memory, params, n_heads, memory_mask=None):
    """Multi-head cross-attention: queries from ``x (..., T, C)``, keys/values from ``memory (..., S, C)``.

    Taught in chapter 5, section 'Cross-attention'.

    ``params``: unprefixed ``wq, wk, wv, wo`` (+ ``bq, bk, bv, bo``), tensors or arrays;
    ``memory_mask`` boolean, broadcastable to ``(..., H, T, S)``; no causal mask, no RoPE::

        out = concat_h softmax((x wq)_h (memory wk)_h^T / sqrt(D)) (memory wv)_h @ wo

    Returns ``(..., T, C)`` in ``x``'s dtype, on ``x``'s device, differentiable.
    """
    _check_tensor("x", x, 2)
    return _cross_attention(x, memory, params, n_heads, memory_mask)


class _Norm(nn.Module):
    """LayerNorm (weight, and bias when ``bias``) or RMSNorm (weight) over the last axis."""

    def __init__(self, d_model, norm, bias, eps):
        super().__init__()
        self.norm = norm
        self.eps = check_norm_eps(norm, eps)
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if (norm == "layernorm" and bias) else None

    def forward(self, x):
        if self.norm == "rmsnorm":
            return rms_norm(x, self.weight, self.eps)
        return layer_norm(x, self.weight, self.bias, self.eps)


def _check_tokens(name, tokens, stack, offset=0):
    """Require int ``tokens (B, T)`` with ids in ``[0, V)`` and ``offset + T <= max_len``; return ``(B, T)``."""
    if not torch.is_tensor(tokens) or tokens.ndim != 2 or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor (B, T), got {getattr(tokens, 'shape', tokens)!r}")
    B, T = tokens.shape
    if offset + T > stack.max_len:
        raise ValueError(f"{name}: {offset + T} positions exceed max_len={stack.max_len}")
    vocab_size = stack.tok_emb.num_embeddings
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"{name} must hold token ids in [0, {vocab_size}), got values in "
                         f"[{int(tokens.min())}, {int(tokens.max())}]")
    return B, T


class _Stack(nn.Module):
    """Token embedding (+ learned positions) -> ``n_layers`` blocks -> one norm.

    ``forward(tokens (B, T), mask, positions (T,), ...) -> hidden (B, T, C)``.
    """

    def __init__(self, vocab_size, d_model, n_layers, n_heads, max_len, *, learned_positions,
                 cross_attention=False, norm_position="pre", norm="layernorm", bias=True, eps=None,
                 **block_kwargs):
        super().__init__()
        check_int("vocab_size", vocab_size, minimum=1)
        check_int("n_layers", n_layers, minimum=0)
        self.max_len = check_int("max_len", max_len, minimum=1)
        self.norm_position = norm_position
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        self.pos_emb = None
        if learned_positions:
            self.pos_emb = nn.Embedding(max_len, d_model)
            nn.init.normal_(self.pos_emb.weight, std=0.02)
        self.blocks = nn.ModuleList(
            TransformerBlock(d_model, n_heads, norm_position=norm_position, norm=norm, bias=bias, eps=eps,
                             cross_attention=cross_attention, **block_kwargs)
            for _ in range(n_layers))
        self.norm = _Norm(d_model, norm, bias, eps)

    def forward(self, tokens, mask, positions, *, rope=None, memory=None, memory_mask=None, cache=None):
        h = self.tok_emb(tokens)  # (B, T, C)
        if self.pos_emb is not None:
            h = h + self.pos_emb(positions)
        if self.norm_position == "post":
            h = self.norm(h)  # post-norm stacks normalise the embeddings (BERT)
        for i, block in enumerate(self.blocks):
            h = block(h, mask, rope=rope, positions=positions, memory=memory, memory_mask=memory_mask,
                      cache=cache, layer_idx=i)
        return self.norm(h) if self.norm_position == "pre" else h

    def logits(self, h):
        """Tied LM head: ``h (B, T, C) @ tok_emb.weight^T -> (B, T, V)``."""
        return h @ self.tok_emb.weight.t()


class EncoderOnlyModel(nn.Module):
    """A bidirectional encoder (BERT-like) with learned positions.

    Taught in chapter 5, section 'One task, three families'.

    ``forward(tokens (B, T), lengths=None)``: ``lengths (B,)`` marks right padding
    (keys at ``j >= lengths[b]`` are masked by ``padding_mask``).  Returns token logits
    ``(B, T, vocab_size)`` (tied to the token embedding), or with ``n_classes`` the
    logits ``(B, n_classes)`` of a linear classifier on the mean of the non-pad hidden states.
    """

    def __init__(self, vocab_size, d_model, n_layers, n_heads, max_len, *, n_classes=None, **options):
        super().__init__()
        self.encoder = _Stack(vocab_size, d_model, n_layers, n_heads, max_len, learned_positions=True, **options)
        self.classifier = None
        if n_classes is not None:
            self.classifier = nn.Linear(d_model, check_int("n_classes", n_classes, minimum=1))

    def forward(self, tokens, lengths=None):
        B, T = _check_tokens("tokens", tokens, self.encoder)
        mask = None if lengths is None else padding_mask(lengths, T, device=tokens.device)
        positions = torch.arange(T, device=tokens.device)
        h = self.encoder(tokens, mask, positions)  # (B, T, C)
        if self.classifier is None:
            return self.encoder.logits(h)
        if lengths is None:
            pooled = h.mean(dim=1)
        else:
            keep = mask[:, 0, 0, :, None].to(h.dtype)  # (B, T, 1)
            pooled = (h * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        return self.classifier(pooled)  # (B, n_classes)


class DecoderOnlyModel(nn.Module):
    """A causal language model (GPT/Llama-like) with a tied LM head.

    Taught in chapter 5, section 'One task, three families'.

    ``rope=True`` rotates queries and keys (no position embedding); ``rope=False`` adds
    learned positions.  ``causal=False`` drops the mask: the model can then read the
    token it must predict (the "cheating" model of the causal-mask chapter).
    ``forward(tokens (B, T), cache=None) -> logits (B, T, vocab_size)``; with a
    :class:`KVCache` the tokens continue the cached sequence: positions start at
    ``cache.seq_len`` and the mask is the bottom-right ``causal_mask(T, seq_len + T)``.
    """

    def __init__(self, vocab_size, d_model, n_layers, n_heads, max_len, *, n_kv_heads=None, rope=True,
                 causal=True, rope_base=10000.0, **options):
        super().__init__()
        self.n_layers, self.causal = n_layers, causal
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.head_dim = check_divisible("d_model", d_model, "n_heads", check_int("n_heads", n_heads, minimum=1))
        # float64 NumPy frequencies: apply_rope casts them to the activations' dtype and device
        self.inv_freq = _numpy_backend.rope_inv_freq(self.head_dim, rope_base) if rope else None
        self.decoder = _Stack(vocab_size, d_model, n_layers, n_heads, max_len, learned_positions=not rope,
                              n_kv_heads=n_kv_heads, **options)

    def forward(self, tokens, cache=None):
        offset = 0 if cache is None else cache.seq_len
        B, T = _check_tokens("tokens", tokens, self.decoder, offset)
        positions = torch.arange(offset, offset + T, device=tokens.device)
        mask = causal_mask(T, offset + T, device=tokens.device) if self.causal else None
        h = self.decoder(tokens, mask, positions, rope=self.inv_freq, cache=cache)
        return self.decoder.logits(h)

    def new_cache(self, batch_size, max_seq_len):
        """An empty :class:`KVCache` sized for this model, on its device and dtype."""
        weight = self.decoder.tok_emb.weight
        return KVCache(self.n_layers, batch_size, self.n_kv_heads, self.head_dim, max_seq_len,
                       dtype=weight.dtype, device=weight.device)

    @torch.no_grad()
    def generate(self, prompt, max_new_tokens, greedy=True, *, temperature=1.0, generator=None):
        """Continue ``prompt (B, T0)`` by ``max_new_tokens`` tokens; returns ``(B, T0 + max_new_tokens)``.

        The prompt is run once to fill a :class:`KVCache`; each new token then costs one
        single-position forward.  ``greedy`` takes the argmax, otherwise tokens are sampled
        from ``softmax(logits / temperature)`` (``generator`` for reproducibility).
        For a causal model the result equals re-running the full forward at every step.
        """
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
        B, T0 = _check_tokens("prompt", prompt, self.decoder, max_new_tokens)
        if T0 == 0:
            raise ValueError("prompt must hold at least one token")
        if not greedy and not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        cache = self.new_cache(B, T0 + max_new_tokens)
        tokens, step_input = prompt, prompt
        for _ in range(max_new_tokens):
            logits = self(step_input, cache=cache)[:, -1]  # (B, V)
            if greedy:
                step_input = logits.argmax(dim=-1, keepdim=True)
            else:
                probs = F.softmax(logits.float() / temperature, dim=-1)
                step_input = torch.multinomial(probs, 1, generator=generator)
            tokens = torch.cat([tokens, step_input], dim=1)
        return tokens


class EncoderDecoderModel(nn.Module):
    """A bidirectional encoder and a causal decoder with cross-attention (learned positions).

    Taught in chapter 5, section 'One task, three families'.

    ``forward(src (B, S), tgt_in (B, T), src_lengths=None) -> logits (B, T, tgt_vocab)``
    (teacher forcing: ``tgt_in`` is the target shifted right, starting with BOS).
    ``encode`` returns ``(memory (B, S, C), memory_mask (B, 1, 1, S) or None)``; ``decode``
    maps ``tgt_in`` and the memory to logits (tied to the target embedding) and accepts a
    :class:`KVCache` for the decoder's self-attention; ``generate`` decodes greedily.
    The encoder and the decoder each have ``n_layers`` blocks.
    """

    def __init__(self, src_vocab, tgt_vocab, d_model, n_layers, n_heads, max_len, **options):
        super().__init__()
        self.n_layers, self.n_heads = n_layers, n_heads
        self.n_kv_heads = options.get("n_kv_heads") or n_heads
        self.encoder = _Stack(src_vocab, d_model, n_layers, n_heads, max_len, learned_positions=True, **options)
        self.decoder = _Stack(tgt_vocab, d_model, n_layers, n_heads, max_len, learned_positions=True,
                              cross_attention=True, **options)

    def encode(self, src, src_lengths=None):
        B, S = _check_tokens("src", src, self.encoder)
        mask = None if src_lengths is None else padding_mask(src_lengths, S, device=src.device)
        return self.encoder(src, mask, torch.arange(S, device=src.device)), mask

    def decode(self, tgt_in, memory, memory_mask=None, cache=None):
        offset = 0 if cache is None else cache.seq_len
        B, T = _check_tokens("tgt_in", tgt_in, self.decoder, offset)
        positions = torch.arange(offset, offset + T, device=tgt_in.device)
        mask = causal_mask(T, offset + T, device=tgt_in.device)
        h = self.decoder(tgt_in, mask, positions, memory=memory, memory_mask=memory_mask, cache=cache)
        return self.decoder.logits(h)

    def forward(self, src, tgt_in, src_lengths=None):
        memory, memory_mask = self.encode(src, src_lengths)
        return self.decode(tgt_in, memory, memory_mask)

    @torch.no_grad()
    def generate(self, src, bos, max_new_tokens, src_lengths=None):
        """Greedy decoding: returns ``(B, 1 + max_new_tokens)`` target ids starting with ``bos``.

        The source is encoded once; the decoder's self-attention keys/values are cached
        (cross-attention keys/values are recomputed from the memory at each step).
        """
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
        bos = check_int("bos", bos, minimum=0)
        if bos >= self.decoder.tok_emb.num_embeddings:
            raise ValueError(f"bos must be < tgt_vocab={self.decoder.tok_emb.num_embeddings}, got {bos}")
        if 1 + max_new_tokens > self.decoder.max_len:
            raise ValueError(f"max_new_tokens: {1 + max_new_tokens} positions exceed max_len={self.decoder.max_len}")
        memory, memory_mask = self.encode(src, src_lengths)
        weight = self.decoder.tok_emb.weight
        C = weight.shape[1]
        cache = KVCache(self.n_layers, src.shape[0], self.n_kv_heads, C // self.n_heads, 1 + max_new_tokens,
                        dtype=weight.dtype, device=weight.device)
        tokens = torch.full((src.shape[0], 1), bos, dtype=torch.long, device=src.device)
        step_input = tokens
        for _ in range(max_new_tokens):
            logits = self.decode(step_input, memory, memory_mask, cache)[:, -1]  # (B, V)
            step_input = logits.argmax(dim=-1, keepdim=True)
            tokens = torch.cat([tokens, step_input], dim=1)
        return tokens
