"""The hostile-filesystem reader (``autograder.core.submission_folder``) and the notebook caps
(``autograder.core.notebook_file``), through intake as grading runs them.

Each family of hostile entries is handed in beside (or instead of) an honest notebook under
pytest's ``tmp_path``: links (to ``solutions/``, a classmate, ``/etc/shadow``, nowhere), hard
links, FIFOs, devices, folders named like notebooks, sparse multi-gigabyte files, amplifying
JSON, names that are not UTF-8, broken ``timestamp.txt`` files, folders of too many entries.
Intake must name each, read nothing it points to, never block and stay within its caps.
"""

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import pytest

from autograder.core import submission_folder
from autograder.core.cells import grade_id
from autograder.core.notebook_file import NOTEBOOK_BYTES, NOTEBOOK_CELLS
from autograder.core.submission_folder import SUBMISSION_BYTES, read_submission, submission_digest
from autograder.worker.intake import Intake, handed_in_time, take_in
from tests.grader.handins import OWN, hand_in, part1, release, source, worked


# -- what lands in submitted/ is hostile ---------------------------------------------------
# Each family is handed in beside (or instead of) an honest notebook; intake must name it,
# read nothing it points to, never block and stay within its caps.


class Deadline:
    """Fail (instead of hanging the suite) if the block takes more than ``seconds``."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __enter__(self):
        import signal

        def expired(*_):
            raise TimeoutError(f"intake took more than {self.seconds} s")

        self.previous = signal.signal(signal.SIGALRM, expired)
        signal.alarm(self.seconds)

    def __exit__(self, *_):
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


def course_tree(tmp_path):
    """A course root with solutions/, and two students' folders of 01-rope (bob's honest)."""
    solutions = tmp_path / "solutions" / "01-rope"
    solutions.mkdir(parents=True)
    nbformat.write(source("01-rope"), solutions / OWN)
    hand_in(tmp_path / "submitted" / "bob" / "01-rope", OWN, worked("bob's work"))
    return tmp_path, solutions


def take_in_course(root, student):
    """Intake as grading does it: the folder opened below the course's submitted/."""
    folder = root / "submitted" / student / "01-rope"
    return take_in(read_submission(folder, within=root / "submitted"), release())


@pytest.mark.parametrize("target", ["solutions", "classmate"])
@pytest.mark.parametrize("linked", ["assignment folder", "student folder"])
def test_a_linked_folder_is_refused_not_graded(tmp_path, target, linked):
    root, solutions = course_tree(tmp_path)
    goal = solutions if target == "solutions" else root / "submitted" / "bob" / "01-rope"
    if linked == "assignment folder":
        (root / "submitted" / "eve").mkdir()
        os.symlink(goal, root / "submitted" / "eve" / "01-rope")
        where = "eve/01-rope"
    else:
        os.symlink(goal.parent, root / "submitted" / "eve")
        where = "eve"
    assert take_in(goal, release()).status == "ok"  # what the link points to would be graded
    got = take_in_course(root, "eve")
    assert got == Intake("unreadable", None, None, (), False,
                         f"the submission folder {where} is a symbolic link, which the grader "
                         "does not follow; nothing in it was read")
    folder = root / "submitted" / "eve" / "01-rope"
    assert submission_digest(folder) != submission_digest(goal)  # the digest does not follow either
    assert take_in_course(root, "bob").status == "ok"


@pytest.mark.parametrize("target", ["/etc/shadow", "solution", "classmate", "dangling"])
def test_a_linked_notebook_is_named_and_never_read(tmp_path, target):
    root, solutions = course_tree(tmp_path)
    goal = {"/etc/shadow": Path("/etc/shadow"), "solution": solutions / OWN,
            "classmate": root / "submitted" / "bob" / "01-rope" / OWN,
            "dangling": root / "nowhere"}[target]
    folder = root / "submitted" / "eve" / "01-rope"
    folder.mkdir(parents=True)
    os.symlink(goal, folder / OWN)
    got = take_in_course(root, "eve")
    assert got == Intake("unreadable", None, OWN, (), False,
                         "01-rope.ipynb is a symbolic link, which the grader does not follow")


