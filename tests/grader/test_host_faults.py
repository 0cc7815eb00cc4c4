"""Faults of the grading host, injected for real on a real class: never a student's grade.

The toy fixture's class of three (``correct``, ``partial``, and ``zlate``, whose folder has
no ``timestamp.txt`` and is graded last by the same worker) is graded from a course folder
nested deep under a ``TMPDIR`` of 200 characters: the kernels' Unix sockets must not depend
on either, and ``zlate`` must be late (the time of grading counts without a
``timestamp.txt``), not take its classmate's submission time; a ``bwrap`` first on PATH
counts the kernels: a worker starts one per notebook (its preflight kernel grades the first,
no spare follows the last). Then the same class is graded
again on a broken host: a ``bwrap`` that cannot start kernels (all of them: the run stops
within a minute, one line, exit 1; or all but the first: the students it could not grade
are ``error``, the host's fault, their grades kept), a broken kernel boot, a full ``autograded/`` (a small tmpfs),
a read-only ``feedback/`` (a read-only bind mount: root ignores mode bits) and a grading
worker killed with SIGKILL mid-student. Each time: one line and no traceback, the earlier
grades stay in the gradebook (no zeros recorded), the run ends within its bound, and the
next ``grade`` finishes the rest with the scores of an undisturbed run. Every run tries a
kernel once (``AUTOGRADER_RETRIES``): an injected fault is certain, a retry only waits for it
again.
"""

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat
import pytest

from autograder.host.release import generate
from autograder.core.grading_run import make_socket_root
from autograder.core.scratch import OWNER, remove_scratch
from autograder.judge.kernel_manager import SUN_PATH_MAX, SocketPathError, check_socket_path
from autograder.sandbox.launcher import unavailable_reason
from test_grading_e2e import Class, points

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "course" / "solutions" / "toy"
AID = "toy"
DUE = "2026-11-20T23:59:00+00:00"
DUE_NAIVE = datetime(2026, 11, 20, 23, 59)  # as the gradebook holds times: naive UTC
ON_TIME = "2026-11-20 10:00:00.000000 UTC"
MISSING = unavailable_reason()
AS_ROOT = os.geteuid() == 0
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]
needs_root = pytest.mark.skipif(not AS_ROOT, reason="mounting a small file system needs root")
FASTEST = {"AUTOGRADER_RETRIES": "kernel_start_tries=1,kernel_start_pause=0"}


def long_folder(base, length):
    """A folder under ``base`` whose path is ``length`` characters long (or one more)."""
    path = str(base)
    while len(path) < length:
        path += "/" + "t" * max(1, min(100, length - len(path) - 1))
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


