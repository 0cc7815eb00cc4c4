"""Which notebook of a student's submission folder to grade, made gradeable.

:func:`take_in` looks at one submission folder and returns an :class:`Intake`:

1. **Candidates** are the ``*.ipynb`` entries directly in the folder, whatever their
   names (``01-rope-Copy1.ipynb``, ``Copy of 01-rope.ipynb``, ``01-rope (1).ipynb``...);
   hidden ones (``.ipynb_checkpoints/`` included) are not. Names are listed, never
   matched as glob patterns. The folder is read by :func:`read_submission`, which
   follows nothing out of it (rule 6).
2. A candidate **belongs to the assignment** by its content, not its name: it holds at
   least half of the release's solution cells, each recognised by its nbgrader
   ``grade_id``, its cell type and, for a code cell, by defining one of the names the
   release expects there (grade_ids alone repeat from one assignment to the next).
   Only when no candidate belongs that way, a candidate whose code defines one of
   those names belongs too: its nbgrader metadata is gone (retyped into a fresh
   notebook, or a copy that lost it), so it is **re-seated** (rule 4).
3. Of several belonging candidates the **newest** is graded: newest by the time saved
   in the notebook (the latest execution time that JupyterLab's cell timing or Colab
   records), else by the file's modification time, then by name. A saved time later
   than the submission's ``timestamp`` is not believed. The other candidates are
   listed in ``others`` and in the message.
4. **Re-seating** puts the student's code into a copy of the release notebook. Each
   release solution cell expects names: those its stub defines and those its test
   cells use that nothing else in the release defines (the ``ANSWER_...`` variables).
   A student code cell goes into the first solution cell whose names it defines; of a
   cell that defines none of them, its imports, functions, classes and assignments
   (helpers) go into the first solution cell, so they exist before use, and the rest is
   dropped. A cell that does not parse goes, as text, into the first solution cell
   whose names it mentions, or is dropped. Copies of the release's locked cells are
   dropped. The student's markdown after the heading of a written part ("Part 5")
   becomes that part's answer cell. A notebook that kept its metadata is graded as it
   is, even with cells deleted (the audit restores deleted locked cells).
5. **Unreadable** candidates (empty, not JSON, JSON that is not a notebook, newer than
   nbformat 4, over a cap of rule 6) are reported by name; if a readable candidate
   belongs, it is graded and the unreadable ones are mentioned. Notebooks of nbformat 3
   and older are upgraded to nbformat 4 (nbformat's own conversion) and graded.
6. **What is handed in is hostile**, so the folder is only ever *looked at*:
   the student's folder and the assignment folder are opened one component at a time
   with ``O_NOFOLLOW`` (a symbolic link there, to ``solutions/`` or to a classmate,
   makes the whole submission unreadable); entries are listed with ``lstat``; a file is
   opened with ``O_NOFOLLOW | O_NONBLOCK``, checked with ``fstat`` to be a regular file
   and read from that descriptor. Symbolic links, folders named ``*.ipynb``, FIFOs,
   sockets and devices are never opened (a FIFO would block forever) and are reported
   by name. A **hard link** (a regular file with more than one name, which may be a
   file of ``solutions/`` or of a classmate) is refused, never read: the instructor
   copies it if it is genuine. Every cost is bounded before it is paid: a file larger
   than :data:`NOTEBOOK_BYTES` (by ``st_size``, then while reading) is not read, nor
   are notebooks beyond :data:`SUBMISSION_BYTES` per folder, nor a folder of more than
   :data:`FOLDER_ENTRIES` entries; a notebook of more than :data:`NOTEBOOK_CELLS` cells or
   JSON nested deeper than :data:`JSON_DEPTH` is refused before nbformat validates
   it. File names that are not UTF-8 are kept as Python's surrogate escapes and shown
   escaped.

The notebook returned is always a fresh object; nothing in the folder is modified.
Messages name files as the student named them, with control characters escaped
(:func:`autograder.core.untrusted.printable`).
"""

