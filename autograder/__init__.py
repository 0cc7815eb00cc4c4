"""Grading for the course: ``python -m autograder generate|grade|feedback|export|roster``.

By the process each module runs in:

* the driver (parent): ``driver`` (the class, the lock, signals), ``gradebook``,
  ``summary``, ``exports``, ``roster``, ``policy``, ``similarity``;
* a grading worker: ``worker`` (one student after another), ``intake``, ``audit``,
  ``execute`` (the executor), ``judge`` (verdicts outside the kernel), ``feedback``,
  ``kernel_manager``; ``checks`` (grader-only, run by the judge);
* the sandbox launcher: ``sandbox`` (cgroup, rlimits, bubblewrap);
* the student's kernel: only ``probe``'s source, sent by the judge.

Shared: ``limits``, ``results`` (typed records), ``assignments`` (the registry),
``nbgrader_config``, ``release``. Importing this package imports nothing else.
"""

import sys

# jsonschema imports rfc3987_syntax (if installed) only to validate "iri" string
# formats, which notebooks never use; building its grammar costs seconds of CPU
# in every process that imports nbformat. Mark it absent before nbformat loads.
sys.modules.setdefault("rfc3987_syntax", None)
