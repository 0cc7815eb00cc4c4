"""End to end: grade a synthetic class per assignment with ``--jobs 2``; check every score.

The toy fixture under ``tests/fixtures/course`` gets the full hostile class, derived
from its source notebook and student version: keep the solution of some parts,
break others, or prepend a hang, a crash, a memory bomb, a fork bomb or a print
flood to one part's solution cell, tamper with or delete test cells. How such a
submission is handled does not depend on the assignment, so each course
assignment gets a class of three (correct, untouched, partial) that checks its
own notebook and checks end to end. The source notebook follows the course
structure (each part: one solution cell, then its test cells), so the exact
expected score of every submission is a sum of test-cell points. One ``grade``
run per assignment grades its class (module-scoped fixture).
"""

import ast
import copy
import csv
import html
import io
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from notebooks import solution_lines, solution_source

from autograder.core.cells import grade_id, is_grade, is_solution, is_test_cell, nbgrader_meta
from autograder.host.driver import grade
from autograder.core.limits import Limits
from autograder.host.release import generate
from autograder.sandbox.cgroups import cgroup_version
from autograder.sandbox.launcher import unavailable_reason

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "course"
from autograder.core.assignments import REGISTRY  # noqa: E402 - the registry
COURSE = tuple(a.id for a in REGISTRY if not a.needs)  # 07-flash-triton has its own tests
FULL = ("toy",)  # graded with the full hostile class; the others with a class of three
LIMITS = dict(jobs=2, limits=Limits(cell_timeout=10, notebook_timeout=90, memory_mb=2048,
                                     output_limit=100_000))
SANDBOX_MISSING = unavailable_reason()

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SANDBOX_MISSING is not None, reason=str(SANDBOX_MISSING))]


# -- the structure of an assignment ---------------------------------------------------------
def is_solution_code(cell):
    """An ungraded solution code cell: the student's code, checked by the test cells after it."""
    return cell.cell_type == "code" and is_solution(cell) and not is_grade(cell)


def parts(release):
    """[(solution grade_id, [(test grade_id, points), ...]), ...] in notebook order."""
    found = []
    for cell in release.cells:
        if is_solution_code(cell):
            found.append((grade_id(cell), []))
        elif is_test_cell(cell) and found:
            found[-1][1].append((grade_id(cell), float(nbgrader_meta(cell)["points"])))
    return [p for p in found if p[1]]


def points(part):
    return sum(p for _, p in part[1])


def wrong_version(source):
    """Same top-level names, wrong values: functions return 0, assignments become -1."""
    lines = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            lines.append(f"def {node.name}({ast.unparse(node.args)}):\n    return 0")
        elif isinstance(node, ast.Assign):
            lines += [f"{ast.unparse(t)} = -1" for t in node.targets]
    return "\n".join(lines) or "pass"


def insert_in_functions(source, statement):
    """``statement`` as the first line of every top-level function (after its docstring)."""
    lines = source.splitlines()
    for node in reversed(ast.parse(source).body):
        if not isinstance(node, ast.FunctionDef):
            continue
        first = node.body[0]
        has_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        if has_doc and len(node.body) == 1:
            continue
        anchor = node.body[1] if has_doc else first
        lines.insert(anchor.lineno - 1, " " * anchor.col_offset + statement)
    return "\n".join(lines)


def defines_function(source):
    return any(isinstance(node, ast.FunctionDef) for node in ast.parse(source).body)


def warning_version(source):
    """Warns once when the cell runs and every time one of its functions is called."""
    return ("import warnings\nwarnings.warn('a warning at definition time')\n"
            + insert_in_functions(source, "warnings.warn('harmless', UserWarning)"))


def reference_version(source):
    """The correct code, but every function also touches ``transformer_ref``."""
    return "from transformer_ref import numpy as ref\n" + insert_in_functions(source, "ref.__name__")


# "timeout" burns a core until its cell's time is up (a busy kernel is still stopped on time);
# the hangs wait asleep, ignoring SIGINT: what they test is the kill after the ignored
# interrupt, which needs no CPU, and two more busy cores for 10 s each would only slow the suite
HANG = ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n"
        "    time.sleep(1)\n")