import ast
import builtins
import copy
import errno
import functools
import json
import os
import re
import stat
import warnings
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import StrEnum
from pathlib import Path

import nbformat

from ..core.course_files import SECRET, TIMESTAMP
from ..core.cells import grade_id, is_locked, is_solution, is_test_cell, visible_source
from ..core.times import as_utc, parse_time
from ..core.results import Status
from ..core.untrusted import printable

__all__ = ["Intake", "Submission", "handed_in_time", "read_submission", "take_in"]

# files of the folder written by collection (nbgrader's, or ``collect``), not by the student
COLLECTION_FILES = (TIMESTAMP, SECRET)
COLLECTION_BYTES = 4096  # a timestamp or a secret is a short line
# names of the folder's own files, written by collection and Jupyter, not by the student
NOT_HANDED_IN = {".ipynb_checkpoints", *COLLECTION_FILES}
# what one submission may cost to take in (the largest release notebook: 35 cells, 32 kB)
NOTEBOOK_BYTES = 32 * 2**20      # one notebook file
SUBMISSION_BYTES = 64 * 2**20    # all the notebooks of one folder together
NOTEBOOK_CELLS = 2000            # cells of one notebook
JSON_DEPTH = 100                 # nesting of a notebook's JSON
FOLDER_ENTRIES = 1000            # entries of one folder that are looked at
FUTURE_SLACK = timedelta(minutes=5)  # clock skew between the collecting host and this one
# a module-level name bound inside these is not bound at module level
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
          ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
# top-level statements of a helper cell that are kept when it is re-seated
DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
               ast.ClassDef, ast.Assign, ast.AnnAssign, ast.AugAssign)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*)$")


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
class Part:
    """A release solution code cell: its index and the names the student defines there."""

    index: int
    names: frozenset[str]


@dataclass(frozen=True)
class Candidate:
    """A ``*.ipynb`` file of the folder: its notebook, or why it cannot be read."""

    name: str
    notebook: nbformat.NotebookNode | None
    problem: str | None  # completes "<name> is ...", set when notebook is None
    time: datetime

    def sentence(self):
        """The one-line reason this candidate is unreadable, naming it."""
        return f"{shown(self.name)} is {self.problem}"


class Kind(StrEnum):
    """What an entry of a submission folder is, by ``lstat`` (never by following it)."""

    FILE = "file"
    FOLDER = "folder"
    LINK = "link"
    SPECIAL = "special"  # a FIFO, a socket or a device


@dataclass(frozen=True)
class Entry:
    """One entry of a submission folder: what it is and, for a file the grader reads,
    its bytes (``data``) or why they were not read (``problem``, completing "NAME is ...").
    ``name`` is as listed (bytes that are not UTF-8 as surrogate escapes)."""

    name: str
    kind: Kind
    mtime: float
    data: bytes | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Submission:
    """What one submission folder holds, read once, without following anything out of it.

    ``problem`` (completing "the submission ...") says why the folder itself was not read:
    then ``entries`` is empty.
    """

    entries: tuple[Entry, ...] = ()
    problem: str | None = None

    def entry(self, name):
        """The entry called ``name``, or None."""
        return next((e for e in self.entries if e.name == name), None)


def take_in(folder, release: nbformat.NotebookNode,
            timestamp: datetime | None = None) -> Intake:
    """The :class:`Intake` of a submission for the student version ``release``.

    ``folder`` is a :class:`Submission` (from :func:`read_submission`) or the path of a
    submission folder, then read with :func:`read_submission`.
    """
    submission = folder if isinstance(folder, Submission) else read_submission(Path(folder))
    if submission.problem:
        return Intake(Status.UNREADABLE, None, None, (), False,
                      f"the submission {submission.problem}; nothing in it was read")
    names = handed_in(submission)
    candidates = [candidate(entry, timestamp) for entry in submission.entries
                  if is_candidate(entry.name)]
    parts = solution_parts(release)
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
    held = f"the folder held: {', '.join(map(shown, names))}" if names else "the folder was empty"
    return Intake(Status.MISSING, None, None, tuple(c.name for c in candidates), False,
                  f"no notebook of this assignment; {held}")


