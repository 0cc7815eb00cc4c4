"""Typed records that cross process boundaries (worker -> driver, and later cluster -> client).

A worker grades one submission and returns a :class:`StudentResult`: its scores per
cell (read from the worker's scratch gradebook), what the audit and the executor
saw, and the files to write (the autograded notebook and the feedback page, as
bytes). The driver alone records it in the class gradebook and writes the files.
Everything here is plain data and pickles.
"""

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class Status(StrEnum):
    """What became of one submission (the ``status`` of ``grades.csv``)."""

    OK = "ok"                  # graded
    ERROR = "error"            # grading it failed (the host's fault or the grader's): see ``error``
    MISSING = "missing"        # no notebook of the assignment was handed in
    UNREADABLE = "unreadable"  # the notebook is not a notebook (empty, not JSON, ...)


class LimitKind(StrEnum):
    """A limit the executor enforced in one cell (the summary's *Hit a limit*)."""

    TIMEOUT = "timeout"                    # the cell ran past its time limit
    HANG = "hang"                          # the kernel ignored the interrupt and was restarted
    NOTEBOOK_TIMEOUT = "notebook_timeout"  # the notebook's wall clock ran out
    CRASH = "crash"                        # the kernel died (os._exit, a crash, the memory cap)
    OUTPUT = "output"                      # the cell printed more than the output limit
    REPLAY = "replay"                      # re-running earlier cells after a restart failed


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
    """A limit the executor enforced (``kind``: a :class:`LimitKind`)."""

    notebook: str
    cell: int
    grade_id: str | None
    kind: LimitKind
    detail: str


@dataclass(frozen=True)
class WorkerStart:
    """A local grading worker's first word: ``fault`` is empty once its preflight kernel
    answered, else why no kernel could start (the grading host's fault)."""

    fault: str = ""


@dataclass
class StudentResult:
    """Everything about one graded submission (the driver fills the last four fields)."""

    student: str
    status: Status = Status.OK
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
    host_fault: bool = False         # status ERROR because of the grading host (no kernel could
                                     # start): never the student's grade; the earlier one is kept
    # filled by the driver from the class gradebook
    score: float = 0.0
    max_score: float = 0.0
    needs_manual: bool = False
    similar: list[str] = field(default_factory=list)

    @property
    def limits(self):
        """Sorted limit kinds this submission hit."""
        return sorted({e.kind for e in self.events})
