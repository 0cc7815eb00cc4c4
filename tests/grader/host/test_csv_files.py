"""The CSV files the grader writes, byte by byte: ``grades.csv``, ``export`` and ``--lms canvas|moodle``.

The writers run on records made here (no gradebook, no grading run): ``write_csv`` on
``StudentResult`` records, and ``write_csv_atomically`` on the rows of ``csv_rows``,
``canvas_rows`` and ``moodle_rows`` built from ``StudentGrade`` records. Each file is compared
with the bytes written out by hand below: the header, RFC 4180's CRLF after every record, a
quoted cell wherever it holds a comma, a quote, a CR or a LF (and only there), text that starts
like a formula behind one apostrophe (``core/untrusted.csv_safe``) while numbers, negative ones
included, stay numbers; then the stdlib ``csv`` reader gives every cell back, a CR or LF inside
one included. (``test_csv_injection.py`` sends a hostile class through a real gradebook.)
"""

import csv
from datetime import datetime, timedelta, timezone

from autograder.core.results import Status, StudentResult
from autograder.host.exports import GRADED, StudentGrade, canvas_rows, csv_rows, moodle_rows, write_csv_atomically
from autograder.host.summary import write_csv

DUE = datetime(2026, 12, 1, 23, 59, tzinfo=timezone.utc)
NAME = 'Love, "lace"'            # a comma and quotes: the cell is quoted, its quotes doubled
BROKEN = "line\nbreak\rcr"       # a LF and a lone CR inside a cell

GRADES = [
    StudentGrade("ada", "Ada", NAME, "ada@uni.edu", "101", "01-rope", DUE, 10.0, status=GRADED,
                 submitted_at=DUE + timedelta(hours=1.5), late_by=timedelta(hours=1.5), late_penalty=1.0,
                 score=8.5, needs_manual=False),
    StudentGrade("-5", None, BROKEN, "b@uni.edu", None, "01-rope", DUE, 10.0),          # missing; id -5 is a number
    StudentGrade("=cmd", "@x", None, "+1@evil", "-7", "01-rope", DUE, 10.0, status=GRADED,
                 submitted_at=DUE, late_by=timedelta(0), late_penalty=0.0, score=0.0, needs_manual=True),
]


def read_back(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_export_file_bytes_and_round_trip(tmp_path):
    path = tmp_path / "export.csv"
    write_csv_atomically(path, csv_rows(GRADES))
    assert path.read_bytes() == (
        b"student_id,name,email,lms_id,assignment,duedate,submitted_at,late_by,late_penalty,score,"
        b"max_score,needs_manual,status\r\n"
        b'ada,"Ada Love, ""lace""",ada@uni.edu,101,01-rope,2026-12-01T23:59:00+00:00,'
        b"2026-12-02T01:29:00+00:00,1.5,1,8.5,10,False,graded\r\n"
        b'-5,"line\nbreak\rcr",b@uni.edu,,01-rope,2026-12-01T23:59:00+00:00,,,,,10,,missing\r\n'
        b"'=cmd,'@x,'+1@evil,-7,01-rope,2026-12-01T23:59:00+00:00,2026-12-01T23:59:00+00:00,"
        b"0.0,0,0,10,True,graded\r\n")
    rows = read_back(path)
    assert [row[:2] for row in rows[1:]] == [["ada", f"Ada {NAME}"], ["-5", BROKEN], ["'=cmd", "'@x"]]
    assert float(rows[1][9]) == 8.5 and rows[2][9] == "" and float(rows[3][3]) == -7


def test_canvas_and_moodle_file_bytes_and_round_trip(tmp_path):
    names = ["01-rope"]
    canvas, moodle = tmp_path / "canvas.csv", tmp_path / "moodle.csv"
    write_csv_atomically(canvas, canvas_rows(GRADES, names, {"01-rope": 10.0}))
    write_csv_atomically(moodle, moodle_rows(GRADES, names))
    assert canvas.read_bytes() == (
        b"Student,ID,SIS User ID,SIS Login ID,Section,01-rope\r\n"
        b"Points Possible,,,,,10\r\n"
        b'"Love, ""lace"", Ada",101,,,,8.5\r\n'    # Last, First
        b'"line\nbreak\rcr",,,,,\r\n'              # missing: an empty cell, never 0
        b"'@x,-7,,,,0\r\n")
    assert moodle.read_bytes() == (
        b"Email address,01-rope\r\n"
        b"ada@uni.edu,8.5\r\n"
        b"b@uni.edu,\r\n"
        b"'+1@evil,0\r\n")
    rows = read_back(canvas)
    assert [row[0] for row in rows[2:]] == [f"{NAME}, Ada", BROKEN, "'@x"]
    assert float(rows[1][5]) == 10 and float(rows[2][5]) == 8.5 and rows[3][5] == ""
    assert [row[1] for row in read_back(moodle)[1:]] == ["8.5", "", "0"]


def result(student, score, error=None, **fields):
    """A graded result, or one whose grading failed with ``error`` (the only rows with an error)."""
    return StudentResult(student=student, score=score, max_score=10.0, error=error, seconds=2.25,
                         status=Status.ERROR if error else Status.OK, **fields)


def test_grades_csv_bytes_round_trip_and_an_unchanged_rewrite(tmp_path):
    path = tmp_path / "grades.csv"
    results = [result("ada", 7.5, flags=["similar-to-classmate"], message="graded '=x.ipynb'"),
               result("-3", 10.0, error=f"cell said {NAME}\r\nthen {BROKEN}"),
               result("-x", 2.0, error="=HYPERLINK(1)", tampered=["@cell"])]
    write_csv(path, "01-rope", results, missing=["+1"])
    written = path.read_bytes()
    assert written == (
        b"student,assignment,score,max_score,status,needs_manual,submitted_at,late_by_hours,late_penalty,"
        b"seconds,failed_tests,limits,tampered,deleted,flags,similar,error,message\r\n"
        b"+1,01-rope,0,,missing,,,,,,,,,,,,,\"on the roster, no submission\"\r\n"
        b'-3,01-rope,10,10,error,0,,,,2.2,,,,,,,"cell said Love, ""lace""\r\nthen line\nbreak\rcr",\r\n'
        b"'-x,01-rope,2,10,error,0,,,,2.2,,,'@cell,,,,'=HYPERLINK(1),\r\n"
        b"ada,01-rope,7.5,10,ok,0,,,,2.2,,,,,similar-to-classmate,,,graded '=x.ipynb'\r\n")
    with open(path, newline="", encoding="utf-8") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert rows["-3"]["error"] == f"cell said {NAME}\r\nthen {BROKEN}"
    assert {s: float(row["score"]) for s, row in rows.items()} == {"-3": 10, "'-x": 2, "+1": 0, "ada": 7.5}
    write_csv(path, "02-gqa", [])   # another run reads the file back and writes it again
    assert path.read_bytes() == written