def run_grade(root, *args, env=None, grader=REPO, timeout=600):
    """``python -m autograder grade toy`` in ``root`` (the grader from ``grader``): the process,
    its seconds."""
    env = {**os.environ, **FASTEST, **(env or {}), "PYTHONPATH": str(grader)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", AID, "--root", str(root),
                           "--no-progress", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return proc, time.monotonic() - start


def scores(root, times=True):
    """``{student: (score, late penalty, submission time)}`` in the class gradebook (without
    the times: a re-grade moves the time of ``zlate``, graded without a timestamp.txt)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        return {s.student.id: (s.score, s.late_submission_penalty, s.timestamp if times else None)
                for s in gb.assignment_submissions(AID)}


def rows(root):
    with open(root / "grades.csv", newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


def one_line_stop(proc, *words):
    """The run stopped with exit status 1 and one line (no traceback) holding ``words``."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last, last
    return last


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The class, graded once from a deep course path under a 200-character TMPDIR."""
    base = tmp_path_factory.mktemp("faults")
    root = long_folder(base / "courses", len(str(base)) + 150) / "toy-course"
    shutil.copytree(FIXTURE, root / "solutions" / AID)
    (root / "course.toml").write_text(f'[late]\npolicy = "10%/day,cap=50%"\n'
                                      f'[assignments."{AID}"]\ndue = "{DUE}"\n')
    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    release = nbformat.read(generate(AID, root, release_dir=base / "release") / f"{AID}.ipynb",
                            as_version=4)
    klass = Class(source, release)
    first = klass.parts[0][0]
    for student, nb in {"correct": klass.notebook(), "partial": klass.notebook(solved={first}),
                        "zlate": klass.notebook()}.items():
        folder = root / "submitted" / student / AID
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{AID}.ipynb")
        if student != "zlate":
            (folder / "timestamp.txt").write_text(ON_TIME)
    tmpdir = long_folder(base / "tmp", 200)
    counting = fake_bwrap(base / "bin", passes=10**6)
    proc, seconds = run_grade(root, "--jobs", "1", env={"TMPDIR": str(tmpdir), **counting})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dict(root=root, klass=klass, tmpdir=tmpdir, base=base, seconds=seconds,
                graded=scores(root), out=proc.stdout, kernels=kernels_started(base / "bin"))


def assert_grades_kept(course, times=True):
    """The gradebook holds the first run's grades: no zero recorded for a host's fault."""
    assert scores(course["root"], times) == scores_of(course["graded"], times)


def scores_of(graded, times):
    return {s: (score, penalty, when if times else None) for s, (score, penalty, when) in graded.items()}


# -- socket paths ------------------------------------------------------------------------------
def test_socket_paths_fit_whatever_tmpdir_and_course_path(course):
    klass, graded = course["klass"], course["graded"]
    assert len(str(course["tmpdir"])) >= 200 and len(str(course["root"])) > 150
    assert graded["correct"][0] == klass.total
    assert graded["partial"][0] == points(klass.parts[0])
    assert {r["status"] for r in rows(course["root"]).values()} == {"ok"}


def test_a_socket_root_is_short_private_named_after_its_run_and_checked(tmp_path):
    root = make_socket_root("abcd_123")
    try:
        assert len(root) < 50 and Path(root).parent == Path("/tmp")
        assert Path(root).name.startswith("autograder-abcd_123-sockets-")
        assert Path(root).stat().st_mode & 0o777 == 0o711 and Path(root).stat().st_uid == os.geteuid()
        check_socket_path(f"{root}/kernel-abcdefgh/k")
        assert sorted(p.name for p in Path(root).iterdir()) == [OWNER]  # held while this process lives
    finally:
        remove_scratch(root)
    assert not Path(root).exists()
    with pytest.raises(SocketPathError, match=str(SUN_PATH_MAX)):
        check_socket_path(str(long_folder(tmp_path, 120) / "k"))


# -- state carried from one student to the next ----------------------------------------------
def test_a_submission_without_timestamp_is_late_not_its_classmates_time(course):
    correct, zlate = course["graded"]["correct"], course["graded"]["zlate"]
    assert correct[1] == 0 and str(correct[2]).startswith("2026-11-20 10:00")
    assert zlate[2] is not None and zlate[2] > correct[2]  # the time of grading, not correct's
    days = -(-(zlate[2] - DUE_NAIVE).total_seconds() // 86400)
    assert zlate[1] == pytest.approx(min(0.1 * days, 0.5) * course["klass"].total)
    row = rows(course["root"])["zlate"]
    assert row["late_penalty"] and float(row["score"]) == pytest.approx(zlate[0] - zlate[1])


# -- a sandbox that cannot start kernels --------------------------------------------------------
def kernels_started(folder):
    """How many kernels the :func:`fake_bwrap` in ``folder`` was asked to start."""
    return len((folder / "kernels").read_text().splitlines())


def fake_bwrap(folder, passes):
    """A ``bwrap`` first on PATH that starts ``passes`` kernels (the real bwrap), then fails
    every kernel, and counts them (:func:`kernels_started`); the launcher's availability
    probe still works."""
    folder.mkdir(parents=True, exist_ok=True)
    count = folder / "kernels"
    count.write_text("")
    script = folder / "bwrap"
    script.write_text(f"""#!/bin/sh
case "$*" in *connection.json*)
  echo x >> {count}
  if [ "$(wc -l < {count})" -gt {passes} ]; then echo "bwrap: injected fault" >&2; exit 1; fi;;
