"""The course's assignments: one registry that release, the checks and the tests read.

Each :class:`Assignment` names its id (the folder under ``solutions/`` and
``release/``), the module of ``autograder.checks`` behind its hidden tests, the
chapter it goes with, and the optional Python packages its kernels need beyond
the course's lock (an assignment whose packages are missing is skipped by the
tests with an install hint). Adding an assignment starts here; CONTRIBUTING.md
lists the other places.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Assignment:
    id: str
    checks: str               # module under autograder.checks
    chapter: str              # the book chapter (file stem under chapters/)
    needs: tuple[str, ...] = ()  # importable packages beyond requirements.lock


REGISTRY = (
    Assignment("01-rope", "rope", "01-rope"),
    Assignment("02-gqa-kv-cache", "gqa", "02-gqa-kv-cache"),
    Assignment("03-causal-mask", "causal", "03-causal-mask"),
    Assignment("04-transformer-block", "block", "04-transformer-block"),
    Assignment("05-families", "families", "05-families"),
    Assignment("06-flash-attention", "flash", "06-flash-attention"),
    Assignment("07-flash-triton", "flash_triton", "06-flash-attention", needs=("triton",)),
    # the paged cache builds on chapter 2's KV cache, the split-K merge on chapter 6's online softmax
    Assignment("08-serving", "serving", "06-flash-attention"),
)
ASSIGNMENTS = tuple(a.id for a in REGISTRY)


def by_id(assignment_id):
    """The registered :class:`Assignment` with this id (KeyError if none)."""
    return {a.id: a for a in REGISTRY}[assignment_id]


def available(assignment):
    """None if the assignment's extra packages import here, else a one-line install hint."""
    import importlib.util

    missing = [name for name in assignment.needs if importlib.util.find_spec(name) is None]
    return f"needs {', '.join(missing)} (pip install -r requirements-triton.lock)" if missing else None
