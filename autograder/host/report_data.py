"""What the instructor's report shows, computed from the gradebook and the run records.

The gradebook is the one source of grades: every score, every test cell's pass or fail,
every late penalty and manual grade here comes from nbgrader's tables, read with plain SQL
that works on SQLite and PostgreSQL alike and *streamed* (``stream_results``/``yield_per``:
a server-side cursor on PostgreSQL, SQLite's row-by-row cursor), one submission at a time,
never a whole ORM graph. What a class keeps is small and fixed per student (a score, a
bit set of failed parts), so memory grows with the class size only by a few numbers a
student, not with the rows read.

Beside it, the records ``grade`` already keeps, read as data (every string in them may be
hostile): the autograded notebooks (a failed test cell's ``error`` output holds the judge's
message), the ``.autograder.json`` stamps (seconds), ``grades.csv`` (limits hit, flags,
status) and ``roster.csv``.

* an assignment's parts and the concept each tests come from :mod:`autograder.host.parts`;
* :func:`assignment_stats`: everything one assignment's page shows
  (:class:`AssignmentStats`);
* :func:`term_stats`: the student-by-assignment matrix and the early warnings
  (:class:`TermStats`);
* :func:`normalize_message`: a failure message with numbers and ids made generic, so that
  the same mistake counts once;
* :func:`co_failures`: which parts fail together more than chance says (Fisher's exact
  test, Bonferroni-corrected, with the phi coefficient and the lift as effect sizes);
* :class:`Pseudonyms`: stable pseudonyms for ``--anonymize``.
"""

import csv
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import groupby
from pathlib import Path

import nbformat

from ..checks._common import diagnosis_key, diagnosis_sentence
from ..core.cells import grade_id, is_test_cell
from ..core.gradebook import open_gradebook
from ..core.course_files import AUTOGRADED, FEEDBACK, GRADES_CSV, REPORT_SECRET, ROSTER_CSV, STAMP
from ..core.untrusted import csv_text
from .parts import Part, assignment_parts, part_by_test_cell

STREAM_ROWS = 2000             # rows fetched per round trip while streaming
EXAMPLES = 3                   # example feedback pages per failure message
ALPHA = 0.05                   # family-wise significance level of the co-failure tests
WARNING_MIN_ASSIGNMENTS = 3    # early warning: at least this many assignments so far ...
WARNING_SLOPE = -10.0          # ... and a least-squares trend of at most this many points/assignment


# -- the parts of an assignment -------------------------------------------------------------
# -- failure messages -----------------------------------------------------------------------
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b")
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w])")
_QUOTED_PATH = re.compile(r"(['\"])/[^'\"]*\1")
_SPACES = re.compile(r"\s+")
# kept as written: an array literal ("[[0. 0. 1. 1.]]" shows a layout) and a shape ("shape (3, 4)")
_KEPT = re.compile(r"\[[\[\]\s\d.eE+\-,TrueFalsnaif]*\]|(?<=shape )\([\d,\s]*\)")
MESSAGE_CHARS = 400
WHOLE_NOTEBOOK = "(whole notebook)"
NO_MESSAGES = "(the notebook could not be read, or none of its test cells ran)"


def normalize_message(message):
    """``message`` with what varies between students made generic, to group equal mistakes.

    Numbers (integers, decimals, scientific notation, signs) become ``#``, memory
    addresses ``0x#``, quoted absolute paths ``'/…'``; runs of white space one space; the
    result is cut to :data:`MESSAGE_CHARS` characters. ``"max error 3.1e-02 at (0, 2, 5)"``
    and ``"max error 4e-1 at (1, 0, 7)"`` both become ``"max error # at (#, #, #)"``. What
    shows a layout is kept: array literals (``[[0. 0. 1. 1.]]``) and the tuple after
    ``shape``.
    """
    text = _HEX.sub("0x#", str(message))
    text = _QUOTED_PATH.sub(r"\1/…\1", text)
    text = text.replace("\ue000", "")
    kept = _KEPT.findall(text)
    text = _NUMBER.sub("#", _KEPT.sub("\ue000", text))  # a private-use character holds each place
    text = re.sub("\ue000", lambda _: kept.pop(0), text)
    text = _SPACES.sub(" ", text).strip()
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 1] + "…"


