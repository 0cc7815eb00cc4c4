"""The gradebook module: what a worker reads out of a gradebook, the driver records back.

A real SQLite gradebook with the toy assignment: a result recorded by
``gradebook.record`` reads back cell for cell with ``gradebook.read_scores``; a
re-recorded result replaces the autograded scores without duplicating a row and
keeps a manual score (marking the cell for review, as nbgrader does); a failed
submission scores 0 in every cell; a URL that cannot be a gradebook is one line; a
worker's nbgrader opens one SQLite file on one kept engine, and a scratch gradebook's
commits do not wait for the disk; a dropped gradebook leaves no engine behind.
"""

import shutil
import time
from pathlib import Path

import pytest

from autograder.core import gradebook
from autograder.host.release import generate
from autograder.core.results import CellScore, NotebookScores, StudentResult

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "course"


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
                         notebooks=[NotebookScores("toy", grades, (("why", "see me"),))])


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


def test_a_failed_grading_records_nothing_and_keeps_the_earlier_grade(db):
    """status error is the host's fault or the grader's: never zeros in the student's row."""
    assert gradebook.record(db, "toy", result(status="error")) == (0.0, 0.0, False)
    with gradebook.open_gradebook(db) as gb:
        assert [s.student.id for s in gb.assignment_submissions("toy")] == []
    assert gradebook.record(db, "toy", result()) == (4.0, 7.0, True)
    assert gradebook.record(db, "toy", result(add=0.0, status="error")) == (4.0, 7.0, True)
    assert gradebook.record(db, "toy", result(add=0.0)) == (3.0, 7.0, True)


def test_a_url_that_cannot_be_a_gradebook_is_one_line(tmp_path):
    with pytest.raises(gradebook.GradebookError, match="does not exist"):
        gradebook.check_url(f"sqlite:///{tmp_path / 'missing' / 'g.db'}")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(gradebook.GradebookError, match="not an SQLite database"):
        gradebook.check_url(f"sqlite:///{tmp_path / 'notes.txt'}")
    assert not (tmp_path / "missing").exists()


def submission_rows(db_url, student):
    """(notebook, grade cells, comment cells) of each notebook of ``student``'s toy submission."""
    with gradebook.open_gradebook(db_url) as gb:
        sub = gb.find_submission("toy", student)
        return [(nb.name, sorted(g.name for g in nb.grades), sorted(c.name for c in nb.comments))
                for nb in sub.notebooks]


def test_a_new_submission_has_the_rows_nbgrader_makes(db):
    gradebook.record(db, "toy", result())
    with gradebook.open_gradebook(db) as gb:  # nbgrader's own way, for a second student
        gb.update_or_create_student("grace")
        gb.add_submission("toy", "grace")
    assert submission_rows(db, "ada") == submission_rows(db, "grace")
    [(name, grades, comments)] = submission_rows(db, "ada")
    assert name == "toy" and len(grades) == 5 and "why" in comments


