"""Helpers shared by the checks: calling student code safely and comparing arrays.

Every public ``check_*`` function of the assignment modules is wrapped by
``@hidden_test``: it verifies the tamper guard before and after the check, silences
warnings (a warning on stderr would zero the test cell) and turns anything
unexpected into an ``AssertionError`` with a student-friendly message.
"""

import functools
import warnings

import numpy as np

from ._anticheat import cheating_message, no_cheating, static_violation
from ._guard import verify


class CheckFailure(AssertionError):
    """A check's verdict: the message is shown to the student."""


def fail(message):
    raise CheckFailure(message)


def hidden_test(check):
    """Decorator for a check: guard, quiet warnings, clean failure messages."""
    _verify = verify  # bound now: rebinding _guard.verify later changes nothing here

    @functools.wraps(check)
    def run(*args, **kwargs):
        _verify()
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            check(*args, **kwargs)
        _verify()

    return run


@hidden_test
def check_no_reference(*fns, forbid_sdpa=False):
    """The hidden line of a part's visible test cell: none of ``fns`` uses the reference.

    Static only (``static_violation``): the visible tests above already ran the code, and
    the part's hidden checks add the tripwires. The verdict zeroes the visible cell, so a
    part that hands its work to ``transformer_ref`` (or SDPA) scores 0 in total.
    """
    for fn in fns:
        reason = static_violation(fn, forbid_sdpa=forbid_sdpa)
        if reason is not None:
            fail(cheating_message(getattr(fn, "__name__", "this part"), reason, forbid_sdpa=forbid_sdpa))


def rng(seed):
    """A seeded NumPy generator (each check uses its own fixed seeds)."""
    return np.random.default_rng(seed)


def call(fn, *args, what, forbid_sdpa=False, copy_inputs=True, **kwargs):
    """Run the student's ``fn`` (on copies of the inputs) under the anti-cheat nets."""
    if not callable(fn):
        fail(f"{what}: expected a function, got {type(fn).__name__}.")
    if copy_inputs:
        args = tuple(_copy(a) for a in args)
        kwargs = {k: _copy(v) for k, v in kwargs.items()}
    try:
        with no_cheating(fn, what, forbid_sdpa=forbid_sdpa):
            return fn(*args, **kwargs)
    except CheckFailure:
        raise
    except AssertionError as err:
        if "solutions must not use" in str(err):
            raise CheckFailure(str(err)) from None
        fail(f"{what} raised AssertionError: {err}")
    except NotImplementedError:
        fail(f"{what} is not implemented yet (it raised NotImplementedError).")
    except Exception as err:  # noqa: BLE001 - any crash of student code is a failed test
        fail(f"{what} raised {type(err).__name__}: {err}")


def expect_value_error(fn, *args, what, argument, **kwargs):
    """``fn(*args)`` must raise ``ValueError`` (the message should name ``argument``)."""
    try:
        with no_cheating(fn, what):
            fn(*args, **kwargs)
    except ValueError:
        return
    except AssertionError as err:
        if "solutions must not use" in str(err):
            raise CheckFailure(str(err)) from None
        fail(f"{what} must raise ValueError for an invalid {argument}, it raised AssertionError.")
    except Exception as err:  # noqa: BLE001
        fail(f"{what} must raise ValueError for an invalid {argument}, "
             f"it raised {type(err).__name__}.")
    fail(f"{what} must raise ValueError for an invalid {argument}, it returned normally.")


def _copy(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    if type(value).__module__ == "torch" and hasattr(value, "clone"):
        return value.detach().clone().requires_grad_(value.requires_grad)
    return value


def to_numpy(out, what, *, kind="numpy"):
    """The student's output as a float64 array; ``kind`` is the type it must have."""
    is_tensor = type(out).__module__ == "torch" and hasattr(out, "detach")
    if kind == "numpy" and not isinstance(out, (np.ndarray, np.generic, float, int)):
        fail(f"{what} must return a NumPy array, got {type(out).__name__}.")
    if kind == "torch" and not is_tensor:
        fail(f"{what} must return a torch.Tensor, got {type(out).__name__}.")
    if is_tensor:
        out = out.detach().cpu().double().numpy()
    return np.asarray(out, dtype=np.float64)


def assert_close(actual, expected, what, *, rtol, atol, hint=""):
    """Entries of ``actual`` within ``atol + rtol * |expected|`` of ``expected``, no NaN."""
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        fail(f"{what}: expected an output of shape {expected.shape}, got {actual.shape}.")
    nan = ~np.isfinite(actual) & np.isfinite(expected)
    if nan.any():
        fail(f"{what}: {int(nan.sum())} of {actual.size} values are NaN or infinite "
             f"(expected finite values).{' ' + hint if hint else ''}")
    error = np.abs(actual - expected)
    bad = ~(error <= atol + rtol * np.abs(expected))
    bad &= ~(actual == expected)  # equal infinities
    if bad.any():
        fail(f"{what}: {int(bad.sum())} of {actual.size} values are wrong "
             f"(largest error {float(np.nanmax(np.where(bad, error, 0.0))):.3g}; "
             f"tolerance |error| <= {atol:g} + {rtol:g}*|expected|)."
             f"{' ' + hint if hint else ''}")


def assert_equal_mask(actual, expected, what, *, hint=""):
    """A boolean array equal to ``expected`` (shape, dtype bool, every entry)."""
    if not isinstance(actual, np.ndarray):
        fail(f"{what} must return a NumPy array, got {type(actual).__name__}.")
    actual = np.asarray(actual)  # a plain ndarray: a subclass cannot override the comparison
    if actual.dtype != np.bool_:
        fail(f"{what} must return a boolean array (True = may attend), got dtype {actual.dtype}.")
    if actual.shape != expected.shape:
        fail(f"{what}: expected shape {expected.shape}, got {actual.shape}.")
    wrong = actual != expected
    if wrong.any():
        fail(f"{what}: {int(wrong.sum())} of {actual.size} entries are wrong.{' ' + hint if hint else ''}")


def assert_number(answer, expected, what, *, rtol=0.0, integer=False):
    """A conceptual answer: a number equal to ``expected`` (within ``rtol``)."""
    if isinstance(answer, bool) or not isinstance(answer, (int, float, np.integer, np.floating)):
        fail(f"{what} must be a number, got {type(answer).__name__}.")
    if integer and float(answer) != int(answer):
        fail(f"{what} must be a whole number, got {answer}.")
    if not abs(float(answer) - expected) <= rtol * abs(expected):
        fail(f"{what} is not correct.")


def assert_choice(answer, expected, what, choices):
    """A conceptual answer: one of ``choices`` (case-insensitive letter or word)."""
    if not isinstance(answer, str) or answer.strip().upper() not in choices:
        fail(f"{what} must be one of {', '.join(repr(c) for c in choices)}, got {answer!r}.")
    if answer.strip().upper() != expected:
        fail(f"{what} is not correct.")
