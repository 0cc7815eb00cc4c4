"""Typed records that cross process boundaries (worker -> driver, and later cluster -> client).

A worker grades one submission and returns a :class:`StudentResult`: its scores per
cell (read from the worker's scratch gradebook), what the audit and the executor
saw, and the files to write (the autograded notebook and the feedback page, as
bytes). The driver alone records it in the class gradebook and writes the files.
Everything here is plain data and pickles.
"""

from dataclasses import dataclass, field
from datetime import datetime

# statuses of a submission
OK, ERROR, MISSING, UNREADABLE = "ok", "error", "missing", "unreadable"


@dataclass(frozen=True)
class CellScore:
    """One graded cell: ``auto_score`` None means it needs a manual grade."""

    name: str
    auto_score: float | None
    max_score: float


@dataclass(frozen=True)
class NotebookScores:
    """The grades and comments of one notebook of a submission."""

    name: str
    late_penalty: float | None
    grades: tuple[CellScore, ...]
    comments: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class LimitEvent:
    """A limit the executor enforced (``kind``: timeout, hang, crash, output, ...)."""

    notebook: str
    cell: int
    grade_id: str | None
    kind: str
    detail: str


@dataclass
class StudentResult:
    """Everything about one graded submission (the driver fills the last four fields)."""

    student: str
    status: str = OK
    error: str | None = None
    message: str = ""                # intake: which file was graded, or why none was
    digest: str = ""                 # content hash of what was handed in
    events: list[LimitEvent] = field(default_factory=list)
    tampered: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    resemblances: list[str] = field(default_factory=list)
    functions: dict[str, str] = field(default_factory=dict)
    timestamp: datetime | None = None
    notebooks: list[NotebookScores] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)  # path under the course root -> bytes
    seconds: float = 0.0
    log: str = ""                    # the worker's log lines for this student, kept on failure
    # filled by the driver from the class gradebook
    score: float = 0.0
    max_score: float = 0.0
    needs_manual: bool = False
    similar: list[str] = field(default_factory=list)

    @property
    def limits(self):
        """Sorted limit kinds this submission hit."""
        return sorted({e.kind for e in self.events})
