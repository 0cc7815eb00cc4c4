"""End to end: what lands in ``submitted/`` is hostile, and a real grading run meets it.

One class of the toy fixture course is graded once (module-scoped fixture, the real
sandbox, ``--jobs 2``): an honest student, and one student per family of hostile file
(links out of the folder, to ``solutions/`` and to a classmate, at every level; a hard
link to the solution; a FIFO, a device, a folder named ``*.ipynb``; a sparse 8 GiB file;
200,000 cells; JSON nested too deep; a file name that is not UTF-8; timestamps that are
not a time or lie in the future; an nbformat 3 notebook), and one per fault a notebook's own
content can have that once made it ungradable for good (an image attachment that is missing
or is only ``text/html``; a value nbformat's schema refuses: a name with a newline, a tag
with a comma, a bad cell id, an empty ``kernelspec``; edited grading metadata: an extra graded
cell, a test cell's points raised; a feedback page that cannot be rendered). Each gets the
status, score and message its family should get (the faults: graded on the assignment's
cells, flagged, their feedback page written); no linked submission is graded as the solution
or as the classmate, and no feedback page shows the solution.
"""

import contextlib
import csv
import io
import json
import os
import re
import shutil
import stat
from datetime import datetime, timedelta, timezone

import nbformat
import pytest

from autograder.core.limits import Limits
from autograder.core.course_files import FEEDBACK
from autograder.host.driver import grade
from autograder.worker import pipeline
from autograder.host.release import generate
from autograder.sandbox.launcher import unavailable_reason
from autograder.core.notebook_file import NOTEBOOK_BYTES, NOTEBOOK_CELLS
from notebooks import solution_source
from tests.grader.test_grading_e2e import FIXTURE, Class

SANDBOX_MISSING = unavailable_reason()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SANDBOX_MISSING is not None, reason=str(SANDBOX_MISSING))]
LIMITS = dict(jobs=2, limits=Limits(cell_timeout=10, notebook_timeout=90, memory_mb=2048,
                                     output_limit=100_000))
AID = "toy"
LINK = "is a symbolic link, which the grader does not follow"
NOT_REGULAR = "is not a regular file (a FIFO, socket or device), never opened"


def write(folder, name, content):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if isinstance(content, nbformat.NotebookNode):
        nbformat.write(content, path)
    else:
        path.write_bytes(content)
    return path


