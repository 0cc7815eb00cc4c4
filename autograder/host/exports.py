"""Grades out of the gradebook, into CSV for the instructor and for an LMS.

The gradebook is the one source of grades: every export here reads it (never
``grades.csv``, which shows the same standings beside what each run saw). nbgrader's
``SubmittedAssignment.score`` is the sum of its cells' scores, a manual score
taking precedence over the automatic one (extra credit added); the late penalty is
stored apart, per notebook (``late_submission_penalty``, written by nbgrader's
``AssignLatePenalties`` or :func:`autograder.core.policy.apply_late_policy`). A score
here is therefore ``max(0, score - penalty)``, as nbgrader's own CSV export
computes it.

* :func:`student_grades`: one :class:`StudentGrade` per student and assignment;
* :func:`export_csv`: all of it, one row each, with the late columns and a status;
* :func:`export_lms`: the import file of an LMS gradebook (``canvas``, ``moodle``).

Every gradebook student appears, on the roster or not; a student without a
submission is ``missing`` (an empty cell in an LMS file, never 0). Files are
written to a temporary file beside the target and moved over it at the end, so an
export that fails leaves the target as it was; no cell can be a spreadsheet formula
(:func:`write_csv_atomically`).
"""

import csv
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ..core.gradebook import open_gradebook, sqlite_path, standings
from ..core.results import Status
from ..core.untrusted import csv_safe

CSV_COLUMNS = ("student_id", "name", "email", "lms_id", "assignment", "duedate", "submitted_at",
               "late_by", "late_penalty", "score", "max_score", "needs_manual", "status")
CANVAS_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
LAYOUTS = ("canvas", "moodle")
GRADED = "graded"       # the export's status of a student with a submission in the gradebook
MISSING = Status.MISSING  # ... and of one without


@dataclass(frozen=True)
class StudentGrade:
    """One student's standing on one assignment, as the gradebook holds it.

    Times are aware UTC datetimes. ``duedate`` is the student's own (extension
    included). A missing submission has ``status`` ``"missing"`` and ``None`` in
    every field that comes from a submission.
    """

    student_id: str
    first_name: str | None
    last_name: str | None
    email: str | None
    lms_id: str | None
    assignment: str
    duedate: datetime | None
    max_score: float
    status: str = MISSING
    submitted_at: datetime | None = None
    late_by: timedelta | None = None
    late_penalty: float | None = None
    score: float | None = None
    needs_manual: bool | None = None

    @property
    def name(self) -> str:
        """``First Last``, or what there is of it."""
        return " ".join(part for part in (self.first_name, self.last_name) if part)


def utc(moment: datetime | None) -> datetime | None:
    """A gradebook time (naive UTC) as an aware UTC datetime."""
    return None if moment is None else moment.replace(tzinfo=timezone.utc)


def student_grades(db_url: str, assignments: Iterable[str] | None = None) -> Iterator[StudentGrade]:
    """Every student of the gradebook at ``db_url`` on each assignment, lazily.

    ``assignments``: names, in the order wanted (default: every assignment of the
    gradebook, by name); students come by id within each. An assignment the gradebook
    does not know yet (not graded: ``export`` runs at any point of the term) has no
    rows. Scores, penalties and lateness are the gradebook's standings
    (:func:`autograder.core.gradebook.standings`), as every output shows them. A SQLite
    gradebook file that does not exist raises a ValueError.
    """
    if (path := sqlite_path(db_url)) is not None and not path.is_file():
        raise ValueError(f"no gradebook at {path}")
    with open_gradebook(db_url) as gb:
        known = {a.name: a for a in gb.assignments}
        names = [n for n in dict.fromkeys(assignments) if n in known] if assignments is not None \
            else sorted(known)
        students = sorted(gb.students, key=lambda s: s.id)
        for name in names:
            assignment = known[name]
            found = standings(db_url, name) or {}
            for student in students:
                known_ = dict(student_id=student.id, first_name=student.first_name,
                              last_name=student.last_name, email=student.email,
                              lms_id=student.lms_user_id, assignment=name,
                              max_score=float(assignment.max_score))
                standing = found.get(student.id)
                if standing is None:
                    yield StudentGrade(duedate=utc(assignment.duedate), **known_)
                    continue
                yield StudentGrade(
                    duedate=standing.duedate, status=GRADED, submitted_at=standing.submitted_at,
                    late_by=standing.late_by, late_penalty=standing.penalty, score=standing.final,
                    needs_manual=standing.needs_manual, **known_)


def points(x: float | None) -> str:
    """A score as the files write it: at most two decimals, no trailing zeros; ``None`` -> empty."""
    return "" if x is None else f"{x:.2f}".rstrip("0").rstrip(".")


