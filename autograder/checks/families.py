"""Hidden tests of assignment 05-families (NumPy, float64 inputs).

Tolerances: masks exact; cross-attention rtol 1e-7, atol 1e-8 (float64 through
four projections and a softmax).
"""

import numpy as np
from transformer_ref import numpy as ref

from ._common import (Mistake, assert_choice, assert_close, assert_equal_mask, call, cascade, hidden_test,
                      hinted, rng, suspects, to_numpy)

F64 = dict(rtol=1e-7, atol=1e-8)
FAMILIES = ("A", "B", "C")  # A encoder-only, B decoder-only, C encoder-decoder
ATTENTION_KEYS = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo")
LENGTH_CASES = [(np.array([4, 2, 1]), 4), (np.array([5]), 5), (np.array([3, 6]), 6)]


def _key_padding(lengths, T):
    """(B, 1, T): key j of sequence b exists iff j < lengths[b]."""
    return (np.arange(T) < lengths[:, None])[:, None, :]


def _causal(T):
    return np.tril(np.ones((T, T), dtype=bool))


# The typical wrong versions of each function (chapter 5's warnings): what each returns on the
# check's inputs, so that a verdict can name the mistake. The test suite plants every one.
MISTAKES = {
    "encoder_mask": (
        Mistake("encoder-mask-causal", "the encoder's mask is causal; an encoder reads its whole input at once.",
                "An encoder is bidirectional: every query sees every real key (j < length), before and after it.",
                lambda lengths, T: _key_padding(lengths, T) & _causal(T)),
        Mistake("encoder-mask-padding-queries", "the padding is applied to the queries (rows), not to the keys.",
                "Hide the padding keys (columns j >= length); a padding query's row does not matter.",
                lambda lengths, T: np.swapaxes(np.broadcast_to(_key_padding(lengths, T), (len(lengths), T, T)), -1, -2)),
    ),
    "decoder_mask": (
        Mistake("decoder-mask-no-padding", "the mask is causal only: padding keys stay visible.",
                "Combine the causal mask (j <= i) with the padding mask (j < length): a & b.",
                lambda lengths, T: np.broadcast_to(_causal(T), (len(lengths), T, T))),
    ),
    "cross_attention": (
        Mistake("cross-causal", "a causal mask is applied in cross-attention (and the memory mask is lost).",
                "Cross-attention has no causal mask: every query may see every (real) memory position; apply only "
                "memory_mask.",
                lambda x, memory, params, n_heads, mask: ref.cross_attention(
                    x, memory, params, n_heads, memory_mask=np.tril(np.ones((x.shape[-2], memory.shape[-2]), bool)))),
        Mistake("cross-keys-from-x", "the keys and values come from x, not from the encoder's memory.",
                "Queries come from x; keys and values from memory: memory @ wk + bk, memory @ wv + bv.",
                lambda x, memory, params, n_heads, mask: ref.cross_attention(x, x, params, n_heads)),
    ),
}
# decoder_mask calls encoder_mask
MISTAKES["decoder_mask"] += cascade(MISTAKES["encoder_mask"], "encoder_mask",
                                    lambda produce: lambda lengths, T: produce(lengths, T) & _causal(T))


@hidden_test
def check_encoder_mask(encoder_mask):
    """Bidirectional self-attention over the real (non-padding) tokens."""
    for lengths, T in LENGTH_CASES:
        what = f"encoder_mask(lengths={lengths.tolist()}, T={T})"
        expected = np.broadcast_to(_key_padding(lengths, T), (len(lengths), T, T))
        hint = "Every query may see every real key; padding keys (j >= length) are hidden; shape (B, T, T)."
        with hinted(hint):
            assert_equal_mask(call(encoder_mask, lengths, T, what=what), expected, what, hint=hint,
                              mistakes=suspects(MISTAKES["encoder_mask"], lengths, T))


@hidden_test
def check_decoder_mask(decoder_mask):
    """Causal self-attention over the real tokens."""
    for lengths, T in LENGTH_CASES:
        what = f"decoder_mask(lengths={lengths.tolist()}, T={T})"
        expected = _key_padding(lengths, T) & ref.causal_mask(T)
        hint = "Combine the causal mask (j <= i) with the padding mask (j < length); shape (B, T, T)."
        with hinted(hint):
            assert_equal_mask(call(decoder_mask, lengths, T, what=what), expected, what, hint=hint,
                              mistakes=suspects(MISTAKES["decoder_mask"], lengths, T))


@hidden_test
def check_prefix_lm_mask(prefix_lm_mask):
    """Prefix LM: bidirectional inside the prefix, causal after it."""
    for T, prefix_len in [(5, 0), (5, 5), (6, 2), (1, 1), (7, 3)]:
        what = f"prefix_lm_mask(T={T}, prefix_len={prefix_len})"
        hint = ("Query i sees key j iff j <= i (causal) or j < prefix_len (the prefix is read both ways); "
                "shape (T, T).")
        with hinted(hint):
            assert_equal_mask(call(prefix_lm_mask, T, prefix_len, what=what), ref.prefix_lm_mask(T, prefix_len),
                              what, hint=hint)


def _attention_params(d_model, n_heads, seed):
    params = ref.init_block_params(d_model, n_heads, 4 * d_model, seed=seed)
    return {key: params[key] for key in ATTENTION_KEYS}


@hidden_test
def check_cross_attention(cross_attention):
    """Decoder queries over encoder memory: T != S, batch dims, a memory padding mask."""
    g = rng(501)
    memory_mask = np.array([True, True, True, False, False, True, True])
    batch_mask = _key_padding(np.array([7, 3]), 7)[:, None]  # (B, 1, 1, S)
    for x_shape, m_shape, n_heads, mask in [((5, 16), (9, 16), 4, None),
                                            ((2, 3, 12), (2, 7, 12), 3, batch_mask),
                                            ((4, 8), (7, 8), 2, memory_mask)]:
        x, memory = g.standard_normal(x_shape), g.standard_normal(m_shape)
        params = _attention_params(x_shape[-1], n_heads, seed=30 + n_heads)
        what = f"cross_attention (x of shape {x_shape}, memory of shape {m_shape})"
        hint = ("Queries come from x (x @ wq + bq), keys and values from memory; "
                "no causal mask in cross-attention.")
        with hinted(hint):
            out = to_numpy(call(cross_attention, x, memory, params, n_heads, mask, what=what), what)
            expected = ref.cross_attention(x, memory, params, n_heads, memory_mask=mask)
            assert_close(out, expected, what, **F64, hint=hint,
                         mistakes=suspects(MISTAKES["cross_attention"], x, memory, params, n_heads, mask))


FAMILY_HINT = ("Ask whether the task reads its whole input at once, generates text left to right, or turns "
               "one sequence into another; the chapter's table of the three families sums it up.")


@hidden_test
def check_answer_sentiment(answer):
    assert_choice(answer, "A", "ANSWER_SENTIMENT", FAMILIES, hint=FAMILY_HINT)


@hidden_test
def check_answer_code_completion(answer):
    assert_choice(answer, "B", "ANSWER_CODE_COMPLETION", FAMILIES, hint=FAMILY_HINT)


@hidden_test
def check_answer_speech_to_text(answer):
    assert_choice(answer, "C", "ANSWER_SPEECH_TO_TEXT", FAMILIES, hint=FAMILY_HINT)
