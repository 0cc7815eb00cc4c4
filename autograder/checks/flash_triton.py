"""Hidden tests of assignment 07-flash-triton (Triton kernels, torch tensors in and out).

The student's kernels run in their sandboxed kernel under Triton's interpreter
(CPU tensors); these checks run in the grading worker, choose the inputs (seeded
``torch.Generator``), and compare what comes back with NumPy in float64:
``transformer_ref.numpy.scaled_dot_product_attention`` for ``out`` and a float64
log-sum-exp of the masked, scaled scores for ``lse``. The references are
computed from the very inputs sent (float16 inputs widened exactly to float64).

Tolerances, with the absolute part relative to the largest finite expected value
of the tensor (``scaled``, at least 1):

* float32 inputs (``out`` and ``lse``, and ``row_logsumexp``): rtol 1e-4, atol
  1e-5 x scaled; measured errors of the course's solution are below 1e-6;
* float16 inputs: ``out`` rtol 1e-2, atol 2e-3 x scaled (its result is rounded
  to 11 significant bits, and P is rounded to float16 before the product with
  V); ``lse`` the same (float32 statistics of float16 scores).

Expected ``-inf`` (the lse of a row that sees no key) must be ``-inf``; any NaN
fails with a message that says so. Rows that see no key must give exactly 0.
Sizes are small because the interpreter runs every program instance in Python:
each check takes about a second.
"""

import math

import numpy as np
from transformer_ref import numpy as ref

from ._common import assert_close, call, fail, hidden_test, to_numpy

F32 = dict(rtol=1e-4, atol=1e-5)
F16 = dict(rtol=1e-2, atol=2e-3)


def _torch():
    import torch

    return torch


def _generator(seed):
    g = _torch().Generator()
    g.manual_seed(seed)
    return g


def _randn(g, shape, dtype=None, scale=1.0):
    torch = _torch()
    x = torch.randn(shape, generator=g, dtype=torch.float32) * scale
    return x.to(dtype or torch.float32)


def _f64(x):
    """A torch tensor as a float64 NumPy array (exact for float16 and float32)."""
    return x.detach().double().numpy()


def _logsumexp(x):
    """Float64 log-sum-exp over the last axis; a row of only -inf gives -inf."""
    m = x.max(axis=-1)
    finite_m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return finite_m + np.log(np.exp(x - finite_m[..., None]).sum(axis=-1))


def _visible(T, S, causal):
    """Bool (T, S): key j visible to query i (bottom-right causal: j <= i + S - T)."""
    if not causal:
        return np.ones((T, S), dtype=bool)
    return np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)


def _run(fn, *args, what, **kwargs):
    """``call``, with a kernel's NotImplementedError (wrapped by the interpreter) said plainly."""
    try:
        return call(fn, *args, what=what, **kwargs)
    except AssertionError as err:
        if "NotImplementedError" in str(err):
            fail(f"{what} is not implemented yet (it raised NotImplementedError).")
        raise


def _tensor(out, what, shape, dtype=None, nan_hint=""):
    """The student's output as float64 NumPy after checking it is a tensor of ``shape`` (and ``dtype``)."""
    torch = _torch()
    if not isinstance(out, torch.Tensor):
        fail(f"{what} must return a torch.Tensor, got {type(out).__name__}.")
    if tuple(out.shape) != tuple(shape):
        fail(f"{what}: expected shape {tuple(shape)}, got {tuple(out.shape)}.")
    if dtype is not None and out.dtype != dtype:
        fail(f"{what}: expected dtype {str(dtype).replace('torch.', '')} (the input dtype), "
             f"got {str(out.dtype).replace('torch.', '')}.")
    try:
        return to_numpy(out, what, kind="torch")
    except AssertionError as err:
        if nan_hint and "NaN" in str(err):
            fail(f"{err} {nan_hint}")
        raise


def _close(actual, expected, what, tol, hint):
    finite = np.abs(expected[np.isfinite(expected)])
    scaled = max(1.0, float(finite.max(initial=0.0)))
    assert_close(actual, expected, what, rtol=tol["rtol"], atol=tol["atol"] * scaled, hint=hint)


# -- Part 1: row_logsumexp ----------------------------------------------------------------
LSE_HINT = ("Keep a running max m and sum l per row; when m grows, rescale l by exp(m_old - m_new); "
            "load out-of-range entries as -inf, store m + log(l) only for rows < R, and subtract 0 "
            "instead of m while m is still -inf (no NaN).")


