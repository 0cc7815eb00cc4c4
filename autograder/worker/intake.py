"""Which notebook of a student's submission folder to grade, made gradeable.

:func:`take_in` looks at one submission folder (a :class:`~autograder.core.submission_folder.SubmissionFolder`,
read by :func:`autograder.core.submission_folder.read_submission`, which follows nothing out of
it) and returns an :class:`Intake`:

1. **Candidates** are the ``*.ipynb`` entries directly in the folder, whatever their
   names (``01-rope-Copy1.ipynb``, ``Copy of 01-rope.ipynb``, ``01-rope (1).ipynb``...);
   hidden ones (``.ipynb_checkpoints/`` included) are not. Names are listed, never
   matched as glob patterns.
2. A candidate **belongs to the assignment** by its content, not its name
   (:func:`autograder.core.solution_cells.belongs_by_grade_ids`). Only when no candidate
   belongs that way, a candidate whose code defines one of the names the release expects
   belongs too: its nbgrader metadata is gone (retyped into a fresh notebook, or a copy that
   lost it), so it is **re-seated** into the release notebook
   (:func:`autograder.worker.reseat.reseat`). A notebook that kept its metadata is graded as
   it is, even with cells deleted (the audit restores deleted locked cells).
3. Of several belonging candidates the **newest** is graded: newest by the time saved
   in the notebook (the latest execution time that JupyterLab's cell timing or Colab
   records), else by the file's modification time, then by name. A saved time later
   than the submission's ``timestamp`` is not believed. The other candidates are
   listed in ``others`` and in the message.
4. **Unreadable** candidates (:func:`autograder.core.notebook_file.read_notebook`'s refusals,
   or files the folder reader did not read) are reported by name; if a readable candidate
   belongs, it is graded and the unreadable ones are mentioned.

:func:`handed_in_time` reads the folder's ``timestamp.txt``. The notebook returned is always
a fresh object; nothing in the folder is modified. Messages name files as the student named
them, with control characters escaped (:func:`autograder.core.untrusted.printable`).
"""

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbformat

from ..core.course_files import TIMESTAMP
from ..core.notebook_file import read_notebook
from ..core.results import Status
from ..core.solution_cells import belongs_by_grade_ids, defined, defines_expected_name, solution_cells
from ..core.submission_folder import SubmissionFolder, handed_in_names, is_candidate, read_submission
from ..core.times import as_utc, parse_time
from ..core.untrusted import printable
from .reseat import reseat

__all__ = ["Intake", "handed_in_time", "take_in"]

FUTURE_SLACK = timedelta(minutes=5)  # clock skew between the collecting host and this one


@dataclass(frozen=True)
class Intake:
    """What to grade from one submission folder, and what to tell about it.

    ``status`` is ``"ok"``, ``"missing"`` or ``"unreadable"``; ``notebook`` (nbformat 4)
    is set only when it is ``"ok"``. ``original_name`` is the file's name as handed in,
    ``others`` the other candidate notebooks (not graded), ``reseated`` whether the
    student's code was put into the release notebook, ``message`` one line for the
    class summary and the feedback page.
    """

    status: str
    notebook: nbformat.NotebookNode | None
    original_name: str | None
    others: tuple[str, ...]
    reseated: bool
    message: str


@dataclass(frozen=True)
class Candidate:
    """A ``*.ipynb`` file of the folder: its notebook, or why it cannot be read."""

    name: str
    notebook: nbformat.NotebookNode | None
    problem: str | None  # completes "<name> is ...", set when notebook is None
    time: datetime

    def sentence(self):
        """The one-line reason this candidate is unreadable, naming it."""
        return f"{printable(self.name)} is {self.problem}"


def take_in(folder, release: nbformat.NotebookNode,
            timestamp: datetime | None = None) -> Intake:
    """The :class:`Intake` of a submission for the student version ``release``.

    ``folder`` is a :class:`SubmissionFolder` (from :func:`read_submission`) or the path of a
    submission folder, then read with :func:`read_submission`.
    """
    submission = folder if isinstance(folder, SubmissionFolder) else read_submission(Path(folder))
    if submission.problem:
        return Intake(Status.UNREADABLE, None, None, (), False,
                      f"the submission {submission.problem}; nothing in it was read")
    names = handed_in_names(submission)
    candidates = [candidate(entry, timestamp) for entry in submission.entries
                  if is_candidate(entry.name)]
    parts = solution_cells(release)
    readable = [c for c in candidates if c.notebook is not None]
    try:
        pool = [c for c in readable if belongs_by_grade_ids(c.notebook, release, parts)]
        retyped = not pool
        if retyped:
            pool = [c for c in readable if defines_expected_name(c.notebook, parts)]
        if pool:
            return graded(pool, candidates, release, parts, retyped)
    finally:
        defined.cache_clear()  # a worker keeps no student's code from one submission to the next
    if len(readable) < len(candidates):
        return unreadable(candidates)
    return missing(names, candidates)


