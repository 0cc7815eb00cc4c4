"""The assignments under stock nbgrader with the course's settings.

In a temporary course, nbgrader's ``generate_assignment`` (the API the formgrader calls)
makes every student version, and the committed ones are not stale. ``autograde`` and
``generate_feedback`` then grade :data:`STOCK`'s source notebook and student version with
the course's own configuration: the source scores full autograded marks, the student
version zero, and the feedback pages show no hidden test and no solution. One assignment
shows the course's settings at work in stock nbgrader: the one with the most of them (the
memory window, the SDPA hook). Every assignment's source and student version are graded
by the course's own driver in ``tests/grader/test_grading_e2e.py`` (its ``correct`` and
``untouched`` students, and their feedback pages), through the same nbgrader preprocessors.
"""

import html
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from notebooks import (ASSIGNMENTS, ROOT, normalised, read, release_path,
                       solution_lines)

STOCK = ["06-flash-attention"]  # graded by stock nbgrader here


def _nbgrader_config(root):
    """The course's own nbgrader settings (what its ``nbgrader_config.py`` loads).

    Stock nbgrader then autogrades exactly as the driver does: the outside judge,
    and sandboxed kernels where bubblewrap is installed (the notebooks graded here
    are the instructor's own, so a plain kernel is safe where it is not).
    """
    from autograder.core.limits import Limits
    from autograder.core.nbgrader_config import autograde_settings, course_config
    from autograder.sandbox.launcher import unavailable_reason

    c = course_config(root)
    c.merge(autograde_settings(Limits(cell_timeout=120), sandboxed=unavailable_reason() is None))
    return c


GRADE_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from nbgrader.apps import NbGraderAPI
    from nbgrader.api import Gradebook
    sys.path[:0] = [{tests!r}, {here!r}]
    from notebooks import ASSIGNMENTS
    from test_assignment_grading import STOCK, _nbgrader_config
    root = Path(sys.argv[1])
    api = NbGraderAPI(config=_nbgrader_config(root))
    out = {{}}
    for aid in ASSIGNMENTS:
        result = api.generate_assignment(aid, force=True)
        assert result["success"], result["error"]
    for aid in STOCK:
        for student, folder in (("reference", "solutions"), ("blank", "release")):
            target = root / "submitted" / student / aid
            target.mkdir(parents=True, exist_ok=True)
            (target / f"{{aid}}.ipynb").write_bytes((root / folder / aid / f"{{aid}}.ipynb").read_bytes())
            result = api.autograde(aid, student, force=True, create=True)
            assert result["success"], result["error"]
            result = api.generate_feedback(aid, student, force=True)
            assert result["success"], result["error"]
    with Gradebook(f"sqlite:///{{root / 'gradebook.db'}}") as gb:
        for aid in STOCK:
            for student in ("reference", "blank"):
                nb = gb.find_submission_notebook(aid, aid, student)
                out[f"{{aid}}/{{student}}"] = [
                    (g.name, g.auto_score, g.max_score, g.cell_type) for g in nb.grades]
    print("RESULT" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A temporary course: generate every assignment; autograde STOCK's source and student version."""
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "solutions", root / "solutions")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run([sys.executable, "-c", GRADE_SCRIPT.format(tests=str(ROOT / "tests"), here=str(Path(__file__).parent)), str(root)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    return root, json.loads(line[len("RESULT"):])


@pytest.mark.slow
@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_committed_student_versions_are_not_stale(course, aid):
    root, _ = course
    assert normalised(read(root / "release" / aid / f"{aid}.ipynb")) == normalised(read(release_path(aid))), \
        "release/ is stale: run python -m autograder generate --all"


@pytest.mark.slow
@pytest.mark.parametrize("aid", STOCK)
def test_sources_score_full_marks_and_student_versions_zero(course, aid):
    _, scores = course
    reference = scores[f"{aid}/reference"]
    auto = [(name, score, max_score) for name, score, max_score, kind in reference if kind == "code"]
    assert auto and all(score == max_score for _, score, max_score in auto), auto
    assert all(score in (0, None) for name, score, _, kind in scores[f"{aid}/blank"]), scores[f"{aid}/blank"]


@pytest.mark.slow
@pytest.mark.parametrize("aid", STOCK)
def test_feedback_has_no_hidden_tests(course, aid):
    root, _ = course
    for student in ("reference", "blank"):
        page = root / "feedback" / student / aid / f"{aid}.html"
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        for marker in ["BEGIN HIDDEN TESTS", "autograder.checks", "_checks.check_"]:
            assert marker not in text, f"{student}: {marker}"
        if student == "blank":
            for line in solution_lines(aid):
                assert line not in text, line
