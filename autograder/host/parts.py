"""An assignment's parts: the one notion of a part that release, the self-check and the report read.

A part is a ``## Part N: concept`` heading of a source notebook and the cells under it, up to the
next such heading (:data:`PART_HEADING`, :func:`assignment_parts`); its id is ``pN``, with which
every grade id of its cells starts (``p3_hidden``: :func:`part_id`). Cells before any such
heading form a part named after the notebook.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..core.cells import grade_id, is_test_cell, is_written_answer
from ..core.course_files import SOURCE

PART_HEADING = re.compile(r"^#{1,6}\s*(Part\s+\d+)\s*[:.\-\u2013\u2014]?\s*(.*)$", re.I | re.M)


@dataclass(frozen=True)
class Part:
    """One part of an assignment: its heading (``Part 2``), the concept it tests, its cells."""

    name: str
    concept: str
    tests: tuple[tuple[str, str], ...]     # (notebook, grade id) of its autograded test cells
    written: tuple[tuple[str, str], ...]   # its answers graded by hand


def assignment_parts(root, assignment):
    """The parts of ``assignment``'s source notebooks, in order.

    A cell belongs to the last ``Part N: concept`` heading above it; cells before any
    such heading form a part named after the notebook. The concept is the heading's text
    after ``Part N:`` (backticks kept: it usually names the function).
    """
    parts = []
    for path in sorted((Path(root) / SOURCE / assignment).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        current = {"name": path.stem, "concept": "", "tests": [], "written": []}
        found = [current]
        for cell in nb.cells:
            heading = PART_HEADING.search(cell.source) if cell.cell_type == "markdown" else None
            if heading:
                current = {"name": heading.group(1).title(), "concept": heading.group(2).strip(),
                           "tests": [], "written": []}
                found.append(current)
            if is_test_cell(cell):
                current["tests"].append((path.stem, grade_id(cell)))
            elif is_written_answer(cell):
                current["written"].append((path.stem, grade_id(cell)))
        parts += [Part(p["name"], p["concept"], tuple(p["tests"]), tuple(p["written"]))
                  for p in found if p["tests"] or p["written"]]
    return parts


def part_by_test_cell(parts):
    """``{(notebook, grade id): part name}`` of every autograded test cell of ``parts``."""
    return {cell: p.name for p in parts for cell in p.tests}


def part_id(cell_grade_id):
    """``"p3"`` for ``"p3_hidden"`` (the course's grade ids start with their part)."""
    match = re.match(r"(p\d+)_", cell_grade_id or "")
    return match.group(1) if match else None
