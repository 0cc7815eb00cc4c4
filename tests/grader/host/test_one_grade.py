"""One grade, the same everywhere, through a term of the toy course (issue 35, items 3 to 7).

A class of four on ``toy`` (7 points: 6 autograded, 1 written), with a roster, a course
``timezone``, a course grace hour that ``toy``'s own policy inherits, and a second
assignment in ``solutions/`` that is never graded. Each step is a command an instructor
runs (``python -m autograder ...`` in a subprocess):

1. ada (solved, on time) and bob (part 1 only, 47 h late) are graded; ``export`` and
   ``export --lms canvas`` work with ``toy-two`` ungraded;
2. cyd (ada's code, in ``toy homework (final).ipynb``, 30 min late: inside the grace) is
   graded in a later, smaller run: the copy is flagged on both rows;
3. the due date moves a day earlier (course.toml), bob gets a two-day extension and ada a
   manual grade; bob is re-graded, then ``feedback``, ``export``, ``export --lms canvas``
   and ``report`` run: every output shows the scores computed here by hand;
4. cyd hands in her own code: the flag goes from both rows.

Stock ``nbgrader autograde`` does not find cyd's renamed notebook, as the README says.
"""

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.host.release import generate
from notebooks import solved
from autograder.sandbox.launcher import unavailable_reason

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "course"
AID = "toy"
MISSING = unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]

DUE = "2026-11-10 12:00"                      # course.toml's, in its timezone (UTC here)
EARLIER = "2026-11-09 12:00"                  # the due date moved a day earlier in step 3
HANDED_IN = {"ada": "2026-11-10 10:00:00.000000 UTC",    # 2 h early
             "bob": "2026-11-12 11:00:00.000000 UTC",    # 47 h late
             "cyd": "2026-11-10 12:30:00.000000 UTC"}    # 30 min late: inside the grace hour
OWN_SOFTMAX = ("def softmax(xs):\n"
               "    top = max(xs)\n"
               "    weights = []\n"
               "    for value in xs:\n"
               "        weights.append(math.exp(value - top))\n"
               "    total = 0.0\n"
               "    for w in weights:\n"
               "        total = total + w\n"
               "    return [w / total for w in weights]\n")

# By hand. Policy 10 %/day of the score per started day past the grace hour (the course's,
# inherited by toy's own "10%/day").
# step 1: ada on time, 6; bob 47 h late = 46 h past the grace = 2 days: 20 % of 3 = 0.6.
FIRST = {"ada": (6.0, 0.0), "bob": (2.4, 0.6)}
# step 3 (due 2026-11-09 12:00): ada 22 h late (21 h past the grace): 1 day, 10 % of 6 + 1 manual;
# bob's due with 2 days' extension is 2026-11-11 12:00: 23 h late, 1 day, 10 % of 3;
# cyd 24.5 h late: 1 day, 10 % of 6.
FINAL = {"ada": (6.3, 0.7), "bob": (2.7, 0.3), "cyd": (5.4, 0.6)}


def cli(root, *args, check=True):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "autograder", *map(str, args), "--root", str(root)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def hand_in(root, student, nb, name=f"{AID}.ipynb"):
    folder = root / "submitted" / student / AID
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "timestamp.txt").write_text(HANDED_IN[student])
    nbformat.write(nb, folder / name)


def course_toml(root, due):
    (root / "course.toml").write_text(f'timezone = "UTC"\n[late]\npolicy = "10%/day,grace=1h"\n'
                                      f'[assignments.{AID}]\ndue = "{due}"\npolicy = "10%/day"\n')


def grades_csv(root):
    with open(root / "grades.csv", newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f) if r["assignment"] == AID}


def exported(root, *args):
    out = root / "out.csv"
    cli(root, "export", *args, "--to", out)
    with open(out, newline="") as f:
        return list(csv.reader(f))


