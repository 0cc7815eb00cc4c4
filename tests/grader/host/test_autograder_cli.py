"""The instructor's command line, run as a subprocess on the toy fixture course."""

import copy
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from notebooks import solved

from autograder.host.release import normalize

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "course"
SUBCOMMANDS = ("generate", "grade", "feedback", "export")


def cli(*args, check=True):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture()
def course(tmp_path):
    shutil.copytree(FIXTURE / "solutions", tmp_path / "solutions")
    return tmp_path


def test_help_documents_every_subcommand():
    top = cli("--help").stdout
    for name in SUBCOMMANDS:
        assert name in top
    assert "submitted/<student>/<assignment>/" in top
    grade_help = cli("grade", "--help").stdout
    for flag in ("--jobs", "--timeout-cell", "--timeout-notebook", "--memory-mb",
                 "--output-limit", "--students", "--db", "--root"):
        assert flag in grade_help, flag
    for name in ("generate", "feedback", "export"):
        assert "usage: python -m autograder " + name in cli(name, "--help").stdout


BAD_INPUT = [
    (("grade", "no-such-assignment"), "unknown assignment 'no-such-assignment'"),
    (("feedback", "no-such-assignment"), "unknown assignment 'no-such-assignment'"),
    (("generate", "no-such-assignment"), "unknown assignment 'no-such-assignment'"),
    (("export", "no-such-assignment"), "unknown assignment 'no-such-assignment'"),
    (("grade", "toy"), "no submitted/ folder"),
    (("grade", "toy", "--db", "sqlite:////no/such/folder/class.db"), "does not exist"),
    (("grade", "toy", "--db", "sqlite:///{course}/solutions/toy/toy.ipynb"), "not an SQLite database"),
    (("export",), "no gradebook"),
]


@pytest.mark.parametrize("args, words", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_a_nonzero_exit_and_no_change(course, args, words):
    """Run from another directory (--root): one line on stderr, exit status 1, nothing written."""
    before = sorted(p.relative_to(course) for p in course.rglob("*"))
    args = [a.format(course=course) for a in args]
    proc = subprocess.run([sys.executable, "-m", "autograder", *args, "--root", str(course)],
                          cwd="/", capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stderr
    assert words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert sorted(p.relative_to(course) for p in course.rglob("*")) == before


def test_malformed_retry_settings_are_one_line_before_anything_is_graded(course):
    """``AUTOGRADER_RETRIES`` (``core.limits.Retries``) is read with the course's files."""
    folder = course / "submitted" / "alice" / "toy"
    folder.mkdir(parents=True)
    shutil.copy(course / "solutions" / "toy" / "toy.ipynb", folder / "toy.ipynb")
    before = sorted(p.relative_to(course) for p in course.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", "toy", "--root", str(course),
                           "--no-progress"], cwd="/", capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO),
                               "AUTOGRADER_RETRIES": "kernel_start_tries=0"})
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == "AUTOGRADER_RETRIES: kernel_start_tries=0: a whole number >= 1\n"
    assert sorted(p.relative_to(course) for p in course.rglob("*")) == before


