"""The nbgrader gradebook, read and written in one place.

* :func:`read_scores`: a worker reads one submission's scores out of its scratch
  gradebook into :class:`~autograder.core.results.NotebookScores`;
* :func:`record`: the driver copies a :class:`~autograder.core.results.StudentResult`
  into the class gradebook (replacing earlier autograded scores, keeping manual
  ones, as nbgrader does) and returns the submission's total;
* :func:`standings`: every submission's :class:`Standing` (total, late penalty, lateness):
  what every output of a score reads (``grades.csv``, exports, the LMS files, the report);
* :func:`keep_similarity`: the hashed shingles of each graded submission's functions
  (:mod:`autograder.core.similarity`) and the pairs found, in two tables of their own
  beside nbgrader's, so a student graded in any run is compared with the whole class;
* :func:`open_gradebook`: a gradebook at any SQLAlchemy URL, with a one-line error
  for a URL that cannot be one (a missing folder, a file that is not a database, a
  PostgreSQL server that cannot be reached);
* :func:`keep_engines_in_nbgrader` and :func:`make_scratch`: a worker's nbgrader opens its
  scratch gradebook on one kept engine, whose commits do not wait for the disk
  (:func:`drop_engine` forgets it when the gradebook goes);
* :func:`writing` and :func:`advisory_lock`: with a PostgreSQL gradebook, runs on
  several hosts serialize the writes that may meet (students, the assignment, the late
  policy; a result's own rows need not wait), and a run holds its assignment, through
  PostgreSQL advisory locks (an SQLite gradebook is one file on one machine: the
  course lock of :mod:`autograder.host.driver` serializes its runs).

``postgresql://`` URLs go through psycopg 3 (pinned), whatever SQLAlchemy's default
driver for the scheme (:func:`engine_url`).
"""

import hashlib
import os
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from .results import CellScore, NotebookScores, Status, needs_manual_grade


class GradebookError(Exception):
    """A gradebook that cannot be opened; the message is one line for the instructor."""


POSTGRES = "postgresql+psycopg://"


def gradebook_faults():
    """The exceptions of a gradebook that cannot be used now (locked by another process, not
    a database, corrupt, its server gone): :class:`GradebookError` and what SQLAlchemy,
    SQLite and psycopg raise below it. Each is a fault of the grading host: one line
    (:func:`fault_line`), never a traceback and never a grade."""
    import sqlite3

    import sqlalchemy.exc

    faults = [GradebookError, sqlalchemy.exc.SQLAlchemyError, sqlite3.Error]
    try:
        import psycopg
    except ImportError:
        pass
    else:
        faults.append(psycopg.Error)
    return tuple(faults)


def fault_line(error):
    """One line for an exception of :func:`gradebook_faults`."""
    if isinstance(error, GradebookError):
        return str(error)
    reason = str(getattr(error, "orig", None) or error).strip().splitlines()
    return f"the gradebook cannot be used ({reason[0] if reason else type(error).__name__})"


def engine_url(db_url):
    """``db_url`` as SQLAlchemy should open it: ``postgresql://`` and ``postgres://`` use psycopg 3."""
    for scheme in ("postgresql://", "postgres://"):
        if db_url.startswith(scheme):
            return POSTGRES + db_url[len(scheme):]
    return db_url


def is_postgres(db_url):
    return engine_url(db_url).startswith(POSTGRES)


SQLITE = "sqlite:///"


def sqlite_url(path):
    """The URL of the SQLite gradebook file ``path``."""
    return f"{SQLITE}{path}"


def sqlite_path(db_url):
    """The file of an SQLite gradebook URL (``sqlite:///PATH``), or None for any other URL.

    The one place the grader takes a URL apart: the driver, the workers, the command line
    and the exports ask here whether a gradebook is a file, and which.
    """
    return Path(db_url[len(SQLITE):]) if db_url.startswith(SQLITE) else None