def test_a_hard_link_to_the_solution_is_refused(tmp_path):
    root, solutions = course_tree(tmp_path)
    folder = root / "submitted" / "eve" / "01-rope"
    folder.mkdir(parents=True)
    os.link(solutions / OWN, folder / OWN)
    got = take_in_course(root, "eve")
    assert got.status == "unreadable" and got.notebook is None
    assert got.message == ("01-rope.ipynb is a hard link (one file with 2 names, maybe outside "
                           "the folder), which the grader does not read; hand in a copy")


def test_fifos_devices_and_folders_named_like_notebooks_are_never_opened(tmp_path):
    hand_in(tmp_path, OWN, worked("honest"))
    os.mkfifo(tmp_path / "pipe.ipynb")  # opening it for reading would block forever
    os.mkfifo(tmp_path / "timestamp.txt")
    (tmp_path / "folder.ipynb").mkdir()
    hand_in(tmp_path / "folder.ipynb", OWN, worked("inside a folder"))
    device = "a device.ipynb"
    try:
        os.mknod(tmp_path / device, 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 5))  # /dev/zero
    except PermissionError:
        device = None  # not root: no device file to hand in
    with Deadline(20):
        got = take_in(tmp_path, release())
        moment, problem = handed_in_time(read_submission(tmp_path), datetime.now(timezone.utc))
    assert (got.status, got.original_name) == ("ok", OWN) and "# honest" in part1(got.notebook)
    assert "folder.ipynb is a folder, not a notebook file" in got.message
    assert "pipe.ipynb is not a regular file (a FIFO, socket or device), never opened" in got.message
    if device:
        assert f"{device} is not a regular file (a FIFO, socket or device), never opened" in got.message
    assert problem == ("timestamp.txt is not a regular file (a FIFO, socket or device), never "
                       "opened; the time of grading counts")


def test_a_multi_gigabyte_sparse_file_is_refused_by_its_size(tmp_path):
    hand_in(tmp_path, OWN, worked("honest"))
    with open(tmp_path / "huge.ipynb", "wb") as f:
        f.truncate(8 * 2**30)  # 8 GiB that take no disk
    with Deadline(10):
        got = take_in(tmp_path, release())
    assert got.status == "ok" and "# honest" in part1(got.notebook)
    assert f"huge.ipynb is larger than the {NOTEBOOK_BYTES // 2**20} MiB the grader reads" in got.message


def test_the_notebooks_of_one_folder_are_read_up_to_a_total(tmp_path):
    for name in ("a.ipynb", "b.ipynb", "c.ipynb"):
        with open(tmp_path / name, "wb") as f:
            f.truncate(NOTEBOOK_BYTES - 1)  # each under the file cap, three over the total
    got = take_in(tmp_path, release())
    assert 2 * (NOTEBOOK_BYTES - 1) < SUBMISSION_BYTES < 3 * (NOTEBOOK_BYTES - 1)
    assert got.message.split("; ") == [
        "a.ipynb is not a notebook (not JSON)", "b.ipynb is not a notebook (not JSON)",
        f"c.ipynb is not read: the folder's notebooks exceed {SUBMISSION_BYTES // 2**20} MiB together"]


def tiny_cells(count):
    cell = {"cell_type": "code", "source": "", "metadata": {}, "outputs": [], "execution_count": None}
    return {"cells": [cell] * count, "metadata": {}, "nbformat": 4, "nbformat_minor": 4}


@pytest.mark.parametrize("case", ["200k cells", "deep JSON", "very deep JSON", "too large"])
def test_amplification_is_bounded_before_nbformat_reads(tmp_path, case):
    import resource
    import time

    deep = {"deep JSON": 200, "very deep JSON": 100_000}.get(case, 0)
    content = {"200k cells": json.dumps(tiny_cells(200_000)).encode(),
               "too large": b" " * (NOTEBOOK_BYTES + 1)}.get(case) or (
        b'{"nbformat": 4, "cells": [], "metadata": {"x": ' + b"[" * deep + b"]" * deep + b"}}")
    hand_in(tmp_path, OWN, content)
    start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with Deadline(60):
        got = take_in(tmp_path, release())
    seconds = time.monotonic() - start
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    expected = {"200k cells": f"a notebook of 200000 cells, more than the {NOTEBOOK_CELLS} the "
                              "grader takes",
                "deep JSON": "JSON nested deeper than the 100 levels the grader takes",
                "very deep JSON": "not a notebook (not JSON)",
                "too large": f"larger than the {NOTEBOOK_BYTES // 2**20} MiB the grader reads"}[case]
    assert got == Intake("unreadable", None, OWN, (), False, f"{OWN} is {expected}")
    # before the caps: 336 s and 2.5 GB for 200k cells (generous margins for 2 shared cores)
    assert seconds < 20 and grown_mb < 1000, (seconds, grown_mb)