# -- the folder, looked at without following anything ------------------------------------
def read_submission(folder: Path, within: Path | None = None) -> Submission:
    """The :class:`Submission` in ``folder``, read without following any link.

    ``within`` is an ancestor of ``folder`` taken as it is (the course's ``submitted/``);
    every folder below it, down to ``folder``, is opened with ``O_NOFOLLOW``, so a link
    there is refused, not followed. By default only ``folder`` itself is checked.
    """
    folder = Path(folder)
    within = Path(within) if within is not None else folder.parent
    steps = folder.relative_to(within).parts
    try:
        fd = os.open(within, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return Submission()
    try:
        for depth, step in enumerate(steps):
            try:
                inner = os.open(step, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK
                                | os.O_CLOEXEC, dir_fd=fd)
            except OSError as error:
                return folder_problem(error, fd, step, Path(*steps[:depth + 1]))
            os.close(fd)
            fd = inner
        return looked_at(fd, Path(*steps))
    finally:
        os.close(fd)


def folder_problem(error, fd, name, path):
    """The :class:`Submission` of the folder ``name`` in the open folder ``fd`` (``path``
    under ``submitted/``) that could not be opened (``error``)."""
    if error.errno == errno.ENOENT:
        return Submission()
    try:
        linked = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        linked = False
    if linked or error.errno == errno.ELOOP:
        return Submission(problem=f"folder {shown(str(path))} is a symbolic link, which the "
                                  "grader does not follow")
    if error.errno == errno.ENOTDIR:
        return Submission(problem=f"folder {shown(str(path))} is not a folder")
    return Submission(problem=f"folder {shown(str(path))} cannot be opened ({error.strerror})")


def looked_at(fd, path):
    """The :class:`Submission` of the open folder ``fd`` (``path`` under ``submitted/``):
    the :class:`Entry` of each name, sorted by name.

    Candidate notebooks and the collection files are read (:func:`read_regular`);
    notebooks beyond :data:`SUBMISSION_BYTES` in all are not. A folder of more than
    :data:`FOLDER_ENTRIES` entries is not read at all.
    """
    with os.scandir(fd) as listing:
        names = sorted(entry.name for _, entry in zip(range(FOLDER_ENTRIES + 1), listing))
    if len(names) > FOLDER_ENTRIES:
        return Submission(problem=f"folder {shown(str(path))} holds more than {FOLDER_ENTRIES} "
                                  "entries, more than the grader looks at")
    entries, budget = [], SUBMISSION_BYTES
    for name in names:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue  # removed while we looked
        kind = kind_of(info.st_mode)
        problem = data = None
        if is_candidate(name) or name in COLLECTION_FILES:
            cap = NOTEBOOK_BYTES if is_candidate(name) else COLLECTION_BYTES
            if kind != Kind.FILE:
                problem = NOT_A_FILE[kind]
            elif is_candidate(name) and budget < info.st_size <= cap:
                problem = (f"not read: the folder's notebooks exceed "
                           f"{SUBMISSION_BYTES // 2**20} MiB together")
            else:
                data, problem = read_regular(name, fd, cap)
                budget -= len(data or b"")
        entries.append(Entry(name, kind, info.st_mtime, data, problem))
    return Submission(tuple(entries))


NOT_A_FILE = {Kind.LINK: "a symbolic link, which the grader does not follow",
              Kind.FOLDER: "a folder, not a notebook file",
              Kind.SPECIAL: "not a regular file (a FIFO, socket or device), never opened"}


def kind_of(mode):
    """The :class:`Kind` of an ``lstat`` mode."""
    if stat.S_ISLNK(mode):
        return Kind.LINK
    if stat.S_ISDIR(mode):
        return Kind.FOLDER
    return Kind.FILE if stat.S_ISREG(mode) else Kind.SPECIAL


def read_regular(name, fd, cap):
    """``(bytes, None)`` of the regular file ``name`` in the open folder ``fd``, else
    ``(None, problem)``: not a regular file, a hard link, or more than ``cap`` bytes.

    The file is opened without following a link and without blocking, checked with
    ``fstat`` and read from that descriptor, at most ``cap + 1`` bytes.
    """
    try:
        handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                         | os.O_CLOEXEC, dir_fd=fd)
    except OSError as error:
        return None, (NOT_A_FILE[Kind.LINK] if error.errno == errno.ELOOP
                      else "a file the grader cannot open")
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            return None, NOT_A_FILE[kind_of(info.st_mode)]
        if info.st_nlink > 1:
            return None, (f"a hard link (one file with {info.st_nlink} names, maybe outside the "
                          "folder), which the grader does not read; hand in a copy")
        if info.st_size > cap:
            return None, too_large(cap)
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(handle, min(1 << 20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return (None, too_large(cap)) if size > cap else (b"".join(chunks), None)
    except OSError:
        return None, "a file the grader cannot read"
    finally:
        os.close(handle)


def too_large(cap):
    """The problem of a file over ``cap`` bytes."""
    return f"larger than the {cap // 2**20 or cap} {'MiB' if cap >= 2**20 else 'bytes'} the grader reads"


def handed_in(submission):
    """Sorted names of what the student put in the folder (folders end in ``/``)."""
    return [entry.name + ("/" if entry.kind == Kind.FOLDER else "")
            for entry in submission.entries if entry.name not in NOT_HANDED_IN]


def is_candidate(name):
    """Whether an entry called ``name`` may be a notebook to consider: a visible ``*.ipynb``."""
    return name.lower().endswith(".ipynb") and not name.startswith(".")


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
        return now, f"{TIMESTAMP} is not a time ('{shown(text[:40])}'); the time of grading counts"
    if moment > now + FUTURE_SLACK:
        return now, f"{TIMESTAMP} is in the future ({shown(text[:40])}); the time of grading counts"
    return moment, None


def read_notebook(data):
    """``(notebook, None)`` for bytes that hold a readable notebook, else ``(None, problem)``.

    The notebook is upgraded to nbformat 4 when it is older. A notebook over
    :data:`NOTEBOOK_CELLS` cells or nested deeper than :data:`JSON_DEPTH` is refused
    before nbformat validates it.
    """
    if not data.strip():
        return None, "empty"
    try:
        text = data.decode("utf-8-sig")
        raw = json.loads(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError, deep nesting
        return None, "not a notebook (not JSON)"
    version = raw.get("nbformat") if isinstance(raw, dict) else None
    if type(version) is not int or not ("cells" in raw or "worksheets" in raw):
        return None, "JSON but not a Jupyter notebook"
    if version > 4:
        return None, f"an nbformat {version} notebook, newer than the grader reads"
    cells = cell_count(raw)
    if cells > NOTEBOOK_CELLS:
        return None, f"a notebook of {cells} cells, more than the {NOTEBOOK_CELLS} the grader takes"
    if too_deep(raw, JSON_DEPTH):
        return None, f"JSON nested deeper than the {JSON_DEPTH} levels the grader takes"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            notebook = nbformat.reads(text, as_version=4)
    except Exception:  # nbformat's reader raises many kinds on a damaged file
        notebook = None
    if notebook is None or not well_formed(notebook):
        return None, "a damaged notebook (its cells cannot be read)"
    return notebook, None


def cell_count(raw):
    """How many cells the notebook JSON ``raw`` holds (nbformat 4, or 3 and older)."""
    def length(value):
        return len(value) if isinstance(value, list) else 0

    if "cells" in raw:
        return length(raw["cells"])
    sheets = raw["worksheets"] if isinstance(raw["worksheets"], list) else []
    return sum(length(sheet.get("cells")) for sheet in sheets if isinstance(sheet, dict))


def too_deep(value, limit):
    """Whether the JSON ``value`` nests lists and objects deeper than ``limit``."""
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= limit:
                    return True
                todo.append((child, depth + 1))
    return False


def well_formed(notebook):
    """Whether every field grading reads has the right type."""
    def good(cell):
        meta = cell.get("metadata")
        return (cell.get("cell_type") in ("code", "markdown", "raw")
                and isinstance(cell.get("source"), str) and isinstance(meta, dict)
                and isinstance(meta.get("nbgrader", {}), dict))
    cells = notebook.get("cells")
    return (isinstance(notebook.get("metadata"), dict) and isinstance(cells, list)
            and all(isinstance(cell, dict) and good(cell) for cell in cells))


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


# -- messages --------------------------------------------------------------------------
def shown(name):
    """``name`` fit for a one-line message: controls, bidi overrides and bytes that are
    not UTF-8 escaped (:func:`autograder.core.untrusted.printable`)."""
    return printable(name)


def also_handed_in(others):
    """``["also handed in: a, b"]`` for the candidates ``others``, or ``[]``."""
    return [f"also handed in: {', '.join(shown(c.name) for c in others)}"] if others else []


def ok_message(chosen, belonging, others, retyped):
    """The message of a graded submission: which file, why, and what else was there."""
    head = f"graded '{shown(chosen.name)}'"
    if belonging > 1:
        head += f", the newest of {belonging} notebooks"
    pieces = [head]
    if retyped:
        pieces.append("it had no nbgrader metadata, so its code was re-seated into the "
                      "assignment's notebook")
    pieces += also_handed_in(others)
    pieces += [c.sentence() for c in others if c.notebook is None]
    return "; ".join(pieces)


# -- names in code ---------------------------------------------------------------------
def parse(source):
    """The module ``source`` parses to, or None."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None


def module_names(tree):
    """Names a parsed cell binds at module level (definitions, assignments, imports)."""
    names, todo = set(), list(tree.body) if tree is not None else []
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        if not isinstance(node, SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return names


def all_bound_names(tree):
    """Every name a parsed cell binds in any scope (arguments and loop variables too)."""
    names = set()
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def used_names(tree):
    """Every name a parsed cell reads."""
    if tree is None:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@functools.lru_cache(maxsize=4096)  # a cell is matched against every release part
def defined(source):
    """Names the code ``source`` binds at module level (none if it does not parse)."""
    return frozenset(module_names(parse(source)))


# -- which notebook belongs ------------------------------------------------------------
def solution_parts(release):
    """The release's solution code cells, each with the names expected there.

    A cell expects what its stub defines and what its test cells (up to the next
    solution cell) read that no release cell binds and Python does not provide.
    """
    code = [(index, cell) for index, cell in enumerate(release.cells) if cell.cell_type == "code"]
    trees = {index: parse(cell.source) for index, cell in code}
    known = set(dir(builtins)).union(*(all_bound_names(tree) for tree in trees.values()))
    groups = []
    for index, cell in code:
        if is_solution(cell):
            groups.append((index, module_names(trees[index])))
        elif groups and is_test_cell(cell):
            groups[-1][1].update(used_names(trees[index]) - known)
    return [Part(index, frozenset(names)) for index, names in groups]


def belongs_by_grade_ids(notebook, release, parts):
    """Whether ``notebook`` holds at least half of the release's solution cells.

    A cell counts when it has the release cell's grade_id and type and, for a code
    cell, defines one of the names expected there (when the stub still stands, the
    stub's own name).
    """
    expected = {part.index: part.names for part in parts}
    wanted = [(index, cell) for index, cell in enumerate(release.cells)
              if is_solution(cell)]

    def present(index, cell):
        return any(grade_id(mine) == grade_id(cell) and mine.cell_type == cell.cell_type
                   and (not expected.get(index) or expected[index] & defined(mine.source))
                   for mine in notebook.cells)

    shared = sum(present(index, cell) for index, cell in wanted)
    return bool(wanted) and 2 * shared >= len(wanted)


def defines_expected_name(notebook, parts):
    """Whether a code cell of ``notebook`` defines a name some release part expects."""
    expected = set().union(*(part.names for part in parts))
    return any(expected & defined(cell.source) for cell in notebook.cells
               if cell.cell_type == "code")


# -- re-seating ------------------------------------------------------------------------
def reseat(notebook, release, parts):
    """A copy of ``release`` holding the student's code and written answers."""
    result = copy.deepcopy(release)
    locked = {cell.source.strip() for cell in release.cells if is_locked(cell)}
    pieces = {part.index: [] for part in parts}
    for cell in notebook.cells:
        if cell.cell_type != "code" or visible_source(cell.source).strip() in locked:
            continue
        part, text = placed(cell.source, parts)
        if part is not None and text.strip():
            pieces[part.index].append(text.strip("\n"))
    for index, texts in pieces.items():
        if texts:
            result.cells[index].source = "\n\n".join(texts)
    for index, answer in written_answers(notebook, release):
        result.cells[index].source = answer
    return result


def placed(source, parts):
    """``(part, text)``: where a student's code cell goes and what of it (part None: dropped)."""
    tree = parse(source)
    if tree is None:
        return mentioned_part(source, parts), source
    names = module_names(tree)
    for part in parts:
        if names & part.names:
            return part, source
    helpers = definitions(source, tree)
    return (parts[0] if parts and helpers else None), helpers


def mentioned_part(source, parts):
    """The first part whose expected names ``source`` mentions as words, or None."""
    for part in parts:
        if any(re.search(rf"\b{re.escape(name)}\b", source) for name in part.names):
            return part
    return None


def definitions(source, tree):
    """The lines of ``source`` that hold its top-level definitions (:data:`DEFINITIONS`)."""
    lines = source.splitlines()
    keep = set()
    for node in tree.body:
        if isinstance(node, DEFINITIONS):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            keep.update(range(first, node.end_lineno + 1))
    return "\n".join(line for number, line in enumerate(lines, 1) if number in keep)


def written_answers(notebook, release):
    """``[(index, answer)]``: the student's text for each written cell of ``release``."""
    answers = []
    copies = {cell.source.strip() for cell in release.cells if cell.cell_type == "markdown"}
    for index, cell in enumerate(release.cells):
        if cell.cell_type == "markdown" and is_solution(cell):
            label = part_label(release.cells[:index])
            answer = text_under(notebook, label, copies) if label else ""
            if answer:
                answers.append((index, answer))
    return answers


def part_label(cells):
    """What a student's heading must contain to start the part the last heading of
    ``cells`` opens: its "Part N", else its whole text; None without a heading."""
    for cell in reversed(cells):
        heading = first_heading(cell.source) if cell.cell_type == "markdown" else None
        if heading is not None:
            found = re.search(r"\bpart\s+\d+\b", heading[1], re.IGNORECASE)
            return found.group() if found else heading[1].strip()
    return None


def first_heading(source):
    """``(level, text, rest)`` of the first ATX heading line of ``source``, or None;
    ``rest`` is what follows that line."""
    lines = source.splitlines()
    for number, line in enumerate(lines):
        match = HEADING.match(line)
        if match:
            return len(match.group(1)), match.group(2), "\n".join(lines[number + 1:])
    return None


def text_under(notebook, label, copies):
    """The student's markdown under the heading that contains ``label``, up to the next
    heading of the same or a higher level; copies of release cells are left out."""
    words = r"\s+".join(map(re.escape, label.split()))
    pattern = re.compile(rf"(?<!\w){words}(?!\w)", re.IGNORECASE)
    texts, level = [], None
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        heading = first_heading(cell.source)
        copied = cell.source.strip() in copies
        if level is None:
            if heading is not None and pattern.search(heading[1]):
                level = heading[0]
                texts += [] if copied else [heading[2]]
        elif heading is not None and heading[0] <= level:
            break
        elif not copied:
            texts.append(cell.source)
    return "\n\n".join(text.strip() for text in texts if text.strip())
