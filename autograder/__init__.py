"""Grading for the course: ``python -m autograder generate|grade|feedback|export``.

The driver modules (``driver``, ``worker``, ``execute``, ``kernel``, ``audit``,
``release``, ``summary``, ``nbgrader_config``) run nbgrader at class scale; the
hidden-test logic lives in the grader-only package ``autograder.checks``.
Importing this package imports nothing else, because every grading kernel
imports it (for ``autograder.checks``) before the student's code runs.
"""

import sys

# jsonschema imports rfc3987_syntax (if installed) only to validate "iri" string
# formats, which notebooks never use; building its grammar costs seconds of CPU
# in every process that imports nbformat. Mark it absent before nbformat loads.
sys.modules.setdefault("rfc3987_syntax", None)