def test_grade_on_a_terminal_says_at_once_what_it_prepares(course):
    """On a terminal, ``grade``'s first line comes before the grader is even imported (which
    takes seconds): it names the assignment and what is being prepared; bad input then is its
    one line as ever."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "autograder", "grade", "no-such-assignment",
                               "--root", str(course)], cwd="/", stdout=subprocess.PIPE, stderr=follower,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        os.close(follower)
        follower = None
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed: all read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        if follower is not None:
            os.close(follower)
        os.close(leader)
    lines = b"".join(chunks).decode().replace("\r\n", "\n").splitlines()
    assert proc.returncode == 1
    assert lines[0] == ("grade no-such-assignment: loading the grader, then preparing the student version, "
                        "the gradebook and the workers..."), lines
    assert "unknown assignment 'no-such-assignment'" in lines[1] and len(lines) == 2, lines


def test_an_empty_class_adds_nothing_to_the_gradebook(course):
    (course / "submitted" / "ada" / "toy").mkdir(parents=True)  # a folder, no notebook
    proc = cli("grade", "toy", "--root", course, check=False)
    assert proc.returncode == 1 and "no submissions of toy" in proc.stderr
    assert not (course / "gradebook.db").exists() and not (course / "grades.csv").exists()


@pytest.mark.slow  # generates all seven assignments twice: about 9 s
def test_generate_is_deterministic_and_check_detects_stale_versions(course):
    cli("generate", "--all", "--root", course)
    path = course / "release" / "toy" / "toy.ipynb"
    first = path.read_bytes()
    cli("generate", "toy", "--root", course)
    assert path.read_bytes() == first
    assert cli("generate", "--check", "toy", "--root", course).returncode == 0
    assert "BEGIN SOLUTION" not in first.decode() and "add(-1, 1)" not in first.decode()

    source_path = course / "solutions" / "toy" / "toy.ipynb"
    source = nbformat.read(source_path, as_version=4)
    source.cells[0].source += "\n\nOne more sentence."
    nbformat.write(source, source_path)
    proc = cli("generate", "--check", "toy", "--root", course, check=False)
    assert proc.returncode == 1 and "stale: release/toy/toy.ipynb" in proc.stdout


def test_normalize_ignores_outputs_but_not_sources():
    nb = nbformat.read(FIXTURE / "solutions" / "toy" / "toy.ipynb", as_version=4)
    executed = copy.deepcopy(nb)
    code = next(c for c in executed.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    code.execution_count = 3
    assert normalize(executed) == normalize(nb)
    code.source += "\nx = 1"
    assert normalize(executed) != normalize(nb)


@pytest.mark.slow
def test_grade_feedback_export_round_trip(course, tmp_path):
    cli("generate", "toy", "--root", course)
    release = nbformat.read(course / "release" / "toy" / "toy.ipynb", as_version=4)
    source = nbformat.read(course / "solutions" / "toy" / "toy.ipynb", as_version=4)
    for student, nb in (("ada", solved(release, source)), ("bob", release)):  # code and the written answer
        folder = course / "submitted" / student / "toy"
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / "toy.ipynb")
    db = tmp_path / "elsewhere" / "class.db"
    db.parent.mkdir()

    out = cli("grade", "toy", "--root", course, "--db", f"sqlite:///{db}", "--jobs", "2",
              "--timeout-cell", "10", "--no-progress").stdout
    assert "Graded 2 submission(s) of toy" in out and "Tests passed:" in out
    assert db.exists() and not (course / "gradebook.db").exists()
    with open(course / "grades.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert (rows["ada"]["score"], rows["ada"]["max_score"]) == ("6", "7")  # + 1 manual point
    assert rows["bob"]["score"] == "0" and rows["bob"]["failed_tests"].count(";") == 3
    assert rows["ada"]["needs_manual"] == "1" and rows["bob"]["needs_manual"] == "0"  # no answer
    assert (course / "autograded" / "ada" / "toy" / "toy.ipynb").exists()

    page = course / "feedback" / "ada" / "toy" / "toy.html"
    page.unlink()
    cli("feedback", "toy", "--root", course, "--db", f"sqlite:///{db}")
    assert page.exists() and "add(-1, 1)" not in page.read_text()

    export = tmp_path / "export.csv"
    cli("export", "toy", "--root", course, "--db", f"sqlite:///{db}", "--to", export)
    with open(export, newline="") as f:
        exported = {r["student_id"]: r for r in csv.DictReader(f)}
    assert float(exported["ada"]["score"]) == 6.0 and float(exported["bob"]["score"]) == 0.0
    assert exported["ada"]["needs_manual"] == "True" and exported["bob"]["needs_manual"] == "False"


def test_readme_starts_the_cluster_with_the_settings_the_tests_use():
    """The ``export`` lines of *Grading on a cluster* are exactly ``grading_cluster_env()``."""
    import re

    from tests.servers import grading_cluster_env

    text = (REPO / "autograder" / "README.md").read_text()
    exports = dict(re.findall(r"^export (DASK_[A-Z_]+)=(\S+)", text, flags=re.M))
    assert exports == grading_cluster_env()