def failure_messages(notebook_path):
    """``{grade id: the judge's message}`` of every test cell that failed in an autograded notebook.

    The message is the ``error`` output the judge put in the cell (``ename: evalue``); a
    notebook that cannot be read gives nothing (it is the student's file, as graded).
    """
    try:  # plain JSON: nbformat's schema validation would cost more than the whole report
        with open(notebook_path, encoding="utf-8") as f:
            nb = nbformat.from_dict(json.load(f))
    except Exception:  # noqa: BLE001 - any unreadable file: no messages, the scores still count
        return {}
    found = {}
    for cell in nb.cells:
        if cell.get("cell_type") != "code" or not is_test_cell(cell):
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                found[grade_id(cell)] = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"
    return found


@dataclass
class MessageGroup:
    """One mistake: a known mistake the checks diagnosed (``mistake`` is its key; every test
    cell that named it, each student counted once), else one normalised failure message of
    one test cell. ``count`` is the number of students."""

    cell: str
    message: str
    count: int = 0
    examples: list[str] = field(default_factory=list)   # students, the first EXAMPLES met
    mistake: str = ""
    students: set = field(default_factory=set, repr=False)

    def add(self, student, cell):
        if cell not in self.cell.split(", "):
            self.cell = ", ".join(sorted({*filter(None, self.cell.split(", ")), cell}))
        if student in self.students:
            return
        self.students.add(student)
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(student)


# -- co-failure -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PairStat:
    """Two parts' failures over the same students: the 2 x 2 table and its statistics."""

    first: str
    second: str
    both: int
    first_only: int
    second_only: int
    neither: int
    phi: float
    lift: float
    p_value: float
    significant: bool


def _log_comb(n, k):
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_greater(a, b, c, d):
    """One-sided p-value of Fisher's exact test that ``a`` (both fail) is larger than chance.

    The probability, with the margins fixed, of ``a`` or more students failing both
    (hypergeometric upper tail).
    """
    row, col, n = a + b, a + c, a + b + c + d
    if n == 0:
        return 1.0
    denominator = _log_comb(n, col)
    top = min(row, col)
    return min(1.0, sum(math.exp(_log_comb(row, k) + _log_comb(n - row, col - k) - denominator)
                        for k in range(a, top + 1) if col - k <= n - row))


def co_failures(failed_sets, parts, alpha=ALPHA):
    """Every pair of ``parts`` with its 2 x 2 table of failures over the class.

    ``failed_sets``: one ``frozenset`` of failed part names per submission. A pair fails
    together *more than chance* when Fisher's exact one-sided test gives p below
    ``alpha`` divided by the number of pairs (Bonferroni) and the phi coefficient is
    positive. Pairs come strongest first (phi).
    """
    n = len(failed_sets)
    counts = Counter(failed_sets)
    names = list(parts)
    pairs = [(x, y) for i, x in enumerate(names) for y in names[i + 1:]]
    out = []
    for x, y in pairs:
        a = sum(k for s, k in counts.items() if x in s and y in s)
        fx = sum(k for s, k in counts.items() if x in s)
        fy = sum(k for s, k in counts.items() if y in s)
        b, c = fx - a, fy - a
        d = n - a - b - c
        den = math.sqrt(fx * (n - fx) * fy * (n - fy))
        phi = (a * d - b * c) / den if den else 0.0
        lift = a * n / (fx * fy) if fx and fy else 0.0
        p = fisher_greater(a, b, c, d)
        out.append(PairStat(x, y, a, b, c, d, phi, lift, p,
                            phi > 0 and p < alpha / max(1, len(pairs))))
    return sorted(out, key=lambda s: (-s.phi, s.first, s.second))


