"""Small classes of one assignment for the judge's tests, graded for real in the sandbox.

Every student hands in the course's own solution (the student version with the source
notebook's solution cells put in), with some cells replaced; :func:`grade_students` grades
the class with :func:`autograder.host.driver.grade` and returns, per student and test
cell, the points and the verdict the autograded notebook shows.
"""

import copy
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat
import notebooks

from autograder.core.cells import grade_id
from autograder.host.driver import grade

REPO = Path(__file__).resolve().parents[3]

# 06-flash-attention's attention the T x S way (right values, O(T * S) memory), for cheats
NAIVE = '''
def _full(q, k, v, causal):
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        scores = np.where(np.arange(S)[None, :] <= np.arange(T)[:, None] + S - T, scores, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(scores - m)
    total = w.sum(axis=-1, keepdims=True)
    return np.divide(w @ v, total, out=np.zeros(q.shape), where=total > 0)
'''


@dataclass(frozen=True)
class Cell:
    """One graded cell of one student: points and the verdict's message ("" if none)."""

    score: float
    message: str


def solved(aid):
    """The student version of ``aid`` with the course's solutions in its solution cells."""
    return notebooks.solved(nbformat.read(REPO / "release" / aid / f"{aid}.ipynb", as_version=4),
                            nbformat.read(REPO / "solutions" / aid / f"{aid}.ipynb", as_version=4))


def replaced(nb, **sources):
    """A copy of ``nb`` whose cells named by grade_id hold ``sources`` instead."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if grade_id(cell) in sources:
            cell.source = sources[grade_id(cell)]
    return nb


def verdict(cell):
    return "".join(o.get("evalue", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "error")


def grade_students(root, aid, students, **options):
    """Grade ``students`` (name -> notebook) of ``aid`` under ``root``.

    Returns ``(results, cells)``: the driver's StudentResults by student, and
    ``{student: {grade_id: Cell}}`` for every graded cell.
    """
    root = Path(root)
    (root / "solutions").mkdir(parents=True, exist_ok=True)
    if not (root / "solutions" / aid).exists():
        shutil.copytree(REPO / "solutions" / aid, root / "solutions" / aid)
    for student, nb in students.items():
        folder = root / "submitted" / student / aid
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, folder / f"{aid}.ipynb")
    results = {r.student: r for r in grade(aid, root, progress=False, **options)}
    cells = {}
    for student, result in results.items():
        scores = {g.name: g.auto_score for nb in result.notebooks for g in nb.grades}
        path = root / "autograded" / student / aid / f"{aid}.ipynb"
        graded = nbformat.read(path, as_version=4) if path.exists() else nbformat.v4.new_notebook()
        messages = {grade_id(c): verdict(c) for c in graded.cells if grade_id(c)}
        cells[student] = {name: Cell(score, messages.get(name, "")) for name, score in scores.items()
                          if score is not None}
    return results, cells
