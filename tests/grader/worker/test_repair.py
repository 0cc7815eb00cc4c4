""":func:`autograder.worker.repair.repair`: an honest notebook is left alone; each fault of
content is repaired in a copy, named, and leaves a notebook nbformat's schema accepts.
(A real grading run of each fault is in ``tests/grader/test_hostile_files.py``.)"""

import copy
from pathlib import Path

import nbformat
import pytest

from autograder.worker.repair import describe, repair

REPO = Path(__file__).resolve().parents[3]
RELEASES = sorted((REPO / "release").glob("*/*.ipynb"))


@pytest.mark.parametrize("path", RELEASES, ids=lambda p: p.parent.name)
def test_the_course_notebooks_as_handed_out_need_no_repair(path):
    release = nbformat.read(path, as_version=4)
    assert repair(release, release) == (release, [])


def test_every_fault_is_named_and_the_copy_is_valid():
    release = nbformat.read(RELEASES[0], as_version=4)
    nb = copy.deepcopy(release)
    graded = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade"))
    gid, points = graded.metadata["nbgrader"]["grade_id"], graded.metadata["nbgrader"]["points"]
    graded.metadata["nbgrader"]["points"] = points + 100
    nb.metadata["kernelspec"] = {}
    nb.cells[0].metadata.update(name="a\nb", tags=["x,y"])
    nb.cells[1]["id"], nb.cells[2]["id"] = "bad id!", nb.cells[3]["id"]
    nb.cells.append(copy.deepcopy(graded))  # a copied graded cell
    figure = nbformat.v4.new_markdown_cell("![f](attachment:figure.png)")
    nb.cells.append(figure)
    before = copy.deepcopy(nb)
    fixed, problems = repair(nb, release)
    assert nb == before  # the student's notebook is not changed
    nbformat.validate(fixed)
    flags = [f for f, _ in problems]
    assert flags.count("invalid-notebook") == 6  # two ids repeat (one of the copy) and flags.count("edited-metadata") == 2
    assert flags.count("missing-attachment") == 1
    assert fixed.cells[nb.cells.index(graded)].metadata["nbgrader"]["points"] == points
    assert "nbgrader" not in fixed.cells[-2].metadata  # the copy is an ordinary cell
    assert f"{gid}: points {points + 100} restored to {points}" in describe(problems, most=len(problems))
    assert describe(problems).endswith("; and 3 more")  # six named, the rest counted
