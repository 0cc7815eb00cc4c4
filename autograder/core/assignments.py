"""The course's assignments: which exist, and what this repository's course knows of each.

* :func:`source_assignments` is the one answer to "which assignments does a course have":
  the folders under ``solutions/`` (:data:`autograder.core.course_files.SOURCE`) that hold a
  notebook. The grader (``generate``, ``grade``, ``serve``, ``collect``, ``report``) reads it
  for whatever course it is given.
* :data:`REGISTRY` describes this repository's own course, whose assignments are exactly its
  ``solutions/`` folders (``tests/grader/assignments/test_assignment_structure.py`` holds the
  two equal): for each, the module of ``autograder.checks`` behind its hidden tests and the
  optional Python packages its kernels need beyond the course's lock (an assignment whose
  packages are missing is skipped by the tests with an install hint). The tests, the
  benchmarks and the book build read it. Adding an assignment starts here; CONTRIBUTING.md
  lists the other places.
"""

from dataclasses import dataclass
from pathlib import Path

from .course_files import SOURCE


def source_assignments(root):
    """Ids of the assignments that have a source folder under ``root/solutions``, sorted."""
    source = Path(root) / SOURCE
    return sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb"))) \
        if source.is_dir() else []


@dataclass(frozen=True)
class Assignment:
    id: str
    checks: str               # module under autograder.checks
    needs: tuple[str, ...] = ()  # importable packages beyond requirements.lock


REGISTRY = (
    Assignment("01-rope", "rope"),
    Assignment("02-gqa-kv-cache", "gqa"),
    Assignment("03-causal-mask", "causal"),
    Assignment("04-transformer-block", "block"),
    Assignment("05-families", "families"),
    Assignment("06-flash-attention", "flash"),
    Assignment("07-flash-triton", "flash_triton", needs=("triton",)),
    Assignment("08-serving", "serving"),
)
ASSIGNMENTS = tuple(a.id for a in REGISTRY)
