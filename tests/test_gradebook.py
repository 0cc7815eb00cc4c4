"""The gradebook module: what a worker reads out of a gradebook, the driver records back.

A real SQLite gradebook with the toy assignment: a result recorded by
``gradebook.record`` reads back cell for cell with ``gradebook.read_scores``; a
re-recorded result replaces the autograded scores without duplicating a row and
keeps a manual score (marking the cell for review, as nbgrader does); a failed
submission scores 0 in every cell; a URL that cannot be a gradebook is one line.
"""

import shutil
from pathlib import Path

import pytest

from autograder import gradebook
from autograder.release import generate
from autograder.results import CellScore, NotebookScores, StudentResult

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "course"


@pytest.fixture()
def db(tmp_path):
    shutil.copytree(FIXTURE / "solutions", tmp_path / "solutions")
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    generate("toy", tmp_path, release_dir=tmp_path / "release" / "toy", db_url=url)
    return url


def result(student="ada", add=1.0, status="ok"):
    grades = (CellScore("test_add_visible", add, 1.0), CellScore("test_add_hidden", 2.0, 2.0),
              CellScore("test_softmax_visible", 1.0, 1.0), CellScore("test_softmax_hidden", 0.0, 2.0),
              CellScore("why", None, 1.0))
    return StudentResult(student=student, status=status,
                         notebooks=[NotebookScores("toy", None, grades, (("why", "see me"),))])


def test_recorded_scores_read_back_cell_for_cell(db):
    score, max_score, needs_manual = gradebook.record(db, "toy", result())
    assert (score, max_score, needs_manual) == (4.0, 7.0, True)
    _, notebooks = gradebook.read_scores(db, "toy", "ada")
    assert [nb.grades for nb in notebooks] == [nb.grades for nb in result().notebooks]
    assert dict(notebooks[0].comments) == {"add": None, "softmax": None, "why": "see me"}
    again = StudentResult(student="ada", notebooks=notebooks)  # and back: nothing changes
    assert gradebook.record(db, "toy", again) == (score, max_score, needs_manual)
    assert gradebook.read_scores(db, "toy", "ada")[1] == notebooks


def test_re_recording_replaces_autograded_scores_and_keeps_manual_ones(db):
    gradebook.record(db, "toy", result())
    with gradebook.open_gradebook(db) as gb:
        grade = gb.find_grade("why", "toy", "toy", "ada")
        grade.manual_score = 1.0
        grade.needs_manual_grade = False
        gb.db.commit()
    score, _, needs_manual = gradebook.record(db, "toy", result(add=0.0))
    assert score == 3.0 + 1.0 and needs_manual  # the manual point stays, flagged for review
    with gradebook.open_gradebook(db) as gb:
        assert len(gb.assignment_submissions("toy")) == 1
        assert gb.find_grade("test_add_visible", "toy", "toy", "ada").auto_score == 0.0


def test_a_failed_submission_scores_zero_everywhere(db):
    score, max_score, _ = gradebook.record(db, "toy", result(status="error"))
    assert (score, max_score) == (0.0, 7.0)


def test_a_url_that_cannot_be_a_gradebook_is_one_line(tmp_path):
    with pytest.raises(gradebook.GradebookError, match="does not exist"):
        gradebook.check_url(f"sqlite:///{tmp_path / 'missing' / 'g.db'}")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(gradebook.GradebookError, match="not an SQLite database"):
        gradebook.check_url(f"sqlite:///{tmp_path / 'notes.txt'}")
    assert not (tmp_path / "missing").exists()
