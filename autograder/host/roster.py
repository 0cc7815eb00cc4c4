"""The class roster: who is enrolled, and how the LMS knows them.

``roster.csv`` (at the course root, say) has a header row naming exactly its four
columns, in any order and any case: ``student_id``, ``name``, ``email`` and ``lms_id``
(cells may be empty, except ``student_id``). A column the grader does not know (an LMS's
``Canvas ID`` for ``lms_id``, say) or one missing is an error that names the columns
expected: a misnamed column would otherwise be read as empty. ``name`` is split into
first and last name at its last space (``Ada King Lovelace`` -> ``Ada King`` / ``Lovelace``).

* :func:`read_roster`: the entries of the file, with a one-line error naming the
  file, the row and the problem for anything the gradebook could not hold;
* :func:`sync_roster`: the gradebook's students take the roster's names, emails
  and LMS ids (an empty cell clears nothing; students are never removed: their grades stay);
* :func:`roster_report`: who on the roster has not submitted an assignment, and
  whose submission is not on the roster.
"""

import csv
from dataclasses import dataclass
from pathlib import Path

from ..core.gradebook import open_gradebook, writing
from ..core.untrusted import printable

COLUMNS = ("student_id", "name", "email", "lms_id")


@dataclass(frozen=True)
class RosterEntry:
    """One student of the roster; an empty cell is ``None``."""

    student_id: str
    first_name: str | None = None
    last_name: str | None = None
    email: str | None = None
    lms_id: str | None = None


@dataclass(frozen=True)
class RosterReport:
    """One assignment against the roster, each list sorted by student id.

    ``missing``: roster students with no submission; ``not_on_roster``: students who
    submitted but are not on the roster.
    """

    assignment: str
    missing: tuple[str, ...]
    not_on_roster: tuple[str, ...]


def split_name(name: str) -> tuple[str | None, str | None]:
    """``(first, last)`` split at the last space; a single word is a first name."""
    first, _, last = name.strip().rpartition(" ")
    if not first:
        return (last or None), None
    return first.strip(), last


def student_id_problem(student_id: str) -> str | None:
    """Why ``student_id`` cannot name a student (it names a folder under ``submitted/``), or None."""
    if not student_id:
        return "empty student_id"
    if "/" in student_id or student_id in (".", ".."):
        return f"student_id {student_id!r} cannot be a folder name (no '/', not '.' or '..')"
    return None


def read_roster(path: str | Path) -> list[RosterEntry]:
    """The entries of the roster CSV at ``path``, in file order.

    Rows are numbered as a spreadsheet shows them (the header is row 1); blank rows
    are skipped. ValueError, one line naming the file (and the row), for: a column
    that is not one of :data:`COLUMNS` or one of them missing, a column named twice,
    an empty id, an id with ``/``, an id given twice.
    """
    path = Path(path)
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    expected = f"expected the columns {','.join(COLUMNS)}"
    if not rows:
        raise ValueError(f"{path}: empty file, {expected}")
    header = [name.strip().lower() for name in rows[0]]
    for name in header:
        if header.count(name) > 1:
            raise ValueError(f"{path}, row 1: column '{printable(name)}' appears {header.count(name)} times")
    unknown = [name for name in header if name not in COLUMNS]
    absent = [name for name in COLUMNS if name not in header]
    if unknown or absent:
        found = "; ".join(part for part in (
            "unknown column(s) " + ", ".join(f"'{printable(n)}'" for n in unknown) if unknown else "",
            f"no {', '.join(absent)} column" if absent else "") if part)
        raise ValueError(f"{path}, row 1: {found} ({expected}, in any order)")
    index = {name: header.index(name) for name in COLUMNS if name in header}
    entries, first_row = [], {}
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        cells = {name: row[i].strip() if i < len(row) else "" for name, i in index.items()}
        student_id = cells["student_id"]
        problem = student_id_problem(student_id)
        if problem is None and student_id in first_row:
            problem = f"student_id {student_id!r} already on row {first_row[student_id]}"
        if problem:
            raise ValueError(f"{path}, row {number}: {problem}")
        first_row[student_id] = number
        first, last = split_name(cells.get("name", ""))
        entries.append(RosterEntry(student_id, first, last, cells.get("email") or None,
                                   cells.get("lms_id") or None))
    return entries


def sync_roster(db_url: str, entries: list[RosterEntry]) -> None:
    """Create or update every roster student in the gradebook at ``db_url``.

    The roster is the authority: first and last name, email and LMS user id are set
    to what the entry holds; an empty cell (``None``) leaves the gradebook's value as it
    is, so a roster never clears an LMS id (or a name, an email) silently. Students not
    on the roster are left as they are, with their grades.
    """
    with writing(db_url), open_gradebook(db_url) as gb:
        for entry in entries:
            given = dict(first_name=entry.first_name, last_name=entry.last_name,
                         email=entry.email, lms_user_id=entry.lms_id)
            gb.update_or_create_student(entry.student_id,
                                        **{k: v for k, v in given.items() if v is not None})


def roster_report(db_url: str, assignment: str, entries: list[RosterEntry]) -> RosterReport:
    """Who on the roster did not submit ``assignment``, and who submitted without being on it.

    ValueError if the gradebook at ``db_url`` does not know the assignment.
    """
    from nbgrader.api import MissingEntry

    with open_gradebook(db_url) as gb:
        try:
            submitted = {s.student_id for s in gb.find_assignment(assignment).submissions}
        except MissingEntry:
            raise ValueError(f"no assignment {assignment!r} in the gradebook {db_url}") from None
    enrolled = {entry.student_id for entry in entries}
    return RosterReport(assignment, tuple(sorted(enrolled - submitted)),
                        tuple(sorted(submitted - enrolled)))
