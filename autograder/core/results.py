"""Typed records that cross process boundaries (worker -> host: a local pipe, a Dask task).

A worker grades one submission and returns a :class:`StudentResult`: its scores per
cell (read from the worker's scratch gradebook), what the audit and the executor
saw, and the files to write (the autograded notebook and the feedback page, as
bytes). The driver alone records it in the class gradebook and writes the files.
A local worker's first word is a :class:`WorkerStart`. Everything here is plain data:
each record's ``to_dict()`` is made of builtins only (``str``, numbers, ``bytes``,
``datetime``, lists and dicts), which is what travels, and ``from_dict()`` builds the
record back, so the host never reads a worker's answer by string keys.

:func:`needs_manual_grade` is the one rule for a cell that awaits a grade by hand.
"""

from dataclasses import asdict, dataclass, field, fields
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


def needs_manual_grade(auto_score: float | None, manual_score: float | None = None) -> bool:
    """Whether a graded cell awaits a grade by hand: nbgrader's rule after an autograde.

    A cell the autograder could not score (``auto_score`` None: a written answer) needs one;
    so does a cell that already has a manual score, which a re-grade marks for review again.
    """
    return manual_score is not None or auto_score is None


@dataclass(frozen=True)
class CellScore:
    """One graded cell: ``auto_score`` None means it needs a manual grade."""

    name: str
    auto_score: float | None
    max_score: float

    @property
    def needs_manual(self) -> bool:
        return needs_manual_grade(self.auto_score)

    @classmethod
    def from_dict(cls, data: dict) -> "CellScore":
        return cls(**data)


@dataclass(frozen=True)
class NotebookScores:
    """The grades and comments of one notebook of a submission."""

    name: str
    grades: tuple[CellScore, ...]
    comments: tuple[tuple[str, str | None], ...] = ()

    @classmethod
    def from_dict(cls, data: dict) -> "NotebookScores":
        return cls(data["name"], tuple(CellScore.from_dict(g) for g in data["grades"]),
                   tuple(tuple(c) for c in data["comments"]))


@dataclass(frozen=True)
class LimitEvent:
    """A limit the executor enforced (``kind``: a :class:`LimitKind`)."""

    notebook: str
    cell: int
    grade_id: str | None
    kind: LimitKind
    detail: str

    @classmethod
    def from_dict(cls, data: dict) -> "LimitEvent":
        """The event the executor wrote into a notebook's metadata, or one sent as a dict."""
        return cls(data["notebook"], data["cell"], data["grade_id"], LimitKind(data["kind"]),
                   data["detail"])


@dataclass(frozen=True)
class WorkerStart:
    """A local grading worker's first word: ``fault`` is empty once its preflight kernel
    answered, else why no kernel could start (the grading host's fault)."""

    fault: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "WorkerStart":
        return cls(str(data["fault"]))


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
    page_penalty: float = 0.0        # the late penalty on the feedback page the worker rendered
    # filled by the driver from the class gradebook
    score: float = 0.0
    max_score: float = 0.0
    needs_manual: bool = False
    similar: list[str] = field(default_factory=list)

    @property
    def limits(self):
        """Sorted limit kinds this submission hit."""
        return sorted({e.kind for e in self.events})

    def page_agrees(self, standing) -> bool:
        """Whether the feedback page the worker rendered (its automatic scores, its penalty)
        shows ``standing``, the class gradebook's (which may hold manual scores and an
        extension the worker's scratch gradebook had not)."""
        shown = sum(g.auto_score or 0.0 for nb in self.notebooks for g in nb.grades)
        return (abs(shown - standing.score) < 1e-9
                and abs(self.page_penalty - standing.penalty) < 1e-9)

    def manual_cells(self) -> set[str]:
        """Grade ids of the cells that await a grade by hand (:func:`needs_manual_grade`)."""
        return {g.name for nb in self.notebooks for g in nb.grades if g.needs_manual}

    def to_dict(self) -> dict:
        """The result as builtins only (what a worker sends the host)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StudentResult":
        """The result a worker sent; ``TypeError``/``KeyError``/``ValueError`` if it is not one."""
        known = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or not set(data) <= known or "student" not in data:
            raise TypeError("not a StudentResult")
        values = dict(data)
        values["status"] = Status(data.get("status", Status.OK))
        values["events"] = [LimitEvent.from_dict(e) for e in data.get("events", ())]
        values["notebooks"] = [NotebookScores.from_dict(nb) for nb in data.get("notebooks", ())]
        return cls(**values)