def libpq_url(db_url):
    """The ``postgresql://`` form of a PostgreSQL gradebook URL, for psycopg itself."""
    return "postgresql://" + engine_url(db_url)[len(POSTGRES):]


def connect_postgres(db_url, application_name="autograder"):
    """A psycopg connection (autocommit) to a PostgreSQL gradebook, or :class:`GradebookError`."""
    import psycopg

    try:
        return psycopg.connect(libpq_url(db_url), autocommit=True, connect_timeout=10,
                               application_name=application_name[:63])
    except psycopg.Error as error:
        where = libpq_url(db_url).split("@")[-1]
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise GradebookError(f"--db: cannot connect to the PostgreSQL gradebook at {where} "
                             f"({reason})") from None


def check_url(db_url):
    """Raise :class:`GradebookError` if ``db_url`` cannot be a gradebook, without creating one."""
    if is_postgres(db_url):
        connect_postgres(db_url).close()
    elif (path := sqlite_path(db_url)) is not None:
        if not path.parent.is_dir():
            raise GradebookError(f"--db: the folder {path.parent} does not exist")
        if path.exists():
            with open(path, "rb") as f:
                head = f.read(16)
            if head and head != b"SQLite format 3\x00":
                raise GradebookError(f"--db: {path} is not an SQLite database")


@contextmanager
def open_gradebook(db_url):
    """nbgrader's ``Gradebook`` at ``db_url`` (created if new), SQLAlchemy warnings silenced.

    The first open in a process checks the URL, creates the tables if they are missing and
    keeps the SQLAlchemy engine; later opens of the same gradebook are a new session on
    that engine (:func:`_reopened`). A class run records result after result: a new engine
    each time would compile every statement of nbgrader's ORM again, most of a record's cost.
    An SQLite gradebook keeps no connection open between opens (its pool is emptied at the
    end of each). A PostgreSQL one keeps one, checked before each use, since a new server
    session per result cost a third of a record; a child forked while it is open leaves it
    to its parent (:func:`_forget_engines`).
    """
    import sqlalchemy.exc
    from nbgrader.api import Gradebook

    from .nbgrader_config import prepare_nbgrader

    db_url = engine_url(db_url)
    key = _engine_key(db_url)
    with warnings.catch_warnings():
        # nbgrader's update_or_create_submission trips harmless SQLAlchemy autoflush warnings
        warnings.simplefilter("ignore", sqlalchemy.exc.SAWarning)
        try:
            if key in _ENGINES:
                gb = _reopened(_ENGINES[key])
            else:
                check_url(db_url)
                prepare_nbgrader()
                gb = Gradebook(db_url)
                if is_postgres(db_url):
                    _course_row(gb)
                    gb.db.remove()
                    gb.engine.dispose()
                    gb = _reopened(sqlalchemy.create_engine(db_url, future=True, pool_size=1,
                                                            pool_pre_ping=True))
                if key is not None:
                    _ENGINES[key] = gb.engine
        except sqlalchemy.exc.SQLAlchemyError as error:
            reason = str(getattr(error, "orig", None) or "").strip().splitlines()
            raise GradebookError(f"--db: cannot open the gradebook "
                                 f"({reason[0] if reason else type(error).__name__})") from None
        try:
            yield gb
        finally:
            gb.db.remove()
            if not is_postgres(db_url):
                gb.engine.dispose()  # connections closed; the engine and its statement cache stay


_ENGINES = {}  # _engine_key(url) -> engine of a gradebook this process has opened


def _forget_engines():
    """In a forked child: drop the parent's engines without touching their connections."""
    for engine in _ENGINES.values():
        engine.dispose(close=False)
    _ENGINES.clear()


os.register_at_fork(after_in_child=_forget_engines)


