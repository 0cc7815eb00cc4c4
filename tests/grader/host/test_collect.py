"""``python -m autograder collect``: LMS bulk downloads into ``submitted/``, hostile archives refused.

Every archive is a real zip written with :mod:`zipfile` here, in the layouts Canvas and
Moodle give their bulk downloads; hostile ones climb out of the folder, hold links, are
zip bombs (a few kB that inflate past the caps), are not zips, or have names that are
not UTF-8. The command runs as an instructor runs it (a subprocess), so its exit status
and its one line are checked as well as every file it writes, and does not write.
"""

import contextlib
import csv
import io
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import pytest

from autograder.host.cli import main
from autograder.host.collect import ArchiveError, Bounds, Lms, collect
from autograder.host.roster import read_roster

REPO = Path(__file__).resolve().parents[3]
AID = "toy"
T1, T2 = (2026, 12, 1, 9, 30, 0), (2026, 12, 2, 18, 45, 10)
ROSTER = [("ada", "Ada Lovelace", "ada@uni.edu", "1001"),
          ("alan", "Alan Turing", "alan@uni.edu", "1002"),
          ("grace", "Grace Brewster Hopper", "grace@uni.edu", ""),  # no LMS id: matched by name
          ("=cmd", "Edsger Dijkstra", "ed@uni.edu", "1004")]


def notebook(marker):
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(f"# {marker}", id="only-cell"))
    return nbformat.writes(nb).encode()


@pytest.fixture
def course(tmp_path):
    shutil.copytree(REPO / "tests" / "fixtures" / "course" / "solutions", tmp_path / "solutions")
    (tmp_path / "course.toml").write_text('timezone = "UTC"  # the zone of the LMS\'s zip times\n')
    with open(tmp_path / "roster.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", "name", "email", "lms_id"])
        writer.writerows(ROSTER)
    return tmp_path


def archive(path, entries):
    """A zip of ``entries``: ``(name, bytes, date_time)`` or a ready ``ZipInfo`` with bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data, *when in entries:
            info = name if isinstance(name, zipfile.ZipInfo) else zipfile.ZipInfo(name, when[0] if when else T1)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return path


def run(course, lms, zip_path, subprocess_=False, assignment=AID):
    """``python -m autograder collect``: ``(returncode, stdout, stderr)``; in this process
    (the command's own ``main``, ``SystemExit`` as the interpreter turns it into an exit
    status and a line) unless ``subprocess_``."""
    argv = ["collect", assignment, "--from", lms, str(zip_path), "--root", str(course)]
    if subprocess_:
        return subprocess.run([sys.executable, "-m", "autograder", *argv], capture_output=True,
                              text=True, cwd=REPO, timeout=120)
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def tree(root):
    """Every path under ``root`` (folders end in /), relative; the course lock's file (which
    every command holds while it runs, empty afterwards) is not the command's output."""
    return sorted(str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*")
                  if p.name != ".autograder.lock")


def stamp(student, course):
    return (course / "submitted" / student / AID / "timestamp.txt").read_text()


