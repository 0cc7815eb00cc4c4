"""A term of grading, end to end, as an instructor runs it from the course root.

One class of 01-rope (the course's first assignment) with a roster of ten: a
correct, a partial, an untouched, a misnamed, a duplicated, a metadata-stripped, a
late and an unreadable submission, plus a roster student who handed in nothing.
Every score is exact. The same students graded with stock ``nbgrader autograde``
(the command line, and ``NbGraderAPI.autograde``, which the formgrader's Autograde
button calls) get the driver's scores. A manual score entered through nbgrader's
API reaches every export. A run stopped with SIGTERM mid-class leaves no process,
folder or cgroup, and running grade again ends with the gradebook an uninterrupted
run gives. A second run while one holds the course is refused.
"""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder.sandbox.launcher import unavailable_reason
from leftovers import run_ids, scratch_folders
from notebooks import solved

REPO = Path(__file__).resolve().parents[3]
AID = "01-rope"
MISSING = unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]



def points_by_part():
    """``{part: points}`` of 01-rope's graded cells, read from its source notebook
    (``p3_hidden`` belongs to part ``p3``), and the points of the written answers."""
    nb = nbformat.read(REPO / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    auto, written = {}, 0.0
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not meta.get("grade"):
            continue
        if meta.get("solution"):  # a written answer, graded by hand
            written += meta["points"]
        else:
            part = meta["grade_id"].split("_")[0]
            auto[part] = auto.get(part, 0.0) + meta["points"]
    return auto, written


PARTS, WRITTEN = points_by_part()
FULL = sum(PARTS.values())  # every autograded point
PENALTY = round(0.10 * FULL, 1)  # 10 %/day of the score for one started day, as course.toml says


def make_course(root):
    """A course root like the repository's: solutions, the driver, the nbgrader config."""
    shutil.copytree(REPO / "solutions" / AID, root / "solutions" / AID)
    shutil.copytree(REPO / "autograder", root / "autograder",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    release = nbformat.read(REPO / "release" / AID / f"{AID}.ipynb", as_version=4)
    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    return release, source


ON_TIME = "2026-11-20 10:00:00.000000 UTC"


def hand_in(root, student, nb, name=f"{AID}.ipynb", when=None, stamp=ON_TIME):
    """Put a notebook (or raw bytes) in the student's folder, with nbgrader's timestamp.txt."""
    folder = root / "submitted" / student / AID
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "timestamp.txt").write_text(stamp)
    path = folder / name
    if isinstance(nb, (bytes, str)):
        path.write_bytes(nb if isinstance(nb, bytes) else nb.encode())
    else:
        nbformat.write(nb, path)
    if when is not None:
        os.utime(path, (when, when))
    return path


def cli(root, *args, check=True, cwd=None, **kw):
    env = {**os.environ, "PYTHONPATH": str(root),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "autograder", *map(str, args), "--root", str(root)],
                          cwd=cwd or root, env=env, capture_output=True, text=True, timeout=900, **kw)
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def scores(db_path):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db_path}") as gb:
        return {s.student.id: s.score for s in gb.assignment_submissions(AID)}


def cell_scores(db_path, student):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db_path}") as gb:
        nb = gb.find_submission_notebook(AID, AID, student)
        return {g.name: g.score for g in nb.grades}


