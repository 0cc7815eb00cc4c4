"""The roster (autograder/host/roster.py), exports (autograder/host/exports.py) and late penalties in the gradebook.

Every test builds a real SQLite gradebook with nbgrader's API (the class of
:func:`class_gradebook`, opened as the driver opens it) and checks exact values.
"""

import csv
from datetime import datetime, timedelta, timezone

import pytest

from autograder.host.exports import export_csv, export_lms
from autograder.core.gradebook import open_gradebook
from autograder.core.policy import CourseSettings, LatePolicy, Lateness, apply_late_policy
from autograder.host.roster import RosterEntry, RosterReport, read_roster, roster_report, sync_roster

UTC = timezone.utc
ROSTER = [
    RosterEntry("ada", "Ada", "Lovelace", "ada@uni.edu", "101"),
    RosterEntry("bob", "Bob", "Ross", "bob@uni.edu", "102"),
    RosterEntry("cyd", "Cyd", "Charisse", "cyd@uni.edu", "103"),
]


def set_grade(gb, cell, assignment, student, auto=None, manual=None):
    """Score one cell of one submission as the autograder (``auto``) or a grader (``manual``) would."""
    grade = gb.find_grade(cell, assignment, assignment, student)
    grade.auto_score, grade.manual_score = auto, manual
    grade.needs_manual_grade = auto is None and manual is None
    gb.db.commit()


@pytest.fixture
def class_gradebook(tmp_path):
    """Two assignments, the roster synced, and the autograder's results (no manual grades yet).

    * ``01-rope`` (due 2026-12-01 23:59 UTC): ``test_rope`` (code, 6 points) and
      ``written`` (markdown, 4 points, graded by hand). ada on time, 6 points; bob
      26 h late, 5 points and a 1-point late penalty; zed (not on the roster) on
      time, 3 points; cyd did not submit.
    * ``02-gqa`` (due 2026-12-08 23:59 UTC): ``test_gqa`` (code, 10 points). Only
      ada, 10 points, without a timestamp.
    """
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with open_gradebook(url) as gb:
        gb.add_assignment("01-rope", duedate="2026-12-01 23:59:00 UTC")
        gb.add_notebook("01-rope", "01-rope")
        gb.add_grade_cell("test_rope", "01-rope", "01-rope", max_score=6, cell_type="code")
        gb.add_grade_cell("written", "01-rope", "01-rope", max_score=4, cell_type="markdown")
        gb.add_assignment("02-gqa", duedate="2026-12-08 23:59:00 UTC")
        gb.add_notebook("02-gqa", "02-gqa")
        gb.add_grade_cell("test_gqa", "02-gqa", "02-gqa", max_score=10, cell_type="code")
        for student, submitted, score in (("ada", "2026-12-01 20:00:00 UTC", 6.0),
                                          ("bob", "2026-12-03 01:59:00 UTC", 5.0),
                                          ("zed", "2026-12-01 12:00:00 UTC", 3.0)):
            gb.update_or_create_student(student)
            gb.add_submission("01-rope", student, timestamp=submitted)
            set_grade(gb, "test_rope", "01-rope", student, auto=score)
            set_grade(gb, "written", "01-rope", student)
        gb.find_submission_notebook("01-rope", "01-rope", "bob").late_submission_penalty = 1.0
        gb.add_submission("02-gqa", "ada")
        set_grade(gb, "test_gqa", "02-gqa", "ada", auto=10.0)
    sync_roster(url, ROSTER)
    return url


def grade_by_hand(url, scores):
    """Enter manual scores for the written answer of 01-rope, as the formgrader does."""
    with open_gradebook(url) as gb:
        for student, score in scores.items():
            set_grade(gb, "written", "01-rope", student, auto=None, manual=score)


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


# ---------------------------------------------------------------- roster.csv