# -- the layouts -------------------------------------------------------------------------
def test_canvas_files_go_to_roster_ids_with_their_entry_times(course):
    zip_path = archive(course / "canvas.zip", [
        ("lovelaceada_1001_5001_toy.ipynb", notebook("ada"), T1),
        ("turingalan_LATE_1002_5002_toy-1.ipynb", notebook("alan late"), T2),
        ("hoppergracebrewster_2003_5003_My Notebook (1).ipynb", notebook("grace"), T1),
        ("dijkstraedsger_1004_5004_toy.ipynb", notebook("ed"), T1),
        ("lovelaceada_1001_5001_notes.txt", b"notes", T1),
        ("strangerdanger_9999_5009_toy.ipynb", notebook("nobody"), T1),
    ])
    done = run(course, "canvas", zip_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "collected 4 notebook(s) of 4 student(s) into submitted/<student>/toy/",
        "not matched to the roster: strangerdanger_9999_5009_toy.ipynb",
        "skipped lovelaceada_1001_5001_notes.txt: not a notebook"]
    submitted = course / "submitted"
    assert tree(submitted) == [
        "=cmd/", "=cmd/toy/", "=cmd/toy/timestamp.txt", "=cmd/toy/toy.ipynb",
        "ada/", "ada/toy/", "ada/toy/timestamp.txt", "ada/toy/toy.ipynb",
        "alan/", "alan/toy/", "alan/toy/timestamp.txt", "alan/toy/toy-1.ipynb",
        "grace/", "grace/toy/", "grace/toy/My Notebook (1).ipynb", "grace/toy/timestamp.txt"]
    assert (submitted / "ada" / AID / "toy.ipynb").read_bytes() == notebook("ada")
    assert (submitted / "alan" / AID / "toy-1.ipynb").read_bytes() == notebook("alan late")
    assert stamp("alan", course) == "2026-12-02 18:45:10.000000 UTC"
    assert stamp("ada", course) == "2026-12-01 09:30:00.000000 UTC"
    mtime = (submitted / "alan" / AID / "toy-1.ipynb").stat().st_mtime
    assert mtime == datetime(*T2, tzinfo=timezone.utc).timestamp()


