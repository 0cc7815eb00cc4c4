"""Hidden tests of assignment 03-causal-mask (NumPy, float64 inputs).

Tolerances: masks exact; softmax and attention rtol 1e-7, atol 1e-9.
"""

import numpy as np
from transformer_ref import numpy as ref

from ._common import (Mistake, suspects, assert_close, assert_equal_mask, assert_number, call,
                      hidden_test, rng, to_numpy)

F64 = dict(rtol=1e-7, atol=1e-9)
MASK_SIZES = [(1, 1), (4, 4), (3, 7), (1, 9), (2, 6), (5, 5)]


# The typical wrong versions of each function (chapter 3's warnings): what each returns on the
# check's inputs, so that a verdict can name the mistake. The test suite plants every one.
MISTAKES = {
    "causal_attention": (
        Mistake("attention-no-scale", "the scores are not divided by sqrt(D).",
                "Scale the scores by 1 / sqrt(D) (D = head_dim) before the softmax.",
                lambda q, k, v: ref.scaled_dot_product_attention(
                    q, k, v, ref.causal_mask(q.shape[-2], k.shape[-2]), scale=1.0)),
    ),
}


@hidden_test
def check_causal_mask(causal_mask):
    """Bottom-right aligned boolean masks for T == S and T < S, and S defaulting to T."""
    for T, S in MASK_SIZES:
        what = f"causal_mask(T={T}, S={S})"
        out = call(causal_mask, T, S, what=what)
        hint = ""
        if isinstance(out, np.ndarray) and out.shape == (T, S) and T != S \
                and (out == np.tril(np.ones((T, S), dtype=bool))).all():
            hint = ("This is the top-left aligned mask: when T != S the last query is the last "
                    "token, so query i may see key j iff j <= i + S - T.")
        assert_equal_mask(out, ref.causal_mask(T, S), what, hint=hint)
    what = "causal_mask(T=4) with S left out"
    assert_equal_mask(call(causal_mask, 4, what=what), ref.causal_mask(4), what)


def _masked_softmax_expected(scores, mask):
    """Softmax over allowed entries; rows with no allowed entry are all zeros."""
    mask = np.broadcast_to(mask, scores.shape)
    allowed = mask.any(axis=-1, keepdims=True)
    safe = np.where(mask, scores, -np.inf)
    safe = np.where(allowed, safe, 0.0)
    out = ref.softmax(safe, axis=-1)
    return np.where(mask & allowed, out, 0.0)


def _softmax_cases():
    g = rng(301)
    yield "random scores, causal mask", g.standard_normal((2, 3, 4, 4)), ref.causal_mask(4)
    yield "T < S", g.standard_normal((3, 5)), ref.causal_mask(3, 5)
    yield ("padded batch, one sequence empty", g.standard_normal((2, 3, 4, 5)),
           ref.padding_mask(np.array([3, 0]), 5))
    mask = g.random((5, 8)) < 0.5
    mask[1] = False
    yield "random mask with a fully masked row", g.standard_normal((5, 8)), mask
    yield "very large scores", 1e4 * g.standard_normal((4, 6)), ref.causal_mask(4, 6)


@hidden_test
def check_masked_softmax(masked_softmax):
    """Matches softmax over allowed keys; fully masked rows are zeros; stable for big scores."""
    for label, scores, mask in _softmax_cases():
        what = f"masked_softmax ({label})"
        out = to_numpy(call(masked_softmax, scores, mask, what=what), what)
        assert_close(out, _masked_softmax_expected(scores, mask), what, **F64,
                     hint="Subtract the row maximum before exp, and return zeros (not NaN) "
                          "for a row whose keys are all masked.")


def _attention_cases():
    g = rng(302)
    for shape_q, shape_kv in [((4, 6, 8), (4, 6, 8)), ((2, 3, 4, 16), (2, 3, 9, 16)),
                              ((2, 1, 5), (2, 7, 5)), ((1, 2, 1, 4), (1, 2, 1, 4))]:
        yield g.standard_normal(shape_q), g.standard_normal(shape_kv), g.standard_normal(shape_kv)


@hidden_test
def check_causal_attention(causal_attention):
    """Causal attention with the 1/sqrt(D) scale for T == S, T < S, T == 1 and T == S == 1."""
    for q, k, v in _attention_cases():
        T, S = q.shape[-2], k.shape[-2]
        what = f"causal_attention (T={T}, S={S})"
        out = to_numpy(call(causal_attention, q, k, v, what=what), what)
        expected = ref.scaled_dot_product_attention(q, k, v, ref.causal_mask(T, S))
        assert_close(out, expected, what, **F64, mistakes=suspects(MISTAKES["causal_attention"], q, k, v),
                     hint="Scores are q @ k^T / sqrt(D); query i sees key j iff j <= i + S - T.")


@hidden_test
def check_cached_causal_attention(cached_causal_attention):
    """Chunked decoding with a growing cache equals one causal forward over the sequence."""
    g = rng(303)
    for length, chunk in [(7, 1), (9, 4), (6, 6), (10, 3)]:
        q, k, v = g.standard_normal((3, 2, length, 8))
        what = f"cached_causal_attention (length {length}, chunk {chunk})"
        out = to_numpy(call(cached_causal_attention, q, k, v, chunk, what=what), what)
        expected = ref.scaled_dot_product_attention(q, k, v, ref.causal_mask(length))
        assert_close(out, expected, what, **F64,
                     hint="Each chunk of queries attends to all keys seen so far, including "
                          "its own, with a bottom-right causal mask of shape (chunk, keys so far).")


@hidden_test
def check_answer_allowed_entries(answer):
    assert_number(answer, int(ref.causal_mask(3, 5).sum()), "ANSWER_ALLOWED_ENTRIES", integer=True,
                  hint="Count the True entries of the causal mask with T = 3 queries and S = 5 keys, aligned bottom-right: query i sees key j iff j <= i + S - T.")


@hidden_test
def check_answer_decode_allowed(answer):
    assert_number(answer, int(ref.causal_mask(1, 10).sum()), "ANSWER_DECODE_ALLOWED", integer=True,
                  hint="One new query (T = 1) with S = 10 keys, aligned bottom-right: it sees every key up to its own.")