def _row_cases():
    torch = _torch()
    g = _generator(701)
    yield "whole tiles", _randn(g, (32, 64)), 16, 32
    yield "ragged rows and columns, batch axes", _randn(g, (2, 3, 53)), 16, 32
    yield "ragged, more rows than one tile", _randn(g, (37, 45)), 16, 16
    yield "large values (exp overflows without the max)", _randn(g, (20, 40), scale=100.0), 16, 16
    x = _randn(g, (5, 50))
    x[0, :32] = float("-inf")      # the first column tile of row 0 is fully masked
    x[1, :] = float("-inf")        # row 1 is fully masked
    x[2, torch.randperm(50, generator=g)[:25]] = float("-inf")
    yield "masked (-inf) entries, tiles and rows", x, 16, 32
    yield "one column", _randn(g, (7, 1)), 16, 16


@hidden_test
def check_row_logsumexp(row_logsumexp):
    """Row log-sum-exp in one pass over column tiles: ragged sizes, batch axes, -inf, large values."""
    for label, x, block_m, block_n in _row_cases():
        what = f"row_logsumexp ({label}, x of shape {tuple(x.shape)}, block_m={block_m}, block_n={block_n})"
        out = _run(row_logsumexp, x, block_m=block_m, block_n=block_n, what=what)
        actual = _tensor(out, what, x.shape[:-1], nan_hint=LSE_HINT)
        _close(actual, _logsumexp(_f64(x)), what, F32, LSE_HINT)


# -- Part 2: flash_forward ----------------------------------------------------------------
TILE_HINT = ("Keep a running max m, normaliser l and accumulator acc per query row; when m grows, "
             "rescale l and acc by exp(m_old - m_new); divide acc by l once, after the last key tile.")
RAGGED_HINT = ("T and S need not be multiples of the tiles: load rows and keys past the end with "
               "mask=... and other=0.0, set the scores of keys j >= S to -inf (a zero score still "
               "counts in the softmax), and store only rows i < T.")
CAUSAL_HINT = ("Causal masks are aligned bottom-right: query i sees key j iff j <= i + S - T. "
               "With T > S the first T - S rows see no key: their output is exactly 0, never NaN.")
LSE_OUT_HINT = ("lse_i = m_i + log(l_i), the natural log of sum_j exp(q_i . k_j / sqrt(D)) over the "
                "visible keys, in float32; -inf for a row that sees no key.")
NAN_HINT = ("A row whose keys in a tile are all masked must not create NaN (exp(-inf - (-inf)) is NaN): "
            "subtract 0 instead of m_new while it is -inf, and divide by 1 where l = 0.")
FP16_HINT = ("Return out in the input dtype: load float16 tiles, multiply them with tl.dot (float32 "
             "result), keep m, l and acc in float32, and cast only when storing.")


def _attention_inputs(g, lead, T, S, D, dtype=None):
    q = _randn(g, (*lead, T, D), dtype)
    k = _randn(g, (*lead, S, D), dtype)
    v = _randn(g, (*lead, S, D), dtype)
    return q, k, v


def _expected(q, k, v, causal):
    """Float64 (out, lse) of the inputs as sent."""
    q64, k64, v64 = _f64(q), _f64(k), _f64(v)
    T, S, D = q64.shape[-2], k64.shape[-2], q64.shape[-1]
    visible = _visible(T, S, causal)
    out = ref.scaled_dot_product_attention(q64, k64, v64, visible)
    scores = np.where(visible, (q64 @ np.swapaxes(k64, -1, -2)) / math.sqrt(D), -np.inf)
    return out, _logsumexp(scores)


def _flash(flash_forward, q, k, v, causal, block_q, block_k, label):
    """The student's (out, lse) as float64 arrays, with the call's description."""
    T = q.shape[-2]
    what = (f"flash_forward ({label}: q {tuple(q.shape)}, k and v {tuple(k.shape)}, "
            f"{str(q.dtype).replace('torch.', '')}, causal={causal}, "
            f"block_q={block_q}, block_k={block_k})")
    result = _run(flash_forward, q, k, v, causal=causal, block_q=block_q, block_k=block_k, what=what)
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        fail(f"{what} must return the tuple (out, lse), got {type(result).__name__}.")
    out = _tensor(result[0], f"{what}, out", q.shape, q.dtype, NAN_HINT)
    lse = _tensor(result[1], f"{what}, lse", (*q.shape[:-2], T), nan_hint=NAN_HINT)
    return out, lse, what