# -- pseudonyms -----------------------------------------------------------------------------
class Pseudonyms:
    """Stable pseudonyms: ``s-`` and 10 hex digits of HMAC-SHA256(course secret, id).

    The secret is 32 random bytes in ``<root>/.report-secret`` (mode 0600, made on first
    use, never written into a report): the same id gets the same pseudonym in every report
    of the course, so reports can be compared across runs, and nobody without the secret can
    test a guessed id against a pseudonym (a plain or salted hash of a short student id
    could be brute-forced from the public salt). Delete the file to unlink old reports.
    ``enabled=False`` leaves ids as they are.
    """

    def __init__(self, root, enabled):
        self.enabled, self.key = enabled, None
        if enabled:
            path = Path(root) / REPORT_SECRET
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(secrets.token_bytes(32))
            self.key = path.read_bytes()
        self.seen = {}

    def __call__(self, student):
        if not self.enabled:
            return student
        if student not in self.seen:
            digest = hmac.new(self.key, student.encode("utf-8", "surrogateescape"), hashlib.sha256)
            self.seen[student] = "s-" + digest.hexdigest()[:10]
        return self.seen[student]

    def scrub(self, text):
        """``text`` with every id met so far replaced by its pseudonym (messages may quote ids)."""
        if not self.enabled or not self.seen:
            return text
        ids = sorted((s for s in self.seen if s), key=len, reverse=True)
        pattern = re.compile("|".join(re.escape(s) for s in ids))
        return pattern.sub(lambda m: self.seen[m.group()], text)


# -- reading the gradebook, streamed ----------------------------------------------------------
def _stream(gb, sql, params, columns):
    """Rows of ``sql`` with typed ``columns``, fetched :data:`STREAM_ROWS` at a time."""
    from sqlalchemy import text

    statement = text(sql).columns(**columns)
    connection = gb.db.connection(execution_options={"stream_results": True,
                                                     "yield_per": STREAM_ROWS})
    return connection.execute(statement, params)


def gradebook_assignments(gb):
    """``[(name, duedate)]`` of the gradebook's assignments, by due date then name."""
    from sqlalchemy import DateTime, String

    rows = _stream(gb, "SELECT name, duedate FROM assignment", {},
                   {"name": String, "duedate": DateTime})
    return sorted(((r.name, r.duedate) for r in rows),
                  key=lambda x: (x[1] is None, x[1] or datetime.min, x[0]))


# The cells of one assignment; grades are found through them (nbgrader's (cell_id, notebook_id)
# index), never by a scan of every grade of the gradebook.
ASSIGNMENT_CELLS = """SELECT c.id FROM base_cell c JOIN notebook nb ON nb.id = c.notebook_id
JOIN assignment ca ON ca.id = nb.assignment_id WHERE ca.name = :assignment"""

# One row per submission, its sums done by the database.
SUBMISSION_TOTALS = f"""
WITH sums AS (
  SELECT sn.assignment_id AS submission, SUM(COALESCE(g.auto_score, 0)) AS auto,
         SUM(COALESCE(g.manual_score, g.auto_score, 0) + COALESCE(g.extra_credit, 0)) AS total,
         MAX(CASE WHEN g.needs_manual_grade THEN 1 ELSE 0 END) AS needs_manual
  FROM grade g JOIN submitted_notebook sn ON sn.id = g.notebook_id
  WHERE g.cell_id IN ({ASSIGNMENT_CELLS}) GROUP BY sn.assignment_id),
penalties AS (
  SELECT sn.assignment_id AS submission, SUM(sn.late_submission_penalty) AS penalty
  FROM submitted_notebook sn JOIN notebook n ON n.id = sn.notebook_id
  JOIN assignment pa ON pa.id = n.assignment_id WHERE pa.name = :assignment
  GROUP BY sn.assignment_id)
SELECT sa.student_id AS student, sa.timestamp AS timestamp, sa.extension AS extension,
       sums.auto AS auto, sums.total AS total, sums.needs_manual AS needs_manual,
       penalties.penalty AS penalty
FROM submitted_assignment sa JOIN assignment a ON a.id = sa.assignment_id
LEFT JOIN sums ON sums.submission = sa.id LEFT JOIN penalties ON penalties.submission = sa.id
WHERE a.name = :assignment
ORDER BY sa.student_id
"""