esac
exec {shutil.which('bwrap')} "$@"
""")
    script.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_no_kernel_can_start_stops_the_run_within_a_minute(course, tmp_path):
    proc, seconds = run_grade(course["root"], "--jobs", "2", "--force",
                              env=fake_bwrap(tmp_path / "bin", passes=0))
    one_line_stop(proc, "no grading kernel can start", "injected fault")
    assert seconds < 60
    assert_grades_kept(course)


def test_one_worker_starts_one_kernel_per_notebook(course):
    """The preflight kernel grades the first student; each notebook launches the next one's
    kernel while it is graded, the last none (the toy class has no memory checks)."""
    assert course["kernels"] == len(course["graded"]) == 3


def test_kernels_that_stop_starting_are_the_hosts_fault_never_a_grade(course, tmp_path):
    """The worker's preflight kernel starts and grades the first student; every later kernel
    fails: the other two are ``error`` with one line each, the host's fault, and keep their
    grades; then a run of two workers grades them, starting one kernel more than notebooks
    (the spare of the worker told that a student still waited, which the other took). Three
    such errors in a row stop the run: ``test_memory_judge``, ``test_schedule``."""
    proc, seconds = run_grade(course["root"], "--jobs", "1", "--force",
                              env=fake_bwrap(tmp_path / "bin", passes=1))
    one_line_stop(proc, "2 submission(s) not graded", "fault of the grading host",
                  "no grading kernel could start (1 tries): ")
    assert seconds < 120
    assert_grades_kept(course, times=False)
    found = rows(course["root"])
    assert sorted(r["status"] for r in found.values()) == ["error", "error", "ok"]
    for student, row in found.items():
        assert row["status"] == "ok" or ("fault of the grading host" in row["error"]
                                         and "\n" not in row["error"])
        assert float(row["score"]) == pytest.approx(course["graded"][student][0]
                                                    - course["graded"][student][1])
    counting = fake_bwrap(tmp_path / "count", passes=10**6)
    again, _ = run_grade(course["root"], "--jobs", "2", env=counting)  # no stamps: those two
    assert again.returncode == 0, again.stderr[-3000:]
    assert_grades_kept(course, times=False)
    assert {r["status"] for r in rows(course["root"]).values()} == {"ok"}
    assert kernels_started(tmp_path / "count") == 2 + 1


def test_a_broken_kernel_boot_stops_the_run(course, tmp_path):
    grader = tmp_path / "grader"
    shutil.copytree(REPO / "autograder", grader / "autograder",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (grader / "autograder" / "kernel" / "boot.py").write_text("raise SystemExit('broken venv')\n")
    proc, seconds = run_grade(course["root"], "--jobs", "1", "--force", grader=grader)
    one_line_stop(proc, "no grading kernel can start", "broken venv")
    assert seconds < 60
    assert_grades_kept(course, times=False)


# -- the course's folders --------------------------------------------------------------------
@pytest.fixture
def mounted():
    """Mount points to unmount after the test, whatever happens."""
    points = []
    yield points
    for point in reversed(points):
        subprocess.run(["umount", "-l", str(point)], check=False)


@needs_root
def test_a_full_autograded_folder_stops_the_run_and_the_next_run_finishes(course, mounted):
    root = course["root"]
    target = root / "autograded"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(target)], check=True)
    mounted.append(target)
    filler = target / "filler"
    with open(filler, "wb", buffering=0) as f:  # fill it to the last byte
        with pytest.raises(OSError, match="No space left"):
            while True:
                f.write(b"\0" * 4096)
    proc, _ = run_grade(root, "--jobs", "1")
    one_line_stop(proc, "No space left on device")
    assert_grades_kept(course, times=False)  # the gradebook first (the same scores), then the files failed
    filler.unlink()
    again, _ = run_grade(root, "--jobs", "1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert_grades_kept(course, times=False)
    for student in course["graded"]:
        assert (target / student / AID / f"{AID}.ipynb").exists()


@needs_root
def test_a_read_only_feedback_folder_stops_the_run_and_the_next_run_finishes(course, mounted):
    root = course["root"]
    target = root / "feedback"
    subprocess.run(["mount", "--bind", str(target), str(target)], check=True)
    mounted.append(target)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)
    proc, _ = run_grade(root, "--jobs", "1", "--force")
    one_line_stop(proc, "Read-only file system")
    assert_grades_kept(course, times=False)
    subprocess.run(["umount", str(target)], check=True)
    mounted.remove(target)
    again, _ = run_grade(root, "--jobs", "1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Unchanged since last graded" in again.stdout  # only the one not recorded
    assert_grades_kept(course, times=False)
    assert all((target / s / AID / f"{AID}.html").exists() for s in course["graded"])


# -- a grading worker killed -----------------------------------------------------------------
def children(pid):
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_killed_worker_is_an_error_that_keeps_the_earlier_grade(course, tmp_path):
    root, klass = course["root"], course["klass"]
    path = root / "submitted" / "partial" / AID / f"{AID}.ipynb"
    honest = path.read_bytes()
    nbformat.write(klass.notebook(solved={klass.parts[0][0]}, change=klass.prepend(
        0, "import time\ntime.sleep(120)\n")), path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade", AID, "--root", str(root),
                             "--no-progress", "--jobs", "1", "--timeout-cell", "300"], cwd=root,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        staged = f"autograder-*/worker0/submitted/*/{AID}/*.ipynb"
        while not list(tmp_path.glob(staged)) and time.monotonic() < deadline:
            time.sleep(0.2)  # until the worker has staged the student: grading has begun
        time.sleep(3)
        [worker] = [pid for pid in children(proc.pid) if children(pid)]  # the one with kernels
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=120)
        assert time.monotonic() - killed < 60
    finally:
        proc.kill()
        path.write_bytes(honest)
    # a student not graded: one line and exit status 1, the rest recorded
    last = one_line_stop(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                         "1 submission(s) not graded", "partial", "worker died")
    assert last.endswith("run grade again to grade them")
    row = rows(root)["partial"]
    assert row["status"] == "error" and "worker died" in row["error"], row
    assert_grades_kept(course, times=False)
    assert (root / "logs" / AID / "partial.log").read_text().strip()  # the worker's own log
    again, _ = run_grade(root, "--jobs", "1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert rows(root)["partial"]["status"] == "ok"
    assert_grades_kept(course, times=False)


# -- the gradebook ------------------------------------------------------------------------------
def test_a_gradebook_locked_by_another_process_is_one_line(course):
    """Another process holds the SQLite gradebook's write lock for the whole run."""
    import sqlite3

    root = course["root"]
    before, graded = (root / "grades.csv").read_bytes(), scores(root)
    holder = sqlite3.connect(root / "gradebook.db", timeout=0)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        proc, _ = run_grade(root, "--jobs", "1", "--force")
    finally:
        holder.rollback()
        holder.close()
    one_line_stop(proc, "gradebook", "locked")
    assert scores(root) == graded  # nothing recorded, nothing lost
    assert (root / "grades.csv").read_bytes() == before


