"""Hidden tests of assignment 01-rope (NumPy, float64 inputs).

Tolerances: frequencies rtol 1e-9 (pure float64 powers); rotated vectors
rtol 1e-7, atol 1e-9 (a few float64 sin/cos per entry); conceptual numbers rtol 1e-3.
"""

import numpy as np
from transformer_ref import numpy as ref

from ._common import (Mistake, answer_cascade, assert_close, assert_number, call, call_keeping_args, cascade, diagnosis,
                      expect_value_error, fail, hidden_test, hinted, identify, rng, suspects, to_numpy,
                      wrong_answers)

FREQ_TOL = dict(rtol=1e-9, atol=0.0)
ROPE_TOL = dict(rtol=1e-7, atol=1e-9)


def _rope_half_split(x, positions, inv_freq):
    """Pairs read as (x[..., i], x[..., i + D/2]) (the half-split layout), written interleaved."""
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    out = np.empty(x.shape)
    out[..., 0::2] = a * np.cos(angles) - b * np.sin(angles)
    out[..., 1::2] = a * np.sin(angles) + b * np.cos(angles)
    return out


def _rope_sign_flipped(x, positions, inv_freq):
    """The first of each pair as a cos + b sin (the second right): a sign slip in the rotation."""
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = ref.apply_rope(x, positions, inv_freq, interleaved=True)
    out[..., 0::2] = a * np.cos(angles) + b * np.sin(angles)
    return out