# The autograded test cells below full marks: only failures cross the connection.
FAILED_TESTS = f"""
SELECT sa.student_id AS student, n.name AS notebook, bc.name AS cell
FROM grade g
JOIN grade_cells gc ON gc.id = g.cell_id
JOIN base_cell bc ON bc.id = g.cell_id
JOIN notebook n ON n.id = bc.notebook_id
JOIN submitted_notebook sn ON sn.id = g.notebook_id
JOIN submitted_assignment sa ON sa.id = sn.assignment_id
WHERE g.cell_id IN ({ASSIGNMENT_CELLS}) AND gc.cell_type = 'code'
  AND COALESCE(g.auto_score, 0) < gc.max_score - 1e-9
ORDER BY sa.student_id
"""


@dataclass
class Submission:
    """One student's submission of one assignment, from its gradebook rows."""

    student: str
    timestamp: datetime | None
    late_by: timedelta | None
    penalty: float
    auto: float              # the autograded total: before manual grades and the penalty
    final: float             # manual grades (over the automatic ones) and extra credit, minus the penalty, >= 0
    needs_manual: bool
    failed_tests: frozenset  # (notebook, grade id) of test cells below full marks


def submissions(gb, assignment, duedate):
    """Each :class:`Submission` of ``assignment``, by student id, streamed from the gradebook.

    Two streams in the database's order of student ids (unique within an assignment), merged
    here by equality alone, so the database's collation may be anything: the submissions with
    their sums, and the failed test cells (whose students are a subset, in the same order).
    """
    from sqlalchemy import DateTime, Float, Integer, Interval, String

    params = {"assignment": assignment}
    totals = _stream(gb, SUBMISSION_TOTALS, params, dict(
        student=String, timestamp=DateTime, extension=Interval, auto=Float, total=Float,
        needs_manual=Integer, penalty=Float))
    failed = groupby(_stream(gb, FAILED_TESTS, params,
                             dict(student=String, notebook=String, cell=String)),
                     key=lambda r: r.student)
    pending = next(failed, None)
    for r in totals:
        cells = frozenset()
        if pending is not None and pending[0] == r.student:
            cells = frozenset((f.notebook, f.cell) for f in pending[1])
            pending = next(failed, None)
        due = duedate + r.extension if duedate and r.extension else duedate
        # late when a penalty is stored (maybe 0): core.policy.apply_late_policy's mark, which
        # counts the grace period as on time
        late = r.penalty is not None and due and r.timestamp and r.timestamp > due
        late_by = r.timestamp - due if late else None
        penalty = r.penalty or 0.0
        yield Submission(r.student, r.timestamp, late_by, penalty, r.auto or 0.0,
                         max(0.0, (r.total or 0.0) - penalty), bool(r.needs_manual), cells)


def assignment_max_score(gb, assignment):
    from sqlalchemy import Float

    rows = _stream(gb, """
        SELECT SUM(COALESCE(gc.max_score, tc.max_score)) AS total FROM base_cell bc
        JOIN notebook n ON n.id = bc.notebook_id JOIN assignment a ON a.id = n.assignment_id
        LEFT JOIN grade_cells gc ON gc.id = bc.id LEFT JOIN task_cells tc ON tc.id = bc.id
        WHERE a.name = :assignment""", {"assignment": assignment}, {"total": Float})
    return float(next(iter(rows)).total or 0.0)


def gradebook_students(gb):
    """``(id, first name, last name)`` of every gradebook student, by id, streamed."""
    from sqlalchemy import String

    return _stream(gb, "SELECT id, first_name, last_name FROM student ORDER BY id", {},
                   {"id": String, "first_name": String, "last_name": String})


