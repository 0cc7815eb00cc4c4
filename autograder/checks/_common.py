"""Helpers shared by the checks: calling the student's code and comparing its outputs.

The checks run in the trusted grading worker, never in the student's kernel
(:mod:`autograder.judge.verdict`). The student's functions they receive are remote: a
call sends the inputs (chosen here) into the sandboxed kernel and brings back
only the outputs. ``@hidden_test`` silences warnings in the worker and leaves
verdicts as ``AssertionError`` messages written for the student. The checks also
accept plain Python functions, which is how the test suite exercises them, except where they
measure memory (:func:`measure`: only the judge's functions can be measured).
"""

import contextlib
import functools
import re
import warnings
from dataclasses import dataclass

import numpy as np


class CheckFailure(AssertionError):
    """A check's verdict: the message is shown to the student."""


def fail(message):
    raise CheckFailure(message)


# -- known mistakes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Mistake:
    """A typical wrong version of a function, recognised from what it returns.

    ``key`` is the stable machine-readable name (the report groups by it, the test suite
    plants it); ``what`` says what the code does, ``fix`` what to do instead (shown to the
    student, never the expected value); ``produce(*inputs)`` computes, from the reference
    library, what that mistake returns on the check's inputs.
    """

    key: str
    what: str
    fix: str
    produce: object = None
    cause: str = ""   # the earlier function whose mistake this is, seen through a later one


def answer_cascade(mistakes, function, through):
    """``function``'s known ``mistakes`` as an answer computed with it shows them (``through(produce)()``
    is that answer): same key; the message says what the answer equals, not that ``function`` is
    wrong (the answer may have been worked out by hand)."""
    return tuple(Mistake(m.key, f"the answer is what {function} gives with a known mistake: {m.what}",
                         f"{m.fix} (If {function}'s own test fails, fix it first.)", through(m.produce),
                         cause=function)
                 for m in mistakes if not m.cause)


def cascade(mistakes, function, through):
    """``function``'s known ``mistakes`` as a later function that calls it shows them:
    ``through(produce)`` computes the later function's output from the earlier one's wrong
    version. Same key (the report counts the cause once), a message that says to fix
    ``function`` first."""
    def seen(m):
        if m.cause:  # already seen through ``function``'s own call of an earlier one
            return Mistake(m.key, f"it calls {function}, which {m.what.removeprefix('it ')}", m.fix,
                           through(m.produce), cause=m.cause)
        return Mistake(m.key, f"it calls {function}, and {function} has a known mistake: {m.what}",
                       f"Fix {function} first (its own test says so): {m.fix}", through(m.produce),
                       cause=function)

    return tuple(seen(m) for m in mistakes)


KNOWN_MISTAKE = "This looks like a known mistake:"
DIAGNOSIS = "[mistake: {}]"
DIAGNOSIS_PATTERN = re.compile(r"\[mistake: ([a-z0-9][a-z0-9-]*)\]")


def diagnosis(mistake):
    """The sentence that names ``mistake`` in a verdict, ending with its machine-readable key."""
    return f"{KNOWN_MISTAKE} {mistake.what} {mistake.fix} {DIAGNOSIS.format(mistake.key)}"


def diagnosis_key(message):
    """The key of the mistake a verdict's ``message`` names, or None."""
    found = DIAGNOSIS_PATTERN.search(str(message))
    return found.group(1) if found else None


def diagnosis_sentence(message):
    """The part of a verdict's ``message`` that names its known mistake (what, fix, key)."""
    message = str(message)
    start = message.rfind(KNOWN_MISTAKE)
    return message[start:] if start >= 0 else message


def suspects(mistakes, *inputs, pick=None, **kwargs):
    """The known ``mistakes`` on these inputs, computed only when asked (a failing output):
    a function returning ``[(mistake, what it returns)]`` of those that apply. ``pick``: the
    index of the output compared, for a function that returns a tuple."""

    def compute():
        found = []
        for mistake in mistakes:
            try:
                out = mistake.produce(*inputs, **kwargs)
                out = out if pick is None else out[pick]
                found.append((mistake, np.asarray(out, dtype=np.float64)))
            except Exception:  # noqa: BLE001 - a mistake that does not apply to these inputs
                continue
        return found

    return compute


