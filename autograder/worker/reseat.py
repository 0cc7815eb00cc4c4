"""Re-seating: a notebook that lost its nbgrader metadata, put into a copy of the release.

:func:`reseat` takes the student's notebook and the release's solution cells
(:func:`autograder.core.solution_cells.solution_cells`) and returns a copy of the release
notebook holding the student's work:

* a student code cell goes into the first solution cell whose expected names it defines;
* of a cell that defines none of them, its imports, functions, classes and assignments
  (helpers) go into the first solution cell, so they exist before use, and the rest is dropped;
* a cell that does not parse goes, as text, into the first solution cell whose names it
  mentions, or is dropped;
* copies of the release's locked cells are dropped;
* the student's markdown after the heading of a written part ("SolutionCell 5") becomes that part's
  answer cell.

The student's notebook is not modified.
"""

import ast
import copy
import re

from ..core.cells import is_locked, is_solution, visible_source
from ..core.solution_cells import module_names, parse

# top-level statements of a helper cell that are kept when it is re-seated
DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
               ast.ClassDef, ast.Assign, ast.AnnAssign, ast.AugAssign)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*)$")


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
    ``cells`` opens: its "SolutionCell N", else its whole text; None without a heading."""
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