# -- the run records --------------------------------------------------------------------------
def grades_csv_rows(root, assignment):
    """``{student: row}`` of ``grades.csv`` for ``assignment`` (empty without the file).

    Cells are read back as they were before ``grade`` made them inert for spreadsheets
    (:func:`~autograder.core.untrusted.csv_text`): an id that looks like a formula is that id.
    """
    path = Path(root) / GRADES_CSV
    if not path.is_file():
        return {}
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        rows = ({k: csv_text(v or "") for k, v in row.items() if k} for row in csv.DictReader(f))
        return {row.get("student", ""): row for row in rows if row.get("assignment") == assignment}


SIMILAR = re.compile(r"(?P<function>\w+) ~ (?P<other>.+) \((?P<share>\d+)%\)")


def similar_pairs(runs):
    """``[(student, classmate, function, share %)]`` from ``grades.csv``'s ``similar`` column
    (``"fn ~ classmate (93%)"`` entries, as the driver writes them), each pair once."""
    pairs = set()
    for student, row in runs.items():
        for entry in filter(None, (row.get("similar") or "").split(";")):
            match = SIMILAR.fullmatch(entry)
            if match:
                a, b = sorted((student, match["other"]))
                pairs.add((a, b, match["function"], int(match["share"])))
    return sorted(pairs)


def graded_folders(root, assignment):
    """Students with an ``autograded/<student>/<assignment>/`` folder (one listing, not one look-up each)."""
    base = os.path.join(root, AUTOGRADED)
    try:
        names = os.listdir(base)
    except OSError:
        return set()
    return {n for n in names if os.path.isdir(os.path.join(base, n, assignment))}