def _matches(actual, wrong, rtol, atol):
    if actual.shape != wrong.shape:
        return False
    both_nan = np.isnan(actual) & np.isnan(wrong)
    close = np.abs(actual - wrong) <= atol + rtol * np.abs(wrong)
    return bool(np.all(close | both_nan | (actual == wrong)))


def identify(actual, candidates, *, rtol=0.0, atol=0.0):
    """The first known mistake of ``candidates`` (see :func:`suspects`) whose output ``actual``
    equals within the check's tolerance (NaN where it has NaN), or None."""
    if not isinstance(actual, np.ndarray) or not candidates:
        return None
    try:
        actual = np.asarray(actual, dtype=np.float64)
        for mistake, wrong in candidates() if callable(candidates) else candidates:
            if _matches(actual, np.asarray(wrong, dtype=np.float64), rtol, atol):
                return mistake
    except (TypeError, ValueError):  # an output that is not numbers matches no mistake
        return None
    return None


def fail_as(what, mistake):
    """Fail ``what``, naming the known ``mistake`` (a verdict the check recognised itself:
    a missing ``ValueError``, a returned cache or table, a failed ``backward``)."""
    fail(f"{what}. {diagnosis(mistake)}")


@contextlib.contextmanager
def hinted(hint):
    """Any verdict raised inside ends with ``hint`` (unless it already says it or names a known
    mistake): a NaN, a wrong shape or type, an exception all get the check's advice."""
    try:
        yield
    except CheckFailure as failure:
        message = str(failure)
        if not hint or hint in message or diagnosis_key(message):
            raise
        raise CheckFailure(f"{message} {hint}") from None


def hidden_test(check):
    """Decorator for a check: quiet warnings, clean failure messages."""

    @functools.wraps(check)
    def run(*args, **kwargs):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            check(*args, **kwargs)

    return run


def rng(seed):
    """A seeded NumPy generator (each check uses its own fixed seeds)."""
    return np.random.default_rng(seed)


def call(fn, *args, what, copy_inputs=True, **kwargs):
    """Run the student's ``fn`` on (copies of) the inputs; any exception fails the check.

    ``fn`` must accept the arguments as its stub declares them (checked for local
    functions; a remote call reports a ``TypeError`` from the kernel the same way).
    """
    if not callable(fn):
        fail(f"{what}: expected a function, got {type(fn).__name__}.")
    if copy_inputs:
        args = tuple(_copy(a) for a in args)
        kwargs = {k: _copy(v) for k, v in kwargs.items()}
    try:
        return fn(*args, **kwargs)
    except CheckFailure:
        raise
    except NotImplementedError:
        fail(f"{what} is not implemented yet (it raised NotImplementedError).")
    except AssertionError as err:
        fail(f"{what} raised AssertionError: {err}")
    except Exception as err:  # noqa: BLE001 - any crash of student code is a failed test
        fail(f"{what} raised {type(err).__name__}: {err}")