def test_read_roster(tmp_path):
    path = tmp_path / "roster.csv"
    path.write_text("\ufeffStudent_ID , NAME,Email,LMS_ID\n"
                    "ada,Ada King Lovelace,ada@uni.edu,101\n"
                    "\n"
                    " plato ,Plato,,\n"
                    ",,,\n"
                    "cyd,,cyd@uni.edu,103\n", encoding="utf-8")
    assert read_roster(path) == [
        RosterEntry("ada", "Ada King", "Lovelace", "ada@uni.edu", "101"),
        RosterEntry("plato", "Plato", None, None, None),
        RosterEntry("cyd", None, None, "cyd@uni.edu", "103"),
    ]


EXPECTED = "(expected the columns student_id,name,email,lms_id, in any order)"


@pytest.mark.parametrize("text, problem", [
    ("", "empty file, expected the columns student_id,name,email,lms_id"),
    ("name,email,lms_id\nAda,ada@uni.edu,1\n", f"row 1: no student_id column {EXPECTED}"),
    ("student_id,name,email,Canvas ID\nada,Ada,a@b,1\n",       # an LMS's name for lms_id
     f"row 1: unknown column(s) 'canvas id'; no lms_id column {EXPECTED}"),
    ("student_id,name,email,lms_id,section\nada,Ada,a@b,1,A\n", f"row 1: unknown column(s) 'section' {EXPECTED}"),
    ("student_id\nada\n", f"row 1: no name, email, lms_id column {EXPECTED}"),
    ("student_id,name,email,lms_id,EMAIL\nada,a,b,c,d\n", "row 1: column 'email' appears 2 times"),
    ("student_id,name,email,lms_id\nada,Ada,,\n,Bob Ross,,\n", "row 3: empty student_id"),
    ("student_id,name,email,lms_id\nada,Ada,,\nbob,Bob,,\nada,Ada L,,\n",
     "row 4: student_id 'ada' already on row 2"),
    ("student_id,name,email,lms_id\nada,,,\n../bob,,,\n", "row 3: student_id '../bob' cannot be a folder name"),
    ("student_id,name,email,lms_id\nada,,,\n..,,,\n", "row 3: student_id '..' cannot be a folder name"),
])
def test_read_roster_errors_name_file_row_and_problem(tmp_path, text, problem):
    path = tmp_path / "roster.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        read_roster(path)
    message = str(error.value)
    assert message.startswith(str(path)) and problem in message and "\n" not in message


def test_sync_roster_writes_names_emails_and_lms_ids(class_gradebook):
    with open_gradebook(class_gradebook) as gb:
        students = {s.id: (s.first_name, s.last_name, s.email, s.lms_user_id) for s in gb.students}
    assert students == {
        "ada": ("Ada", "Lovelace", "ada@uni.edu", "101"),
        "bob": ("Bob", "Ross", "bob@uni.edu", "102"),
        "cyd": ("Cyd", "Charisse", "cyd@uni.edu", "103"),   # on the roster only: created
        "zed": (None, None, None, None),                    # not on the roster: left alone
    }
    sync_roster(class_gradebook, [RosterEntry("bob", "Robert", "Ross", None, "202")])
    with open_gradebook(class_gradebook) as gb:
        bob = gb.find_student("bob")   # an empty cell clears nothing: the email stays
        assert (bob.first_name, bob.last_name, bob.email, bob.lms_user_id) == ("Robert", "Ross", "bob@uni.edu", "202")
        assert gb.find_submission("01-rope", "bob").score == 5.0   # grades untouched
    sync_roster(class_gradebook, [RosterEntry("bob"), RosterEntry("ada", "Ada", "Lovelace")])
    with open_gradebook(class_gradebook) as gb:   # never an LMS id cleared silently
        assert {s.id: s.lms_user_id for s in gb.students} == {"ada": "101", "bob": "202", "cyd": "103", "zed": None}


def test_roster_report(class_gradebook):
    assert roster_report(class_gradebook, "01-rope", ROSTER) == RosterReport("01-rope", ("cyd",), ("zed",))
    assert roster_report(class_gradebook, "02-gqa", ROSTER) == RosterReport("02-gqa", ("bob", "cyd"), ())
    with pytest.raises(ValueError, match="no assignment '03-mask' in the gradebook"):
        roster_report(class_gradebook, "03-mask", ROSTER)