def test_moodle_folders_and_flat_files_go_to_roster_ids(course):
    zip_path = archive(course / "moodle.zip", [
        ("Ada Lovelace_1001_assignsubmission_file_/toy.ipynb", notebook("ada"), T1),
        ("Alan Turing_1002_assignsubmission_file_toy.ipynb", notebook("alan"), T2),  # flat
        ("Grace  Brewster HOPPER_78_assignsubmission_file_/solution.ipynb", notebook("grace"), T1),
        ("Ada Lovelace_1001_assignsubmission_onlinetext_onlinetext.html", b"<p>hi</p>", T1),
        ("Someone Else_79_assignsubmission_file_/toy.ipynb", notebook("?"), T1),
    ])
    done = run(course, "moodle", zip_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "collected 3 notebook(s) of 3 student(s) into submitted/<student>/toy/"
    assert "not matched to the roster: Someone Else_79_assignsubmission_file_/toy.ipynb" in done.stdout
    assert (course / "submitted" / "grace" / AID / "solution.ipynb").read_bytes() == notebook("grace")
    assert (course / "submitted" / "alan" / AID / "toy.ipynb").read_bytes() == notebook("alan")


# -- whose file it is: the LMS's part of the path, never the student's -------------------
def add_to_roster(course, *rows):
    with open(course / "roster.csv", "a", newline="") as f:
        csv.writer(f).writerows(rows)


@pytest.mark.parametrize("lms, ada, eves", [
    ("moodle", "Ada Lovelace_1001_assignsubmission_file_/toy.ipynb", [
        "Eve Smith_1005_assignsubmission_file_/Ada Lovelace_0_assignsubmission_file_toy.ipynb",
        "Eve Smith_1005_assignsubmission_file_/Ada Lovelace_1001_assignsubmission_file_/toy.ipynb",
        "Eve Smith_1005_assignsubmission_file_Ada Lovelace_1001_assignsubmission_file_toy.ipynb",
        "Eve Smith_1005_assignsubmission_file_/lovelaceada_1001_5001_more.ipynb"]),
    ("canvas", "lovelaceada_1001_5001_toy.ipynb", [
        "smitheve_1005_5005_lovelaceada_1001_5001_toy.ipynb",
        "smitheve_1005_5005_Ada Lovelace_1001_assignsubmission_file_toy.ipynb"]),
])
def test_a_classmate_named_file_or_folder_stays_its_senders(course, lms, ada, eves):
    """Eve names her files and folders after Ada's entries: they are Eve's files, Ada keeps hers."""
    add_to_roster(course, ("eve", "Eve Smith", "eve@uni.edu", "1005"))
    # Eve's entries come later (the newest copy of a name wins): the old greedy pattern gave them to Ada
    zip_path = archive(course / f"{lms}.zip", [(ada, notebook("ada"), T1)]
                       + [(name, notebook(f"eve {i}"), T2) for i, name in enumerate(eves)])
    done = run(course, lms, zip_path)
    assert done.returncode == 0, done.stderr
    submitted = course / "submitted"
    assert sorted(p.name for p in (submitted / "ada" / AID).iterdir()) == ["timestamp.txt", "toy.ipynb"]
    assert (submitted / "ada" / AID / "toy.ipynb").read_bytes() == notebook("ada")
    assert stamp("ada", course) == "2026-12-01 09:30:00.000000 UTC"
    eve = {p.read_bytes() for p in (submitted / "eve" / AID).glob("*.ipynb")}
    assert eve <= {notebook(f"eve {i}") for i in range(len(eves))} and eve, sorted(eve)
    assert ada not in done.stdout, done.stdout  # never "skipped ... an older copy"


def test_a_name_never_overrides_an_id_and_ambiguity_is_an_error(course):
    # Alan has the LMS id 1002: an entry with his name and another id is not his (Ada's entry
    # makes the archive one that matches the roster, which an archive matching nobody is not)
    zip_path = archive(course / "other-id.zip", [("Alan Turing_77_assignsubmission_file_/toy.ipynb", notebook("?")),
                                                 ("Ada Lovelace_1001_assignsubmission_file_/toy.ipynb", notebook("ada"))])
    done = run(course, "moodle", zip_path)
    assert done.returncode == 0 and not (course / "submitted" / "alan").exists(), done.stderr
    assert "not matched to the roster: Alan Turing_77_assignsubmission_file_/toy.ipynb" in done.stdout
    # Grace has no LMS id (found by name): two ids claiming her name are an error naming both entries
    first, second = ("Grace Brewster Hopper_78_assignsubmission_file_/toy.ipynb",
                     "Grace Brewster Hopper_79_assignsubmission_file_/toy.ipynb")
    zip_path = archive(course / "two-ids.zip", [(first, notebook("g1")), (second, notebook("g2"))])
    done = run(course, "moodle", zip_path)
    assert done.returncode == 1 and first in done.stderr and second in done.stderr, done.stderr
    assert str(zip_path) in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (course / "submitted" / "grace").exists()
    shutil.rmtree(course / "submitted")
    # two roster students of one name, neither with an LMS id: an error naming the entry and both
    add_to_roster(course, ("wei1", "Wei Zhang", "w1@uni.edu", ""), ("wei2", "Wei Zhang", "w2@uni.edu", ""))
    entry = "Wei Zhang_80_assignsubmission_file_/toy.ipynb"
    done = run(course, "moodle", archive(course / "same-name.zip", [(entry, notebook("w"))]))
    assert done.returncode == 1 and entry in done.stderr and "wei1, wei2" in done.stderr, done.stderr
    assert not (course / "submitted").exists()


def test_an_entry_time_that_is_no_date_names_the_archive_and_the_entry(course):
    entry = "lovelaceada_1001_5001_toy.ipynb"
    zip_path = archive(course / "dates.zip", [(entry, notebook("ada"), (2026, 13, 1, 9, 30, 0))])
    done = run(course, "canvas", zip_path)
    assert done.returncode == 1 and str(zip_path) in done.stderr and entry in done.stderr, done.stderr
    assert "month must be in 1..12" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (course / "submitted").exists()


def test_a_second_collection_replaces_the_folder_and_keeps_the_newest_duplicate(course):
    old = course / "submitted" / "ada" / AID
    old.mkdir(parents=True)
    (old / "stale.ipynb").write_bytes(notebook("stale"))
    entries = [(zipfile.ZipInfo("lovelaceada_1001_5001_toy.ipynb", T2), notebook("newer")),
               (zipfile.ZipInfo("lovelaceada_1001_5001_toy.ipynb", T1), notebook("older"))]
    with pytest.warns(UserWarning, match="Duplicate name"):
        zip_path = archive(course / "dup.zip", entries)
    done = run(course, "canvas", zip_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in old.iterdir()) == ["timestamp.txt", "toy.ipynb"]
    assert (old / "toy.ipynb").read_bytes() == notebook("newer")
    assert "skipped lovelaceada_1001_5001_toy.ipynb: an older copy of" in done.stdout
    aside = [p for p in old.parent.iterdir() if p.name != AID]   # the earlier folder: kept, named
    assert len(aside) == 1 and re.fullmatch(r"\.toy\.replaced-\d{8}T\d{6}Z", aside[0].name)
    assert (aside[0] / "stale.ipynb").read_bytes() == notebook("stale")
    assert f"replaced ada's earlier submission, kept as submitted/ada/{aside[0].name}" in done.stdout
    again = run(course, "canvas", zip_path)   # the same second: a second name, nothing lost
    assert again.returncode == 0 and again.stdout.count("replaced ada's") == 1
    assert len([p for p in old.parent.iterdir() if p.name != AID]) == 2


def test_what_is_kept_aside_is_not_graded(course):
    """The driver and stock nbgrader read only ``submitted/<student>/<assignment>``."""
    from autograder.host.driver import find_students

    aside = course / "submitted" / "ada" / ".toy.replaced-20261201T093000Z"
    aside.mkdir(parents=True)
    (aside / "toy.ipynb").write_bytes(notebook("earlier"))
    assert find_students(course, AID) == []


# -- hostile archives: one line, exit 1, nothing written ---------------------------------
def link_entry(name, target):
    info = zipfile.ZipInfo(name, T1)
    info.create_system = 3
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info, target.encode()


HOSTILE = {
    "zip slip ..": (("../../evil_1001_5001_toy.ipynb", b"{}"), "would be written outside"),
    "nested ..": (("lovelaceada_1001_5001_x/../../../toy.ipynb", b"{}"), "would be written outside"),
    "absolute": (("/tmp/evil_1001_5001_toy.ipynb", b"{}"), "would be written outside"),
    "drive letter": (("C:/evil_1001_5001_toy.ipynb", b"{}"), "would be written outside"),
    "backslash ..": (("..\\..\\evil_1001_5001_toy.ipynb", b"{}"), "would be written outside"),
    "backslash": (("dir\\lovelaceada_1001_5001_toy.ipynb", b"{}"), "has a backslash"),
    "symlink": (link_entry("lovelaceada_1001_5001_toy.ipynb", "/etc/shadow"), "is a symbolic link"),
    "symlink to solutions": (link_entry("lovelaceada_1001_5001_toy.ipynb", "../../solutions/toy/toy.ipynb"),
                             "is a symbolic link"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_entry_refuses_the_whole_archive(course, case):
    entry, expected = HOSTILE[case]
    zip_path = archive(course / "hostile.zip", [("turingalan_1002_5002_toy.ipynb", notebook("alan")),
                                                entry])
    before = tree(course)
    done = run(course, "canvas", zip_path)
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"collect: {zip_path}: entry ") and expected in done.stderr
    assert tree(course) == before  # nothing written, not even the honest student
    assert not list(course.parent.glob("evil*")) and not Path("/tmp/evil_1001_5001_toy.ipynb").exists()


def zip_bomb(path):
    """A few kB that inflate to 40 MiB, past the per-file cap."""
    bomb = archive(path, [("turingalan_1002_5002_toy.ipynb", notebook("alan")),
                          ("lovelaceada_1001_5001_toy.ipynb", b"\0" * (40 * 2**20))])
    assert bomb.stat().st_size < 64 * 1024
    with zipfile.ZipFile(bomb) as zf:
        assert zf.getinfo("lovelaceada_1001_5001_toy.ipynb").file_size > Bounds().file_bytes
    return bomb


@pytest.mark.parametrize("how", ["in process", pytest.param("as a command", marks=pytest.mark.slow)])
def test_a_zip_bomb_of_a_few_kilobytes_is_refused_while_inflating(course, how):
    bomb = zip_bomb(course / "bomb.zip")
    before = tree(course)
    start = time.monotonic()
    done = run(course, "canvas", bomb, subprocess_=how == "as a command")
    assert done.returncode == 1, done
    assert done.stderr.strip() == (f"collect: {bomb}: entry 'lovelaceada_1001_5001_toy.ipynb' "
                                   "inflates more than 200 times its size (a zip bomb)")
    assert tree(course) == before and time.monotonic() - start < 60


def test_sizes_are_counted_not_read_from_the_headers(course, tmp_path):
    roster = read_roster(course / "roster.csv")
    zip_path = archive(tmp_path / "big.zip", [("lovelaceada_1001_5001_toy.ipynb", os.urandom(3000)),
                                              ("turingalan_1002_5002_toy.ipynb", notebook("alan"))])
    # a header that claims a small size cannot smuggle bytes: zipfile stops, the CRC fails
    data = bytearray(zip_path.read_bytes())
    with zipfile.ZipFile(zip_path) as zf:
        info = zf.getinfo("lovelaceada_1001_5001_toy.ipynb")
    lying = tmp_path / "lying.zip"
    offset = data.find(b"PK\x01\x02")  # the central directory's first entry: its file_size at +24
    data[offset + 24:offset + 28] = (100).to_bytes(4, "little")
    data[info.header_offset + 22:info.header_offset + 26] = (100).to_bytes(4, "little")
    lying.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="not a readable zip archive"):
        collect(lying, Lms.CANVAS, AID, course, roster)
    # a file over the per-file cap is skipped and reported; the others are written
    report = collect(zip_path, Lms.CANVAS, AID, course, roster, Bounds(file_bytes=2000, ratio=10**6))
    assert [c.student for c in report.collected] == ["alan"]
    assert report.skipped == (("lovelaceada_1001_5001_toy.ipynb", "larger than the 0 MiB the grader reads"),)
    assert not (course / "submitted" / "ada").exists()
    with pytest.raises(ArchiveError, match="inflates to more than 0 MiB"):
        collect(zip_path, Lms.CANVAS, AID, course, roster, Bounds(total_bytes=1000, ratio=10**6))
    with pytest.raises(ArchiveError, match="2 entries, more than the 1 collect takes"):
        collect(zip_path, Lms.CANVAS, AID, course, roster, Bounds(entries=1))


@pytest.mark.parametrize("content, expected", [
    (b"PK\x03\x04 this is not really a zip", "not a readable zip archive"),
    (b"", "not a readable zip archive"),
])
def test_a_file_that_is_not_a_zip_is_one_line(course, content, expected):
    path = course / "broken.zip"
    path.write_bytes(content)
    done = run(course, "canvas", path)
    assert done.returncode == 1 and expected in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_names_that_are_not_utf8_or_hold_controls(course):
    # flagged UTF-8 but not UTF-8: the archive is refused
    zip_path = archive(course / "utf8.zip", [("lovelaceada_1001_5001_toyé.ipynb", notebook("ada"))])
    data = zip_path.read_bytes().replace("é".encode(), b"\xff\xfe")
    zip_path.write_bytes(data)
    done = run(course, "canvas", zip_path)
    assert done.returncode == 1 and "an entry name marked UTF-8 is not UTF-8" in done.stderr
    # a name with terminal escapes: written under a plain name, shown escaped
    zip_path = archive(course / "escape.zip", [("lovelaceada_1001_5001_\x1b[2Jtoy.ipynb", notebook("ada")),
                                               ("\x1b]0;owned\x07_9_9_toy.ipynb", notebook("?"))])
    done = run(course, "canvas", zip_path)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "not matched to the roster: \\x1b]0;owned\\x07_9_9_toy.ipynb" in done.stdout
    assert sorted(p.name for p in (course / "submitted" / "ada" / AID).iterdir()) == ["timestamp.txt", "toy.ipynb"]


def test_a_linked_student_folder_is_not_written_into(course, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (course / "submitted").mkdir()
    os.symlink(elsewhere, course / "submitted" / "ada")
    zip_path = archive(course / "c.zip", [("lovelaceada_1001_5001_toy.ipynb", notebook("ada"))])
    done = run(course, "canvas", zip_path)
    assert done.returncode == 0
    assert "skipped lovelaceada_1001_5001_toy.ipynb: submitted/ada or its toy folder is a link" in done.stdout
    assert list(elsewhere.iterdir()) == []


def test_without_a_roster_or_with_an_unknown_assignment_one_line(course):
    zip_path = archive(course / "c.zip", [("lovelaceada_1001_5001_toy.ipynb", notebook("ada"))])
    (course / "roster.csv").unlink()
    done = run(course, "canvas", zip_path)
    assert done.returncode == 1 and done.stderr.startswith("collect: no roster.csv under")
    done = run(course, "canvas", zip_path, assignment="nope")
    assert done.returncode == 1 and done.stderr.startswith("unknown assignment 'nope'")


# -- an archive of the wrong assignment, a roster that matches nobody, the _LATE mark ------
def source_bytes(course, assignment):
    return (course / "solutions" / assignment / f"{assignment}.ipynb").read_bytes()


@pytest.fixture
def two_assignments(course):
    """The toy course with a second assignment, 01-rope, beside toy."""
    shutil.copytree(REPO / "solutions" / "01-rope", course / "solutions" / "01-rope")
    return course


def test_the_archive_of_another_assignment_is_refused_whole(two_assignments):
    """``collect 01-rope`` given toy's download: one line, exit 1, nobody's 01-rope work touched."""
    course = two_assignments
    earlier = course / "submitted" / "ada" / "01-rope"
    earlier.mkdir(parents=True)
    (earlier / "01-rope.ipynb").write_bytes(b"ada's real work")
    zip_path = archive(course / "toy.zip", [
        ("lovelaceada_1001_5001_toy.ipynb", source_bytes(course, AID)),
        ("turingalan_1002_5002_toy.ipynb", source_bytes(course, AID))])
    before = tree(course)
    done = run(course, "canvas", zip_path, subprocess_=True, assignment="01-rope")
    assert done.returncode == 1 and done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith(f"collect: {zip_path}: its notebooks are not 01-rope's: 2 of 2 hold "
                                  "the nbgrader cells of toy; nothing was collected"), done.stderr
    assert tree(course) == before and (earlier / "01-rope.ipynb").read_bytes() == b"ada's real work"
    assert run(course, "canvas", zip_path).returncode == 0   # it is toy's: collected as toy


def test_collect_01_rope_given_the_06_download_refuses_it(course):
    """The issue's case, on the course's own notebooks: students' 06 notebooks (solved and
    untouched) are not 01-rope's, though their grade ids (p1_solution...) are the same."""
    from notebooks import solved

    for aid in ("01-rope", "06-flash-attention"):
        shutil.copytree(REPO / "solutions" / aid, course / "solutions" / aid)
    release = nbformat.read(REPO / "release" / "06-flash-attention" / "06-flash-attention.ipynb", as_version=4)
    source = nbformat.read(course / "solutions" / "06-flash-attention" / "06-flash-attention.ipynb", as_version=4)
    zip_path = archive(course / "06.zip", [
        ("lovelaceada_1001_5001_06-flash-attention.ipynb", nbformat.writes(solved(release, source)).encode()),
        ("turingalan_1002_5002_06-flash-attention.ipynb", nbformat.writes(release).encode())])
    done = run(course, "canvas", zip_path, assignment="01-rope")
    assert done.returncode == 1 and not (course / "submitted").exists()
    assert done.stderr.strip() == (f"collect: {zip_path}: its notebooks are not 01-rope's: 2 of 2 hold "
                                   "the nbgrader cells of 06-flash-attention; nothing was collected "
                                   "(the download of another assignment?)")
    assert run(course, "canvas", zip_path, assignment="06-flash-attention").returncode == 0


def test_one_students_notebook_of_another_assignment_is_skipped(two_assignments):
    course = two_assignments
    earlier = course / "submitted" / "alan" / AID
    earlier.mkdir(parents=True)
    (earlier / "toy.ipynb").write_bytes(b"alan's earlier toy")
    zip_path = archive(course / "toy.zip", [
        ("lovelaceada_1001_5001_toy.ipynb", source_bytes(course, AID)),
        ("turingalan_1002_5002_01-rope.ipynb", source_bytes(course, "01-rope")),
        ("dijkstraedsger_1004_5004_toy.ipynb", notebook("no nbgrader cells: grading decides"))])
    done = run(course, "canvas", zip_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "collected 2 notebook(s) of 2 student(s) into submitted/<student>/toy/"
    assert ("skipped turingalan_1002_5002_01-rope.ipynb: a notebook of 01-rope, not of toy (by its "
            "nbgrader cells): not collected, the student's folder is left as it was") in done.stdout
    assert sorted(p.name for p in earlier.iterdir()) == ["toy.ipynb"]
    assert (earlier / "toy.ipynb").read_bytes() == b"alan's earlier toy"


def test_a_roster_that_matches_nobody_is_refused(course):
    with open(course / "roster.csv", "w", newline="") as f:
        csv.writer(f).writerows([["student_id", "name", "email", "lms_id"], ["s1", "Some One", "", "77"]])
    zip_path = archive(course / "c.zip", [("lovelaceada_1001_5001_toy.ipynb", notebook("ada")),
                                          ("turingalan_1002_5002_toy.ipynb", notebook("alan"))])
    done = run(course, "canvas", zip_path)
    assert done.returncode == 1 and done.stdout == "" and not (course / "submitted").exists()
    assert done.stderr.strip() == (f"collect: {zip_path}: none of its 2 notebook(s) matches a roster "
                                   "student by lms_id or name: check the roster's lms_id and name "
                                   "columns (student_id,name,email,lms_id)")
    (course / "roster.csv").write_text("student_id,name,email,Canvas ID\nada,Ada Lovelace,,1001\n")
    done = run(course, "canvas", zip_path)
    assert done.returncode == 1 and "unknown column(s) 'canvas id'; no lms_id column" in done.stderr


def test_zip_times_need_a_zone(course):
    """A zip entry's time has no zone: read in course.toml's timezone, refused without one;
    an entry with the extended timestamp (a Unix time) needs none."""
    zip_path = archive(course / "c.zip", [("lovelaceada_1001_5001_toy.ipynb", notebook("ada"), T1)])
    (course / "course.toml").write_text("")
    done = run(course, "canvas", zip_path)
    assert done.returncode == 1 and not (course / "submitted").exists()
    assert "has a time without a time zone: declare the zone the LMS writes its zip times in" in done.stderr
    (course / "course.toml").write_text('timezone = "America/New_York"\n')
    assert run(course, "canvas", zip_path).returncode == 0
    assert stamp("ada", course) == "2026-12-01 14:30:00.000000 UTC"   # 09:30 in New York
    (course / "course.toml").write_text("")
    info = zipfile.ZipInfo("lovelaceada_1001_5001_toy.ipynb", T1)
    moment = int(datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc).timestamp())
    info.extra = (0x5455).to_bytes(2, "little") + (5).to_bytes(2, "little") + b"\x01" + moment.to_bytes(4, "little")
    assert run(course, "canvas", archive(course / "ut.zip", [(info, notebook("ada"))])).returncode == 0
    assert stamp("ada", course) == "2026-12-01 08:00:00.000000 UTC"


def test_canvas_late_mark_is_checked_against_the_times(course):
    (course / "course.toml").write_text('timezone = "UTC"\n[assignments.toy]\n'
                                        'due = "2026-12-02 12:00 UTC"\n')
    zip_path = archive(course / "c.zip", [
        ("lovelaceada_LATE_1001_5001_toy.ipynb", notebook("ada"), T1),      # marked, but on time
        ("turingalan_1002_5002_toy.ipynb", notebook("alan"), T2),          # late, not marked
        ("dijkstraedsger_LATE_1004_5004_toy.ipynb", notebook("ed"), T2)])  # marked and late: agree
    done = run(course, "canvas", zip_path)
    assert done.returncode == 0, done.stderr
    marks = [line for line in done.stdout.splitlines() if line.startswith("late mark: ")]
    assert marks == [
        "late mark: ada: Canvas marks the submission late, but its newest file is from 2026-12-01 "
        "09:30:00 UTC, before the due date 2026-12-02 12:00:00 UTC (an extension or a due date of "
        "Canvas's own?)",
        "late mark: alan: Canvas does not mark the submission late, but its newest file is from "
        "2026-12-02 18:45:10 UTC, after the due date 2026-12-02 12:00:00 UTC (an extension in Canvas?)"]


def test_collect_is_refused_while_another_command_holds_the_course(course):
    import fcntl

    zip_path = archive(course / "c.zip", [("lovelaceada_1001_5001_toy.ipynb", notebook("ada"))])
    with open(course / ".autograder.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("grade toy, pid 4242 on gradinghost, since today\n")
        held.flush()
        done = run(course, "canvas", zip_path, subprocess_=True)
    assert done.returncode == 1 and not (course / "submitted").exists()
    assert done.stderr.strip() == ("another command holds this course: grade toy, pid 4242 "
                                   "on gradinghost, since today; wait for it to finish (or stop it) "
                                   "and run collect again")


@pytest.mark.slow
def test_a_collected_canvas_download_is_graded_with_its_times(course):
    from autograder.core.limits import Limits
    from autograder.host.driver import grade
    from autograder.host.release import generate
    from autograder.sandbox.launcher import unavailable_reason
    from nbgrader.api import Gradebook
    from tests.grader.test_grading_e2e import Class

    if unavailable_reason():
        pytest.skip(str(unavailable_reason()))
    source = nbformat.read(course / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    release = generate(AID, course, release_dir=course / "release-check")
    klass = Class(source, nbformat.read(release / f"{AID}.ipynb", as_version=4))
    zip_path = archive(course / "canvas.zip", [
        ("lovelaceada_1001_5001_toy.ipynb", nbformat.writes(klass.notebook()).encode(), T1),
        ("turingalan_LATE_1002_5002_Copy of toy.ipynb",
         nbformat.writes(klass.notebook(solved=[])).encode(), T2)])
    assert run(course, "canvas", zip_path).returncode == 0
    results = {r.student: r for r in grade(AID, course, progress=False, out=io.StringIO(), jobs=2,
                                           limits=Limits(cell_timeout=10, notebook_timeout=90))}
    assert (results["ada"].status, results["ada"].score) == ("ok", klass.total)
    assert (results["alan"].status, results["alan"].score) == ("ok", 0)
    assert "graded 'Copy of toy.ipynb'" in results["alan"].message
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        assert gb.find_submission(AID, "alan").timestamp == datetime(*T2)
        assert gb.find_submission(AID, "ada").timestamp == datetime(*T1)
