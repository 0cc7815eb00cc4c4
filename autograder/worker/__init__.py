"""A grading worker: a process that grades one submission after another.

It runs as a local worker forked by the driver (``loop``) or inside a Dask worker
(``plugin``); either way it runs the same ``pipeline``: ``intake`` (which notebook to grade,
``reseat`` for one without its metadata), ``repair``, ``audit`` (edited or deleted test cells,
suspicious code), nbgrader's autograding with the judge, and the feedback page
(:mod:`autograder.core.feedback_page`). It writes only its own scratch gradebook and returns a
typed result. It may import ``core``, ``judge`` and ``sandbox``, never ``host``; the host never
imports it, but starts ``loop`` and ``plugin`` by name
(:func:`autograder.core.grading_run.call_by_name`).
"""