def _pairs(head_dim):
    return np.arange(head_dim // 2)


def _llama3(theta, scale, original_max_len, low_freq_factor, high_freq_factor, *, reversed_blend=False):
    """Llama 3's banded frequencies from the plain ones ``theta``; ``reversed_blend``: the
    blend's weights swapped (the known mistake)."""
    wavelength = 2 * np.pi / theta
    g = (original_max_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    g = 1 - g if reversed_blend else g
    blended = (1 - g) * theta / scale + g * theta
    out = np.where(wavelength > original_max_len / low_freq_factor, theta / scale, blended)
    return np.where(wavelength < original_max_len / high_freq_factor, theta, out)


# The typical wrong versions of each function (chapter 1's warnings): what each returns on the
# check's inputs, so that a verdict can name the mistake. The test suite plants every one.
MISTAKES = {
    "rope_inv_freq": (
        Mistake("rope-freq-off-by-one", "the pairs are counted from i = 1, so every frequency is one pair too slow.",
                "Count the pairs i = 0 .. head_dim/2 - 1: pair 0 has frequency 1.",
                lambda d, base: base ** (-2.0 * (_pairs(d) + 1) / d)),
        Mistake("rope-freq-missing-two", "the exponent is -i/head_dim, so the frequencies fall half as fast.",
                "The exponent is -2i/head_dim: i counts pairs, 2i the features they start at.",
                lambda d, base: base ** (-1.0 * _pairs(d) / d)),
        Mistake("rope-no-value-error", "it accepts an odd head_dim, which cannot be cut into pairs.",
                "Raise ValueError when head_dim is odd (RoPE rotates pairs of features)."),
    ),
    "apply_rope": (
        Mistake("rope-pair-layout", "it pairs feature i with feature i + head_dim/2 (the half-split layout).",
                "Check the pair layout: this course's RoPE is interleaved, pair i is (x[..., 2i], x[..., 2i+1]).",
                _rope_half_split),
        Mistake("rope-wrong-sign", "the first feature of each pair is a cos + b sin: a sign is flipped.",
                "A rotation by angle t maps (a, b) to (a cos t - b sin t, a sin t + b cos t).",
                _rope_sign_flipped),
    ),
    "ntk_inv_freq": (
        Mistake("ntk-linear-scale", "the base is multiplied by scale itself.",
                "NTK-aware scaling raises scale to d / (d - 2): base * scale ** (d / (d - 2)).",
                lambda d, base, scale: ref.rope_inv_freq(d, base * scale)),
        Mistake("ntk-as-interpolation", "every frequency is divided by scale (that is position interpolation).",
                "NTK-aware scaling changes the base, which keeps the fast pairs and slows the slow ones.",
                lambda d, base, scale: ref.rope_inv_freq(d, base) / scale),
    ),
}
# ntk_inv_freq calls rope_inv_freq (the notebook's Part 1) with the NTK base
MISTAKES["ntk_inv_freq"] += cascade(
    MISTAKES["rope_inv_freq"], "rope_inv_freq",
    lambda produce: lambda d, base, scale: produce(d, base * scale ** (d / (d - 2))))
MISTAKES["llama3_inv_freq"] = (
    Mistake("llama3-blend-reversed", "the band between the edges blends the other way round: "
            "g * theta / scale + (1 - g) * theta.",
            "g grows with original_max_len / wavelength, so g = 1 keeps theta: (1 - g) * theta / scale + g * theta.",
            lambda d, base, *band: _llama3(ref.rope_inv_freq(d, base), *band, reversed_blend=True)),
    Mistake("llama3-no-value-error", "it accepts high_freq_factor <= low_freq_factor (the blend divides by "
            "their difference).", "Raise ValueError unless high_freq_factor > low_freq_factor."),
    # llama3_inv_freq starts from rope_inv_freq (Part 1)
    *cascade(MISTAKES["rope_inv_freq"], "rope_inv_freq",
             lambda produce: lambda d, base, *band: _llama3(produce(d, base), *band)),
)


def _slowest_wavelength(inv_freq):
    return 2 * np.pi / inv_freq(128, 10000.0)[-1]


def _full_turn_pairs(inv_freq):
    return int(np.sum(4096 * inv_freq(128, 10000.0) >= 2 * np.pi))


# Known wrong answers of the conceptual questions, from the same model as the answer: an answer
# computed with Part 1's mistake (the answer cell calls rope_inv_freq), or a slip of the units.
WRONG_ANSWERS = {
    "ANSWER_SLOWEST_WAVELENGTH": (
        Mistake("wavelength-no-2pi", "the answer is 1 / inv_freq, which leaves out the 2 pi.",
                "A full turn is 2 pi radians: divide 2 pi by the frequency.",
                lambda: _slowest_wavelength(ref.rope_inv_freq) / (2 * np.pi)),
        Mistake("wavelength-in-degrees", "the answer counts a turn as 360 (degrees).",
                "inv_freq is in radians per position: a full turn is 2 pi radians.",
                lambda: _slowest_wavelength(ref.rope_inv_freq) * 360 / (2 * np.pi)),
        Mistake("wavelength-first-pair", "the answer is the wavelength of pair 0, the fastest pair.",
                "The slowest pair is the last one, i = head_dim/2 - 1: it has the smallest inv_freq.",
                lambda: 2 * np.pi / ref.rope_inv_freq(128, 10000.0)[0]),
        *answer_cascade(MISTAKES["rope_inv_freq"][:2], "rope_inv_freq", lambda produce: lambda: _slowest_wavelength(produce)),
    ),
    "ANSWER_FULL_TURN_PAIRS": (
        Mistake("full-turn-slow-pairs", "the answer counts the pairs that do not turn fully (the slow ones).",
                "Count the pairs with 4096 * inv_freq[i] >= 2 pi: the fast pairs, from i = 0 on.",
                lambda: 64 - _full_turn_pairs(ref.rope_inv_freq)),
        Mistake("full-turn-no-2pi", "the answer compares 4096 * inv_freq with 1, not with a full turn of 2 pi.",
                "A full turn is 2 pi radians: count the pairs with 4096 * inv_freq[i] >= 2 pi.",
                lambda: int(np.sum(4096 * ref.rope_inv_freq(128, 10000.0) >= 1))),
        *answer_cascade(MISTAKES["rope_inv_freq"][:2], "rope_inv_freq", lambda produce: lambda: _full_turn_pairs(produce)),
    ),
}


@hidden_test
def check_rope_inv_freq(rope_inv_freq):
    """``rope_inv_freq(head_dim, base)`` equals base**(-2i/head_dim) for several sizes."""
    for head_dim, base in [(2, 10000.0), (8, 10000.0), (64, 10000.0), (128, 500000.0), (6, 7.5)]:
        what = f"rope_inv_freq(head_dim={head_dim}, base={base})"
        hint = "Pair i uses base ** (-2 * i / head_dim) for i = 0 .. head_dim/2 - 1."
        with hinted(hint):
            out = to_numpy(call(rope_inv_freq, head_dim, base, what=what), what)
            assert_close(out, ref.rope_inv_freq(head_dim, base), what, **FREQ_TOL, hint=hint,
                         mistakes=suspects(MISTAKES["rope_inv_freq"], head_dim, base))
    expect_value_error(rope_inv_freq, 7, 10000.0, what="rope_inv_freq(7)", argument="head_dim",
                       mistake=_mistake("rope_inv_freq", "rope-no-value-error"))


def _mistake(function, key):
    """``function``'s known mistake ``key`` (of :data:`MISTAKES`)."""
    return next(m for m in MISTAKES[function] if m.key == key)


def _rope_cases():
    g = rng(101)
    yield "one head", g.standard_normal((5, 8)), np.arange(5)
    yield "batch and heads", g.standard_normal((2, 3, 7, 16)), np.arange(7)
    yield "positions not starting at 0", g.standard_normal((4, 6, 32)), np.arange(100, 106)
    yield "unordered positions", g.standard_normal((1, 9, 10)), g.permutation(50)[:9]


@hidden_test
def check_apply_rope(apply_rope):
    """Interleaved RoPE on random inputs with batch/head dims and arbitrary positions."""
    for label, x, positions in _rope_cases():
        head_dim = x.shape[-1]
        inv_freq = ref.rope_inv_freq(head_dim, 10000.0)
        what = f"apply_rope ({label}, x of shape {x.shape})"
        hint = ("Check the pair layout: pair i is (x[..., 2i], x[..., 2i+1]), "
                "rotated by position * inv_freq[i].")
        with hinted(hint):
            out = to_numpy(call(apply_rope, x, positions=positions, inv_freq=inv_freq, what=what), what)
            expected = ref.apply_rope(x, positions, inv_freq, interleaved=True)
            assert_close(out, expected, what, **ROPE_TOL, hint=hint,
                         mistakes=suspects(MISTAKES["apply_rope"], x, positions, inv_freq))
    _check_input_unchanged(apply_rope)


def _check_input_unchanged(apply_rope):
    """The task says "do not modify x": the caller's array must be the same afterwards."""
    x = rng(103).standard_normal((2, 5, 8))
    inv_freq = ref.rope_inv_freq(8, 10000.0)
    what = "apply_rope (x must not be modified)"
    _, after = call_keeping_args(apply_rope, x, positions=np.arange(3, 8), inv_freq=inv_freq,
                                 what=what)
    if not np.array_equal(np.asarray(after[0]), x):
        fail("apply_rope changed its input x; return a new array and leave x as it was.")


@hidden_test
def check_apply_rope_relative(apply_rope):
    """The property RoPE is built for: q.k after rotation depends only on n - m."""
    g = rng(102)
    head_dim = 16
    inv_freq = ref.rope_inv_freq(head_dim, 10000.0)
    q, k = g.standard_normal((2, head_dim))
    q[4:6] = 0.0  # one pair of zeros: its rotation is zero, not NaN
    what = "apply_rope (relative-position property)"

    def rotate(x, position):
        out = call(apply_rope, x[None], positions=np.array([position]), inv_freq=inv_freq, what=what)
        return to_numpy(out, what)[0]

    hint = "Check the pair layout: pair i is (x[..., 2i], x[..., 2i+1]), rotated by position * inv_freq[i]."

    def verdict(message, rotated, x, position):
        """``message``, naming the known mistake whose rotation of ``x`` is ``rotated``."""
        known = identify(rotated[None], suspects(MISTAKES["apply_rope"], x[None], np.array([position]), inv_freq),
                         **ROPE_TOL)
        fail(f"{message} {diagnosis(known) if known else hint}")

    with hinted(hint):
        rotated = {(x_name, m): rotate(x, m) for x_name, x in (("q", q), ("k", k))
                   for m in (0, 5, 10, 15, 237, 242, 1000, 1005, 77)}
    scores = [float(rotated["q", m] @ rotated["k", n]) for m, n in [(0, 5), (10, 15), (237, 242), (1000, 1005)]]
    spread = max(scores) - min(scores)
    # written so that a NaN score fails too (every comparison with NaN is False)
    if not spread <= 1e-8 * max(1.0, max(abs(s) for s in scores)):
        verdict("apply_rope: the score <RoPE(q, m), RoPE(k, n)> changes when m and n are shifted "
                "by the same amount; a rotation by position * inv_freq must depend only on n - m.",
                rotated["q", 237], q, 237)
    rq = rotated["q", 77]
    norms_in = np.linalg.norm(q)
    if not abs(np.linalg.norm(rq) - norms_in) <= 1e-9 * norms_in:
        verdict("apply_rope: a rotation must keep the vector's length.", rq, q, 77)
    if not np.all(rq[4:6] == 0.0):
        verdict("apply_rope: a pair of zeros must stay zeros after the rotation.", rq, q, 77)


@hidden_test
def check_ntk_inv_freq(ntk_inv_freq):
    """NTK-aware frequencies: first pair untouched, last pair divided by the scale."""
    for head_dim, base, scale in [(8, 10000.0, 2.0), (64, 10000.0, 4.0), (128, 10000.0, 8.0),
                                  (128, 500000.0, 1.0), (4, 100.0, 16.0)]:
        what = f"ntk_inv_freq(head_dim={head_dim}, base={base}, scale={scale})"
        hint = "NTK-aware scaling changes the base to base * scale ** (d / (d - 2))."
        with hinted(hint):
            out = to_numpy(call(ntk_inv_freq, head_dim, base, scale, what=what), what)
            assert_close(out, ref.ntk_inv_freq(head_dim, base, scale), what, **FREQ_TOL, hint=hint,
                         mistakes=suspects(MISTAKES["ntk_inv_freq"], head_dim, base, scale))


@hidden_test
def check_answer_slowest_wavelength(answer):
    """Positions per full turn of the slowest pair, head_dim 128, base 10000."""
    slowest = ref.rope_inv_freq(128, 10000.0)[-1]
    expected = 2 * np.pi / slowest
    assert_number(answer, expected, "ANSWER_SLOWEST_WAVELENGTH", rtol=1e-3,
                  wrong=wrong_answers(WRONG_ANSWERS["ANSWER_SLOWEST_WAVELENGTH"]),
                  hint="The slowest pair is the last one, i = 63 of 64 (head_dim 128, base 10000): its wavelength is 2 * pi / inv_freq[63] positions.")


@hidden_test
def check_answer_full_turn_pairs(answer):
    """How many of the 64 pairs (head_dim 128) turn fully within 4096 positions."""
    expected = int(np.sum(4096 * ref.rope_inv_freq(128, 10000.0) >= 2 * np.pi))
    assert_number(answer, expected, "ANSWER_FULL_TURN_PAIRS", integer=True,
                  wrong=wrong_answers(WRONG_ANSWERS["ANSWER_FULL_TURN_PAIRS"]),
                  hint="Count the pairs i of 64 (head_dim 128, base 10000) with 4096 * inv_freq[i] >= 2 * pi: the fast pairs, from i = 0 on.")


@hidden_test
def check_llama3_inv_freq(llama3_inv_freq):
    """Llama 3's banded frequencies against the reference, Llama 3.1's own configuration included."""
    cases = [(128, 500000.0, 8.0, 8192, 1.0, 4.0),   # Llama 3.1
             (128, 10000.0, 10.0, 2048, 1.0, 4.0),   # Hugging Face's test configuration
             (64, 10000.0, 4.0, 4096, 2.0, 8.0),     # other band edges
             (128, 10000.0, 10.0, 2048, 1.0, 1000.0),  # no pair in the kept band
             (32, 10000.0, 1.0, 4096, 1.0, 4.0),     # scale 1: plain RoPE
             (4, 100.0, 16.0, 64, 1.0, 4.0)]         # a tiny head
    for head_dim, base, scale, original, low, high in cases:
        what = (f"llama3_inv_freq(head_dim={head_dim}, base={base}, scale={scale}, original_max_len={original}, "
                f"low_freq_factor={low}, high_freq_factor={high})")
        with hinted(LLAMA3_HINT):
            out = to_numpy(call(llama3_inv_freq, head_dim, base, scale, original, low_freq_factor=low,
                                high_freq_factor=high, what=what), what)
            assert_close(out, ref.llama3_inv_freq(head_dim, base, scale, original, low, high), what, **FREQ_TOL,
                         hint=LLAMA3_HINT, mistakes=suspects(MISTAKES["llama3_inv_freq"], head_dim, base, scale,
                                                             original, low, high))
    expect_value_error(llama3_inv_freq, 128, 10000.0, 8.0, 8192, low_freq_factor=4.0, high_freq_factor=4.0,
                       what="llama3_inv_freq with high_freq_factor == low_freq_factor", argument="high_freq_factor",
                       mistake=_mistake("llama3_inv_freq", "llama3-no-value-error"))


LLAMA3_HINT = ("Pairs with wavelength 2*pi/theta_i below original_max_len / high_freq_factor keep "
               "theta_i, those above original_max_len / low_freq_factor get theta_i / scale, and in "
               "between (1 - g) * theta_i / scale + g * theta_i, where g rises linearly in "
               "original_max_len / wavelength, from 0 where that ratio is low_freq_factor to 1 where it "
               "is high_freq_factor.")