def write_csv_atomically(path: str | Path, rows: Iterable[Iterable[str]]) -> None:
    """Write ``rows`` to ``path`` through a temporary file in the same folder.

    The temporary file is moved over ``path`` (``os.replace``) only once every row
    is written and on disk; if ``rows`` raises, it is removed and ``path`` is left
    as it was. The file is readable by its owner only (mode 0600: grades are private).
    Every cell goes through :func:`~autograder.core.untrusted.csv_safe`: a student id,
    a name or an email that starts like a formula (``=``, ``+``, ``-``, ``@``, a tab or
    a carriage return) is written as text, numbers stay numbers.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"cannot write {path}: the folder {path.parent} does not exist")
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            # RFC 4180's CRLF: the writer then quotes every cell holding a CR or a LF (with "\n"
            # alone, a bare CR in a student's text went out unquoted and began a new row)
            csv.writer(f, lineterminator="\r\n").writerows([csv_safe(cell) for cell in row] for row in rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def csv_rows(grades: Iterable[StudentGrade]) -> Iterator[list[str]]:
    """The header and one row per grade, in :data:`CSV_COLUMNS` order."""
    yield list(CSV_COLUMNS)
    for g in grades:
        late_by = "" if g.late_by is None else f"{g.late_by.total_seconds() / 3600:.1f}"
        yield [g.student_id, g.name, g.email or "", g.lms_id or "", g.assignment,
               g.duedate.isoformat() if g.duedate else "",
               g.submitted_at.isoformat() if g.submitted_at else "",
               late_by, points(g.late_penalty), points(g.score), points(g.max_score),
               "" if g.needs_manual is None else str(g.needs_manual), g.status]


def export_csv(db_url: str, path: str | Path, assignments: Iterable[str] | None = None) -> None:
    """Write one row per student and assignment of the gradebook at ``db_url`` to ``path``.

    Columns (:data:`CSV_COLUMNS`): ``student_id``, ``name``, ``email``, ``lms_id``,
    ``assignment``, ``duedate`` (the student's, extension included) and
    ``submitted_at`` (ISO 8601, UTC), ``late_by`` (hours, one decimal),
    ``late_penalty`` and ``score`` (points, the penalty already taken off),
    ``max_score``, ``needs_manual`` (``True`` while a manually graded cell awaits
    its grade), ``status`` (``graded``, or ``missing`` with the submission's cells
    empty). ``assignments``: only these, in this order (default: all, by name).
    """
    write_csv_atomically(path, csv_rows(student_grades(db_url, assignments)))


def canvas_rows(grades: list[StudentGrade], names: list[str], max_scores: dict[str, float]):
    """Canvas's gradebook import: student columns, then one column per assignment."""
    yield list(CANVAS_COLUMNS) + names
    yield ["Points Possible", "", "", "", ""] + [points(max_scores[n]) for n in names]
    for student, scores in by_student(grades).items():
        g = scores[names[0]]
        label = ", ".join(p for p in (g.last_name, g.first_name) if p) or g.student_id
        yield [label, g.lms_id or "", "", "", ""] + [points(scores[n].score) for n in names]


def moodle_rows(grades: list[StudentGrade], names: list[str]):
    """Moodle's grade import: ``Email address``, then one column per assignment."""
    students = by_student(grades)
    unknown = sorted(s for s, scores in students.items() if not scores[names[0]].email)
    if unknown:
        raise ValueError(f"moodle: no email address in the gradebook for {', '.join(unknown)} "
                         "(add it to roster.csv and sync the roster)")
    yield ["Email address"] + names
    for scores in students.values():
        yield [scores[names[0]].email] + [points(scores[n].score) for n in names]


def by_student(grades: list[StudentGrade]) -> dict[str, dict[str, StudentGrade]]:
    """student id -> assignment -> grade, students in the order the grades come."""
    table: dict[str, dict[str, StudentGrade]] = {}
    for g in grades:
        table.setdefault(g.student_id, {})[g.assignment] = g
    return table


def export_lms(db_url: str, path: str | Path, layout: str,
               assignments: Iterable[str] | None = None) -> None:
    """Write the gradebook at ``db_url`` to ``path`` as an LMS gradebook import file.

    One row per gradebook student, one column per assignment (``assignments``, in
    this order; default: all, by name), holding the score after the late penalty;
    a missing submission is an empty cell, never 0.

    ``layout="canvas"``: Canvas's *Gradebook > Import* CSV. Columns ``Student``,
    ``ID``, ``SIS User ID``, ``SIS Login ID``, ``Section``, then the assignments, and
    a first data row ``Points Possible`` with each assignment's maximum. Canvas needs
    the header's student columns (``Section`` last, left empty here) and, in each
    row, the student's name (``Last, First``) and ``ID``, the Canvas user id: the
    roster's ``lms_id``. It matches a student by ``ID``, else by name, and shows the
    students it cannot match in its preview. An assignment column matches the Canvas
    assignment of the same title (``Title (canvas id)`` matches by id); an unknown
    title becomes a new assignment worth its ``Points Possible``. An empty cell is
    no score.

    ``layout="moodle"``: Moodle's *Grades > Import > CSV file*. Columns
    ``Email address``, then the assignments. In the import form pick, under
    *Identify user by*, ``Map from`` = ``Email address`` and ``Map to`` =
    ``Email address``; under *Grade item mappings*, map each assignment column to its
    grade item (or *New grade item*). An empty cell is no grade. Moodle gives a
    row with an empty identifier the grades to the student of the row before, so a
    student without an email in the gradebook raises a ValueError naming them.

    ValueError for an unknown layout; nothing is written then. An assignment not graded
    yet has no column.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown LMS layout {layout!r} (use {' or '.join(LAYOUTS)})")
    grades = list(student_grades(db_url, assignments))
    names = list(dict.fromkeys(g.assignment for g in grades))
    if not names:
        raise ValueError(f"nothing to export: no assignment graded in the gradebook {db_url}")
    max_scores = {g.assignment: g.max_score for g in grades}
    rows = canvas_rows(grades, names, max_scores) if layout == "canvas" else moodle_rows(grades, names)
    write_csv_atomically(path, rows)