def test_a_notebook_at_the_cell_cap_is_still_read(tmp_path):
    nb = worked("long")
    nb.cells += [nbformat.v4.new_markdown_cell("filler") for _ in range(NOTEBOOK_CELLS - len(nb.cells))]
    hand_in(tmp_path, OWN, nb)
    got = take_in(tmp_path, release())
    assert got.status == "ok" and len(got.notebook.cells) == NOTEBOOK_CELLS


@pytest.mark.parametrize("where", ["beside the notebook", "a notebook's own name"])
def test_file_names_that_are_not_utf8(tmp_path, where):
    if where == "beside the notebook":
        hand_in(tmp_path, OWN, worked("honest"))
        (tmp_path / os.fsdecode(b"notes-\xff\xfe.txt")).write_bytes(b"x")
        name, shown = OWN, None
    else:
        name = os.fsdecode(b"01-rope-\xe9.ipynb")  # latin-1 bytes
        hand_in(tmp_path, name, worked("honest"))
        shown = "01-rope-\\xe9.ipynb"
    got = take_in(tmp_path, release())
    assert (got.status, got.original_name) == ("ok", name) and "# honest" in part1(got.notebook)
    assert got.message == (f"graded '{shown}'" if shown else "graded '01-rope.ipynb'")
    got.message.encode("utf-8")  # printable: no surrogate is left
    assert len(submission_digest(tmp_path)) == 64


def test_nbformat_3_is_upgraded_and_graded(tmp_path):
    old = nbformat.convert(worked("saved by an old Jupyter"), 3)
    assert old.nbformat == 3 and "worksheets" in old
    hand_in(tmp_path, OWN, nbformat.writes(old).encode())
    got = take_in(tmp_path, release())
    assert (got.status, got.original_name, got.reseated) == ("ok", OWN, False)
    assert got.notebook.nbformat == 4 and "# saved by an old Jupyter" in part1(got.notebook)
    assert [grade_id(c) for c in got.notebook.cells] == [grade_id(c) for c in release().cells]


NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text, expected, problem", [
    ("2026-12-01 10:00:00.123456 UTC", datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=timezone.utc), None),
    ("2026-12-03 13:00:00 +0100", datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc), None),
    ("yesterday, promise", NOW, "timestamp.txt is not a time ('yesterday, promise'); the time of grading counts"),
    ("\x1b]0;owned\x07 2026", NOW, "timestamp.txt is not a time ('\\x1b]0;owned\\x07 2026'); the time of grading counts"),
    ("2099-01-01 00:00:00 UTC", NOW, "timestamp.txt is in the future (2099-01-01 00:00:00 UTC); the time of grading counts"),
    ("9999-12-31T23:59:59+00:00", NOW, "timestamp.txt is in the future (9999-12-31T23:59:59+00:00); the time of grading counts"),
])
def test_a_timestamp_that_is_not_a_time_or_in_the_future_counts_as_the_time_of_grading(
        tmp_path, text, expected, problem):
    (tmp_path / "timestamp.txt").write_text(text)
    assert handed_in_time(read_submission(tmp_path), NOW) == (expected, problem)


def test_no_timestamp_is_no_time(tmp_path):
    assert handed_in_time(read_submission(tmp_path), NOW) == (None, None)
    (tmp_path / "timestamp.txt").write_bytes(b"\xff" * (submission_folder.COLLECTION_BYTES + 1))
    moment, problem = handed_in_time(read_submission(tmp_path), NOW)
    assert moment == NOW and problem.startswith("timestamp.txt is larger than the 4096 bytes")


def test_a_folder_of_too_many_entries_is_not_looked_through(tmp_path):
    folder = tmp_path / "eve" / "01-rope"
    hand_in(folder, OWN, worked("honest"))
    for number in range(submission_folder.FOLDER_ENTRIES):
        (folder / f"junk-{number:04}").touch()
    got = take_in(read_submission(folder, within=tmp_path), release())
    assert got == Intake("unreadable", None, None, (), False,
                         f"the submission folder eve/01-rope holds more than "
                         f"{submission_folder.FOLDER_ENTRIES} entries, more than the grader looks at; "
                         "nothing in it was read")