def stamp_seconds(root, student, assignment):
    """Seconds the last grading of a submission took (its stamp), or None."""
    try:
        with open(os.path.join(root, AUTOGRADED, student, assignment, STAMP), encoding="utf-8") as f:
            return float(json.load(f)["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def roster_ids(root):
    """Student ids of ``roster.csv`` (None when the course has no roster)."""
    from .roster import read_roster

    path = Path(root) / ROSTER_CSV
    return [e.student_id for e in read_roster(path)] if path.is_file() else None


def feedback_pages(root, student, assignment):
    """Paths (relative to the course root) of a student's feedback pages of ``assignment``."""
    folder = Path(root) / FEEDBACK / student / assignment
    try:
        return sorted(p.relative_to(root).as_posix() for p in folder.glob("*.html"))
    except OSError:
        return []


# -- one assignment -----------------------------------------------------------------------------
@dataclass
class AssignmentStats:
    """What one assignment's page shows; student ids as they are (pseudonyms come later)."""

    assignment: str
    duedate: datetime | None
    max_score: float
    parts: list[Part]
    n_students: int                       # in the gradebook
    auto: list[float]                     # autograded totals, one per submission
    final: list[float]                    # after manual grades and late penalties
    test_passes: dict                     # (notebook, grade id) -> students who passed it
    n_submissions: int
    pairs: list[PairStat]
    messages: list[MessageGroup]          # most common first
    seconds: list[tuple[str, float]]      # (student, grading seconds), slowest first
    late: list[tuple[str, float, float]]  # (student, hours late, penalty)
    needs_manual: int
    limits: list[tuple[str, str]]         # (student, limits hit) from grades.csv
    flags: list[tuple[str, str]]          # (student, flags) from grades.csv
    similar: list[tuple[str, str, str, int]]  # (student, classmate, function, share %): grades.csv
    statuses: Counter                     # grades.csv status -> count
    missing: list[str]                    # roster students with no submission
    not_on_roster: list[str]


def assignment_stats(root, db_url, assignment):
    """Read one assignment's gradebook rows (streamed) and run records into :class:`AssignmentStats`."""
    root = Path(root)
    parts = assignment_parts(root, assignment)
    where = part_by_test_cell(parts)
    runs = grades_csv_rows(root, assignment)
    with open_gradebook(db_url) as gb:
        dates = dict(gradebook_assignments(gb))
        if assignment not in dates:
            raise ValueError(f"no assignment {assignment!r} in the gradebook: grade it first")
        duedate = dates[assignment]
        max_score = assignment_max_score(gb, assignment)
        n_students = sum(1 for _ in gradebook_students(gb))
        auto, final, failures, late, seconds = [], [], [], [], []
        groups, submitted, needs_manual, failed = {}, set(), 0, Counter()
        graded = graded_folders(root, assignment)
        for sub in submissions(gb, assignment, duedate):
            submitted.add(sub.student)
            auto.append(sub.auto)
            final.append(sub.final)
            needs_manual += sub.needs_manual
            failed.update(sub.failed_tests)
            failures.append(frozenset(where[c] for c in sub.failed_tests if c in where))
            if sub.late_by:
                late.append((sub.student, sub.late_by.total_seconds() / 3600, sub.penalty))
            if sub.student not in graded:
                continue
            took = stamp_seconds(root, sub.student, assignment)
            if took is not None:
                seconds.append((sub.student, took))
            if sub.failed_tests:
                collect_messages(root, sub, assignment, groups, where)
    roster = roster_ids(root)
    return AssignmentStats(
        assignment=assignment, duedate=duedate, max_score=max_score, parts=parts,
        n_students=n_students, auto=auto, final=final, test_passes={c: len(auto) - failed[c] for p in parts for c in p.tests},
        n_submissions=len(auto),
        pairs=co_failures(failures, [p.name for p in parts if p.tests]),
        messages=sorted(groups.values(), key=lambda g: (-g.count, g.cell, g.message)),
        seconds=sorted(seconds, key=lambda x: (-x[1], x[0])), late=late, needs_manual=needs_manual,
        limits=[(s, r["limits"]) for s, r in sorted(runs.items()) if r.get("limits")],
        flags=[(s, r["flags"]) for s, r in sorted(runs.items()) if r.get("flags")],
        similar=similar_pairs(runs),
        statuses=Counter(r.get("status", "") for r in runs.values()),
        missing=sorted(set(roster) - submitted) if roster is not None else [],
        not_on_roster=sorted(submitted - set(roster)) if roster is not None else [])


def collect_messages(root, sub, assignment, groups, where=None):
    """Add the failures of ``sub``'s autograded notebooks to ``groups``: a diagnosed mistake
    (the checks' ``[mistake: key]``) once per student whatever cells it failed, any other
    message by test cell and normalised text, and a notebook that gave no message at all
    (unreadable, or no test cell ran) as one row, not one per cell. With ``where`` (test cell ->
    part, :func:`autograder.host.parts.part_by_test_cell`), an undiagnosed failure of a part in which a test cell of the same
    student names a mistake (a visible test of the part beside the hidden one that diagnosed it)
    counts as that mistake: the mistake is counted once, not once more as a message."""
    notebooks = {nb for nb, _ in sub.failed_tests}
    for notebook in sorted(notebooks):
        path = Path(root) / AUTOGRADED / sub.student / assignment / f"{notebook}.ipynb"
        found = failure_messages(path)
        if not found:
            group = groups.setdefault(("", NO_MESSAGES), MessageGroup(WHOLE_NOTEBOOK, NO_MESSAGES))
            group.add(sub.student, WHOLE_NOTEBOOK)
            continue
        cells = sorted(cell for nb, cell in sub.failed_tests if nb == notebook)
        raws = {cell: found.get(cell, "(no message: the cell did not run)") for cell in cells}
        diagnosed = {}  # part -> (key, message) of its first diagnosed cell
        for cell in cells:
            key, part = diagnosis_key(raws[cell]), (where or {}).get((notebook, cell))
            if key and part is not None:
                diagnosed.setdefault(part, (key, raws[cell]))
        for cell in cells:
            raw = raws[cell]
            key = diagnosis_key(raw)
            if not key and where and (notebook, cell) in where and where[notebook, cell] in diagnosed:
                key, raw = diagnosed[where[notebook, cell]]
            if key:
                group = groups.setdefault(("mistake", key), MessageGroup(
                    cell, normalize_message(diagnosis_sentence(raw)), mistake=key))
            else:
                message = normalize_message(raw)
                group = groups.setdefault((cell, message), MessageGroup(cell, message))
            group.add(sub.student, cell)


# -- the term -------------------------------------------------------------------------------
TERM_SCORES = """
WITH totals AS (
  SELECT sn.assignment_id AS submission,
         SUM(COALESCE(g.manual_score, g.auto_score, 0) + COALESCE(g.extra_credit, 0)) AS total
  FROM grade g JOIN submitted_notebook sn ON sn.id = g.notebook_id GROUP BY sn.assignment_id),
penalties AS (
  SELECT assignment_id AS submission, SUM(late_submission_penalty) AS penalty
  FROM submitted_notebook GROUP BY assignment_id)
SELECT sa.student_id AS student, a.name AS assignment, sa.timestamp AS timestamp,
       sa.extension AS extension, totals.total AS total, penalties.penalty AS penalty
FROM submitted_assignment sa JOIN assignment a ON a.id = sa.assignment_id
LEFT JOIN totals ON totals.submission = sa.id
LEFT JOIN penalties ON penalties.submission = sa.id
"""  # one pass of grouped sums (a correlated subquery per submission scans nbgrader's tables)


@dataclass(frozen=True)
class Cell:
    """One student on one assignment in the term matrix: percent of the maximum, or missing."""

    percent: float | None      # None: no submission
    late: bool = False


@dataclass
class TermStats:
    assignments: list[str]
    max_scores: dict
    students: list[tuple[str, str]]        # (id, name as the gradebook has it)
    matrix: dict                            # student -> [Cell per assignment]
    warnings: list[tuple[str, float, list]]  # (student, slope in points/assignment, percents)


def term_stats(db_url):
    """The whole term from the gradebook: one aggregated row per submission, streamed."""
    from sqlalchemy import DateTime, Float, Interval, String

    with open_gradebook(db_url) as gb:
        order = gradebook_assignments(gb)
        names = [name for name, _ in order]
        dues = dict(order)
        index = {name: i for i, name in enumerate(names)}
        max_scores = {name: assignment_max_score(gb, name) for name in names}
        students = [(r.id, " ".join(p for p in (r.first_name, r.last_name) if p))
                    for r in gradebook_students(gb)]
        matrix = {s: [Cell(None)] * len(names) for s, _ in students}
        rows = _stream(gb, TERM_SCORES, {}, dict(
            student=String, assignment=String, timestamp=DateTime, extension=Interval,
            total=Float, penalty=Float))
        for r in rows:
            due = dues[r.assignment]
            due = due + r.extension if due and r.extension else due
            late = bool(r.penalty is not None and due and r.timestamp and r.timestamp > due)
            top = max_scores[r.assignment]
            score = max(0.0, (r.total or 0.0) - (r.penalty or 0.0))
            row = matrix.setdefault(r.student, [Cell(None)] * len(names))
            row[index[r.assignment]] = Cell(100.0 * score / top if top else 0.0, late)
    started = [i for i in range(len(names))
               if any(row[i].percent is not None for row in matrix.values())]
    return TermStats(names, max_scores, students, matrix, early_warnings(matrix, started))


def trend(values):
    """Least-squares slope of ``values`` against 0, 1, 2, ..."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    sxx = sum((i - mean_x) ** 2 for i in range(n))
    return sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values)) / sxx if sxx else 0.0


def early_warnings(matrix, started):
    """Students whose scores fall across the term, steepest first.

    The rule: over the assignments that at least one student has handed in so far (in
    term order), with a missing submission counted as 0 %, at least
    :data:`WARNING_MIN_ASSIGNMENTS` of them, the least-squares slope of the student's
    percentages is :data:`WARNING_SLOPE` points per assignment or steeper.
    """
    if len(started) < WARNING_MIN_ASSIGNMENTS:
        return []
    out = []
    for student, row in matrix.items():
        values = [row[i].percent or 0.0 for i in started]
        slope = trend(values)
        if slope <= WARNING_SLOPE:
            out.append((student, slope, values))
    return sorted(out, key=lambda x: (x[1], x[0]))


def summary_numbers(values):
    """``(mean, median)`` of ``values`` (``(None, None)`` when empty)."""
    return (statistics.fmean(values), statistics.median(values)) if values else (None, None)
