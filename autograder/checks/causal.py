"""Hidden tests of assignment 03-causal-mask (NumPy, float64 inputs).

Tolerances: masks exact; softmax and attention rtol 1e-7, atol 1e-9.
"""

import numpy as np
from transformer_ref import numpy as ref

from ._common import (Mistake, assert_close, assert_equal_mask, assert_number, call, cascade, hidden_test,
                      hinted, rng, suspects, to_numpy, wrong_answers)

F64 = dict(rtol=1e-7, atol=1e-9)
MASK_SIZES = [(1, 1), (4, 4), (3, 7), (1, 9), (2, 6), (5, 5)]


def _softmax_unguarded(scores, mask, *, stable=True):
    """Masked softmax as the known mistakes compute it: a fully masked row divides 0 by 0 (NaN);
    ``stable=False`` also leaves out the row maximum (exp overflows for large scores)."""
    mask = np.broadcast_to(mask, scores.shape)
    masked = np.where(mask, scores, -np.inf)
    shift = masked.max(axis=-1, keepdims=True) if stable else 0.0
    e = np.where(mask, np.exp(masked - shift), 0.0)
    return e / e.sum(axis=-1, keepdims=True)


def _attention(q, k, v, mask=None, softmax=None, scale=None):
    """Causal attention as ``causal_attention`` computes it, from ``mask(T, S)`` (the bottom-right
    causal mask by default) and ``softmax(scores, mask)``, each possibly a known mistake's."""
    T, S = q.shape[-2], k.shape[-2]
    allowed = (mask or ref.causal_mask)(T, S)
    if softmax is None:
        return ref.scaled_dot_product_attention(q, k, v, allowed, scale=scale)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    return softmax(q @ np.swapaxes(k, -1, -2) * scale, allowed) @ v


def _chunked(q, k, v, chunk, attention=_attention, *, all_keys=False):
    """``cached_causal_attention``: each chunk of queries over the keys so far (``all_keys``: over
    every key, the known mistake) through ``attention(q, k, v)``, possibly a known mistake's."""
    length, outs = q.shape[-2], []
    for start in range(0, length, chunk):
        end = length if all_keys else min(start + chunk, length)
        outs.append(attention(q[..., start:min(start + chunk, length), :], k[..., :end, :], v[..., :end, :]))
    return np.concatenate(outs, axis=-2)


# The typical wrong versions of each function (chapter 3's warnings): what each returns on the
# check's inputs, so that a verdict can name the mistake. The test suite plants every one.
MISTAKES = {
    "causal_mask": (
        Mistake("mask-top-left", "it is the top-left aligned mask (query i sees keys 0 .. i), which is wrong when T != S.",
                "When T != S the last query is the last token: query i may see key j iff j <= i + S - T "
                "(aligned bottom-right).",
                lambda T, S: np.tril(np.ones((T, S), dtype=bool))),
        Mistake("mask-off-by-one", "each query is hidden from its own key (j < i + S - T): the diagonal is missing.",
                "A token may attend to itself: query i sees key j iff j <= i + S - T.",
                lambda T, S: np.arange(S)[None, :] < np.arange(T)[:, None] + (S - T)),
    ),
    "masked_softmax": (
        Mistake("softmax-nan-rows", "a row whose keys are all masked divides 0 by 0 and gives NaN.",
                "Return zeros for a row with no allowed key: replace its -inf maximum by 0 and divide by 1 where the "
                "sum is 0.", _softmax_unguarded),
        Mistake("softmax-finite-fill", "masked scores are filled with a large finite number (say -1e9), so a row whose "
                "keys are all masked gets uniform weights over the keys it must not see.",
                "Mask with -inf and return zeros for a row with no allowed key (chapter 3: why not a large finite "
                "number).", lambda scores, mask: ref.softmax(np.where(mask, scores, -1e9), axis=-1)),
        Mistake("softmax-unstable", "exp of large scores overflows (inf / inf = NaN): the row maximum is not subtracted.",
                "Subtract each row's maximum (over the allowed entries) before exp: softmax is unchanged, exp "
                "cannot overflow.", lambda scores, mask: _softmax_unguarded(scores, mask, stable=False)),
    ),
    "causal_attention": (
        Mistake("attention-no-scale", "the scores are not divided by sqrt(D).",
                "Scale the scores by 1 / sqrt(D) (D = head_dim) before the softmax.",
                lambda q, k, v: _attention(q, k, v, scale=1.0)),
    ),
    "cached_causal_attention": (
        Mistake("cache-sees-everything", "each chunk attends to every key of the sequence, the future included.",
                "A chunk ending at position end may only see the keys [:end] (the cache so far and itself).",
                lambda q, k, v, chunk: _chunked(q, k, v, chunk, all_keys=True)),
    ),
}
# causal_attention calls causal_mask and masked_softmax; cached_causal_attention calls causal_attention
MISTAKES["causal_attention"] += (
    cascade(MISTAKES["causal_mask"], "causal_mask", lambda produce: lambda q, k, v: _attention(q, k, v, mask=produce))
    + cascade(MISTAKES["masked_softmax"], "masked_softmax",
              lambda produce: lambda q, k, v: _attention(q, k, v, softmax=produce)))