def test_a_corrupt_gradebook_is_one_line(course):
    """The file starts as SQLite but its pages are garbage: one line, and nothing changed."""
    root = course["root"]
    db = root / "gradebook.db"
    kept, graded = db.read_bytes(), scores(root)
    try:
        db.write_bytes(kept[:100] + bytes(range(256)) * ((len(kept) - 100) // 256 + 1))
        proc, _ = run_grade(root, "--jobs", "1", "--force")
        one_line_stop(proc, "gradebook")
    finally:
        db.write_bytes(kept)
    assert scores(root) == graded


def test_postgresql_stopped_mid_run_is_one_line_and_what_was_recorded_is_written(tmp_path):
    """A real PostgreSQL gradebook whose server stops (fast shutdown) once the first student
    is recorded: the run stops with one line and exit status 1; ``grades.csv`` and the
    summary are written for the students recorded before."""
    from tests.servers import POSTGRES_HINT, postgres_bin, postgres_server

    if postgres_bin() is None:
        pytest.skip(POSTGRES_HINT)
    psycopg = pytest.importorskip("psycopg", reason="psycopg missing: run `make venv`")

    root = tmp_path / "course"
    shutil.copytree(FIXTURE, root / "solutions" / AID)
    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    release = nbformat.read(generate(AID, root, release_dir=tmp_path / "release") / f"{AID}.ipynb",
                            as_version=4)
    klass = Class(source, release)
    students = ["a", "b", "c", "d"]
    for student in students:
        folder = root / "submitted" / student / AID
        folder.mkdir(parents=True)
        nbformat.write(klass.notebook(), folder / f"{AID}.ipynb")
    with postgres_server("stopped") as url:
        with psycopg.connect(url.replace("/stopped", "/postgres"), autocommit=True) as conn:
            folder = conn.execute("SHOW data_directory").fetchone()[0]
        postmaster = int(Path(folder, "postmaster.pid").read_text().split()[0])
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade", AID, "--root",
                                 str(root), "--db", url, "--no-progress", "--jobs", "1"],
                                cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        stamps = f"autograded/*/{AID}/.autograder.json"
        deadline = time.monotonic() + 300
        while not list(root.glob(stamps)) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.kill(postmaster, signal.SIGINT)  # fast shutdown: every connection is cut
        out, err = proc.communicate(timeout=300)
    recorded = sorted(p.parent.parent.name for p in root.glob(stamps))
    assert 1 <= len(recorded) < len(students), recorded
    last = one_line_stop(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                         "stopped because", "not graded")
    assert f"{len(recorded)} submission(s) recorded" in last, last
    assert set(recorded) <= set(rows(root)), rows(root)  # grades.csv written for them
    assert all(rows(root)[s]["status"] == "ok" for s in recorded)
    assert f"of {AID}" in out, out  # the summary was printed
