"""The service's queue on disk: every attempt it accepted, and what became of it.

One SQLite file, ``<state>/journal.db`` (WAL, ``synchronous=FULL``): an attempt is
*accepted* when its row is committed, after its files were written and synced under
``<state>/attempts/<token>/`` (:mod:`autograder.service.intake`), so nothing accepted is
ever lost, whatever stops the service. The grading loop and the web process share it.

An attempt's ``state``: ``queued`` -> ``grading`` -> ``done`` (graded: score, status and
the result kept) or ``refused`` (the course's attempt rules said no; never graded, never
counted). On start, :meth:`Journal.recover` puts every ``grading`` attempt back in the
queue: a grade in progress when the service died is graded again, and recorded once
(recording replaces).

**Who goes next** (:meth:`Journal.next_attempts`), the fairness rule: at most one attempt
per student in flight; among the students with a queued attempt and none in flight, the
one served longest ago goes first (never served: by their first queued attempt), and gets
their oldest queued attempt. So students are served round robin: one student's ten uploads
never delay another's first.

``token`` is the only name an attempt has outside: 128 random bits. A student's every
query goes through :meth:`Journal.attempt_of` with their own id, so another student's
token answers exactly as a token that does not exist.
"""

import secrets
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

QUEUED, GRADING, DONE, REFUSED = "queued", "grading", "done", "refused"

SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY,
    token TEXT UNIQUE NOT NULL,
    student TEXT NOT NULL,
    assignment TEXT NOT NULL,
    source TEXT NOT NULL,            -- 'exchange' or 'web'
    origin TEXT UNIQUE,              -- the exchange's inbound folder name (exchange only)
    received REAL NOT NULL,          -- epoch seconds, when it was accepted
    state TEXT NOT NULL,
    started REAL,
    finished REAL,
    status TEXT,                     -- the grade's status (ok, missing, unreadable, error)
    score REAL,
    max_score REAL,
    message TEXT NOT NULL DEFAULT '',
    counted INTEGER NOT NULL DEFAULT 0,  -- the attempt the gradebook holds
    released INTEGER NOT NULL DEFAULT 0  -- its full page handed to the exchange
);
CREATE INDEX IF NOT EXISTS by_student ON attempts (student, assignment);
CREATE INDEX IF NOT EXISTS by_state ON attempts (state);
CREATE TABLE IF NOT EXISTS served (student TEXT PRIMARY KEY, last INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS switches (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Attempt:
    """One row of the journal."""

    id: int
    token: str
    student: str
    assignment: str
    source: str
    origin: str | None
    received: float
    state: str
    started: float | None
    finished: float | None
    status: str | None
    score: float | None
    max_score: float | None
    message: str
    counted: int
    released: int


COLUMNS = ", ".join(Attempt.__dataclass_fields__)


class Journal:
    """The journal at ``<state>/journal.db`` (made if absent)."""

    def __init__(self, state: Path):
        self.path = Path(state) / "journal.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def close(self):
        self.db.close()

    @contextmanager
    def transaction(self):
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def rows(self, where="1", args=()):
        cursor = self.db.execute(f"SELECT {COLUMNS} FROM attempts WHERE {where} ORDER BY id", args)
        return [Attempt(*row) for row in cursor.fetchall()]

    # -- intake -----------------------------------------------------------------------
    @staticmethod
    def new_token():
        return secrets.token_urlsafe(16)

    def add(self, token, student, assignment, source, origin=None, state=QUEUED, message="",
            received=None):
        """Record an accepted (or refused) attempt whose files are already written."""
        with self.transaction() as db:
            db.execute("INSERT INTO attempts (token, student, assignment, source, origin, received, "
                       "state, message) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (token, student, assignment, source, origin,
                        time.time() if received is None else received, state, message))

    def known_origins(self):
        return {row[0] for row in self.db.execute("SELECT origin FROM attempts WHERE origin IS NOT NULL")}

    def accepted_times(self, student, assignment):
        """Epoch times of ``student``'s attempts of ``assignment`` that count against the rules."""
        return [row[0] for row in self.db.execute(
            "SELECT received FROM attempts WHERE student = ? AND assignment = ? AND state != ?",
            (student, assignment, REFUSED))]

    # -- the queue ----------------------------------------------------------------------
    def recover(self):
        """Put every attempt that was being graded back in the queue; how many."""
        with self.transaction() as db:
            return db.execute("UPDATE attempts SET state = ?, started = NULL WHERE state = ?",
                              (QUEUED, GRADING)).rowcount

    def next_attempts(self, slots):
        """Up to ``slots`` queued attempts to grade now, by the fairness rule (the module's),
        each marked ``grading``."""
        taken = []
        with self.transaction() as db:
            busy = {r[0] for r in db.execute("SELECT student FROM attempts WHERE state = ?", (GRADING,))}
            candidates = db.execute(
                "SELECT a.student, MIN(a.id), COALESCE(s.last, 0) FROM attempts a "
                "LEFT JOIN served s ON s.student = a.student WHERE a.state = ? "
                "GROUP BY a.student ORDER BY COALESCE(s.last, 0), MIN(a.id)", (QUEUED,)).fetchall()
            tick = db.execute("SELECT COALESCE(MAX(last), 0) FROM served").fetchone()[0]
            for student, first, _ in candidates:
                if len(taken) >= slots:
                    break
                if student in busy:
                    continue
                tick += 1
                db.execute("UPDATE attempts SET state = ?, started = ? WHERE id = ?",
                           (GRADING, time.time(), first))
                db.execute("INSERT INTO served (student, last) VALUES (?, ?) ON CONFLICT(student) "
                           "DO UPDATE SET last = excluded.last", (student, tick))
                taken.append(first)
        return [self.rows("id = ?", (i,))[0] for i in taken]

    def finish(self, attempt_id, status, score, max_score, message):
        with self.transaction() as db:
            db.execute("UPDATE attempts SET state = ?, finished = ?, status = ?, score = ?, "
                       "max_score = ?, message = ? WHERE id = ?",
                       (DONE, time.time(), status, score, max_score, message, attempt_id))

    def requeue(self, attempt_id):
        with self.transaction() as db:
            db.execute("UPDATE attempts SET state = ?, started = NULL WHERE id = ?", (QUEUED, attempt_id))

    def set_counted(self, student, assignment, attempt_id):
        with self.transaction() as db:
            db.execute("UPDATE attempts SET counted = (id = ?) WHERE student = ? AND assignment = ?",
                       (attempt_id, student, assignment))

    def mark_released(self, attempt_id):
        with self.transaction() as db:
            db.execute("UPDATE attempts SET released = 1 WHERE id = ?", (attempt_id,))

    # -- what each role may see -----------------------------------------------------------
    def attempts_of(self, student, assignment=None):
        if assignment is None:
            return self.rows("student = ?", (student,))
        return self.rows("student = ? AND assignment = ?", (student, assignment))

    def attempt_of(self, student, token):
        """``student``'s attempt ``token``, or None: another student's answers as none does."""
        found = self.rows("token = ? AND student = ?", (token, student))
        return found[0] if found else None

    def position(self, attempt):
        """How many attempts are graded before ``attempt`` by the fairness rule, if nothing
        new arrives (0: it is next, or being graded)."""
        if attempt.state != QUEUED:
            return 0
        queued = self.rows("state = ?", (QUEUED,))
        mine = [a for a in queued if a.student == attempt.student and a.id < attempt.id]
        last = dict(self.db.execute("SELECT student, last FROM served").fetchall())
        rounds = len(mine)  # own earlier attempts: one per round
        ahead = 0
        by_student = {}
        for a in queued:
            by_student.setdefault(a.student, []).append(a)
        me = last.get(attempt.student, 0)
        for student, items in by_student.items():
            if student == attempt.student:
                continue
            before_me = last.get(student, 0) < me or (last.get(student, 0) == me and items[0].id < attempt.id)
            ahead += min(len(items), rounds + (1 if before_me else 0))
        return ahead + rounds

    def queue(self):
        return self.rows("state IN (?, ?)", (QUEUED, GRADING))

    def switch(self, name, value=None):
        """The switch ``name`` (``"paused"``): set it when ``value`` is given; its value."""
        if value is not None:
            with self.transaction() as db:
                db.execute("INSERT INTO switches (name, value) VALUES (?, ?) ON CONFLICT(name) "
                           "DO UPDATE SET value = excluded.value", (name, value))
        row = self.db.execute("SELECT value FROM switches WHERE name = ?", (name,)).fetchone()
        return row[0] if row else ""


def throughput(journal, now=None):
    """Per assignment: attempts graded in the last hour, and the median and worst seconds
    from acceptance to result of those: ``{assignment: (count, p50, max)}``."""
    now = now or time.time()
    by = {}
    for a in journal.rows("state = ? AND finished > ?", (DONE, now - 3600)):
        by.setdefault(a.assignment, []).append(a.finished - a.received)
    out = {}
    for assignment, waits in sorted(by.items()):
        waits.sort()
        out[assignment] = (len(waits), waits[len(waits) // 2], waits[-1])
    return out