# ---------------------------------------------------------------- exports

HEADER = ["student_id", "name", "email", "lms_id", "assignment", "duedate", "submitted_at",
          "late_by", "late_penalty", "score", "max_score", "needs_manual", "status"]
ROPE_DUE, GQA_DUE = "2026-12-01T23:59:00+00:00", "2026-12-08T23:59:00+00:00"


def test_export_csv_reads_the_gradebook_after_manual_grading(class_gradebook, tmp_path):
    out = tmp_path / "export.csv"
    export_csv(class_gradebook, out, ["01-rope"])
    assert read_rows(out)[1] == ["ada", "Ada Lovelace", "ada@uni.edu", "101", "01-rope", ROPE_DUE,
                                 "2026-12-01T20:00:00+00:00", "0.0", "0", "6", "10", "True", "graded"]

    grade_by_hand(class_gradebook, {"ada": 3.5, "bob": 2.0})
    export_csv(class_gradebook, out)
    assert read_rows(out) == [
        HEADER,
        ["ada", "Ada Lovelace", "ada@uni.edu", "101", "01-rope", ROPE_DUE,
         "2026-12-01T20:00:00+00:00", "0.0", "0", "9.5", "10", "False", "graded"],
        ["bob", "Bob Ross", "bob@uni.edu", "102", "01-rope", ROPE_DUE,
         "2026-12-03T01:59:00+00:00", "26.0", "1", "6", "10", "False", "graded"],   # 5 + 2 - 1
        ["cyd", "Cyd Charisse", "cyd@uni.edu", "103", "01-rope", ROPE_DUE,
         "", "", "", "", "10", "", "missing"],
        ["zed", "", "", "", "01-rope", ROPE_DUE,
         "2026-12-01T12:00:00+00:00", "0.0", "0", "3", "10", "True", "graded"],
        ["ada", "Ada Lovelace", "ada@uni.edu", "101", "02-gqa", GQA_DUE,
         "", "0.0", "0", "10", "10", "False", "graded"],
        ["bob", "Bob Ross", "bob@uni.edu", "102", "02-gqa", GQA_DUE, "", "", "", "", "10", "", "missing"],
        ["cyd", "Cyd Charisse", "cyd@uni.edu", "103", "02-gqa", GQA_DUE, "", "", "", "", "10", "", "missing"],
        ["zed", "", "", "", "02-gqa", GQA_DUE, "", "", "", "", "10", "", "missing"],
    ]


def test_export_csv_due_date_includes_the_extension(class_gradebook, tmp_path):
    with open_gradebook(class_gradebook) as gb:
        gb.grant_extension("01-rope", "bob", hours=2)
    export_csv(class_gradebook, tmp_path / "export.csv", ["01-rope"])
    bob = read_rows(tmp_path / "export.csv")[2]
    assert bob[5:8] == ["2026-12-02T01:59:00+00:00", "2026-12-03T01:59:00+00:00", "24.0"]


def test_canvas_layout(class_gradebook, tmp_path):
    grade_by_hand(class_gradebook, {"ada": 3.5, "bob": 2.0})
    out = tmp_path / "canvas.csv"
    export_lms(class_gradebook, out, "canvas")
    assert out.read_text() == (
        "Student,ID,SIS User ID,SIS Login ID,Section,01-rope,02-gqa\n"
        "Points Possible,,,,,10,10\n"
        '"Lovelace, Ada",101,,,,9.5,10\n'
        '"Ross, Bob",102,,,,6,\n'
        '"Charisse, Cyd",103,,,,,\n'
        "zed,,,,,3,\n")


