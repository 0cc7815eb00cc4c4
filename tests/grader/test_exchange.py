"""End to end: the JupyterHub round trip through nbgrader's filesystem exchange.

A course root of the toy fixture with the course's own ``nbgrader_config.py`` and a
temporary exchange (``c.Exchange.root``, ``c.CourseDirectory.course_id``). The instructor
runs ``nbgrader release_assignment``; two students (each their own ``HOME`` and
``JUPYTERHUB_USER``) run ``nbgrader fetch_assignment``, work (one correct, one with
markup in a written answer that would run script in a browser) and ``nbgrader submit``;
the instructor runs ``nbgrader collect``, the course's ``python -m autograder grade`` (the
real sandbox) and ``nbgrader release_feedback``; the students run ``nbgrader
fetch_feedback`` and get exactly the course's feedback page: their score, no hidden tests,
nothing that runs. ``release_feedback`` needs the ``timestamp.txt`` and
``submission_secret.txt`` that grading writes beside each page.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.sandbox.launcher import unavailable_reason
from tests.grader.service.hub import exchange_config
from tests.grader.test_grading_e2e import FIXTURE, Class

REPO = Path(__file__).resolve().parents[2]
NBGRADER = Path(sys.executable).parent / "nbgrader"
AID, COURSE_ID = "toy", "attention-2"
# A JupyterHub single-user server runs as the OS user "jovyan"; nbgrader then takes the
# student's name from JUPYTERHUB_USER (nbgrader.utils.get_username). The students' commands
# run as that user would: nbgrader's real command line, with the OS user name it would see.
AS_HUB_USER = ("import sys, nbgrader.utils as u; u.get_osusername = lambda: 'jovyan'; "
               "from nbgrader.apps.nbgraderapp import main; sys.argv[0] = 'nbgrader'; sys.exit(main())")
PAYLOAD = '<img src=x onerror="document.title=\'owned\'"><script>window.owned=1</script>'
SANDBOX_MISSING = unavailable_reason()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SANDBOX_MISSING is not None, reason=str(SANDBOX_MISSING))]


def run(args, cwd, env):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def trip(tmp_path_factory):
    base = tmp_path_factory.mktemp("exchange")
    root, exchange = base / "course", base / "exchange"
    shutil.copytree(FIXTURE / "solutions" / AID, root / "solutions" / AID)
    config = (REPO / "nbgrader_config.py").read_text()
    (root / "nbgrader_config.py").write_text(config + "\n" + exchange_config(exchange, COURSE_ID))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("JUPYTERHUB_USER", None)
    autograder = [sys.executable, "-m", "autograder"]
    run(autograder + ["generate", AID, "--root", str(root)], REPO, env)
    run([str(NBGRADER), "release_assignment", AID], root, env)

    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    klass = Class(source, nbformat.read(root / "release" / AID / f"{AID}.ipynb", as_version=4))
    students = {"alice": klass.notebook(), "mallory": klass.notebook(solved=[])}
    written = next(c for c in students["mallory"].cells
                   if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("solution"))
    written.source = f"My answer. {PAYLOAD}"
    homes = {}
    for student, notebook in students.items():
        home = base / "home" / student
        home.mkdir(parents=True)
        (home / "nbgrader_config.py").write_text("c = get_config()\n" + exchange_config(exchange, COURSE_ID))
        senv = dict(env, HOME=str(home), JUPYTERHUB_USER=student)
        student_nbgrader = [sys.executable, "-c", AS_HUB_USER]
        run(student_nbgrader + ["fetch_assignment", AID], home, senv)
        fetched = home / AID / f"{AID}.ipynb"
        assert fetched.exists()
        nbformat.write(notebook, fetched)
        run(student_nbgrader + ["submit", AID], home, senv)
        homes[student] = (home, senv)

    run([str(NBGRADER), "collect", AID], root, env)
    graded = run(autograder + ["grade", AID, "--root", str(root), "--no-progress", "--jobs", "2"],
                 REPO, env)
    released = run([str(NBGRADER), "release_feedback", AID], root, env)
    fetched = {}
    for student, (home, senv) in homes.items():
        run([sys.executable, "-c", AS_HUB_USER, "fetch_feedback", AID], home, senv)
        fetched[student] = sorted((home / AID / "feedback").glob(f"*/{AID}.html"))
    return dict(root=root, exchange=exchange, klass=klass, fetched=fetched, graded=graded,
                released=released)


def test_collect_brings_the_exchange_files_and_grade_scores_them(trip):
    root = trip["root"]
    for student in ("alice", "mallory"):
        folder = root / "submitted" / student / AID
        assert {"timestamp.txt", "submission_secret.txt", f"{AID}.ipynb"} <= {p.name for p in folder.iterdir()}
    with open(root / "grades.csv") as f:
        text = f.read()
    assert re.search(rf"^alice,{AID},.*\bok\b", text, re.M), text
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission(AID, s).score for s in ("alice", "mallory")}
        stamp = gb.find_submission(AID, "alice").timestamp
    assert scores == {"alice": trip["klass"].total, "mallory": 0}
    handed = (root / "submitted" / "alice" / AID / "timestamp.txt").read_text()
    assert stamp.strftime("%Y-%m-%d %H:%M:%S") == handed[:19]  # nbgrader's own submit time


def test_release_feedback_finds_its_timestamp_and_secret(trip):
    root = trip["root"]
    for student in ("alice", "mallory"):
        folder = root / "feedback" / student / AID
        handed = (root / "submitted" / student / AID / "timestamp.txt").read_text()
        assert (folder / "timestamp.txt").read_text()[:19] == handed[:19]
        assert (folder / "submission_secret.txt").read_text() == (
            root / "submitted" / student / AID / "submission_secret.txt").read_text().strip()
    released = list((trip["exchange"] / COURSE_ID / "feedback").glob("*.html"))
    assert len(released) == 2, trip["released"].stderr


def test_each_student_fetches_exactly_the_course_feedback_page(trip):
    root = trip["root"]
    for student, pages in trip["fetched"].items():
        assert len(pages) == 1, (student, pages)
        mine = (root / "feedback" / student / AID / f"{AID}.html").read_bytes()
        assert pages[0].read_bytes() == mine
    page = trip["fetched"]["mallory"][0].read_text()
    assert "My answer." in page
    assert "Content-Security-Policy" in page
    assert not re.search(r"<script[^>]*>\s*window\.owned", page) and "onerror=" not in page
    alice = trip["fetched"]["alice"][0].read_text()
    assert "BEGIN HIDDEN TESTS" not in alice and "BEGIN SOLUTION" not in alice