def build(root, klass):
    """Every student's folder; ``{student: (status, score, message piece, flags)}``."""
    submitted, solutions = root / "submitted", root / "solutions" / AID
    honest = klass.notebook()
    expected = {}

    def student(name, status="ok", score=klass.total, message="", flags=()):
        expected[name] = (status, score, message, set(flags))
        return submitted / name / AID

    write(student("honest"), f"{AID}.ipynb", honest)
    # links: the assignment folder, the student folder, the notebook
    (submitted / "linked-solutions").mkdir(parents=True)
    student("linked-solutions", "unreadable", 0, f"the submission folder linked-solutions/{AID} {LINK}")
    os.symlink(solutions, submitted / "linked-solutions" / AID)
    student("linked-classmate", "unreadable", 0, f"the submission folder linked-classmate {LINK}")
    os.symlink(submitted / "honest", submitted / "linked-classmate")
    folder = student("linked-shadow", "unreadable", 0, f"{AID}.ipynb {LINK}")
    folder.mkdir(parents=True)
    os.symlink("/etc/shadow", folder / f"{AID}.ipynb")
    folder = student("hardlink", "unreadable", 0, f"{AID}.ipynb is a hard link")
    folder.mkdir(parents=True)
    os.link(solutions / f"{AID}.ipynb", folder / f"{AID}.ipynb")
    # things that are not files, beside an honest notebook
    folder = student("fifo", message=f"pipe.ipynb {NOT_REGULAR}")
    write(folder, f"{AID}.ipynb", honest)
    os.mkfifo(folder / "pipe.ipynb")
    os.mkfifo(folder / "submission_secret.txt")
    if os.geteuid() == 0:
        folder = student("device", message=f"zero.ipynb {NOT_REGULAR}")
        write(folder, f"{AID}.ipynb", honest)
        os.mknod(folder / "zero.ipynb", 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    folder = student("dir-ipynb", message=f"{AID}.ipynb is a folder, not a notebook file")
    write(folder, "mine.ipynb", honest)
    write(folder / f"{AID}.ipynb", f"{AID}.ipynb", honest)
    folder = student("sparse", message=f"huge.ipynb is larger than the {NOTEBOOK_BYTES // 2**20} MiB")
    write(folder, f"{AID}.ipynb", honest)
    with open(folder / "huge.ipynb", "wb") as f:
        f.truncate(8 * 2**30)
    # amplification
    cell = {"cell_type": "code", "source": "", "metadata": {}, "outputs": [], "execution_count": None}
    write(student("cells-200k", "unreadable", 0, f"a notebook of 200000 cells, more than the "
                                                  f"{NOTEBOOK_CELLS}"),
          f"{AID}.ipynb", json.dumps({"cells": [cell] * 200_000, "metadata": {}, "nbformat": 4,
                                      "nbformat_minor": 4}).encode())
    write(student("deep-json", "unreadable", 0, "JSON nested deeper than the 100 levels"),
          f"{AID}.ipynb", b'{"nbformat": 4, "metadata": {}, "cells": ' + b"[" * 300 + b"]" * 300 + b"}")
    # names and times
    folder = student("not-utf8", message=f"graded '{AID}.ipynb'")
    write(folder, f"{AID}.ipynb", honest)
    write(folder, os.fsdecode(b"notes-\xff\xfe.ipynb"), b"not json")
    folder = student("stamp-garbage", message="timestamp.txt is not a time ('last tuesday')",
                     flags={"bad-timestamp"})
    write(folder, f"{AID}.ipynb", honest)
    write(folder, "timestamp.txt", b"last tuesday")
    folder = student("stamp-future", message="timestamp.txt is in the future", flags={"bad-timestamp"})
    write(folder, f"{AID}.ipynb", honest)
    write(folder, "timestamp.txt", b"2099-01-01 00:00:00 UTC")
    write(student("stamp-good"), "timestamp.txt", b"2026-01-02 03:04:05 UTC")
    write(submitted / "stamp-good" / AID, f"{AID}.ipynb", honest)
    write(student("nbformat3", message=f"graded '{AID}.ipynb'"), f"{AID}.ipynb",
          nbformat.writes(nbformat.convert(honest, 3)).encode())
    # a student folder whose name is not UTF-8 cannot be a student id
    write(submitted / os.fsdecode(b"eve-\xff") / AID, f"{AID}.ipynb", honest)
    # what a notebook's own content can get wrong: graded all the same, flagged, named
    for name, fault, flag, message in CONTENT_FAULTS:
        nb = klass.notebook()  # (honest was converted to nbformat 3 in place above)
        fault(nb)
        write(student(name, message=message, flags={flag}), f"{AID}.ipynb", nb)
    return expected


def _markdown(source, attachments=None):
    def fault(nb):
        cell = nbformat.v4.new_markdown_cell(source)
        if attachments:
            cell.attachments = attachments
        nb.cells.insert(1, cell)
    return fault


def _set(where, key, value):
    def fault(nb):
        target = nb.metadata if where == "notebook" else nb.cells[where].metadata
        target[key] = value
    return fault


def _cell_id(nb):
    nb.cells[1]["id"] = "bad id!"


def _edited_grading(nb):
    test = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_add_hidden")
    test.metadata["nbgrader"]["points"] = 20
    nb.cells.append(nbformat.v4.new_code_cell("assert True", metadata={"nbgrader": {
        "grade": True, "grade_id": "bonus", "points": 50, "locked": False, "solution": False,
        "schema_version": 3}}))


RENDER_FAILS = "feedback-render-fails-here"
CONTENT_FAULTS = [  # (student, fault, flag, message piece)
    ("missing-attachment", _markdown("A figure: ![my plot](attachment:figure.png)"), "missing-attachment",
     "image 'figure.png' is not attached"),
    ("html-attachment", _markdown("![page](attachment:page.html)", {"page.html": {"text/html": "PGI+aGk8L2I+"}}),
     "missing-attachment", "attachment 'page.html' is not an image (text/html)"),
    ("name-newline", _set(0, "name", "two\nlines"), "invalid-notebook", "metadata 'name'"),
    ("tag-comma", _set(0, "tags", ["a,b"]), "invalid-notebook", "metadata 'tags'"),
    ("bad-cell-id", _cell_id, "invalid-notebook", "id 'bad id!' is not a valid cell id"),
    ("empty-kernelspec", _set("notebook", "kernelspec", {}), "invalid-notebook", "notebook metadata 'kernelspec'"),
    ("edited-metadata", _edited_grading, "edited-metadata", "points 20 restored to 2"),
    ("unrenderable", _markdown(RENDER_FAILS), "feedback-failed", "the feedback page could not be rendered"),
]


def render_feedback_that_fails_on_a_marker(config):
    """The worker's ``render_feedback``, raising inside nbgrader's converter for one notebook
    (as a template that cannot render it would): the scores must stand."""
    from autograder.core.feedback_page import FeedbackExporter

    original = FeedbackExporter.from_notebook_node

    def from_notebook_node(self, nb, resources=None, **kw):
        if any(RENDER_FAILS in cell.source for cell in nb.cells):
            raise ValueError("a template that cannot render this notebook")
        return original(self, nb, resources, **kw)

    FeedbackExporter.from_notebook_node = from_notebook_node
    try:
        return _render_feedback(config)
    finally:
        FeedbackExporter.from_notebook_node = original


_render_feedback = pipeline.render_feedback


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-course")
    shutil.copytree(FIXTURE / "solutions" / AID, root / "solutions" / AID)
    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    release_dir = generate(AID, root, release_dir=root / "release-check")
    klass = Class(source, nbformat.read(release_dir / f"{AID}.ipynb", as_version=4))
    expected = build(root, klass)
    out, err = io.StringIO(), io.StringIO()
    started = datetime.now(timezone.utc)
    with contextlib.redirect_stderr(err), pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "render_feedback", render_feedback_that_fails_on_a_marker)
        results = grade(AID, root, progress=False, out=out, **LIMITS)
    return dict(root=root, klass=klass, expected=expected, out=out.getvalue(), err=err.getvalue(),
                results={r.student: r for r in results}, started=started)


