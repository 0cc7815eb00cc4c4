"""A grading worker: a process that grades one submission after another.

It runs as a local worker forked by the driver (``loop``) or inside a Dask worker
(``plugin``); either way it runs the same ``pipeline``: ``intake`` (which notebook to grade),
``audit`` (edited or deleted test cells, suspicious code, with ``similarity``), nbgrader's
autograding with the judge, and ``feedback``. It writes only its own scratch gradebook and
returns a typed result. It may import ``core``, ``judge`` and ``sandbox``, never ``host``.
"""
