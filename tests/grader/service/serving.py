"""Helpers of the service tests: a course with an exchange, ``serve`` as a real process,
and hand-ins in the exchange's own layout.

:func:`hand_in` writes what ``nbgrader submit`` writes (``inbound/<student>+<assignment>+
<timestamp>+<random>/`` with the notebook, ``timestamp.txt`` and ``submission_secret.txt``),
for the tests that need many students at once; the round trip through nbgrader's own
``submit`` and ``fetch_feedback`` is in ``test_serve.py`` and, through JupyterLab,
``test_hub_e2e.py``.
"""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import nbformat

from autograder.service.journal import Journal
from tests.servers import _start

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "course"
AID, COURSE_ID = "toy", "attention-2"


def make_course(base, course_toml=""):
    """A course root of the toy assignment under ``base`` with an exchange beside it:
    ``(root, exchange)``; the student version generated."""
    root, exchange = base / "course", base / "exchange"
    shutil.copytree(FIXTURE / "solutions" / AID, root / "solutions" / AID)
    config = (REPO / "nbgrader_config.py").read_text()
    (root / "nbgrader_config.py").write_text(
        config + f"\nc.Exchange.root = {str(exchange)!r}\nc.CourseDirectory.course_id = {COURSE_ID!r}\n")
    (root / "course.toml").write_text(course_toml)
    (exchange / COURSE_ID / "inbound").mkdir(parents=True)
    (exchange / COURSE_ID / "feedback").mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "autograder", "generate", AID, "--root", str(root)],
                   cwd=REPO, env=environ(), check=True, capture_output=True, timeout=600)
    return root, exchange


def environ():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for name in list(env):
        if name.startswith("JUPYTERHUB_"):
            env.pop(name)
    return env


def hand_in(exchange, student, notebook, when=None):
    """One ``nbgrader submit`` of ``notebook`` by ``student``: the inbound folder's name."""
    when = when or datetime.now(timezone.utc)
    stamp = when.strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    name = f"{student}+{AID}+{stamp}+{secrets.token_hex(6)}"
    staging = exchange / COURSE_ID / f".{name}"
    staging.mkdir()
    nbformat.write(notebook, staging / f"{AID}.ipynb")
    (staging / "timestamp.txt").write_text(stamp)
    (staging / "submission_secret.txt").write_text(secrets.token_hex(64))
    os.rename(staging, exchange / COURSE_ID / "inbound" / name)  # lands whole, as a copy would
    return name


@contextmanager
def serving(root, exchange, state, log, *extra):
    """``python -m autograder serve`` on the course, for as long as the ``with`` lasts."""
    argv = [sys.executable, "-m", "autograder", "serve", "--root", str(root), "--state", str(state),
            "--exchange", str(exchange), "--course-id", COURSE_ID, *extra]
    process = _start(argv, log, env=environ())
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def wait_for(check, what, process=None, log=None, timeout=300):
    """Wait until ``check()`` is true (every 0.1 s); fail naming ``what`` (and the log)."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert process is None or process.poll() is None, f"serve ended: {Path(log).read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s; " + (
            Path(log).read_text()[-3000:] if log else "")
        time.sleep(0.1)
    return value


def attempts(state):
    """Every attempt of the journal at ``state`` (read as the service writes it)."""
    journal = Journal(state)
    try:
        return journal.rows()
    finally:
        journal.close()


def children(pid):
    """Ids of the processes whose parent is ``pid``."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
