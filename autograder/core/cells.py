"""What a cell of an nbgrader notebook is: the grader's one vocabulary of cells.

Built on :mod:`nbgrader.utils`, so the grader and nbgrader never disagree about a cell:

* a **test cell** is a graded code cell that is not a solution: its points are decided by
  the outside judge (:mod:`autograder.judge.verdict`);
* a **set-up cell** is a locked code cell that is neither graded nor a solution (imports,
  data, helpers): trusted code, which the judge runs too;
* a **locked** cell is one nbgrader restores from the student version when it grades
  (:func:`nbgrader.utils.is_locked`: every non-solution graded or ``locked`` cell);
* a **written answer** is a graded markdown solution cell, graded by hand.

A test cell's hidden lines sit between :data:`HIDDEN_BEGIN` and :data:`HIDDEN_END`:
:func:`visible_source` is what a student's kernel may run, :func:`judged_source` what the
judge runs.
"""

from nbgrader.utils import is_grade, is_locked, is_solution

__all__ = ["HIDDEN_BEGIN", "HIDDEN_END", "nbgrader_meta", "grade_id", "is_grade", "is_locked",
           "is_solution", "is_test_cell", "is_setup_cell", "is_written_answer",
           "visible_source", "judged_source"]

HIDDEN_BEGIN = "### BEGIN HIDDEN TESTS"
HIDDEN_END = "### END HIDDEN TESTS"


def nbgrader_meta(cell):
    """The cell's ``metadata.nbgrader`` dict (empty when it has none)."""
    return cell.get("metadata", {}).get("nbgrader", {})


def grade_id(cell):
    """The cell's nbgrader ``grade_id``, or None."""
    return nbgrader_meta(cell).get("grade_id")


def is_test_cell(cell):
    """A graded code cell that is not a solution: its points are decided by the judge."""
    return cell.cell_type == "code" and bool(is_grade(cell)) and not is_solution(cell)


def is_setup_cell(cell):
    """A locked, ungraded code cell (the notebook's set-up): trusted code run on both sides."""
    return cell.cell_type == "code" and bool(is_locked(cell)) and not is_grade(cell)


def is_written_answer(cell):
    """A graded markdown solution cell: an answer graded by hand."""
    return cell.cell_type == "markdown" and bool(is_grade(cell)) and bool(is_solution(cell))


def visible_source(source):
    """``source`` without its hidden-test blocks (what the student's kernel may run)."""
    out, hidden = [], False
    for line in source.splitlines():
        if line.strip().startswith(HIDDEN_BEGIN):
            hidden = True
        elif line.strip().startswith(HIDDEN_END):
            hidden = False
        elif not hidden:
            out.append(line)
    return "\n".join(out)


def judged_source(source):
    """``source`` with the hidden-test markers removed (what the judge runs)."""
    return "\n".join(line for line in source.splitlines()
                     if line.strip() not in (HIDDEN_BEGIN, HIDDEN_END))