def drop_engine(db_url):
    """Close and forget the engines this process keeps for the gradebook at ``db_url``.

    For a gradebook that is about to be removed with its folder: a Dask worker lives through
    many runs, each with a scratch gradebook of its own, and would otherwise keep each run's
    engine (and its statement cache) for the rest of its life.
    """
    url = engine_url(db_url)
    for key in [key for key in _ENGINES if key[0] == url]:
        _ENGINES.pop(key).dispose()


def _engine_key(db_url):
    """What identifies a gradebook for reuse: the URL, and for SQLite the file's inode.

    A deleted and re-created SQLite file is a new gradebook (tables to create); a file that
    does not exist yet has no key (it is created, then the next open keeps it).
    """
    if (path := sqlite_path(db_url)) is not None:
        try:
            return db_url, path.stat().st_ino
        except OSError:
            return None
    return db_url, None


def _reopened(engine, gb=None, course_id="default_course", authenticator=None):
    """nbgrader's ``Gradebook`` as a new session on a kept engine, without its set-up."""
    from nbgrader.api import Gradebook
    from sqlalchemy.orm import scoped_session, sessionmaker

    gb = Gradebook.__new__(Gradebook) if gb is None else gb
    gb.engine = engine
    gb.db = scoped_session(sessionmaker(autoflush=True, bind=engine, future=True))
    gb.course_id, gb.authenticator = course_id, authenticator  # as Gradebook() sets them
    return gb


def keep_engines_in_nbgrader():
    """Make nbgrader's own ``Gradebook(url)`` of an SQLite gradebook reuse this process's engine.

    nbgrader's converters and preprocessors open a new ``Gradebook`` for each step: nine per
    autograded notebook and one more for its feedback page. Each made a new SQLAlchemy engine,
    so each compiled its statements again (about 40 compilations per notebook, most of
    nbgrader's own gradebook time) and inspected and created the tables again. After this,
    the first open of a file does all that and keeps the engine (as :func:`open_gradebook`
    does); a later one is a new session on it that checks the course row, as nbgrader's
    set-up does. ``close()`` still empties the engine's pool, so no connection stays open.
    Only SQLite gradebooks: a worker's scratch gradebook is one, private to its process.
    """
    from nbgrader.api import Gradebook

    made = Gradebook.__init__
    if getattr(made, "keeps_engines", False):
        return

    def __init__(self, db_url, course_id="default_course", authenticator=None):
        key = _engine_key(db_url) if sqlite_path(db_url) is not None else None
        if key not in _ENGINES:
            made(self, db_url, course_id, authenticator)
            if key is not None:
                _ENGINES[key] = self.engine
            return
        _reopened(_ENGINES[key], self, course_id, authenticator)
        self.check_course(course_id=course_id)

    __init__.keeps_engines = True
    Gradebook.__init__ = __init__


def make_scratch(db_url):
    """Let this process write the SQLite gradebook at ``db_url`` without waiting for the disk.

    For a worker's scratch gradebook only: a copy of the run's template, made afresh when the
    worker starts, read by nobody else, and thrown away at the end of the run, so a commit
    need not survive a crash: its connections run with ``synchronous=OFF`` and the rollback
    journal in memory. A transaction still rolls back whole. (What it saves per notebook is in
    ``benchmarks/README.md``.)
    """
    from sqlalchemy import event

    if sqlite_path(db_url) is None:
        raise ValueError(f"a scratch gradebook is an SQLite file, not {db_url}")
    with open_gradebook(db_url) as gb:
        engine = gb.engine
    if not event.contains(engine, "connect", _without_disk_waits):
        event.listen(engine, "connect", _without_disk_waits)


def _without_disk_waits(connection, _record):
    cursor = connection.cursor()
    cursor.execute("PRAGMA synchronous = OFF")
    cursor.execute("PRAGMA journal_mode = MEMORY")
    cursor.close()


def _course_row(gb):
    """Give a PostgreSQL gradebook the course row nbgrader's converters refer to.

    nbgrader's converters record assignments under ``CourseDirectory.course_id``, empty by
    default, and create no course row for the empty id; SQLite does not check the foreign
    key, PostgreSQL does. So the empty course exists in every PostgreSQL gradebook.
    """
    from nbgrader.api import Course

    if gb.db.query(Course).filter(Course.id == "").first() is None:
        gb.db.add(Course(id=""))
        gb.db.commit()


