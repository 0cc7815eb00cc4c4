"""Grader-only checks behind the hidden tests of the six assignments.

Each hidden test cell of ``solutions/<id>/<id>.ipynb`` is one call such as
``rope.check_apply_rope(apply_rope)``. The checks compare the student's function
with ``transformer_ref`` on seeded random inputs and edge cases, check the
properties the chapter teaches, and fail (``AssertionError``, a clear message,
nothing on stderr) when the function is wrong, uses ``transformer_ref`` (or SDPA
where attention is the task), or when the notebook tampered with NumPy, torch,
the references or these checks (see ``_guard``).

This package is never copied to students: it lives outside ``solutions/``.
"""

from ._guard import verify

__all__ = ["verify"]