def newest(candidates):
    """The newest of ``candidates`` (by :attr:`Candidate.time`, then by name)."""
    return max(candidates, key=lambda c: (c.time, c.name))


def graded(pool, candidates, release, parts, retyped):
    """The ``"ok"`` :class:`Intake` of the newest belonging candidate of ``pool``."""
    chosen = newest(pool)
    notebook = reseat(chosen.notebook, release, parts) if retyped else chosen.notebook
    others = [c for c in candidates if c is not chosen]
    return Intake(Status.OK, notebook, chosen.name, tuple(c.name for c in others), retyped,
                  ok_message(chosen, len(pool), others, retyped))


def unreadable(candidates):
    """The ``"unreadable"`` :class:`Intake`: every unreadable candidate, named and explained."""
    broken = [c for c in candidates if c.notebook is None]
    chosen = newest(broken)
    others = tuple(c.name for c in candidates if c is not chosen)
    message = "; ".join([c.sentence() for c in broken]
                        + also_handed_in([c for c in candidates if c.notebook is not None]))
    return Intake(Status.UNREADABLE, None, chosen.name, others, False, message)


def missing(names, candidates):
    """The ``"missing"`` :class:`Intake`, naming what the folder held instead."""
    held = f"the folder held: {', '.join(map(printable, names))}" if names else "the folder was empty"
    return Intake(Status.MISSING, None, None, tuple(c.name for c in candidates), False,
                  f"no notebook of this assignment; {held}")


def candidate(entry, timestamp):
    """The :class:`Candidate` of the folder entry ``entry``."""
    notebook, problem = (read_notebook(entry.data) if entry.data is not None
                         else (None, entry.problem or "a file the grader cannot open"))
    saved = saved_time(notebook) if notebook is not None else None
    if saved is not None and timestamp is not None and saved > as_utc(timestamp):
        saved = None
    return Candidate(entry.name, notebook, problem,
                     saved or datetime.fromtimestamp(entry.mtime, timezone.utc))


def handed_in_time(submission, now):
    """``(time, problem)``: when the submission was handed in, by its ``timestamp.txt``.

    ``(None, None)`` without a ``timestamp.txt``. One that is not a regular file, is not
    a time (:func:`autograder.core.times.parse_time`) or is later than ``now`` (beyond
    :data:`FUTURE_SLACK`) is not believed: the time is ``now``, the time of grading (the
    latest it can have been handed in, so a broken file never makes work less late), and
    ``problem`` says why, for the message.
    """
    entry = submission.entry(TIMESTAMP)
    if entry is None:
        return None, None
    if entry.data is None:
        return now, f"{TIMESTAMP} is {entry.problem}; the time of grading counts"
    text = entry.data.decode("utf-8", "replace").strip()
    try:
        moment = parse_time(text)
    except ValueError:
        return now, f"{TIMESTAMP} is not a time ('{printable(text[:40])}'); the time of grading counts"
    if moment > now + FUTURE_SLACK:
        return now, f"{TIMESTAMP} is in the future ({printable(text[:40])}); the time of grading counts"
    return moment, None


def saved_time(notebook):
    """The latest execution time recorded in ``notebook``'s cells (UTC), or None.

    JupyterLab's cell timing writes ISO times under ``metadata.execution``; Colab
    writes milliseconds since the epoch under ``metadata.executionInfo.timestamp``.
    """
    times = []
    for cell in notebook.cells:
        timing = cell.metadata.get("execution")
        if isinstance(timing, dict):
            times += [iso_time(value) for value in timing.values()]
        info = cell.metadata.get("executionInfo")
        if isinstance(info, dict):
            times.append(epoch_ms_time(info.get("timestamp")))
    return max((t for t in times if t is not None), default=None)


def iso_time(value):
    """``value`` as an ISO-8601 time in UTC, or None."""
    try:
        return as_utc(datetime.fromisoformat(value))
    except (TypeError, ValueError):
        return None


def epoch_ms_time(value):
    """``value`` as milliseconds since the epoch in UTC, or None."""
    if type(value) not in (int, float):
        return None
    try:
        return datetime.fromtimestamp(value / 1000, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


def also_handed_in(others):
    """``["also handed in: a, b"]`` for the candidates ``others``, or ``[]``."""
    return [f"also handed in: {', '.join(printable(c.name) for c in others)}"] if others else []


def ok_message(chosen, belonging, others, retyped):
    """The message of a graded submission: which file, why, and what else was there."""
    head = f"graded '{printable(chosen.name)}'"
    if belonging > 1:
        head += f", the newest of {belonging} notebooks"
    pieces = [head]
    if retyped:
        pieces.append("it had no nbgrader metadata, so its code was re-seated into the "
                      "assignment's notebook")
    pieces += also_handed_in(others)
    pieces += [c.sentence() for c in others if c.notebook is None]
    return "; ".join(pieces)
