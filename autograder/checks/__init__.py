"""Grader-only checks behind the hidden tests of the six assignments.

Each hidden test of ``solutions/<id>/<id>.ipynb`` is one call such as
``rope.check_apply_rope(apply_rope)``. The judge runs it in the trusted grading
worker (never in the student's kernel): the student's function arrives as a
remote function whose calls return only the student's outputs. The checks compare
them with ``transformer_ref`` on seeded random inputs and edge cases, check the
properties the chapter teaches, and fail with an ``AssertionError`` whose message
is written for the student.

This package is never copied to students, and it is not visible inside the
sandbox that runs their kernels.
"""