def test_moodle_layout(class_gradebook, tmp_path):
    grade_by_hand(class_gradebook, {"ada": 3.5, "bob": 2.0})
    out = tmp_path / "moodle.csv"
    with pytest.raises(ValueError, match="moodle: no email address in the gradebook for zed "):
        export_lms(class_gradebook, out, "moodle")
    assert not out.exists()
    with open_gradebook(class_gradebook) as gb:   # not on the roster, but the gradebook knows an email
        gb.update_or_create_student("zed", email="zed@elsewhere.org")
    export_lms(class_gradebook, out, "moodle", ["02-gqa", "01-rope"])
    assert out.read_text() == (
        "Email address,02-gqa,01-rope\n"
        "ada@uni.edu,10,9.5\n"
        "bob@uni.edu,,6\n"
        "cyd@uni.edu,,\n"
        "zed@elsewhere.org,,3\n")


@pytest.mark.parametrize("export, expected", [
    (lambda url, out: export_csv(url, out, ["01-rope", "03-mask"]), 5),
    (lambda url, out: export_lms(url, out, "canvas", ["01-rope", "03-mask"]), 6),
    (lambda url, out: export_lms(url, out, "moodle", ["01-rope", "03-mask"]), 0),
])
def test_an_assignment_not_graded_yet_is_absent_never_an_error(class_gradebook, tmp_path, export, expected):
    """``export`` at any point of the term: 03-mask is in solutions/ but not graded yet."""
    out = tmp_path / "grades_for_lms.csv"
    out.write_text("last week's export\n")
    if not expected:  # moodle refuses zed (no email): the target stays as it was
        with pytest.raises(ValueError, match="no email address in the gradebook for zed"):
            export(class_gradebook, out)
        assert out.read_text() == "last week's export\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["gradebook.db", "grades_for_lms.csv"]
        return
    export(class_gradebook, out)
    rows = read_rows(out)
    assert len(rows) == expected and "03-mask" not in out.read_text()
    assert rows[0][-1] == "01-rope" if rows[0][0] == "Student" else {r[4] for r in rows[1:]} == {"01-rope"}


def test_export_errors(class_gradebook, tmp_path):
    with pytest.raises(ValueError, match="unknown LMS layout 'blackboard' \\(use canvas or moodle\\)"):
        export_lms(class_gradebook, tmp_path / "out.csv", "blackboard")
    with pytest.raises(ValueError, match="no gradebook at .*typo.db"):
        export_csv(f"sqlite:///{tmp_path / 'typo.db'}", tmp_path / "out.csv")
    with pytest.raises(ValueError, match="the folder .*nowhere does not exist"):
        export_csv(class_gradebook, tmp_path / "nowhere" / "out.csv")
    assert not (tmp_path / "typo.db").exists() and not (tmp_path / "out.csv").exists()


# ---------------------------------------------------------------- late penalties in the gradebook

TEN_PERCENT = CourseSettings(LatePolicy.parse("10%/day,cap=50%,grace=1h"))


def test_apply_late_policy_follows_manual_grades(class_gradebook, tmp_path):
    # bob: 26 h late, 25 h past the grace: two started days, 20 % of his score
    assert apply_late_policy(class_gradebook, "01-rope", TEN_PERCENT) == {
        "ada": Lateness(timedelta(0), 0.0),
        "bob": Lateness(timedelta(hours=26), 1.0),          # 20 % of 5
        "zed": Lateness(timedelta(0), 0.0),
    }
    grade_by_hand(class_gradebook, {"bob": 2.0})
    assert apply_late_policy(class_gradebook, "01-rope", TEN_PERCENT)["bob"].penalty == pytest.approx(1.4)
    export_csv(class_gradebook, tmp_path / "export.csv", ["01-rope"])
    assert read_rows(tmp_path / "export.csv")[2][7:10] == ["26.0", "1.4", "5.6"]


def test_apply_late_policy_writes_the_due_date_and_respects_extensions(class_gradebook):
    later = CourseSettings(TEN_PERCENT.default_policy,
                           due_dates={"01-rope": datetime(2026, 12, 3, 0, 0, tzinfo=UTC)})
    assert apply_late_policy(class_gradebook, "01-rope", later)["bob"] == Lateness(
        timedelta(hours=1, minutes=59), 0.5)                # past the grace by 59 min: one day, 10 %
    with open_gradebook(class_gradebook) as gb:
        assert gb.find_assignment("01-rope").duedate == datetime(2026, 12, 3, 0, 0)
        gb.grant_extension("01-rope", "bob", days=1)
    assert apply_late_policy(class_gradebook, "01-rope", later)["bob"] == Lateness(timedelta(0), 0.0)
    with open_gradebook(class_gradebook) as gb:
        assert gb.find_submission("01-rope", "bob").late_submission_penalty == 0.0