def page(root, student):
    """``(score, max, penalty or None)`` of the student's feedback page."""
    html = (root / "feedback" / student / AID / f"{AID}.html").read_text()
    score, top = re.search(r"\(Score: ([\d.]+) / ([\d.]+)\)</h4>", html).groups()
    late = re.search(r"Late submission penalty \(Score: -([\d.]+)\)", html)
    return float(score), float(top), float(late.group(1)) if late else None


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-grade")
    shutil.copytree(FIXTURE / "solutions" / AID, root / "solutions" / AID)
    (root / "solutions" / "toy-two").mkdir()  # in solutions/, never graded this term
    shutil.copy(FIXTURE / "solutions" / AID / f"{AID}.ipynb", root / "solutions" / "toy-two" / "toy-two.ipynb")
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    course_toml(root, DUE)
    (root / "roster.csv").write_text("student_id,name,email,lms_id\n" + "".join(
        f"{s},{s.title()} Student,{s}@uni.edu,{100 + i}\n" for i, s in enumerate(("ada", "bob", "cyd", "dan"))))
    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    release = nbformat.read(generate(AID, root, release_dir=root / "release-check") / f"{AID}.ipynb",
                            as_version=4)
    shutil.rmtree(root / "release-check")
    (root / "gradebook.db").unlink(missing_ok=True)
    hand_in(root, "ada", solved(release, source))
    hand_in(root, "bob", solved(release, source, parts={"add"}))
    seen = {}

    # 1. ada and bob; exports with toy-two ungraded
    cli(root, "grade", AID, "--students", "ada,bob", "--jobs", "2", "--no-progress")
    seen["first"] = grades_csv(root)
    seen["export"] = exported(root)
    seen["canvas"] = exported(root, "--lms", "canvas")
    seen["toy-two only"] = cli(root, "export", "toy-two", "--lms", "canvas", "--to", "two.csv").stdout

    # 2. cyd, a renamed copy of ada's notebook, graded later in a run of her own
    hand_in(root, "cyd", solved(release, source), name="toy homework (final).ipynb")
    seen["cyd run"] = cli(root, "grade", AID, "--jobs", "2", "--no-progress").stdout
    seen["copied"] = grades_csv(root)

    # 3. a due date a day earlier, an extension, a manual grade; bob re-graded, then every output
    from nbgrader.api import Gradebook

    course_toml(root, EARLIER)
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        gb.grant_extension(AID, "bob", days=2)
        grade = gb.find_grade("why", AID, AID, "ada")
        grade.manual_score, grade.needs_manual_grade = 1.0, False
        gb.db.commit()
    cli(root, "grade", AID, "--students", "bob", "--force", "--jobs", "1", "--no-progress")
    seen["bob page after grade"] = page(root, "bob")
    seen["csv before feedback"] = grades_csv(root)
    cli(root, "feedback", AID)
    seen["pages"] = {s: page(root, s) for s in FINAL}
    seen["final"] = grades_csv(root)
    seen["final export"] = exported(root)
    seen["final canvas"] = exported(root, "--lms", "canvas")
    cli(root, "report", "--to", "reports")
    with open(root / "reports" / "index.matrix.csv", newline="") as f:
        seen["matrix"] = {r["student"]: r for r in csv.DictReader(f)}

    # 4. cyd hands in her own softmax: no longer similar
    own = solved(release, source)
    next(c for c in own.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax").source = OWN_SOFTMAX
    hand_in(root, "cyd", own, name="toy homework (final).ipynb")
    cli(root, "grade", AID, "--jobs", "2", "--no-progress")
    seen["own work"] = grades_csv(root)

    # last (its --force empties autograded/cyd/toy before it looks for notebooks)
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the course's nbgrader_config.py imports the grader
    seen["stock"] = subprocess.run([str(Path(sys.executable).parent / "nbgrader"), "autograde", AID,
                                    "--student", "cyd", "--force"], cwd=root, env=env,
                                   capture_output=True, text=True, timeout=600)
    seen["feedback after stock"] = cli(root, "feedback", AID).stdout
    return seen


def test_the_first_run_scores_and_an_ungraded_assignment_is_absent_from_exports(term):
    rows = term["first"]
    for student, (score, penalty) in FIRST.items():
        assert (float(rows[student]["score"]), float(rows[student]["late_penalty"] or 0)) == (score, penalty)
    assert rows["ada"]["late_by_hours"] == "" and rows["bob"]["late_by_hours"] == "47.0"
    assert rows["dan"]["status"] == "missing" and rows["dan"]["error"] == ""
    assert all(r["error"] == "" for r in rows.values()) and "graded 'toy.ipynb'" in rows["ada"]["message"]
    header, *body = term["export"]
    assert {r[4] for r in body} == {AID} and len(body) == 4       # toy-two: absent, not an error
    assert {r[0]: float(r[9]) for r in body if r[9]} == {s: v[0] for s, v in FIRST.items()}
    assert term["canvas"][0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", AID]
    assert {r[1]: r[5] for r in term["canvas"][2:]} == {"100": "6", "101": "2.4", "102": "", "103": ""}
    assert term["toy-two only"].startswith("nothing to export yet: toy-two not graded")


def test_a_copy_graded_in_a_later_run_is_flagged_on_both_rows(term):
    rows = term["copied"]
    assert "similar-to-classmate" in rows["cyd"]["flags"] and "softmax ~ ada" in rows["cyd"]["similar"]
    assert "similar-to-classmate" in rows["ada"]["flags"] and "softmax ~ cyd" in rows["ada"]["similar"]
    assert "similar-to-classmate" not in rows["bob"]["flags"]
    said = term["cyd run"].split("Similar to a classmate")[1].splitlines()  # one cluster, the class's
    assert said[0].endswith(": 1 cluster(s) of 2 students") and said[1].startswith("  2 students: ada, cyd: softmax (")


def test_inside_the_inherited_grace_is_on_time(term):
    """toy's own ``policy = "10%/day"`` keeps the course's grace hour: cyd, 30 min late, is on
    time in grades.csv and in the summary's list of late students."""
    cyd = term["copied"]["cyd"]
    assert (float(cyd["score"]), cyd["late_by_hours"], cyd["late_penalty"]) == (6.0, "", "")
    late = term["cyd run"].split("Late (")[1].split("Score:")[0]
    assert "bob" in late and "cyd" not in late


def test_grade_rewrites_a_page_its_worker_rendered_without_the_extension(term):
    """The worker's scratch gradebook has no extension (nor manual grades): its page for bob
    said -0.9 (three days late); grade renders it again from the class gradebook."""
    assert term["bob page after grade"] == (FINAL["bob"][0], 7.0, FINAL["bob"][1])
    row = term["csv before feedback"]["bob"]
    assert (float(row["score"]), float(row["late_penalty"])) == FINAL["bob"]


def test_every_output_agrees_after_a_due_date_an_extension_and_a_manual_grade(term):
    header, *body = term["final export"]
    export = {r[0]: r for r in body}
    canvas = {r[0].split(", ")[1].split()[0].lower(): r[5] for r in term["final canvas"][2:]}
    for student, (score, penalty) in FINAL.items():
        row = term["final"][student]
        assert (float(row["score"]), float(row["late_penalty"])) == (score, penalty), student
        assert (float(export[student][9]), float(export[student][8])) == (score, penalty), student
        assert float(canvas[student]) == score, student
        assert term["pages"][student] == (score, 7.0, penalty), student
        assert term["matrix"][student][AID] == f"{100 * score / 7:.0f} late", student
    assert term["matrix"]["dan"][AID] == "missing" and export["dan"][-1] == "missing"


def test_the_flag_goes_from_both_rows_when_no_longer_similar(term):
    rows = term["own work"]
    for student in ("ada", "cyd"):
        assert "similar-to-classmate" not in rows[student]["flags"] and rows[student]["similar"] == ""
    assert float(rows["cyd"]["score"]) == FINAL["cyd"][0]   # still correct, still late by a day


def test_stock_nbgrader_does_not_find_a_renamed_notebook_as_the_readme_says(term):
    """The driver grades ``toy homework (final).ipynb`` by its cells; stock nbgrader grades only
    a notebook named as the source's (``toy.ipynb``): the README says so, in these words."""
    assert term["stock"].returncode != 0
    assert "No notebooks found" in term["stock"].stdout + term["stock"].stderr
    readme = " ".join((REPO / "autograder" / "README.md").read_text().split())
    assert "only a notebook named as the source's" in readme and "No notebooks found" in readme
    # its --force emptied cyd's autograded folder: feedback says whose page it could not render
    assert ("no autograded notebook, page left as it was: cyd (grade toy --force --students ... "
            "renders it again)") in term["feedback after stock"]
