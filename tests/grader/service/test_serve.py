"""``python -m autograder serve`` end to end: the exchange in, the sandboxed grader, feedback out.

One course (the toy assignment, ``course.toml``: 3 attempts each, the best counts) and one
``serve --jobs 1`` for a deadline's worth of hand-ins, landed in the exchange before it
starts: alice through nbgrader's own ``submit``, the others in nbgrader's layout
(:func:`serving.hand_in`). What must hold, each computed independently of the service:

* the students are served round robin, one in flight each: alice, ann, ben, cat, then
  ann's second and third attempts;
* ann's fourth attempt is refused by the rules (never graded) and told so through the
  exchange; her best attempt is her grade, and ``submitted/`` holds it;
* ``nbgrader fetch_feedback`` hands alice exactly the course's feedback page;
* ``grade --force`` afterwards gives every student the same score;
* ``kill -9`` of the service mid-grade, then a restart: every attempt is graded, once, its
  feedback released, and the killed service's workers are gone.
"""

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbformat
import pytest

from autograder.core.scratch import OWNER
from autograder.sandbox.launcher import unavailable_reason
from autograder.service.journal import DONE, GRADING, REFUSED
from nbgrader.utils import notebook_hash
from tests.grader.test_grading_e2e import Class
from tests.grader.service.serving import (AID, COURSE_ID, REPO, alive, attempts, children, environ,
                                          hand_in, make_course, serving, wait_for)

SANDBOX_MISSING = unavailable_reason()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SANDBOX_MISSING is not None, reason=str(SANDBOX_MISSING))]
NBGRADER = Path(sys.executable).parent / "nbgrader"
RULES = '[service]\nattempts = 3\ncounts = "best"\n'
AS_HUB_USER = ("import sys, nbgrader.utils as u; u.get_osusername = lambda: 'jovyan'; "
               "from nbgrader.apps.nbgraderapp import main; sys.argv[0] = 'nbgrader'; sys.exit(main())")


def nbgrader_as(student, home, *args):
    env = dict(environ(), HOME=str(home), JUPYTERHUB_USER=student)
    done = subprocess.run([sys.executable, "-c", AS_HUB_USER, *args], cwd=home, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])


def scores(root):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        return {s.student_id: s.score for s in gb.assignment_submissions(AID)}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    base = tmp_path_factory.mktemp("serve")
    root, exchange = make_course(base, RULES)
    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    klass = Class(source, nbformat.read(root / "release" / AID / f"{AID}.ipynb", as_version=4))
    return dict(base=base, root=root, exchange=exchange, klass=klass, state=base / "state")