def lock_key(name):
    """A signed 64-bit advisory-lock key for ``name`` (stable across hosts and runs)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def advisory_lock(db_url, name, label="autograder", wait=True):
    """Hold the PostgreSQL session advisory lock ``name`` on a connection of its own.

    ``label`` becomes the connection's ``application_name``, so a refused run can say who
    holds the lock (:func:`lock_holder`). Yields ``True`` once the lock is held; with
    ``wait=False`` it yields ``None`` at once, holding nothing, when another session holds
    it. The server releases the lock when the connection closes, however this process ends.
    """
    key = lock_key(name)
    with connect_postgres(db_url, label) as conn:
        if wait:
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        elif not conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
            yield None
            return
        yield True


def lock_holder(db_url, name):
    """``application_name`` of the session that holds advisory lock ``name``, or None."""
    key = lock_key(name) & 0xFFFFFFFFFFFFFFFF
    with connect_postgres(db_url) as conn:
        row = conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
            " AND l.classid::text::bigint = %s AND l.objid::text::bigint = %s",
            (key >> 32, key & 0xFFFFFFFF)).fetchone()
    return row[0] if row else None


def writing(db_url):
    """Context in which one process at a time writes the gradebook (PostgreSQL: across hosts).

    nbgrader creates a student or a submission row by "look it up, else insert": two runs
    on different assignments that record the same new student at once would both insert.
    """
    return advisory_lock(db_url, WRITE_LOCK) if is_postgres(db_url) else nullcontext()


WRITE_LOCK = "autograder:write"


def read_scores(db_url, assignment, student):
    """``(timestamp, [NotebookScores])`` of one submission, or ``(None, [])``."""
    from nbgrader.api import MissingEntry

    with open_gradebook(db_url) as gb:
        try:
            sub = gb.find_submission(assignment, student)
        except MissingEntry:
            return None, []
        return sub.timestamp, [
            NotebookScores(
                name=nb.name,
                grades=tuple(CellScore(g.name, g.auto_score, g.max_score) for g in nb.grades),
                comments=tuple((c.name, c.auto_comment) for c in nb.comments))
            for nb in sub.notebooks]


@dataclass(frozen=True)
class Standing:
    """One submission's score as the gradebook holds it: the one score every output shows.

    ``score``: the sum of its cells' scores, a manual score taking precedence over the
    automatic one (nbgrader's ``SubmittedAssignment.score``); ``penalty``: the late penalty
    stored by :func:`autograder.core.policy.apply_late_policy`, the one writer of
    penalties; ``late``: whether it counts as late (a penalty is stored, maybe 0; inside
    the grace period is on time); ``late_by``: how late, zero when on time; ``final``:
    ``max(0, score - penalty)``, what every file and page shows. Times are aware UTC;
    ``duedate`` is the student's own (extension included).
    """

    student: str
    score: float
    max_score: float
    penalty: float = 0.0
    late: bool = False
    late_by: timedelta = timedelta(0)
    submitted_at: datetime | None = None
    duedate: datetime | None = None
    needs_manual: bool = False

    @property
    def final(self) -> float:
        return max(0.0, self.score - self.penalty)


def _aware(moment):
    return None if moment is None else moment.replace(tzinfo=timezone.utc)


def standings(db_url, assignment):
    """``{student: Standing}`` of every submission of ``assignment``; ``None`` when the
    gradebook does not know the assignment (not graded yet)."""
    from nbgrader.api import MissingEntry

    with open_gradebook(db_url) as gb:
        try:
            record = gb.find_assignment(assignment)
        except MissingEntry:
            return None
        found = {}
        for sub in record.submissions:
            late = any(nb.late_submission_penalty is not None for nb in sub.notebooks)
            found[sub.student_id] = Standing(
                sub.student_id, float(sub.score), float(sub.max_score),
                float(sub.late_submission_penalty or 0.0) if late else 0.0, late,
                timedelta(seconds=sub.total_seconds_late) if late else timedelta(0),
                _aware(sub.timestamp), _aware(sub.duedate), bool(sub.needs_manual_grade))
        return found


FINGERPRINTS = "autograder_fingerprints"  # the gradebook's tables that are not nbgrader's
SIMILAR = "autograder_similar"


def _tables(gb, db_url):
    """``(fingerprints, similar)``, the copy detector's tables, created in the gradebook if they
    are not there yet (under the write lock: runs of two assignments may meet on a new
    PostgreSQL gradebook)."""
    from sqlalchemy import Column, Float, LargeBinary, MetaData, String, Table, inspect

    meta = MetaData()
    prints = Table(FINGERPRINTS, meta,
                   Column("assignment", String(128), primary_key=True),
                   Column("student", String(128), primary_key=True),
                   Column("function", String(256), primary_key=True),
                   Column("prints", LargeBinary, nullable=False))
    similar = Table(SIMILAR, meta,
                    Column("assignment", String(128), primary_key=True),
                    Column("student", String(128), primary_key=True),
                    Column("other", String(128), primary_key=True),
                    Column("function", String(256), primary_key=True),
                    Column("share", Float, nullable=False))
    found = inspect(gb.engine)
    if not (found.has_table(FINGERPRINTS) and found.has_table(SIMILAR)):
        with writing(db_url):
            meta.create_all(gb.engine, checkfirst=True)
    return prints, similar


def keep_similarity(db_url, assignment, students, find_pairs):
    """Keep the copy detector's record of ``assignment``: each student of ``students``
    (``{student: {function: frozenset of 64-bit ints}}``, an empty dict for a submission with
    nothing to compare) replaces what was kept of them, their pairs are found again against
    the whole class kept (``find_pairs(students, kept)``, ``kept`` an iterable of
    ``(student, function, prints)`` rows read one at a time, theirs included; it returns
    ``[(student, other, function, share)]``), and the pairs of everyone else stay as they
    were. Returns every kept pair of the assignment, ``student < other``.
    """
    from array import array

    from sqlalchemy import delete, or_, select

    with open_gradebook(db_url) as gb:
        prints, similar = _tables(gb, db_url)
        names = list(students)
        with gb.engine.begin() as conn:
            for start in range(0, len(names), 500):  # a bounded IN list per statement
                chunk = names[start:start + 500]
                conn.execute(delete(prints).where(prints.c.assignment == assignment,
                                                  prints.c.student.in_(chunk)))
                conn.execute(delete(similar).where(
                    similar.c.assignment == assignment,
                    or_(similar.c.student.in_(chunk), similar.c.other.in_(chunk))))
            rows = [dict(assignment=assignment, student=student, function=name,
                         prints=array("Q", sorted(found)).tobytes())
                    for student, functions in students.items() for name, found in functions.items()]
            if rows:
                conn.execute(prints.insert(), rows)
        with gb.engine.connect() as conn:
            kept = ((student, name, frozenset(array("Q", bytes(data)))) for student, name, data in
                    conn.execution_options(stream_results=True, yield_per=500).execute(
                        select(prints.c.student, prints.c.function, prints.c.prints)
                        .where(prints.c.assignment == assignment)))
            found = find_pairs(students, kept) if students else []
        with gb.engine.begin() as conn:
            if found:
                conn.execute(similar.insert(), [dict(assignment=assignment, student=a, other=b,
                                                     function=name, share=share)
                                                for a, b, name, share in found])
            return sorted(tuple(row) for row in conn.execute(
                select(similar.c.student, similar.c.other, similar.c.function, similar.c.share)
                .where(similar.c.assignment == assignment)))


CELL_KINDS = ("grade_cell", "solution_cell", "task_cell", "source_cell")  # nbgrader's, as SaveCells saves them


def copy_assignment(source_url, target_url, assignment):
    """Register ``assignment`` of the gradebook at ``source_url`` in a new one at ``target_url``.

    Its notebooks and their grade, solution, task and source cells (hidden tests included),
    as nbgrader's ``SaveCells`` writes them when it generates the student version; no due
    date and no submission. A run generates the student version once, into the class
    gradebook, and gives its workers this copy (the *template*: what autograding needs).
    """
    with open_gradebook(source_url) as source, open_gradebook(target_url) as target:
        registered = source.find_assignment(assignment)
        target.add_assignment(assignment, course_id=registered.course_id)
        for notebook in registered.notebooks:
            target.add_notebook(notebook.name, assignment, kernelspec=notebook.kernelspec)
            for kind in CELL_KINDS:
                for cell in getattr(notebook, f"{kind}s"):
                    info = {k: v for k, v in cell.to_dict().items()
                            if k not in ("id", "name", "notebook", "assignment")}
                    getattr(target, f"update_or_create_{kind}")(cell.name, notebook.name,
                                                                assignment, **info)


def forget_submission(db_url, assignment, student):
    """Remove ``student``'s submission of ``assignment`` (its grades and comments), if any.

    A worker's scratch gradebook grades every submission under one internal id: the
    previous student's submission must be gone before the next one is graded, or nbgrader
    would carry its metadata over (its submission time, to a submission without
    ``timestamp.txt``, wiping out a late penalty).
    """
    from nbgrader.api import MissingEntry

    with open_gradebook(db_url) as gb:
        try:
            gb.remove_submission(assignment, student)
        except MissingEntry:
            pass


def record(db_url, assignment, result):
    """Copy ``result`` into the class gradebook; return ``(score, max_score, needs_manual)``.

    Autograded scores are replaced (a re-grade is idempotent: no duplicate rows);
    manual scores stay, and a cell that has one is marked for manual review again
    (nbgrader's own rule after an autograde). A missing or unreadable submission
    scores 0 in every cell. A submission whose grading failed (status ``error``: the
    host's fault or the grader's, never the student's) changes nothing: the earlier
    grade, if any, stays, and no zeros are recorded; its figures are returned.
    Late penalties are not written here: their one writer is
    :func:`autograder.core.policy.apply_late_policy`, which the driver runs once the class is
    recorded (a penalty follows the class gradebook's scores, extensions and manual grades).
    A gradebook that cannot be written (a full disk, a read-only file) raises
    :class:`GradebookError` with one line; nothing of the result is recorded then.

    One client records a whole class, so this is its hot path: the submission comes
    with its notebooks, grades, comments and their cells in four queries
    (:func:`_submission`), not one lazy load per cell; a new one is written in the same
    transaction as its scores (on SQLite one commit in all, not nbgrader's three); and
    only the student row is written under the gradebook's write lock (:func:`_student_row`).
    """

    try:
        if result.status == Status.ERROR:
            with open_gradebook(db_url) as gb:
                sub = _submission(gb, assignment, result.student)
                return ((sub.score, sub.max_score, bool(sub.needs_manual_grade)) if sub
                        else (0.0, 0.0, False))
        return _record(db_url, assignment, result)
    except gradebook_faults() as error:
        if isinstance(error, GradebookError):
            raise
        reason = str(getattr(error, "orig", None) or type(error).__name__).splitlines()[0]
        raise GradebookError(f"cannot write the gradebook ({reason}): nothing of "
                             f"{result.student} was recorded") from None


def _record(db_url, assignment, result):
    """:func:`record` of a graded (or missing, or unreadable) submission."""
    from nbgrader import utils

    with open_gradebook(db_url) as gb:
        _student_row(gb, db_url, result.student)
        sub = (_submission(gb, assignment, result.student)
               or _add_submission(gb, assignment, result.student))
        # this submission's own time (None without one), never an earlier one's
        sub.timestamp = utils.parse_utc(result.timestamp) if result.timestamp else None
        graded = {nb.name: nb for nb in result.notebooks}
        for notebook in sub.notebooks:
            data = graded.get(notebook.notebook.name)
            scores = {g.name: g.auto_score for g in data.grades} if data else {}
            for grade in notebook.grades:  # missing, unreadable: 0 everywhere
                auto = 0.0 if result.status != Status.OK else scores.get(grade.cell.name, 0.0)
                grade.auto_score = auto
                grade.needs_manual_grade = needs_manual_grade(auto, grade.manual_score)
            comments = dict(data.comments) if data else {}
            for comment in notebook.comments:
                comment.auto_comment = comments.get(comment.cell.name)
        gb.db.commit()
        return sub.score, sub.max_score, bool(sub.needs_manual_grade)  # one query: their sums


def _student_row(gb, db_url, student):
    """Make sure ``student`` has a row.

    Runs of different assignments record at once into one PostgreSQL gradebook, and two
    of them may meet the same new student: there this looks the student up and inserts it
    holding the write lock of :func:`writing` for one transaction of its own (the server
    releases the lock at its commit); the rest of a record touches only the run's own
    assignment. An SQLite gradebook has one writer: the row joins the record's transaction.
    """
    from nbgrader.api import Student
    from sqlalchemy import text

    postgres = is_postgres(db_url)
    if postgres:
        gb.db.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": lock_key(WRITE_LOCK)})
    if gb.db.get(Student, student) is None:
        gb.db.add(Student(id=student))
    if postgres:
        gb.db.commit()


def _add_submission(gb, assignment, student):
    """Add ``student``'s submission of ``assignment``, uncommitted; return it.

    The rows nbgrader's ``Gradebook.add_submission`` makes (a notebook per notebook of the
    assignment, a grade per grade cell, a comment per solution cell, both per task cell),
    without its commit, so that a new submission and its scores are one transaction. Its
    grades and comments name their cells by id; after the flush, ``grade.cell`` comes from
    the cells loaded here, without a query.
    """
    from nbgrader.api import Assignment, Comment, Grade, Notebook, SubmittedAssignment, SubmittedNotebook
    from sqlalchemy.orm import selectinload

    master = (gb.db.query(Assignment).filter(Assignment.name == assignment)
              .options(selectinload(Assignment.notebooks).selectinload(Notebook._base_cells))
              .one())  # a notebook's grade, solution and task cells are views of its cells
    sub = SubmittedAssignment(assignment=master, student_id=student)
    for notebook in master.notebooks:
        nb = SubmittedNotebook(notebook=notebook, assignment=sub)
        for cell in notebook.grade_cells:
            Grade(cell_id=cell.id, notebook=nb)
        for cell in notebook.solution_cells:
            Comment(cell_id=cell.id, notebook=nb)
        for cell in notebook.task_cells:
            Comment(cell_id=cell.id, notebook=nb)
            Grade(cell_id=cell.id, notebook=nb)
    gb.db.add(sub)
    gb.db.flush()
    return sub


def _submission(gb, assignment, student):
    """``student``'s submission of ``assignment`` with everything :func:`record` sets, or None."""
    from nbgrader.api import Assignment, Comment, Grade, SubmittedAssignment, SubmittedNotebook
    from sqlalchemy.orm import selectinload

    notebooks = selectinload(SubmittedAssignment.notebooks)
    return (gb.db.query(SubmittedAssignment).join(Assignment)
            .filter(Assignment.name == assignment, SubmittedAssignment.student_id == student)
            .options(notebooks.joinedload(SubmittedNotebook.notebook),
                     notebooks.selectinload(SubmittedNotebook.grades).joinedload(Grade.cell),
                     notebooks.selectinload(SubmittedNotebook.comments).joinedload(Comment.cell))
            .one_or_none())