def call_keeping_args(fn, *args, what, **kwargs):
    """``(output, positional arguments as they are after the call)``: did ``fn`` modify them?"""
    if hasattr(fn, "call_keeping_args"):
        try:
            return fn.call_keeping_args(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            fail(f"{what} raised {type(err).__name__}: {err}")
    args = tuple(_copy(a) for a in args)
    return call(fn, *args, what=what, copy_inputs=False, **kwargs), args


def expect_value_error(fn, *args, what, argument, mistake=None, **kwargs):
    """``fn(*args)`` must raise ``ValueError`` (the message should name ``argument``); when it
    does not, the verdict names ``mistake`` (the known mistake of a missing check), if given."""
    named = f" {diagnosis(mistake)}" if mistake is not None else ""
    try:
        fn(*args, **kwargs)
    except ValueError:
        return
    except Exception as err:  # noqa: BLE001
        fail(f"{what} must raise ValueError for an invalid {argument}, "
             f"it raised {type(err).__name__}.{named}")
    fail(f"{what} must raise ValueError for an invalid {argument}, it returned normally.{named}")


def measure(fn, *args, what):
    """``(output, peak extra bytes)`` of one call of the student's ``fn``, on the grader's meter.

    Memory has one meter: ``fn.measure``, from the judge. A remote function is measured from
    outside a fresh sandboxed kernel (the peak of its cgroup's memory from before any student
    code ran until the output was encoded: NumPy, torch, threads, child processes and files
    alike); a grading host that cannot measure that raises its own error, which fails the test
    as the host's fault. A function in the learner's own kernel (the self-check) cannot be
    measured that way: its peak is None, and the check judges its output alone. A function
    without ``measure`` (not handed over by the judge) is the caller's error: ``TypeError``.
    """
    if not hasattr(fn, "measure"):
        raise TypeError(f"{what}: memory is measured only through the judge (a function it hands "
                        "over, with its measure method), not on a plain function")
    try:
        return fn.measure(*args)
    except CheckFailure:
        raise
    except NotImplementedError:
        fail(f"{what} is not implemented yet (it raised NotImplementedError).")
    except Exception as err:  # noqa: BLE001
        if getattr(err, "host_fault", False):  # the grading host cannot measure: not a verdict
            raise
        fail(f"{what} raised {type(err).__name__}: {err}")


def _copy(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    if type(value).__module__ == "torch" and hasattr(value, "clone"):
        return value.detach().clone().requires_grad_(value.requires_grad)
    return value


def to_numpy(out, what, *, kind="numpy", mistakes=()):
    """The student's output as a float64 array; ``kind`` is the type it must have.

    Any NaN fails here, with a message that says so (no expected output has one;
    an infinity where a finite value is expected fails in :func:`assert_close`); when it is
    what a known mistake of ``mistakes`` (``[(mistake, its output)]``) returns, the message
    names that mistake.
    """
    is_tensor = type(out).__module__ == "torch" and hasattr(out, "detach")
    if kind == "numpy" and not isinstance(out, (np.ndarray, np.generic, float, int)):
        fail(f"{what} must return a NumPy array, got {type(out).__name__}.")
    if kind == "torch" and not is_tensor:
        fail(f"{what} must return a torch.Tensor, got {type(out).__name__}.")
    if is_tensor:
        out = out.detach().cpu().double().numpy()
    try:
        array = np.asarray(out, dtype=np.float64)
    except (TypeError, ValueError):
        fail(f"{what} must return numbers, got {type(out).__name__}.")
    if np.isnan(array).any():
        known = identify(array, mistakes, rtol=1e-6, atol=1e-9)
        fail(f"{what}: {int(np.isnan(array).sum())} of {array.size} values are NaN."
             f"{' ' + diagnosis(known) if known else ''}")
    return array


def tolerance(out, *, f64, f32):
    """The tolerance for the student's output dtype: float64 tight, anything coarser ``f32``.

    A task that does not fix the dtype accepts an honest float32 computation.
    """
    dtype = getattr(out, "dtype", None)
    return f64 if dtype is None or np.dtype(str(dtype).replace("torch.", "")) == np.float64 else f32


def assert_close(actual, expected, what, *, rtol, atol, hint="", mistakes=()):
    """Entries of ``actual`` within ``atol + rtol * |expected|`` of ``expected``, no NaN.

    A failing ``actual`` that equals (same tolerance) what a known mistake returns
    (``mistakes``: ``[(mistake, its output)]``, see :func:`suspects`) fails naming that
    mistake and its fix, in place of the general ``hint``.
    """
    expected = np.asarray(expected, dtype=np.float64)

    def advice():  # a known mistake's name and fix, else the hint: computed only on failure
        known = identify(actual, mistakes, rtol=rtol, atol=atol)
        text = diagnosis(known) if known is not None else hint
        return f" {text}" if text else ""

    if actual.shape != expected.shape:
        fail(f"{what}: expected an output of shape {expected.shape}, got {actual.shape}.{advice()}")
    nan = ~np.isfinite(actual) & np.isfinite(expected)
    if nan.any():
        fail(f"{what}: {int(nan.sum())} of {actual.size} values are NaN or infinite "
             f"(expected finite values).{advice()}")
    error = np.abs(actual - expected)
    bad = ~(error <= atol + rtol * np.abs(expected))
    bad &= ~(actual == expected)  # equal infinities
    if bad.any():
        fail(f"{what}: {int(bad.sum())} of {actual.size} values are wrong "
             f"(largest error {float(np.nanmax(np.where(bad, error, 0.0))):.3g}; "
             f"tolerance |error| <= {atol:g} + {rtol:g}*|expected|).{advice()}")


def assert_equal_mask(actual, expected, what, *, hint="", mistakes=()):
    """A boolean array equal to ``expected`` (shape, dtype bool, every entry); a wrong one that
    equals what a known mistake of ``mistakes`` returns (see :func:`suspects`) names it."""
    if not isinstance(actual, np.ndarray):
        fail(f"{what} must return a NumPy array, got {type(actual).__name__}.")
    actual = np.asarray(actual)  # a plain ndarray: a subclass cannot override the comparison
    if actual.dtype != np.bool_:
        fail(f"{what} must return a boolean array (True = may attend), got dtype {actual.dtype}.")
    if actual.shape != expected.shape:
        fail(f"{what}: expected shape {expected.shape}, got {actual.shape}.")
    wrong = actual != expected
    if wrong.any():
        known = identify(actual.astype(np.float64), mistakes)
        text = diagnosis(known) if known is not None else hint
        fail(f"{what}: {int(wrong.sum())} of {actual.size} entries are wrong.{' ' + text if text else ''}")


def wrong_answers(mistakes, *inputs):
    """What each known mistake of ``mistakes`` answers on ``inputs`` (its ``produce``), computed
    only when asked (a wrong answer): a function returning ``[(value, mistake)]`` for
    :func:`assert_number`; a mistake that does not apply is left out."""

    def compute():
        found = []
        for mistake in mistakes:
            try:
                found.append((float(mistake.produce(*inputs)), mistake))
            except Exception:  # noqa: BLE001 - a mistake that does not apply to these inputs
                continue
        return found

    return compute


def assert_number(answer, expected, what, *, rtol=0.0, integer=False, hint="", wrong=()):
    """A conceptual answer: a number equal to ``expected`` (within ``rtol``); a wrong one
    fails with the tolerance and ``hint`` (how to get there, never the value), or, when it
    equals a known wrong answer of ``wrong`` (``[(value, mistake)]``, or a function returning
    them, see :func:`wrong_answers`), with that mistake named (a mistake whose answer is the right one
    is never named). A known wrong answer that is a whole number matches to within ``rtol``, any
    other to within ``max(rtol, 1e-3)``, relative (an answer typed from a printed value, 16.1 GB,
    still names its slip); the nearest one is named."""
    if isinstance(answer, bool) or not isinstance(answer, (int, float, np.integer, np.floating)):
        fail(f"{what} must be a number, got {type(answer).__name__}.")
    if not np.isfinite(float(answer)):
        fail(f"{what} must be a finite number, got {answer}.{' ' + hint if hint else ''}")
    if abs(float(answer) - expected) <= rtol * abs(expected) and not (integer and float(answer) != int(answer)):
        return
    within = f"checked to within {rtol:.3g} of the answer, relative" if rtol else "checked exactly"
    near = [(abs(float(answer) - value), mistake) for value, mistake in (wrong() if callable(wrong) else wrong)
            if abs(float(answer) - value) <= max(rtol, 0.0 if float(value).is_integer() else 1e-3) * abs(value)
            and not abs(value - expected) <= rtol * abs(expected)]
    if near:
        fail(f"{what} is not correct ({within}). {diagnosis(min(near, key=lambda n: n[0])[1])}")
    if integer and float(answer) != int(answer):
        fail(f"{what} must be a whole number, got {answer}.{' ' + hint if hint else ''}")
    fail(f"{what} is not correct ({within}).{' ' + hint if hint else ''}")


def assert_choice(answer, expected, what, choices, *, hint=""):
    """A conceptual answer: one of ``choices`` (case-insensitive letter or word)."""
    if not isinstance(answer, str) or answer.strip().upper() not in choices:
        fail(f"{what} must be one of {', '.join(repr(c) for c in choices)}, got {answer!r}.")
    if answer.strip().upper() != expected:
        fail(f"{what} is not correct.{' ' + hint if hint else ''}")