DUE = "2026-11-20T23:59:00+00:00"
ROSTER = ["correct", "partial", "untouched", "misnamed", "duplicated", "stripped", "unreadable",
          "late", "absent1", "absent2"]


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    root = tmp_path_factory.mktemp("term")
    release, source = make_course(root)
    (root / "course.toml").write_text(f'[late]\npolicy = "10%/day,cap=50%"\n'
                                      f'[assignments."{AID}"]\ndue = "{DUE}"\n')
    (root / "roster.csv").write_text("student_id,name,email,lms_id\n" + "".join(
        f"{s},Student {s.title()},{s}@example.edu,{1000 + i}\n" for i, s in enumerate(ROSTER)))
    now = time.time()
    hand_in(root, "late", solved(release, source), stamp="2026-11-21 02:29:00.000000 UTC")  # 2.5 h late
    hand_in(root, "correct", solved(release, source))
    hand_in(root, "partial", solved(release, source, parts={"p1_solution", "p3_solution"}))
    hand_in(root, "untouched", release)
    hand_in(root, "misnamed", solved(release, source), name="rope homework (final).ipynb")
    hand_in(root, "duplicated", release, name=f"{AID}.ipynb", when=now - 3600)
    hand_in(root, "duplicated", solved(release, source), name=f"{AID}-Copy1.ipynb", when=now)
    stripped = solved(release, source)
    for cell in stripped.cells:
        cell.metadata.pop("nbgrader", None)
    hand_in(root, "stripped", stripped, name="Copy of 01-rope.ipynb")
    hand_in(root, "unreadable", b"this is not a notebook")
    out = cli(root, "grade", AID, "--jobs", "2", "--no-progress").stdout
    return dict(root=root, release=release, source=source, out=out,
                rows={r["student"]: r for r in csv.DictReader(open(root / "grades.csv"))})


EXPECTED = {"correct": FULL, "partial": PARTS["p1"] + PARTS["p3"], "untouched": 0.0, "misnamed": FULL,
            "duplicated": FULL, "stripped": FULL, "unreadable": 0.0, "late": FULL - PENALTY}


@pytest.mark.parametrize("student", sorted(EXPECTED))
def test_every_submission_scores_exactly(term, student):
    """grades.csv after the late penalty (10 % of the score for one started day)."""
    assert float(term["rows"][student]["score"]) == EXPECTED[student], term["rows"][student]


def test_lateness_is_shown(term):
    row = term["rows"]["late"]
    assert (row["late_by_hours"], float(row["late_penalty"])) == ("2.5", PENALTY)
    assert term["rows"]["correct"]["late_penalty"] == "" and "correct: 0" not in term["out"]
    assert "Late (10%/day,cap=50%): 1" in term["out"] and f"late: 2.5 h late, -{PENALTY:g} points" in term["out"]


def test_the_feedback_page_grade_wrote_shows_the_penalty(term):
    """The worker writes the penalty into its scratch gradebook before it renders the page
    (core.policy.apply_late_policy, the one writer of penalties): the page says it at once,
    with how late (2.5 h), the course's policy in words and the points taken."""
    def page(student):
        return (term["root"] / "feedback" / student / AID / f"{AID}.html").read_text()

    assert (f"Late submission penalty (Score: -{round(PENALTY, 2)}): handed in 2h30m after the due "
            f"date; late policy: 10% of the score per started day late, at most 50%; {PENALTY:g} points "
            "taken</li>") in page("late")
    assert "Late submission penalty" not in page("correct")