# -- a PostgreSQL gradebook: one kept session, the write lock, forks ----------------------------
def backends(url):
    """Process ids of the server sessions on ``url``'s database, other than the asking one."""
    import psycopg

    with psycopg.connect(gradebook.libpq_url(url), autocommit=True) as conn:
        return sorted(r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"))


@pytest.fixture()
def pg(tmp_path, postgres):
    url = postgres(f"gradebook_{tmp_path.name[-12:].replace('-', '_').lower()}")
    with gradebook.open_gradebook(url):  # made ready as ``grade`` makes it
        pass
    shutil.copytree(FIXTURE / "solutions", tmp_path / "solutions")
    generate("toy", tmp_path, release_dir=tmp_path / "release" / "toy", db_url=url)
    return url


def test_postgres_records_keep_one_session_that_a_fork_leaves_alone(pg):
    import gc
    import os

    assert gradebook.record(pg, "toy", result("ada")) == (4.0, 7.0, True)
    [session] = backends(pg)
    gradebook.record(pg, "toy", result("grace"))
    assert backends(pg) == [session]  # the same server session, not one per result
    child = os.fork()
    if child == 0:  # what a forked grading worker does with the parent's gradebook: nothing
        gradebook._ENGINES.clear()
        gc.collect()
        os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
    time.sleep(0.2)
    assert backends(pg) == [session]  # the child did not end the parent's session
    gradebook.record(pg, "toy", result("alan"))
    assert backends(pg) == [session]


def test_postgres_record_reconnects_after_the_server_ends_its_session(pg):
    import psycopg

    gradebook.record(pg, "toy", result("ada"))
    [session] = backends(pg)
    with psycopg.connect(gradebook.libpq_url(pg), autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (session,))
    time.sleep(0.2)
    assert gradebook.record(pg, "toy", result("grace", add=0.0)) == (3.0, 7.0, True)
    assert backends(pg) not in ([], [session])


def test_postgres_new_students_wait_for_the_write_lock(pg):
    import threading

    gradebook.record(pg, "toy", result("ada"))
    done = []
    with gradebook.writing(pg):  # another run creating students, say from its roster
        thread = threading.Thread(target=lambda: done.append(gradebook.record(pg, "toy", result("grace"))))
        thread.start()
        thread.join(1.5)
        assert thread.is_alive() and not done
    thread.join(30)
    assert done == [(4.0, 7.0, True)]


def test_an_sqlite_url_is_taken_apart_in_one_place(tmp_path):
    path = tmp_path / "a b" / "gradebook.db"
    assert gradebook.sqlite_path(gradebook.sqlite_url(path)) == path
    assert gradebook.sqlite_path("postgresql://grader@db/ml101") is None
    assert gradebook.sqlite_path("sqlite://") is None  # in memory: no file


ASSIGNMENT_ROWS = {  # every row of an assignment's registration, by name (ids may differ)
    "assignment": "SELECT name, duedate, course_id FROM assignment",
    "notebook": "SELECT name, kernelspec FROM notebook",
    "cells": "SELECT b.name, b.type, g.max_score, g.cell_type, t.max_score, s.id IS NOT NULL"
             " FROM base_cell b LEFT JOIN grade_cells g ON g.id = b.id"
             " LEFT JOIN task_cells t ON t.id = b.id LEFT JOIN solution_cells s ON s.id = b.id",
    "sources": "SELECT name, cell_type, locked, source, checksum FROM source_cell",
}


def registration(path):
    import sqlite3

    with sqlite3.connect(path) as db:
        return {what: sorted(db.execute(query)) for what, query in ASSIGNMENT_ROWS.items()}


def test_a_copied_assignment_is_the_registration_nbgrader_makes(db, tmp_path):
    """The run's template gradebook is a copy of the class gradebook's registration: the
    same notebooks and cells (hidden tests, checksums, points) as generating into it."""
    copy = tmp_path / "template.db"
    gradebook.copy_assignment(db, gradebook.sqlite_url(copy), "toy")
    generated = registration(gradebook.sqlite_path(db))
    assert registration(copy) == generated
    assert sum(1 for cell in generated["cells"] if cell[2] is not None) == 5  # the toy's graded cells
    assert any("HIDDEN TESTS" in source for _, _, _, source, _ in generated["sources"])


def test_nbgraders_own_gradebooks_share_one_engine_per_sqlite_file(db, tmp_path):
    """A worker's nbgrader opens a Gradebook for each step; after keep_engines_in_nbgrader
    they are sessions on one engine (its compiled statements kept), nbgrader's course check
    still runs, no connection stays open, and a new file still gets its tables."""
    from nbgrader.api import Course, Gradebook

    gradebook.keep_engines_in_nbgrader()
    with Gradebook(db) as first:
        engine = first.engine
        first.find_assignment("toy")
    compiled = len(engine._compiled_cache)
    with Gradebook(db, course_id="other") as second:
        assert second.engine is engine
        assert second.course_id == "other"
        assert "other" in {course.id for course in second.db.query(Course)}
        second.find_assignment("toy")
    assert len(engine._compiled_cache) == compiled + 1  # the Course query; find_assignment's was kept
    assert engine.pool.checkedout() == 0
    with Gradebook(gradebook.sqlite_url(tmp_path / "new.db")) as third:
        assert third.engine is not engine
        third.add_assignment("fresh")
        assert third.find_assignment("fresh").name == "fresh"


def test_a_scratch_gradebook_commits_without_waiting_for_the_disk(db):
    from nbgrader.api import Gradebook

    gradebook.keep_engines_in_nbgrader()
    gradebook.make_scratch(db)
    for opened in (gradebook.open_gradebook(db), Gradebook(db)):
        with opened as gb:
            connection = gb.db.connection()
            assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 0
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "memory"
    gradebook.record(db, "toy", result())
    assert [nb.grades for nb in gradebook.read_scores(db, "toy", "ada")[1]] == \
        [nb.grades for nb in result().notebooks]
    with pytest.raises(ValueError, match="an SQLite file"):
        gradebook.make_scratch("postgresql://grader@127.0.0.1/course")


def test_a_dropped_gradebook_leaves_no_engine_behind(db):
    """What a Dask worker does when a run's scratch folder goes: its engine is closed and
    forgotten, and a later open makes a new one."""
    from nbgrader.api import Gradebook

    gradebook.keep_engines_in_nbgrader()
    with Gradebook(db) as first:
        engine = first.engine
    assert engine in gradebook._ENGINES.values()
    gradebook.drop_engine(db)
    assert engine not in gradebook._ENGINES.values()
    with Gradebook(db) as second:
        assert second.engine is not engine
        assert second.find_assignment("toy").name == "toy"


def test_similarity_is_kept_per_student_and_found_again_for_those_graded(tmp_path):
    """What the copy detector keeps of a class: hashed shapes and pairs, one student at a time;
    a student graded again (or in a later run) is compared with the whole class kept, a pair
    goes with its student's re-grade, other assignments are untouched."""
    from autograder.core.gradebook import keep_similarity
    from autograder.core.similarity import fingerprints, pairs_with

    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    copied = ("def softmax(xs):\n    m = max(xs)\n    e = [math.exp(x - m) for x in xs]\n"
              "    s = sum(e)\n    return [v / s for v in e]\n")
    own = ("def softmax(xs):\n    top = max(xs)\n    weights = []\n    for value in xs:\n"
           "        weights.append(math.exp(value - top))\n    total = sum(weights)\n"
           "    return [w / total for w in weights]\n")

    def keep(assignment, **students):
        found = keep_similarity(url, assignment, {s: fingerprints(f) for s, f in students.items()},
                                pairs_with)
        return [pair[:3] for pair in found]

    assert keep("toy", ann={"softmax": copied}) == []
    assert keep("other", ann={"softmax": copied}, ben={"softmax": copied}) == [("ann", "ben", "softmax")]
    assert keep("toy", cat={"softmax": own}) == []                          # a later run
    assert keep("toy", ben={"softmax": copied.replace("xs", "values")}) == [("ann", "ben", "softmax")]
    assert keep("toy", dan={"softmax": own}) == [("ann", "ben", "softmax"), ("cat", "dan", "softmax")]
    assert keep("toy", ben={"softmax": own}) == [("ben", "cat", "softmax"), ("ben", "dan", "softmax"),
                                                 ("cat", "dan", "softmax")]   # ann: no longer
    assert keep("toy", cat={}, dan={}) == []                                   # nothing to compare
    assert keep("toy") == [] and keep("other") == [("ann", "ben", "softmax")]
