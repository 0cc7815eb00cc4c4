"""Grading for the course: ``python -m autograder generate|grade|feedback|export|roster``.

One folder per process, so a file's path says where its code runs and what it may import
(``tests/grader/test_layers.py`` keeps it so):

* ``host/``: the instructor's process: the command line, a grading run, local worker
  processes, the Dask client, recording, release, roster, exports, the summary;
* ``worker/``: a grading worker (forked locally, or in a Dask worker): the per-submission
  pipeline, intake, audit, similarity, feedback, the local loop, the Dask plugin;
* ``judge/``: execution and verdicts in the trusted worker: the executor, the judge, the
  sandboxed kernel manager;
* ``sandbox/``: the kernel launcher and its cgroups, standard library only;
* ``kernel/``: the probe, the only grader code inside a student's kernel (stdlib and NumPy);
* ``core/``: what the trusted processes share: limits, typed results, the assignment
  registry, the cell vocabulary, nbgrader's configuration, the gradebook, the late policy;
* ``checks/``: the hidden tests' checks, imported by test cells in the judge.

Importing this package imports nothing else (the sandbox launcher imports it on every kernel
start).
"""

import sys

# jsonschema imports rfc3987_syntax (if installed) only to validate "iri" string
# formats, which notebooks never use; building its grammar costs seconds of CPU
# in every process that imports nbformat. Mark it absent before nbformat loads.
sys.modules.setdefault("rfc3987_syntax", None)