def test_apply_late_policy_spreads_a_penalty_over_notebooks(class_gradebook):
    with open_gradebook(class_gradebook) as gb:
        gb.add_assignment("03-two", duedate="2026-12-10 12:00:00 UTC")
        for notebook, points in (("a", 3.0), ("b", 5.0)):
            gb.add_notebook(notebook, "03-two")
            gb.add_grade_cell("test", notebook, "03-two", max_score=5, cell_type="code")
        gb.add_submission("03-two", "ada", timestamp="2026-12-11 13:00:00 UTC")
        for notebook, points in (("a", 3.0), ("b", 5.0)):
            grade = gb.find_grade("test", notebook, "03-two", "ada")
            grade.auto_score, grade.needs_manual_grade = points, False
        gb.db.commit()
    assert apply_late_policy(class_gradebook, "03-two", CourseSettings(LatePolicy.parse("2/day"))) == {
        "ada": Lateness(timedelta(days=1, hours=1), 4.0)}
    with open_gradebook(class_gradebook) as gb:
        penalties = {nb.name: nb.late_submission_penalty for nb in gb.find_submission("03-two", "ada").notebooks}
        assert penalties == {"a": 3.0, "b": 1.0}
        assert gb.find_submission("03-two", "ada").late_submission_penalty == 4.0


def test_apply_late_policy_unknown_assignment(class_gradebook):
    with pytest.raises(ValueError, match="no assignment '03-mask' in the gradebook"):
        apply_late_policy(class_gradebook, "03-mask", TEN_PERCENT)


def test_inside_the_grace_period_is_on_time_in_every_reader(class_gradebook, tmp_path):
    """zed hands in 30 min after the due date, inside the course's grace hour: on time in the
    gradebook's standings, the export and the report's heatmap; bob (26 h late) is late in all
    of them. Under ``none`` (no grace) both are late, and free."""
    from autograder.core.gradebook import standings
    from autograder.host.report_data import term_stats

    with open_gradebook(class_gradebook) as gb:
        gb.find_submission("01-rope", "zed").timestamp = datetime(2026, 12, 2, 0, 29)
        gb.db.commit()
    assert apply_late_policy(class_gradebook, "01-rope", TEN_PERCENT)["zed"] == Lateness(timedelta(0), 0.0)
    for policy, bob_penalty, zed_late in ((TEN_PERCENT, 1.0, timedelta(0)),
                                          (CourseSettings(LatePolicy.parse("none")), 0.0, timedelta(minutes=30))):
        apply_late_policy(class_gradebook, "01-rope", policy)
        found = standings(class_gradebook, "01-rope")
        assert (found["zed"].late, found["zed"].late_by, found["zed"].penalty) == (bool(zed_late), zed_late, 0.0)
        assert (found["bob"].late, found["bob"].late_by, found["bob"].penalty) == \
            (True, timedelta(hours=26), bob_penalty)
        assert found["bob"].final == 5.0 - bob_penalty
        export_csv(class_gradebook, tmp_path / "export.csv", ["01-rope"])
        rows = {r[0]: r for r in read_rows(tmp_path / "export.csv")[1:]}
        assert (rows["zed"][7], rows["bob"][7]) == (f"{zed_late.total_seconds() / 3600:.1f}", "26.0")
        late = {s: [c.late for c in cells] for s, cells in term_stats(class_gradebook).matrix.items()}
        assert late["zed"][0] is bool(zed_late) and late["bob"][0] is True and late["ada"][0] is False
    assert standings(class_gradebook, "03-mask") is None   # not graded yet: no standings, no error