LOOP = "while True:\n    pass\n"
MEMORY = "hog = []\nwhile True:\n    hog.append(bytearray(50_000_000))\n"
EXIT = "import os\nos._exit(1)\n"
SEGFAULT = "import ctypes\nctypes.string_at(0)\n"
FLOOD = "while True:\n    print('x' * 10_000)\n"
SYSEXIT = "import sys\nsys.exit(3)\n"
FORKBOMB = """\
import os, time
for _ in range(1000):
    try:
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
    except OSError:
        break
"""
OFFLINE = "import socket\nassert [n for _, n in socket.if_nameindex()] == ['lo'], 'network reachable'\n"
MONKEYPATCH = """\
import importlib, pkgutil
import numpy
numpy.allclose = lambda *a, **k: True
numpy.array_equal = lambda *a, **k: True
numpy.isclose = lambda *a, **k: True
numpy.testing.assert_allclose = lambda *a, **k: None
numpy.testing.assert_array_equal = lambda *a, **k: None
try:
    import autograder.checks as _ac
    for _info in pkgutil.iter_modules(_ac.__path__):
        _mod = importlib.import_module("autograder.checks." + _info.name)
        for _name in dir(_mod):
            if not _name.startswith("__") and callable(getattr(_mod, _name)):
                setattr(_mod, _name, lambda *a, **k: None)
except ImportError:
    pass
"""


class Class:
    """The synthetic class of one assignment: submissions and their expected scores."""

    def __init__(self, source, release):
        self.source, self.release = source, release
        self.parts = parts(release)
        self.solutions = {grade_id(c): solution_source(c.source) for c in source.cells if is_solution_code(c)}
        self.total = sum(points(p) for p in self.parts)
        self.submissions, self.expected = {}, {}

    def notebook(self, solved=None, change=None):
        """The student version with the parts in ``solved`` (default all) solved;
        ``change`` maps a solution grade_id to a function of its (solved) source."""
        solved = set(self.solutions) if solved is None else set(solved)
        nb = copy.deepcopy(self.release)
        for cell in nb.cells:
            gid = grade_id(cell)
            if is_solution_code(cell):
                if gid in solved:
                    cell.source = self.solutions[gid]
                if change and gid in change:
                    cell.source = change[gid](cell.source)
        return nb

    def add(self, student, nb, score, **expect):
        self.submissions[student] = nb
        self.expected[student] = dict(score=score, **expect)

    def prepend(self, part, code):
        """``change`` that puts ``code`` before the solution of part number ``part``."""
        return {self.parts[part][0]: lambda src: code + src}


# Who is in each class: the cases of test_exact_score are made from these lists, so every case
# grades someone (the fixture checks build_class adds exactly these students).
CLASS_OF_THREE = ("correct", "untouched", "partial")
FULL_ONLY = ("wrong", "skip1", "segfault1", "timeout", "hang", "hang1", "membomb", "crash", "sysexit",
             "flood", "network", "forkbomb", "warnings", "reference", "monkeypatch", "tampered", "deleted")


def build_class(source, release, full):
    """The synthetic class. Parts depend on earlier parts (later tests call earlier
    functions), so most breakages go into the last part, whose loss costs exactly
    its own points; the first part is broken only next to ``skip1`` (the first part
    left undone), whose score it must equal.

    ``full=False`` leaves out the limit cases that cost the most time and do not
    depend on the assignment's content (loops, hangs, memory, exits, floods); the
    toy fixture and the first course assignment always get the full class.
    """
    c = Class(source, release)
    last = c.parts[-1][0]
    lost_last = c.total - points(c.parts[-1])
    half = (len(c.parts) + 1) // 2
    c.add("correct", c.notebook(), c.total)
    c.add("untouched", copy.deepcopy(release), 0)
    c.add("partial", c.notebook(solved=[p[0] for p in c.parts[:half]]),
          sum(points(p) for p in c.parts[:half]))
    if not full:
        return c
    c.add("wrong", c.notebook(change={g: wrong_version for g in c.solutions}), 0)
    c.add("skip1", c.notebook(solved=[p[0] for p in c.parts[1:]]), c.total - points(c.parts[0]))
    c.add("segfault1", c.notebook(change=c.prepend(0, SEGFAULT)), "skip1", limits={"crash"})
    c.add("timeout", c.notebook(change=c.prepend(-1, LOOP)), lost_last, limits={"timeout"})
    c.add("hang", c.notebook(change=c.prepend(-1, HANG)), lost_last, limits={"timeout", "hang"})
    c.add("hang1", c.notebook(change=c.prepend(0, HANG)), "skip1", limits={"hang"})
    c.add("membomb", c.notebook(change=c.prepend(-1, MEMORY)), lost_last)
    c.add("crash", c.notebook(change=c.prepend(-1, EXIT)), lost_last, limits={"crash"})
    c.add("sysexit", c.notebook(change=c.prepend(-1, SYSEXIT)), lost_last)
    c.add("flood", c.notebook(change=c.prepend(-1, FLOOD)), lost_last, limits={"output"})
    c.add("network", c.notebook(change=c.prepend(-1, OFFLINE)), c.total)
    if process_cgroups_work():  # never fork-bomb a machine without the cap
        c.add("forkbomb", c.notebook(change=c.prepend(-1, FORKBOMB)), c.total)
    c.add("warnings", c.notebook(change={g: warning_version for g in c.solutions}), c.total)
    # transformer_ref is not importable in the sandbox: the part's cell fails, so its tests do
    # (and so do later parts that call its functions)
    k = max(i for i, p in enumerate(c.parts) if defines_function(c.solutions[p[0]]))
    names = [n.name for n in ast.parse(c.solutions[c.parts[k][0]]).body if isinstance(n, ast.FunctionDef)]
    lost = [p for p in c.parts[k:]
            if p is c.parts[k] or any(re.search(rf"\b{n}\b", c.solutions[p[0]]) for n in names)]
    c.add("reference", c.notebook(change={c.parts[k][0]: reference_version}),
          c.total - sum(points(p) for p in lost), flags={"imports-transformer_ref"})
    c.add("monkeypatch", c.notebook(solved=[], change=c.prepend(0, MONKEYPATCH)), 0,
          flags={"imports-autograder", "dynamic-import"})
    last_test = c.parts[-1][1][0][0]
    nb = c.notebook(change={last: wrong_version})
    next(cell for cell in nb.cells if grade_id(cell) == last_test).source = "pass"
    c.add("tampered", nb, lost_last, tampered={last_test})
    nb = c.notebook(change={last: wrong_version})
    nb.cells = [cell for cell in nb.cells if grade_id(cell) != last_test]
    c.add("deleted", nb, lost_last, deleted={last_test})
    return c