MISTAKES["cached_causal_attention"] += cascade(
    MISTAKES["causal_attention"], "causal_attention",
    lambda produce: lambda q, k, v, chunk: _chunked(q, k, v, chunk, produce))


def _allowed(T, S, mask=ref.causal_mask):
    return int(mask(T, S).sum())


# Known wrong answers of the conceptual questions: the count a wrong mask gives
WRONG_ANSWERS = {
    "ANSWER_ALLOWED_ENTRIES": (
        Mistake("allowed-top-left", "the count is the top-left aligned mask's (query i sees keys 0 .. i).",
                "Align the mask bottom-right: query i sees key j iff j <= i + S - T, so every query sees S - T "
                "more keys.", lambda: _allowed(3, 5, MISTAKES["causal_mask"][0].produce)),
        Mistake("allowed-masked", "the answer counts the masked (False) entries, not the allowed ones.",
                "Count the True entries: the keys each query may see.", lambda: 3 * 5 - _allowed(3, 5)),
    ),
    "ANSWER_DECODE_ALLOWED": (
        Mistake("decode-top-left", "the count is the top-left aligned mask's: the new query would see key 0 only.",
                "The one new query is the last token: it sees every key, its own included (bottom-right).",
                lambda: _allowed(1, 10, MISTAKES["causal_mask"][0].produce)),
        Mistake("decode-not-itself", "the count leaves out the new token's own key.",
                "A token attends to itself: the new query sees every cached key and its own.",
                lambda: _allowed(1, 10) - 1),
    ),
}


@hidden_test
def check_causal_mask(causal_mask):
    """Bottom-right aligned boolean masks for T == S and T < S, and S defaulting to T."""
    for T, S in MASK_SIZES:
        what = f"causal_mask(T={T}, S={S})"
        with hinted(MASK_HINT):
            out = call(causal_mask, T, S, what=what)
            assert_equal_mask(out, ref.causal_mask(T, S), what, hint=MASK_HINT,
                              mistakes=suspects(MISTAKES["causal_mask"], T, S))
    what = "causal_mask(T=4) with S left out"
    with hinted("S defaults to T: causal_mask(T) is causal_mask(T, T)."):
        assert_equal_mask(call(causal_mask, 4, what=what), ref.causal_mask(4), what,
                          mistakes=suspects(MISTAKES["causal_mask"], 4, 4))


MASK_HINT = "Query i may see key j iff j <= i + S - T (aligned bottom-right), as a boolean (T, S) array."


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
        hint = ("Subtract the row maximum before exp, and return zeros (not NaN) "
                "for a row whose keys are all masked.")
        known = suspects(MISTAKES["masked_softmax"], scores, mask)
        with hinted(hint):
            out = to_numpy(call(masked_softmax, scores, mask, what=what), what, mistakes=known)
            assert_close(out, _masked_softmax_expected(scores, mask), what, **F64, hint=hint, mistakes=known)


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
        hint = "Scores are q @ k^T / sqrt(D); query i sees key j iff j <= i + S - T."
        known = suspects(MISTAKES["causal_attention"], q, k, v)
        with hinted(hint):
            out = to_numpy(call(causal_attention, q, k, v, what=what), what, mistakes=known)
            expected = ref.scaled_dot_product_attention(q, k, v, ref.causal_mask(T, S))
            assert_close(out, expected, what, **F64, mistakes=known, hint=hint)


@hidden_test
def check_cached_causal_attention(cached_causal_attention):
    """Chunked decoding with a growing cache equals one causal forward over the sequence."""
    g = rng(303)
    for length, chunk in [(7, 1), (9, 4), (6, 6), (10, 3)]:
        q, k, v = g.standard_normal((3, 2, length, 8))
        what = f"cached_causal_attention (length {length}, chunk {chunk})"
        hint = ("Each chunk of queries attends to all keys seen so far, including "
                "its own, with a bottom-right causal mask of shape (chunk, keys so far).")
        known = suspects(MISTAKES["cached_causal_attention"], q, k, v, chunk)
        with hinted(hint):
            out = to_numpy(call(cached_causal_attention, q, k, v, chunk, what=what), what, mistakes=known)
            expected = ref.scaled_dot_product_attention(q, k, v, ref.causal_mask(length))
            assert_close(out, expected, what, **F64, hint=hint, mistakes=known)


@hidden_test
def check_answer_allowed_entries(answer):
    assert_number(answer, int(ref.causal_mask(3, 5).sum()), "ANSWER_ALLOWED_ENTRIES", integer=True,
                  wrong=wrong_answers(WRONG_ANSWERS["ANSWER_ALLOWED_ENTRIES"]),
                  hint="Count the True entries of the causal mask with T = 3 queries and S = 5 keys, aligned bottom-right: query i sees key j iff j <= i + S - T.")


@hidden_test
def check_answer_decode_allowed(answer):
    assert_number(answer, int(ref.causal_mask(1, 10).sum()), "ANSWER_DECODE_ALLOWED", integer=True,
                  wrong=wrong_answers(WRONG_ANSWERS["ANSWER_DECODE_ALLOWED"]),
                  hint="One new query (T = 1) with S = 10 keys, aligned bottom-right: it sees every key up to its own.")