def _check_out(flash_forward, cases, hint, seed):
    g = _generator(seed)
    for label, lead, T, S, D, causal, block_q, block_k in cases:
        q, k, v = _attention_inputs(g, lead, T, S, D)
        out, _, what = _flash(flash_forward, q, k, v, causal, block_q, block_k, label)
        expected, _ = _expected(q, k, v, causal)
        if causal and T > S:
            unseen = out[..., : T - S, :]
            if (unseen != 0).any():
                fail(f"{what}: rows 0 .. {T - S - 1} see no key (T > S, bottom-right causal mask) "
                     f"and must be exactly 0; {int((unseen != 0).sum())} of their values are not. "
                     + CAUSAL_HINT)
        _close(out, expected, f"{what}, out", F32, hint)


@hidden_test
def check_tiles(flash_forward):
    """Non-causal, T = S a multiple of both tiles: the online softmax across key tiles."""
    _check_out(flash_forward, [
        ("whole tiles", (2,), 64, 64, 16, False, 16, 16),
        ("whole tiles, 32 x 32", (1, 2), 64, 64, 32, False, 32, 32),
        ("whole tiles, block_q != block_k", (2, 2), 32, 32, 16, False, 16, 32),
        ("batch axes, block_q > block_k", (2, 1, 2), 32, 32, 16, False, 32, 16),
    ], TILE_HINT, 711)


@hidden_test
def check_ragged(flash_forward):
    """Non-causal, T and S not multiples of the tiles, T < S and T > S, one query, one key."""
    _check_out(flash_forward, [
        ("ragged, T < S", (2, 2), 37, 53, 16, False, 16, 16),
        ("ragged, T > S", (1, 3), 53, 37, 16, False, 32, 16),
        ("T smaller than one tile", (2,), 5, 70, 16, False, 16, 32),
        ("one query (decoding)", (1, 2), 1, 45, 32, False, 16, 16),
        ("one key", (2,), 20, 1, 16, False, 16, 16),
    ], RAGGED_HINT, 712)


@hidden_test
def check_causal(flash_forward):
    """Causal, bottom-right: T = S, T < S, T > S (fully masked rows exactly 0, never NaN)."""
    _check_out(flash_forward, [
        ("causal, whole tiles", (1, 2), 64, 64, 16, True, 16, 16),
        ("causal, ragged, T < S", (2, 2), 37, 53, 16, True, 16, 32),
        ("causal, T > S: rows 0 .. 25 see no key", (1, 2), 45, 19, 16, True, 16, 16),
        ("causal, T > S, rows 0 .. 19 see no key", (2,), 50, 30, 32, True, 32, 16),
        ("causal, one query (decoding)", (3,), 1, 33, 16, True, 16, 16),
        ("causal, T = S ragged", (2,), 20, 20, 16, True, 32, 16),
    ], CAUSAL_HINT, 713)


@hidden_test
def check_lse(flash_forward):
    """lse = log sum_j exp(scale q_i . k_j) over visible keys, against a float64 log-sum-exp."""
    g = _generator(714)
    for label, lead, T, S, D, causal, block_q, block_k in [
            ("whole tiles", (2,), 32, 32, 16, False, 16, 16),
            ("ragged, T < S", (1, 2), 37, 53, 16, False, 16, 32),
            ("causal, T > S: rows 0 .. 25 see no key", (2,), 45, 19, 16, True, 16, 16),
            ("causal, ragged, T < S", (2, 1), 21, 40, 32, True, 32, 16)]:
        q, k, v = _attention_inputs(g, lead, T, S, D)
        _, lse, what = _flash(flash_forward, q, k, v, causal, block_q, block_k, label)
        _, expected = _expected(q, k, v, causal)
        _close(lse, expected, f"{what}, lse", F32, LSE_OUT_HINT)


@hidden_test
def check_float16(flash_forward):
    """float16 inputs: out in float16 (float32 statistics inside), lse in float32."""
    torch = _torch()
    g = _generator(715)
    for label, lead, T, S, D, causal, block_q, block_k in [
            ("whole tiles", (2,), 32, 32, 16, False, 16, 16),
            ("causal, ragged, T > S: rows 0 .. 23 see no key", (1, 2), 45, 21, 16, True, 16, 32),
            ("ragged, T < S", (2,), 21, 50, 32, False, 32, 16)]:
        q, k, v = _attention_inputs(g, lead, T, S, D, torch.float16)
        out, lse, what = _flash(flash_forward, q, k, v, causal, block_q, block_k, label)
        expected_out, expected_lse = _expected(q, k, v, causal)
        _close(out, expected_out, f"{what}, out", F16, FP16_HINT)
        _close(lse, expected_lse, f"{what}, lse", F16, LSE_OUT_HINT)