def process_cgroups_work():
    import os

    return os.geteuid() == 0 and cgroup_version() > 0


# -- one grading run per assignment -----------------------------------------------------------
def assignments():
    found = [("toy", FIXTURE)]
    found += [(a, REPO) for a in COURSE if (REPO / "solutions" / a / f"{a}.ipynb").exists()]
    return found


@pytest.fixture(scope="module")
def grading_run(tmp_path_factory):
    """``grading_run(assignment, course)``: its class graded, once in the module (``graded``
    and ``graded_full`` share the run)."""
    runs = {}

    def run(assignment, course):
        if assignment not in runs:
            runs[assignment] = graded_assignment(assignment, course, tmp_path_factory)
        return runs[assignment]
    return run


@pytest.fixture(scope="module", params=assignments(), ids=lambda p: p[0])
def graded(request, grading_run):
    """Each assignment's class, graded."""
    return grading_run(*request.param)


@pytest.fixture(scope="module", params=[a for a in assignments() if a[0] in FULL], ids=lambda p: p[0])
def graded_full(request, grading_run):
    """The classes that hold the full hostile class, graded (the same runs as ``graded``'s)."""
    return grading_run(*request.param)


def graded_assignment(assignment, course, tmp_path_factory):
    """Build the synthetic class of ``assignment`` in a fresh course folder and grade it."""
    root = tmp_path_factory.mktemp(f"course-{assignment}")
    shutil.copytree(course / "solutions" / assignment, root / "solutions" / assignment)
    source = nbformat.read(root / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    release_dir = generate(assignment, root, release_dir=root / "release-check")
    release = nbformat.read(release_dir / f"{assignment}.ipynb", as_version=4)
    klass = build_class(source, release, full=assignment in FULL)
    roster = set(CLASS_OF_THREE) | (set(FULL_ONLY) if assignment in FULL else set())
    assert set(klass.submissions) == roster - (set() if process_cgroups_work() else {"forkbomb"})
    for student, nb in klass.submissions.items():
        folder = root / "submitted" / student / assignment
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{assignment}.ipynb")
    out = io.StringIO()
    results = grade(assignment, root, progress=False, out=out, **LIMITS)
    first = {r.student: r.score for r in results}
    return dict(root=root, assignment=assignment, klass=klass, out=out.getvalue(),
                results={r.student: r for r in results}, first=first)


def expected_score(graded, student):
    """The expected score; a student name stands for that student's actual score."""
    score = graded["klass"].expected[student]["score"]
    return graded["results"][score].score if isinstance(score, str) else score


@pytest.mark.parametrize("student", CLASS_OF_THREE)
def test_exact_score(graded, student):
    check_score(graded, student)


@pytest.mark.parametrize("student", FULL_ONLY)
def test_exact_score_full_class(graded_full, student):
    if student == "forkbomb" and not process_cgroups_work():
        pytest.skip("the fork bomb is in the class only where process cgroups cap it (root and cgroups)")
    check_score(graded_full, student)


def check_score(graded, student):
    """The student's score, status, limits, flags and restored test cells are the expected ones."""
    result = graded["results"][student]
    expect = graded["klass"].expected[student]
    assert result.status == "ok", result.error
    if student == "skip1":  # the first part undone: at most the other parts' points
        first = points(graded["klass"].parts[0])
        assert 0 < result.score <= graded["klass"].total - first
        if graded["assignment"] == "toy":
            assert result.score == graded["klass"].total - first
    else:
        assert result.score == pytest.approx(expected_score(graded, student)), (student, result.events)
    kinds = {e.kind for e in result.events}
    assert expect.get("limits", set()) <= kinds
    assert expect.get("flags", set()) <= set(result.flags)
    assert set(result.tampered) == expect.get("tampered", set())
    assert set(result.deleted) == expect.get("deleted", set())


def test_honest_submissions_are_not_flagged(graded):
    """Nothing but the class-wide copy detector: this synthetic class hands in one solution."""
    for student in ("correct", "untouched", "partial", "skip1", "warnings"):
        if student not in graded["results"]:
            continue
        result = graded["results"][student]
        assert set(result.flags) <= {"similar-to-classmate"}, result.flags
        assert not result.tampered and not result.deleted
        assert not result.events, result.events
    assert "similar-to-classmate" in graded["results"]["correct"].flags  # same code as "partial"


def test_gradebook_and_csv_agree_and_regrading_is_idempotent(graded):
    from nbgrader.api import Gradebook

    root, assignment = graded["root"], graded["assignment"]
    with open(root / "grades.csv", newline="") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert set(rows) == set(graded["klass"].submissions)
    for student, row in rows.items():
        assert float(row["score"]) == pytest.approx(graded["results"][student].score)
    assert "tampered" not in rows["correct"]["tampered"]
    if assignment in FULL:  # regrading is the same code for every assignment; toy has every status
        assert rows["tampered"]["tampered"] and rows["deleted"]["deleted"]
        assert "crash" in rows["segfault1"]["limits"]
        assert "output" in rows["flood"]["limits"] and "hang" in rows["hang"]["limits"]
        assert "imports-transformer_ref" in rows["reference"]["flags"]
        regrade = ["correct", "partial", "segfault1", "tampered"]
        unchanged = grade(assignment, root, progress=False, out=io.StringIO(), students=regrade,
                          **LIMITS)
        assert unchanged == []  # nothing changed since the first run: nothing is graded again
        again = grade(assignment, root, progress=False, out=io.StringIO(), students=regrade,
                      force=True, **LIMITS)
        assert {r.student: r.score for r in again} == {s: graded["first"][s] for s in regrade}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        subs = gb.assignment_submissions(assignment)
        assert sorted(s.student.id for s in subs) == sorted(graded["klass"].submissions)
        for sub in subs:
            assert sub.score == pytest.approx(graded["first"][sub.student.id])
    with open(root / "grades.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == len(graded["klass"].submissions)


def test_feedback_has_no_hidden_tests_or_solutions(graded):
    root, assignment, klass = graded["root"], graded["assignment"], graded["klass"]
    source = klass.source
    hidden = [line.strip() for c in source.cells if is_test_cell(c)
              for line in re.findall(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", c.source, re.S)
              for line in line.splitlines() if len(line.strip()) > 12]
    assert hidden, "the assignment should have hidden tests"
    pages = list((root / "feedback").glob(f"*/{assignment}/*.html"))
    assert len(pages) == len(graded["klass"].submissions)
    for page in pages:
        text = page.read_text()
        for line in hidden:
            assert line not in text and _html_escape(line) not in text, (page, line)
    if assignment in COURSE:  # the student version as released: its page shows no model answer
        page = root / "feedback" / "untouched" / assignment / f"{assignment}.html"
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        assert not [line for line in solution_lines(assignment) if line in text]


def test_summary_reports_limits_and_tampering(graded):
    out = graded["out"]
    assert "Tests passed:" in out and "Slowest:" in out
    if graded["assignment"] not in FULL:
        return
    for needle in ("hang", "output", "Hit a limit:", "crash",
                   "Edited test cells (restored):", "Deleted test cells (restored):",
                   "Suspicious code:", "imports-transformer_ref"):
        assert needle in out, needle


def _html_escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
