"""Argument checks shared by both backends.

Every public function validates its input and raises ``ValueError`` whose
message starts with the offending argument's name, e.g.
``ValueError("head_dim must be even for RoPE, got 7")``.
These helpers only look at Python numbers and ``.shape`` tuples, so they work
for NumPy arrays and torch tensors alike.
"""

import math
import numbers

__all__ = [
    "check_int",
    "check_positive_float",
    "check_choice",
    "check_ndim",
    "check_even",
    "check_divisible",
    "check_same_dim",
    "check_mask_shape",
]


def check_int(name, value, *, minimum=0):
    """Return ``value`` as an ``int`` if it is an integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_positive_float(name, value, *, minimum=None, allow_equal=True):
    """Return ``value`` as a finite ``float``; ``> 0`` unless ``minimum`` is given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is None:
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    elif value < minimum or (not allow_equal and value == minimum):
        op = ">=" if allow_equal else ">"
        raise ValueError(f"{name} must be {op} {minimum}, got {value}")
    return value


def check_choice(name, value, choices):
    """Return ``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)!r}, got {value!r}")
    return value


def check_ndim(name, x, minimum):
    """Require ``x.ndim >= minimum``; return the shape as a tuple."""
    shape = tuple(x.shape)
    if len(shape) < minimum:
        raise ValueError(f"{name} must have at least {minimum} dimensions, got shape {shape}")
    return shape


def check_even(name, value, what=""):
    """Require an even positive integer (e.g. a RoPE head dimension)."""
    value = check_int(name, value, minimum=1)
    if value % 2:
        raise ValueError(f"{name} must be even{what}, got {value}")
    return value


def check_divisible(name, value, by_name, by):
    """Require ``value % by == 0`` (e.g. query heads by KV heads)."""
    if by <= 0 or value % by:
        raise ValueError(f"{name} ({value}) must be divisible by {by_name} ({by})")
    return value // by


def check_same_dim(name_a, dim_a, name_b, dim_b, what):
    """Require two sizes to agree; the message names both arguments."""
    if dim_a != dim_b:
        raise ValueError(f"{name_a} and {name_b} must have the same {what}, got {dim_a} and {dim_b}")


def check_mask_shape(name, mask_shape, target):
    """Require ``mask_shape`` to broadcast against ``target`` (the score shape)."""
    mask_shape, target = tuple(mask_shape), tuple(target)
    if len(mask_shape) > len(target):
        raise ValueError(f"{name} of shape {mask_shape} has more dimensions than the scores {target}")
    for m, t in zip(reversed(mask_shape), reversed(target)):
        if m != 1 and m != t:
            raise ValueError(f"{name} of shape {mask_shape} does not broadcast to the scores {target}")
