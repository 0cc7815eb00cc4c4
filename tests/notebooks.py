"""Helpers shared by the assignment tests: where the notebooks are, and how to read them.

Not a test module: the assignment tests import it, and every test (and benchmark) that hands
in a solved notebook takes :func:`solved` from here.
"""

import copy
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the grader-only checks are not installed, they live in the repo
    sys.path.insert(0, str(ROOT))
from autograder.core.assignments import REGISTRY  # noqa: E402 - the registry
from autograder.core.cells import grade_id, is_solution, nbgrader_meta, visible_source  # noqa: E402

# assignments that run on the course's lock alone (07-flash-triton, which needs triton, has its
# own test module)
ASSIGNMENTS = [a.id for a in REGISTRY if not a.needs]
FORBIDDEN_MARKERS = ["BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS",
                     "autograder.checks", "_checks.check_"]


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


def source_path(aid):
    return ROOT / "solutions" / aid / f"{aid}.ipynb"


def release_path(aid):
    return ROOT / "release" / aid / f"{aid}.ipynb"


def read(path):
    return nbformat.read(str(path), as_version=4)


meta = nbgrader_meta  # a cell's nbgrader metadata: the grader's own reading of it


def solution_lines(aid, min_len=30):
    """Distinctive lines of the solution regions and written model answers of ``aid``
    (lines that the given parts of the notebook also show, e.g. in a visible test, excluded)."""
    lines, shown = set(), set()
    for cell in read(source_path(aid)).cells:
        body = cell.source
        if meta(cell).get("solution") and cell.cell_type == "code":
            body = "\n".join(re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", body, re.S))
            shown |= {line.strip() for line in re.sub(r"### BEGIN SOLUTION\n.*?### END SOLUTION", "",
                                                       cell.source, flags=re.S).splitlines()}
        elif not meta(cell).get("solution"):
            shown |= {line.strip() for line in body.splitlines()}
            continue
        lines |= {line.strip() for line in body.splitlines() if len(line.strip()) >= min_len}
    return lines - shown


def normalised(nb):
    """What a student sees: cell types, sources and nbgrader metadata."""
    return [(c.cell_type, c.source, meta(c)) for c in nb.cells]


def hidden_checks(aid):
    """``[(check name, argument)]`` of every ``_checks.check_X(name)`` call in ``aid``'s hidden tests,
    in notebook order: what the grader runs, read from the source notebook itself."""
    calls = []
    for cell in read(source_path(aid)).cells:
        for hidden in re.findall(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", cell.source, re.S):
            calls += re.findall(r"_checks\.(check_\w+)\((\w+)\)", hidden)
    return calls


def solved_namespace(aid, replace=()):
    """Run the set-up and solution cells of ``aid`` (optionally edited) like a notebook does."""
    nb = read(source_path(aid))
    namespace = {"__name__": "__main__"}
    code = [nb.cells[1].source] + [c.source for c in nb.cells if meta(c).get("solution") and c.cell_type == "code"]
    code = "\n\n".join(code)
    for old, new in replace:
        assert old in code, f"mutation target not found: {old!r}"
        code = code.replace(old, new)
    exec(compile(code, f"<{aid}>", "exec"), namespace)
    return namespace