def test_every_family_gets_its_status_score_and_message(hostile):
    results, expected = hostile["results"], hostile["expected"]
    assert set(results) == set(expected)  # eve-\xff is not a student id: skipped
    for student, (status, score, message, flags) in expected.items():
        result = results[student]
        assert (result.status, result.score) == (status, pytest.approx(score)), (student, result)
        assert message in result.message, (student, result.message)
        assert flags <= set(result.flags), (student, result.flags)
        if status == "ok" and student != "honest":
            assert result.max_score == results["honest"].max_score


def test_content_faults_are_graded_on_the_assignments_cells_with_their_page(hostile):
    """Each fault of a notebook's content: the full score (the extra graded cell and the raised
    points count for nothing), a feedback page of the notebook, and the cause kept in the log."""
    root, results = hostile["root"], hostile["results"]
    for student, *_ in CONTENT_FAULTS:
        result = results[student]
        assert result.max_score == results["honest"].max_score, student
        page = (root / FEEDBACK / student / AID / f"{AID}.html").read_text()
        if student == "unrenderable":
            assert "was graded" in page and "a template that cannot render this notebook" in page
            assert "a template that cannot render this notebook" in result.log
        else:
            assert "Part 2: softmax" in page, student  # the notebook itself
    assert "alt=\"my plot\"" in (root / FEEDBACK / "missing-attachment" / AID / f"{AID}.html").read_text()
    assert "cell 13: grading metadata 'bonus' is not the assignment's" in results["edited-metadata"].message


def test_a_folder_name_that_is_not_utf8_is_skipped_with_one_line(hostile):
    assert hostile["err"].strip() == ("skipped submitted/eve-\\xff: not a student id "
                                      "(not valid UTF-8, or control characters)")


def test_amplification_costs_seconds_not_minutes(hostile):
    # before the caps: 336 s and 2.5 GB for 200k cells; generous margins for 2 shared cores
    for student in ("cells-200k", "deep-json", "sparse", "fifo"):
        assert hostile["results"][student].seconds < 60, student


def test_no_link_grades_or_shows_the_solution(hostile):
    root, klass = hostile["root"], hostile["klass"]
    lines = [line.strip() for code in klass.solutions.values()
             for line in solution_source(code).splitlines() if len(line.strip()) > 12]
    assert lines
    for student in ("linked-solutions", "linked-classmate", "linked-shadow", "hardlink"):
        pages = list((root / FEEDBACK / student / AID).glob("*.html"))
        assert pages, student
        for page in pages:
            text = page.read_text()
            assert "BEGIN SOLUTION" not in text and "root:" not in text
            assert not [line for line in lines if line in text or line.replace("<", "&lt;") in text]


def test_timestamps_that_cannot_be_believed_count_as_the_time_of_grading(hostile):
    from nbgrader.api import Gradebook

    root, started = hostile["root"], hostile["started"]
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        stamps = {s: gb.find_submission(AID, s).timestamp
                  for s in ("stamp-garbage", "stamp-future", "stamp-good")}
    for student in ("stamp-garbage", "stamp-future"):
        moment = stamps[student].replace(tzinfo=timezone.utc)
        assert started - timedelta(seconds=5) <= moment <= datetime.now(timezone.utc), student
    assert stamps["stamp-good"].replace(tzinfo=timezone.utc) == datetime(2026, 1, 2, 3, 4, 5,
                                                                         tzinfo=timezone.utc)
    written = (root / FEEDBACK / "stamp-good" / AID / "timestamp.txt").read_text()
    assert written == "2026-01-02 03:04:05.000000 UTC"  # beside the page, for release_feedback


def test_the_csv_and_summary_name_every_family(hostile):
    with open(hostile["root"] / "grades.csv", newline="") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert set(rows) == set(hostile["expected"])
    assert rows["linked-solutions"]["status"] == "unreadable"
    assert "bad-timestamp" in rows["stamp-future"]["flags"]
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f\ud800-\udfff]", hostile["out"])


def test_regrading_an_unchanged_hostile_class_grades_nothing(hostile):
    again = grade(AID, hostile["root"], progress=False, out=io.StringIO(), **LIMITS)
    assert again == []  # the digests read the same hostile folders the same way
