"""Student versions: ``solutions/<id>/`` -> ``release/<id>/`` with nbgrader.

``generate`` is nbgrader's ``generate_assignment`` with this course's settings.
Its output is deterministic, so the committed ``release/`` can be checked
against a fresh generation: :func:`stale_notebooks` lists the notebooks whose
:func:`normalize`-d content differs.
"""

import copy
import tempfile
from pathlib import Path

import nbformat

from ..core.cells import grade_id, is_solution, visible_source
from ..core.gradebook import sqlite_url
from ..core.nbgrader_config import RELEASE, SOURCE, course_config, prepare_nbgrader


def source_assignments(root):
    """Ids of the assignments that have a source folder under ``root/solutions``."""
    source = Path(root) / SOURCE
    return sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb"))) \
        if source.is_dir() else []


def generate(assignment, root=".", release_dir=None, db_url=None):
    """Generate the student version of ``assignment``; return its folder.

    ``release_dir`` (absolute, or relative to ``root``) defaults to ``release``;
    ``db_url`` to a throw-away SQLite gradebook, because the student version
    does not depend on it (``grade`` registers the assignment in the real one).
    """
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory

    prepare_nbgrader()
    root = Path(root).resolve()
    with tempfile.TemporaryDirectory(prefix="autograder-gen-") as tmp:
        c = course_config(root, db_url or sqlite_url(Path(tmp) / "gradebook.db"), assignment=assignment)
        c.CourseDirectory.release_directory = str(release_dir or RELEASE)
        c.BaseConverter.force = True
        GenerateAssignment(coursedir=CourseDirectory(config=c), config=c).start()
    return root / (release_dir or RELEASE) / assignment


def normalize(nb):
    """A copy of notebook ``nb`` without what may legitimately vary between runs.

    Outputs, execution counts, execution timing and widget state are dropped;
    cell sources are compared as text. Two student versions are the same if
    their normalized forms are equal.
    """
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if isinstance(cell.source, list):
            cell.source = "".join(cell.source)
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def stale_notebooks(assignment, root="."):
    """Relative paths of committed student notebooks that differ from a fresh generation."""
    root = Path(root).resolve()
    with tempfile.TemporaryDirectory(prefix="autograder-rel-") as tmp:
        fresh = generate(assignment, root, release_dir=Path(tmp) / "release")
        stale = []
        for new in sorted(fresh.glob("*.ipynb")):
            old = root / RELEASE / assignment / new.name
            if not old.exists() or normalize(nbformat.read(old, 4)) != normalize(nbformat.read(new, 4)):
                stale.append(str(old.relative_to(root)))
        return stale


def solution_source(source):
    """A solution cell's source as a student who solved it hands it in: without hidden tests
    and without the ``### BEGIN/END SOLUTION`` marker lines."""
    return "\n".join(line for line in visible_source(source).splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


def solved(release, source, parts=None):
    """A copy of the student version ``release`` with the solutions of the instructor's
    ``source`` notebook in its solution cells (code and written answers): those whose grade id
    is in ``parts``, or all of them. What a student who solved the assignment hands in (the
    tests' and the benchmarks' classes are made of it)."""
    answers = {grade_id(c): solution_source(c.source) for c in source.cells if is_solution(c)}
    nb = copy.deepcopy(release)
    for cell in nb.cells:
        if grade_id(cell) in answers and (parts is None or grade_id(cell) in parts):
            cell.source = answers[grade_id(cell)]
    return nb