@pytest.fixture(scope="module")
def burst(course):
    """The hand-ins, then one ``serve`` until all are graded; what the tests read."""
    base, root, exchange, klass = course["base"], course["root"], course["exchange"], course["klass"]
    subprocess.run([str(NBGRADER), "release_assignment", AID], cwd=root, env=environ(), check=True,
                   capture_output=True, timeout=600)
    home = base / "home" / "alice"
    home.mkdir(parents=True)
    (home / "nbgrader_config.py").write_text(
        f"c = get_config()\nc.Exchange.root = {str(exchange)!r}\nc.CourseDirectory.course_id = {COURSE_ID!r}\n")
    nbgrader_as("alice", home, "fetch_assignment", AID)
    nbformat.write(klass.notebook(), home / AID / f"{AID}.ipynb")
    nbgrader_as("alice", home, "submit", AID)
    half = [p[0] for p in klass.parts[: (len(klass.parts) + 1) // 2]]
    partial = sum(sum(points for _, points in p[1]) for p in klass.parts[: len(half)])
    t0 = datetime.now(timezone.utc)
    ann = [klass.notebook(), klass.notebook(solved=[]), klass.notebook(solved=half), klass.notebook()]
    names = {"ann": [hand_in(exchange, "ann", nb, t0 + timedelta(seconds=i)) for i, nb in enumerate(ann)],
             "ben": [hand_in(exchange, "ben", klass.notebook(solved=half), t0)],
             "cat": [hand_in(exchange, "cat", klass.notebook(solved=[]), t0)]}
    log = base / "serve.log"
    with serving(root, exchange, course["state"], log, "--jobs", "1") as process:
        wait_for(lambda: (rows := attempts(course["state"])) and len(rows) == 7
                 and all(a.state in (DONE, REFUSED) for a in rows), "7 attempts graded or refused",
                 process, log)
        process.send_signal(signal.SIGTERM)
        stopped = process.wait(timeout=60)
    nbgrader_as("alice", home, "fetch_feedback", AID)
    return dict(course, names=names, home=home, partial=partial, stopped=stopped, log=log,
                rows=attempts(course["state"]))


def test_students_are_served_round_robin_one_at_a_time(burst):
    graded = sorted((a for a in burst["rows"] if a.state == DONE), key=lambda a: a.started)
    assert [a.student for a in graded] == ["alice", "ann", "ben", "cat", "ann", "ann"]
    for student in ("ann",):  # one attempt of a student in flight: the next starts once it is recorded
        mine = [a for a in graded if a.student == student]
        assert all(later.started >= earlier.finished for earlier, later in zip(mine, mine[1:]))


def test_the_best_attempt_counts_and_a_fourth_is_refused(burst):
    klass, root = burst["klass"], burst["root"]
    ann = [a for a in burst["rows"] if a.student == "ann"]
    assert [a.state for a in ann] == [DONE, DONE, DONE, REFUSED]
    assert [a.score for a in ann[:3]] == [klass.total, 0, burst["partial"]]
    assert "all 3 attempts" in ann[3].message
    assert [a.counted for a in ann] == [1, 0, 0, 0]
    assert scores(root) == {"alice": klass.total, "ann": klass.total, "ben": burst["partial"], "cat": 0}
    handed = nbformat.read(root / "submitted" / "ann" / AID / f"{AID}.ipynb", as_version=4)
    assert handed == klass.notebook()  # the counted attempt is what grade would grade
    secret = (burst["state"] / "attempts" / ann[3].token / "submission" / "submission_secret.txt").read_text()
    page = burst["exchange"] / COURSE_ID / "feedback" / f"{notebook_hash(secret=secret, notebook_id=AID)}.html"
    assert "not graded" in page.read_text() and "all 3 attempts" in page.read_text()


def test_fetch_feedback_gets_the_course_page(burst):
    fetched = sorted((burst["home"] / AID / "feedback").glob(f"*/{AID}.html"))
    assert len(fetched) == 1
    assert fetched[0].read_bytes() == (burst["root"] / "feedback" / "alice" / AID / f"{AID}.html").read_bytes()
    text = fetched[0].read_text()
    assert "Content-Security-Policy" in text and "BEGIN HIDDEN TESTS" not in text


def test_sigterm_stops_cleanly_and_grade_agrees(burst):
    assert burst["stopped"] == 0, burst["log"].read_text()[-2000:]
    before = scores(burst["root"])
    subprocess.run([sys.executable, "-m", "autograder", "grade", AID, "--root", str(burst["root"]),
                    "--force", "--no-progress", "--jobs", "2"], cwd=REPO, env=environ(),
                   check=True, capture_output=True, timeout=600)
    assert scores(burst["root"]) == before


def held_scratch(pid):
    """The scratch folders process ``pid`` holds (:mod:`autograder.core.scratch`)."""
    folders = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if link.endswith(f"/{OWNER}"):
            folders.add(Path(link).parent)
    return sorted(folders)


def test_kill_9_mid_grade_then_restart_grades_everything_once(burst):
    root, exchange, state, klass = burst["root"], burst["exchange"], burst["state"], burst["klass"]
    names = [hand_in(exchange, s, klass.notebook()) for s in ("dan", "eve", "fay")]
    log = burst["base"] / "serve-killed.log"
    with serving(root, exchange, state, log, "--jobs", "1") as process:
        wait_for(lambda: any(a.state == GRADING and a.student in ("dan", "eve", "fay")
                             for a in attempts(state)), "a grade in progress", process, log)
        workers = wait_for(lambda: children(process.pid), "serve's grading workers", process, log)
        scratch = held_scratch(process.pid)  # the lane's scratch and socket folders
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    deadline = time.monotonic() + 30
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in workers), "a worker outlived the killed service"
    assert len(scratch) == 2, scratch  # the lane's, left by the kill (no finally ran)
    old = time.time() - 120  # the sweep leaves a folder changed in the last minute
    for folder in scratch:
        try:
            os.utime(folder, (old, old))
        except FileNotFoundError:  # a run of another test beside this one swept it already
            pass
    log = burst["base"] / "serve-restarted.log"
    with serving(root, exchange, state, log, "--jobs", "1") as process:
        wait_for(lambda: sum(a.state == DONE and a.student in ("dan", "eve", "fay")
                             for a in attempts(state)) == 3, "the three graded", process, log)
    assert "queued again" in log.read_text()
    assert not any(f.exists() for f in scratch), scratch  # the restarted lane swept them
    rows = [a for a in attempts(state) if a.origin in names]
    assert sorted(a.student for a in rows) == ["dan", "eve", "fay"]  # each taken in once
    assert {a.score for a in rows} == {klass.total}
    for a in rows:
        secret = (state / "attempts" / a.token / "submission" / "submission_secret.txt").read_text()
        assert (exchange / COURSE_ID / "feedback" / f"{notebook_hash(secret=secret, notebook_id=AID)}.html").is_file()
    assert {s: v for s, v in scores(root).items() if s in ("dan", "eve", "fay")} == dict.fromkeys(
        ("dan", "eve", "fay"), klass.total)