def test_a_failed_test_cell_says_its_message_once(term):
    """A visible test that fails in the student's kernel fails the same way in the judge: the
    autograded cell (and so the page) shows the error once, as the verdict, not the kernel's
    copy of it too."""
    graded = nbformat.read(term["root"] / "autograded" / "partial" / AID / f"{AID}.ipynb", as_version=4)
    failed = [c for c in graded.cells if c.cell_type == "code"
              and any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    assert failed, "the partial submission fails some tests"
    for cell in failed:
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        others = [o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                  for o in cell.outputs if o.get("output_type") != "error"]
        assert len(errors) == 1, cell.outputs
        assert not any(errors[0]["ename"] in text or errors[0]["evalue"] in text for text in others), \
            (cell.metadata.get("nbgrader"), cell.outputs)
    assert any(c.metadata["nbgrader"]["grade_id"] == "p2_visible" for c in failed)


def test_the_summary_lists_only_what_needs_a_look(term):
    """Only the unusual notebook choices (another name, several notebooks, re-seated code),
    and one line on the written answers waiting, with what to run."""
    lines = term["out"].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Unusual notebook choices"))
    listed = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        listed.append(line.strip().split(":")[0])
    assert sorted(listed) == ["duplicated", "misnamed", "stripped"], lines[start:]
    assert "Which notebook was graded" not in term["out"]
    waiting = sum(row["needs_manual"] == "1" for row in term["rows"].values())
    assert waiting, term["rows"]
    line = next(line for line in lines if line.startswith("Written answers to grade by hand:"))
    assert f"of {waiting} student(s)" in line and f"python -m autograder feedback {AID}" in line, line


def test_the_roster_names_the_missing(term):
    from nbgrader.api import Gradebook

    rows = term["rows"]
    for student in ("absent1", "absent2"):
        assert rows[student]["status"] == "missing" and rows[student]["score"] == "0"
    assert "On the roster, no submission (missing): 2: absent1, absent2" in term["out"]
    with Gradebook(f"sqlite:///{term['root'] / 'gradebook.db'}") as gb:
        student = gb.find_student("late")
        assert (student.first_name, student.last_name, student.email, student.lms_user_id) == \
            ("Student", "Late", "late@example.edu", "1007")


def test_intake_is_reported(term):
    rows, out = term["rows"], term["out"]
    assert rows["unreadable"]["status"] == "unreadable" and "not a notebook" in rows["unreadable"]["message"]
    assert "rope homework (final).ipynb" in rows["misnamed"]["message"]
    assert "01-rope-Copy1.ipynb" in rows["duplicated"]["message"] and "also handed in" in out
    assert all(row["error"] == "" for row in rows.values())   # nothing failed: no error anywhere
    assert "reseated" in rows["stripped"]["flags"]
    page = term["root"] / "feedback" / "unreadable" / AID / f"{AID}.html"
    assert "not a notebook" in page.read_text()
    for row in rows.values():
        assert "/tmp" not in row["message"] and "autograder-" not in row["message"]


def test_stock_nbgrader_gives_the_drivers_scores(term, tmp_path):
    """``nbgrader autograde`` from the course root, and the API the formgrader calls."""
    root = term["root"]
    db = root / "gradebook.db"
    driver = {s: cell_scores(db, s) for s in ("correct", "partial")}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)  # exactly as an instructor runs it: the config file finds the course
    proc = subprocess.run([str(Path(sys.executable).parent / "nbgrader"), "autograde", AID,
                           "--student", "correct", "--force"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert cell_scores(db, "correct") == driver["correct"]
    code = ("from nbgrader.apps import NbGraderAPI\n"
            "from traitlets.config.loader import PyFileConfigLoader\n"
            "config = PyFileConfigLoader('nbgrader_config.py', path='.').load_config()\n"
            f"result = NbGraderAPI(config=config).autograde({AID!r}, 'partial', force=True)\n"
            "assert result['success'], result['error']\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert cell_scores(db, "partial") == driver["partial"]


def test_a_manual_score_reaches_every_export(term):
    from nbgrader.api import Gradebook

    root = term["root"]
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        grade = gb.find_grade("p5_written", AID, AID, "correct")
        grade.manual_score = WRITTEN
        grade.needs_manual_grade = False  # what the formgrader's grade API does on save
        gb.db.commit()
    cli(root, "export", AID, "--to", "export-all.csv")
    with open(root / "export-all.csv", newline="") as f:
        exported = {r["student_id"]: r for r in csv.DictReader(f)}
    assert float(exported["correct"]["score"]) == FULL + WRITTEN
    assert exported["correct"]["needs_manual"] == "False" and exported["misnamed"]["needs_manual"] == "True"
    assert float(exported["late"]["score"]) == FULL - PENALTY and exported["absent1"]["status"] == "missing"
    cli(root, "export", AID, "--lms", "canvas", "--to", "export-canvas.csv")
    with open(root / "export-canvas.csv", newline="") as f:
        canvas = list(csv.reader(f))
    assert canvas[0][:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    row = next(r for r in canvas if r[0] == "Correct, Student")
    assert row[1] == "1000" and float(row[-1]) == FULL + WRITTEN
    cli(root, "feedback", AID, "--students", "correct")
    page = (root / "feedback" / "correct" / AID / f"{AID}.html").read_text()
    assert f"Score: {FULL + WRITTEN:.1f} / {FULL + WRITTEN:.1f}" in page and "to be graded by hand" not in page
    cli(root, "feedback", AID, "--students", "misnamed")
    page = (root / "feedback" / "misnamed" / AID / f"{AID}.html").read_text()
    assert "to be graded by hand" in page and "<code>p2_hidden_random</code>" in page
    assert "cdnjs" not in page and "_mathjax/tex-chtml.js" in page


def test_a_second_run_is_refused_while_one_holds_the_course(term):
    root = term["root"]
    import fcntl

    with open(root / ".autograder.lock", "r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.seek(0)
        held.truncate()
        held.write("grade 01-rope, pid 4242 on gradinghost, since today\n")
        held.flush()
        proc = cli(root, "grade", AID, "--force", "--no-progress", check=False)
    assert proc.returncode == 1
    assert "another command holds this course: grade 01-rope, pid 4242" in proc.stderr


def leftovers(root):
    """Processes of the course's runs, and the cgroups and scratch folders of the runs stamped there."""
    found = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmdline:
            found.add(cmdline.replace("\0", " ")[:120])
    return sorted(found | scratch_folders(run_ids(root, AID)))


def test_sigterm_mid_class_then_grade_again_equals_an_uninterrupted_run(tmp_path):
    release, source = make_course(tmp_path / "a")
    make_course(tmp_path / "b")
    slow = solved(release, source)
    for cell in slow.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "p1_solution":
            cell.source = "import time\ntime.sleep(4)\n" + cell.source
    for root in (tmp_path / "a", tmp_path / "b"):
        for i in range(6):
            hand_in(root, f"s{i}", slow if i % 2 else solved(release, source, parts={"p1_solution"}))
    uninterrupted = tmp_path / "b"
    cli(uninterrupted, "grade", AID, "--jobs", "2", "--no-progress")

    root = tmp_path / "a"
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade", AID, "--root", str(root),
                             "--jobs", "2", "--no-progress"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(root.glob(f"autograded/*/{AID}/.autograder.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert scratch_folders(run_ids(root, AID))  # mid-class: the run's folders are found by its id
    proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - stopped < 10
    assert proc.returncode == 1 and "stopped by SIGTERM" in err, err
    time.sleep(1)
    assert leftovers(root) == []
    recorded = scores(root / "gradebook.db")
    stamped = {p.parent.parent.name for p in root.glob(f"autograded/*/{AID}/.autograder.json")}
    assert 0 < len(stamped) < 6 and stamped <= set(recorded)
    for student in recorded:  # the gradebook and the files agree
        assert (root / "feedback" / student / AID / f"{AID}.html").exists() == (student in stamped)
    with open(root / "grades.csv", newline="") as f:
        assert {r["student"] for r in csv.DictReader(f)} == set(recorded)

    again = cli(root, "grade", AID, "--jobs", "2", "--no-progress").stdout
    assert f"Unchanged since last graded (skipped; --force re-grades them): {len(stamped)}" in again
    assert scores(root / "gradebook.db") == scores(uninterrupted / "gradebook.db")
    assert json.loads((root / "autograded" / "s1" / AID / ".autograder.json").read_text())["status"] == "ok"
    assert leftovers(root) == []


def test_nbgrader_db_commands_work_without_the_venv_on_path(tmp_path):
    """As the README says: `.venv/bin/nbgrader db ...` from the course root, no alembic on PATH."""
    make_course(tmp_path)
    nbgrader = str(Path(sys.executable).parent / "nbgrader")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = "/usr/bin:/bin"
    for args in (["db", "assignment", "add", AID], ["db", "upgrade"],
                 ["db", "student", "add", "eve", "--last-name", "Evans"]):
        proc = subprocess.run([nbgrader, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
    proc = subprocess.run([nbgrader, "db", "assignment", "list"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert f"{AID} (due: None)" in proc.stdout
    assert "eve" in subprocess.run([nbgrader, "db", "student", "list"], cwd=tmp_path, env=env,
                                   capture_output=True, text=True, timeout=300).stdout
