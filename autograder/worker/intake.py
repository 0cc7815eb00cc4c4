"""Which notebook of a student's submission folder to grade, made gradeable.

:func:`take_in` looks at one submission folder and returns an :class:`Intake`:

1. **Candidates** are the ``*.ipynb`` files directly in the folder, whatever their
   names (``01-rope-Copy1.ipynb``, ``Copy of 01-rope.ipynb``, ``01-rope (1).ipynb``...).
   Folders (``.ipynb_checkpoints/`` included), hidden files and symbolic links are not
   candidates; names are listed with ``iterdir()``, never matched as glob patterns.
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
5. **Unreadable** candidates (empty, not JSON, JSON that is not a notebook, nbformat 3
   or older) are reported by name; if a readable candidate belongs, it is graded and
   the unreadable ones are mentioned. Nothing is converted.

The notebook returned is always a fresh object; nothing in the folder is modified.
Messages name files only as the student named them.
"""

import ast
import builtins
import copy
import json
import re
import unicodedata
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import nbformat

from ..core.cells import grade_id, is_locked, is_solution, is_test_cell, visible_source
from ..core.results import Status

__all__ = ["Intake", "take_in"]

# names of the folder's own files, written by collection and Jupyter, not by the student
NOT_HANDED_IN = {".ipynb_checkpoints", "timestamp.txt"}
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


def take_in(folder: Path, release: nbformat.NotebookNode,
            timestamp: datetime | None = None) -> Intake:
    """The :class:`Intake` of submission ``folder`` for the student version ``release``."""
    folder = Path(folder)
    names = handed_in(folder)
    candidates = [candidate(folder / name, timestamp) for name in names
                  if is_candidate(folder / name)]
    parts = solution_parts(release)
    readable = [c for c in candidates if c.notebook is not None]
    pool = [c for c in readable if belongs_by_grade_ids(c.notebook, release, parts)]
    retyped = not pool
    if retyped:
        pool = [c for c in readable if defines_expected_name(c.notebook, parts)]
    if pool:
        return graded(pool, candidates, release, parts, retyped)
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


# -- the folder ------------------------------------------------------------------------
def handed_in(folder):
    """Sorted names of what the student put in ``folder`` (folders end in ``/``)."""
    if not folder.is_dir():
        return []
    return sorted(entry.name + ("/" if entry.is_dir() and not entry.is_symlink() else "")
                  for entry in folder.iterdir() if entry.name not in NOT_HANDED_IN)


def is_candidate(path):
    """Whether ``path`` is a notebook to consider: a plain, visible ``.ipynb`` file."""
    return (path.name.lower().endswith(".ipynb") and not path.name.startswith(".")
            and not path.is_symlink() and path.is_file())


def candidate(path, timestamp):
    """The :class:`Candidate` of the file at ``path``, read without changing it."""
    notebook, problem = read_notebook(path)
    saved = saved_time(notebook) if notebook is not None else None
    if saved is not None and timestamp is not None and saved > as_utc(timestamp):
        saved = None
    modified = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
    return Candidate(path.name, notebook, problem, saved or modified)


def read_notebook(path):
    """``(notebook, None)`` for a readable nbformat-4 notebook, else ``(None, problem)``."""
    try:
        data = path.read_bytes()
    except OSError:
        return None, "a file the grader cannot open"
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
    if version != 4:
        newer = "; save it with Jupyter 4 or newer" if version < 4 else ", newer than the grader reads"
        return None, f"an nbformat {version} notebook{newer}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            notebook = nbformat.reads(text, as_version=4)
    except Exception:  # nbformat's reader raises many kinds on a damaged file
        notebook = None
    if notebook is None or not well_formed(notebook):
        return None, "a damaged notebook (its cells cannot be read)"
    return notebook, None


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


def as_utc(moment):
    """``moment`` with a time zone: a naive time is taken as UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


# -- messages --------------------------------------------------------------------------
def shown(name):
    """``name`` fit for a one-line message: control and format characters become ``?``."""
    return "".join("?" if unicodedata.category(ch).startswith("C") else ch for ch in name)


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


def defined(source):
    """Names the code ``source`` binds at module level (none if it does not parse)."""
    return module_names(parse(source))


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
