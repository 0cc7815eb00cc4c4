"""``python -m autograder report``: what the class got wrong, checked against the gradebook.

Fast tests: message normalisation, Fisher's exact test against an exact count of tables,
the parts and concepts read from the source notebooks, pseudonyms, one-line errors, and the
streamed term matrix of a synthetic gradebook (``benchmarks/bench_report.py``'s bulk
inserts) against nbgrader's own ORM, on SQLite and on PostgreSQL.

Slow tests: a real class of 01-rope and 03-causal-mask (honest, partial, two typical
mistakes, late, and a student whose id and failure message are markup) graded once with the
real sandbox; every figure's numbers are recomputed from the gradebook through nbgrader's ORM;
``--anonymize`` leaves no real id or name in any file name or content. Browser tests (real
Chromium): axe-core finds no WCAG 2 A/AA violation in light or dark mode, nothing scrolls
sideways at 390 px and figure text stays readable there, no request leaves the page, and the
hostile text stays text (no element, no marker); on every page at 1280 and 390 px, light and
dark, every table cell is on the screen and inside any box that clips it, no cell's text
overflows, a table shown as cards labels each value, and no legend covers a bar or a marker
(measured geometrically: :data:`LAYOUT_JS`).
"""

import copy
import csv
import json
import math
import random
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.core.course_files import REPORT_SECRET
from autograder.host.parts import assignment_parts
from autograder.host import report_data as data
from autograder.host.report_page import FIG_WIDTH_IN, MIN_TEXT_PT, PHONE_COLUMN_PX

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_report  # noqa: E402

from test_term import cli, solved  # noqa: E402


# -- fast: the pieces ---------------------------------------------------------------------------
def test_messages_with_other_numbers_and_ids_are_one_message():
    a = data.normalize_message("max error 3.1e-02 at (0, 2, 5)")
    assert a == data.normalize_message("max error 4E+1 at (1, 0, 7)") == "max error # at (#, #, #)"
    assert data.normalize_message("<obj at 0x7f3a>  in '/tmp/x/y.py'") == "<obj at 0x#> in '/…'"
    assert data.normalize_message("layer2 of shape (3,4) at 5") == "layer2 of shape (3,4) at #"  # names keep digits
    # what shows a layout is kept: an array literal, a shape
    assert data.normalize_message("AssertionError: [[0. 0. 1. 1.]] x2") == "AssertionError: [[0. 0. 1. 1.]] x2"
    assert data.normalize_message("[1, 2] \ue000 7") == "[1, 2] #"  # the placeholder cannot be forged
    assert data.normalize_message("x" * 1000).endswith("…") and len(data.normalize_message("x" * 1000)) == 400


def autograded(root, student, aid, errors):
    """An autograded notebook of ``student`` whose test cells ``errors`` ({grade id: message})
    failed; ``errors=None`` writes a file that is not a notebook."""
    path = root / "autograded" / student / aid / f"{aid}.ipynb"
    path.parent.mkdir(parents=True)
    if errors is None:
        path.write_text("{not json")
        return
    nb = nbformat.v4.new_notebook()
    for cell, message in errors.items():
        code = nbformat.v4.new_code_cell("check(f)", metadata={"nbgrader": {
            "grade": True, "solution": False, "grade_id": cell, "points": 1, "locked": True}})
        code.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue=message, traceback=[])]
        nb.cells.append(code)
    nbformat.write(nb, path)


def test_what_went_wrong_counts_mistakes_not_messages(tmp_path):
    """A diagnosed mistake is one row whatever cells and values it failed, each student once;
    an unreadable notebook one row; other messages by cell and normalised text."""
    from autograder.checks._common import Mistake, diagnosis

    scale = Mistake("gqa-no-scale", "the scores are not divided by sqrt(D).", "Scale them.")
    named = lambda case: f"attention ({case}): 3 of 9 values are wrong. {diagnosis(scale)}"  # noqa: E731
    classes = {"ann": {"p1": named("case 1"), "p2": named("case 7")},   # one mistake, two cells
               "ben": {"p1": named("case 2")},
               "cat": {"p1": "f: [[0. 0. 1. 1.]] wrong", "p2": "f: 3 of 10 values are wrong"},
               "dan": {"p1": "f: [[1. 1. 0. 0.]] wrong", "p2": "f: 4 of 10 values are wrong"},
               "eve": None}                                           # unreadable
    groups = {}
    for student, errors in classes.items():
        autograded(tmp_path, student, "a", errors)
        failed = {("a", c) for c in (errors or {"p1": 0, "p2": 0, "p3": 0})}
        sub = data.Submission(student, None, None, 0.0, 0.0, 0.0, False, frozenset(failed))
        data.collect_messages(tmp_path, sub, "a", groups)
    rows = sorted((g.mistake, g.cell, g.message, g.count, tuple(g.examples)) for g in groups.values())
    assert rows == sorted([
        ("gqa-no-scale", "p1, p2", "This looks like a known mistake: the scores are not divided by "
         "sqrt(D). Scale them. [mistake: gqa-no-scale]", 2, ("ann", "ben")),
        ("", data.WHOLE_NOTEBOOK, data.NO_MESSAGES, 1, ("eve",)),
        ("", "p1", "AssertionError: f: [[0. 0. 1. 1.]] wrong", 1, ("cat",)),   # the layout is kept
        ("", "p1", "AssertionError: f: [[1. 1. 0. 0.]] wrong", 1, ("dan",)),
        ("", "p2", "AssertionError: f: # of # values are wrong", 2, ("cat", "dan"))])


def test_similarity_pairs_come_from_grades_csv_once_each():
    runs = {"ada": {"similar": "apply_rope ~ bo b (1) (93%);rope_inv_freq ~ cy (80%)"},
            "bo b (1)": {"similar": "apply_rope ~ ada (93%)"},
            "cy": {"similar": "rope_inv_freq ~ ada (80%)"}, "dee": {"similar": ""}}
    assert data.similar_pairs(runs) == [("ada", "bo b (1)", "apply_rope", 93),
                                        ("ada", "cy", "rope_inv_freq", 80)]


def test_page_text_is_escaped_and_cannot_reorder_what_is_shown():
    from autograder.host.report_page import esc, href

    assert esc('<b a="1">&') == "&lt;b a=&quot;1&quot;&gt;&amp;"
    assert esc("ab\u202ecd\x1b[2J") == "ab\\u202ecd\\x1b[2J"  # shown as escapes, not obeyed
    assert href("..", "feedback", 'x"><a', "p q.html") == "../feedback/x%22%3E%3Ca/p%20q.html"


def exact_fisher(a, b, c, d):
    """P(X >= a) for the hypergeometric margins of the table, by exact integer counting."""
    row, col, n = a + b, a + c, a + b + c + d
    total = math.comb(n, col)
    return sum(math.comb(row, k) * math.comb(n - row, col - k)
               for k in range(a, min(row, col) + 1)) / total


@pytest.mark.parametrize("table", [(3, 1, 1, 3), (0, 5, 5, 0), (10, 0, 0, 10), (1, 2, 3, 40),
                                   (50, 100, 120, 9730)])
def test_fisher_matches_an_exact_count(table):
    assert data.fisher_greater(*table) == pytest.approx(exact_fisher(*table), rel=1e-9, abs=1e-300)


def test_parts_that_fail_together_are_found_and_independent_ones_are_not():
    rng = random.Random(1)
    sets = []
    for _ in range(400):
        together = rng.random() < 0.3
        failed = {"Part 1", "Part 2"} if together else set()
        if rng.random() < 0.3:
            failed.add("Part 3")  # independent of the others
        sets.append(frozenset(failed))
    pairs = {(p.first, p.second): p for p in data.co_failures(sets, ["Part 1", "Part 2", "Part 3"])}
    both = pairs[("Part 1", "Part 2")]
    assert both.significant and both.phi == pytest.approx(1.0)
    n1 = sum("Part 1" in s for s in sets)
    assert both.lift == pytest.approx(len(sets) / n1)  # P(both) / (P(1) P(2)) with 1 == 2
    assert not pairs[("Part 1", "Part 3")].significant and not pairs[("Part 2", "Part 3")].significant
    assert sum(p.both + p.first_only + p.second_only + p.neither == 400 for p in pairs.values()) == 3


def test_parts_and_concepts_come_from_the_source_notebook():
    from autograder.core.cells import grade_id, is_test_cell

    parts = assignment_parts(REPO, "01-rope")
    assert [p.name for p in parts] == [f"Part {i}" for i in range(1, 7)]
    assert parts[1].concept == "`apply_rope`" and parts[4].written == (("01-rope", "p5_written"),)
    nb = nbformat.read(REPO / "solutions" / "01-rope" / "01-rope.ipynb", as_version=4)
    tests = [("01-rope", grade_id(c)) for c in nb.cells if is_test_cell(c)]
    assert [t for p in parts for t in p.tests] == tests  # each test cell once, in order


def test_pseudonyms_are_stable_keyed_and_private(tmp_path):
    one, two = data.Pseudonyms(tmp_path, True), data.Pseudonyms(tmp_path, True)
    assert one("ada") == two("ada") != one("bob") and one("ada").startswith("s-")
    assert oct((tmp_path / REPORT_SECRET).stat().st_mode & 0o777) == "0o600"
    assert one.scrub("ada copied from bob") == f"{one('ada')} copied from {one('bob')}"
    (tmp_path / REPORT_SECRET).unlink()
    assert data.Pseudonyms(tmp_path, True)("ada") != one("ada")  # a new secret: unlinkable
    assert data.Pseudonyms(tmp_path, False)("ada") == "ada"


@pytest.mark.slow  # three fresh processes, each loading nbgrader
def test_bad_input_is_one_line(tmp_path):
    (tmp_path / "solutions").symlink_to(REPO / "solutions")
    proc = cli(tmp_path, "report", check=False, cwd=REPO)
    assert proc.returncode != 0 and "no gradebook" in proc.stderr and "Traceback" not in proc.stderr
    bench_report.make_gradebook(f"sqlite:///{tmp_path}/gradebook.db", 5, assignments=("01-rope",))
    proc = cli(tmp_path, "report", "99-nope", check=False, cwd=REPO)
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1 and "99-nope" in proc.stderr
    (tmp_path / "blocker").write_text("a file")
    proc = cli(tmp_path, "report", "--to", "blocker/sub", check=False, cwd=REPO)
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1 and "--to" in proc.stderr


def orm_term(db_url):
    """Percent per (student, assignment) and test passes per cell, through nbgrader's ORM."""
    from autograder.core.gradebook import open_gradebook

    percents, passes = {}, {}
    with open_gradebook(db_url) as gb:
        for assignment in gb.assignments:
            for sub in gb.assignment_submissions(assignment.name):
                penalty = sum(nb.late_submission_penalty or 0 for nb in sub.notebooks)
                percents[(sub.student_id, assignment.name)] = \
                    100 * max(0.0, sub.score - penalty) / assignment.max_score
                for nb in sub.notebooks:
                    for g in nb.grades:
                        if g.cell.cell_type == "code":
                            key = (assignment.name, g.name)
                            passes[key] = passes.get(key, 0) + (g.auto_score >= g.max_score)
    return percents, passes


def check_synthetic(db_url, root):
    bench_report.make_gradebook(db_url, 60, seed=3, assignments=("01-rope", "03-causal-mask"))
    term = data.term_stats(db_url)
    percents, passes = orm_term(db_url)
    got = {(s, a): row[j].percent for s, row in term.matrix.items()
           for j, a in enumerate(term.assignments) if row[j].percent is not None}
    assert got.keys() == percents.keys() and len(term.matrix) == 60
    assert all(got[k] == pytest.approx(v) for k, v in percents.items())
    stats = data.assignment_stats(root, db_url, "03-causal-mask")
    for (nb, cell), n in stats.test_passes.items():
        assert n == passes[("03-causal-mask", cell)], cell
    assert stats.n_submissions == sum(a == "03-causal-mask" for _, a in percents)


def test_the_streamed_term_matches_nbgraders_orm_sqlite(tmp_path):
    (tmp_path / "solutions").symlink_to(REPO / "solutions")
    check_synthetic(f"sqlite:///{tmp_path}/gradebook.db", tmp_path)


@pytest.mark.slow
def test_the_streamed_term_matches_nbgraders_orm_postgres(tmp_path, postgres):
    (tmp_path / "solutions").symlink_to(REPO / "solutions")
    check_synthetic(postgres("report_term"), tmp_path)


# -- slow: a real graded class --------------------------------------------------------------------
AIDS = ("01-rope", "03-causal-mask")
DUE = "2026-11-20T23:59:00+00:00"
ON_TIME, LATE = "2026-11-20 10:00:00.000000 UTC", "2026-11-21 02:29:00.000000 UTC"
HOSTILE_ID = '=1+1"><img src=x onerror="document.body.dataset.pwned=1">'  # a formula, and markup
HOSTILE_MESSAGE = "<script>document.body.dataset.pwned=2</script><b id=injected>bold</b>"
HOSTILE_SHOWN = data.normalize_message(HOSTILE_MESSAGE)  # "...pwned=#...": its number normalised
MISTAKES = {"01-rope": [("out[..., 0::2] = a * cos - b * sin", "out[..., 0::2] = a * cos + b * sin")],
            "03-causal-mask": [("return j <= i + (S - T)", "return j <= i")]}
MISTAKE_CELL = {"01-rope": "p2_hidden_random", "03-causal-mask": "p1_hidden"}
HOSTILE_FUNCTION = {"01-rope": "apply_rope", "03-causal-mask": "causal_mask"}
ROSTER = ["honest-ada", "partial-bob", "mistake-cy", "mistake-di", "late-eve", HOSTILE_ID, "absent-fay"]
NAMES = {s: f"Name{i} Surname{i}" for i, s in enumerate(ROSTER)}


def mutated(release, source, edits):
    nb = solved(release, source)
    for cell in nb.cells:
        for old, new in edits:
            cell.source = cell.source.replace(old, new)
    return nb


def hostile(release, source, function):
    """Correct, except that ``function`` raises an AssertionError whose message is markup."""
    nb = solved(release, source)
    for cell in nb.cells:
        if f"def {function}(" in cell.source and cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source += (f"\n\ndef {function}(*args, **kwargs):\n"
                            f"    raise AssertionError({HOSTILE_MESSAGE!r})\n")
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    from autograder.sandbox.launcher import unavailable_reason

    if (why := unavailable_reason()) is not None:
        pytest.skip(str(why))
    root = tmp_path_factory.mktemp("report")
    shutil.copytree(REPO / "autograder", root / "autograder", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    (root / "course.toml").write_text('[late]\npolicy = "10%/day,cap=50%"\n' + "".join(
        f'[assignments."{a}"]\ndue = "{DUE}"\n' for a in AIDS))
    with open(root / "roster.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", "name", "email", "lms_id"])
        writer.writerows([s, NAMES[s], "", ""] for s in ROSTER)
    for aid in AIDS:
        shutil.copytree(REPO / "solutions" / aid, root / "solutions" / aid)
        release = nbformat.read(REPO / "release" / aid / f"{aid}.ipynb", as_version=4)
        source = nbformat.read(REPO / "solutions" / aid / f"{aid}.ipynb", as_version=4)
        first_two = {g for g in ("p1_solution", "p2_solution")}
        for student, nb, stamp in [
                ("honest-ada", solved(release, source), ON_TIME),
                ("partial-bob", solved(release, source, parts=first_two), ON_TIME),
                ("mistake-cy", mutated(release, source, MISTAKES[aid]), ON_TIME),
                ("mistake-di", mutated(release, source, MISTAKES[aid]), ON_TIME),
                ("late-eve", solved(release, source), LATE),
                (HOSTILE_ID, hostile(release, source, HOSTILE_FUNCTION[aid]), ON_TIME)]:
            folder = root / "submitted" / student / aid
            folder.mkdir(parents=True)
            (folder / "timestamp.txt").write_text(stamp)
            nbformat.write(copy.deepcopy(nb), folder / f"{aid}.ipynb")
    outputs = {aid: cli(root, "grade", aid, "--jobs", "2", "--no-progress").stdout for aid in AIDS}
    manual_grade(root)
    cli(root, "feedback", "01-rope")  # the late penalty again, with the manual score
    report = cli(root, "report").stdout
    cli(root, "report", "--anonymize", "--to", "anon")
    return dict(root=root, db=f"sqlite:///{root}/gradebook.db", grade=outputs, report=report)


def manual_grade(root):
    """The instructor grades ada's written answer of 01-rope by hand: 2 of 2."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        grade = gb.find_grade("p5_written", "01-rope", "01-rope", "honest-ada")
        grade.manual_score = 2.0
        gb.db.commit()


def page_data(graded, name):
    return json.loads((graded["root"] / "reports" / f"{name}.json").read_text())


def orm_submissions(db_url, aid):
    """Per student: autograded total, final score, max, late, failed test cells: nbgrader's ORM."""
    from autograder.core.gradebook import open_gradebook

    out = {}
    with open_gradebook(db_url) as gb:
        top = gb.find_assignment(aid).max_score
        for sub in gb.assignment_submissions(aid):
            grades = [g for nb in sub.notebooks for g in nb.grades]
            penalty = sum(nb.late_submission_penalty or 0 for nb in sub.notebooks)
            out[sub.student_id] = dict(
                auto=sum(g.auto_score or 0 for g in grades), final=max(0.0, sub.score - penalty),
                top=top, late=sub.total_seconds_late > 0, penalty=penalty,
                failed={g.name for g in grades if g.cell.cell_type == "code" and g.auto_score < g.max_score})
    return out


def autograded_cells(db_url, aid):
    """The assignment's autograded cells in the gradebook (nbgrader's ORM), in notebook order."""
    from autograder.core.gradebook import open_gradebook

    with open_gradebook(db_url) as gb:
        notebook = gb.find_notebook(aid, aid)
        order = [c.name for c in notebook.source_cells]
        return sorted((c.name for c in notebook.grade_cells if c.cell_type == "code"), key=order.index)


def bins(values, top):
    counts = [0] * 10
    for v in values:
        counts[min(9, int(10 * v / top))] += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("aid", AIDS)
def test_scores_and_pass_rates_match_the_gradebook(graded, aid):
    subs = orm_submissions(graded["db"], aid)
    page = page_data(graded, aid)
    top = next(iter(subs.values()))["top"]
    assert [r["autograded"] for r in page["scores"]] == bins([s["auto"] for s in subs.values()], top)
    assert [r["final"] for r in page["scores"]] == bins([s["final"] for s in subs.values()], top)
    for row in page["tests"]:
        failed = sum(row["test cell"] in s["failed"] for s in subs.values())
        assert (row["passed"], row["of"]) == (len(subs) - failed, len(subs)), row
    assert [r["test cell"] for r in page["tests"]] == autograded_cells(graded["db"], aid)
    assert [r["student"] for r in page["late"]] == [s for s, v in subs.items() if v["late"]] == ["late-eve"]
    assert page["late"][0]["penalty"] == pytest.approx(subs["late-eve"]["penalty"]) and subs["late-eve"]["penalty"] > 0
    assert [r["student"] for r in page["roster"]] == ["absent-fay"]


@pytest.mark.slow
def test_manual_grades_move_the_final_distribution(graded):
    subs = orm_submissions(graded["db"], "01-rope")
    assert subs["honest-ada"]["final"] == subs["honest-ada"]["auto"] + 2.0 == subs["honest-ada"]["top"]
    rows = page_data(graded, "01-rope")["scores"]
    assert rows[-1]["final"] >= 1 and rows[-1]["autograded"] == 0  # nobody autogrades to 100 %


@pytest.mark.slow
@pytest.mark.parametrize("aid", AIDS)
def test_the_same_mistake_is_one_message_with_examples(graded, aid):
    page = page_data(graded, aid)
    # one row for the mistake, whatever cells it failed (a diagnosed row lists them all)
    mine = [r for r in page["messages"] if MISTAKE_CELL[aid] in r["test cell"].split(", ")
            and set(r["examples"].split()) >= {"mistake-cy", "mistake-di"}]
    assert len(mine) == 1 and mine[0]["students"] == 2, page["messages"]
    subs = orm_submissions(graded["db"], aid)
    per_cell = {}
    for r in page["messages"]:
        for cell in r["test cell"].split(", "):
            per_cell[cell] = per_cell.get(cell, 0) + r["students"]
    for cell, n in per_cell.items():  # every failure of a cell counted once, in one message
        assert n == sum(cell in s["failed"] for s in subs.values()), cell
    html = (graded["root"] / "reports" / f"{aid}.html").read_text()
    assert 'href="../feedback/mistake-cy/' in html or 'href="../feedback/mistake-di/' in html


@pytest.mark.slow
def test_the_term_matches_the_gradebook(graded):
    page = page_data(graded, "index")
    percents = {}
    for aid in AIDS:
        for student, s in orm_submissions(graded["db"], aid).items():
            percents[(student, aid)] = 100 * s["final"] / s["top"]
    for row in page["matrix"]:
        for aid in AIDS:
            cell = row[aid]
            if (row["student"], aid) in percents:
                assert float(cell.split()[0]) == pytest.approx(percents[(row["student"], aid)], abs=0.5)
                assert cell.endswith("late") == (row["student"] == "late-eve")
            else:
                assert cell == "missing" and row["student"] == "absent-fay"
    assert {r["student"]: r["name"] for r in page["matrix"]} == NAMES  # names as the gradebook has them
    completion = {r["assignment"]: r["handed in"] for r in page["assignments"]}
    assert completion == {aid: 6 for aid in AIDS}


@pytest.mark.slow
def test_hostile_text_is_escaped_and_csv_cells_are_inert(graded):
    html = (graded["root"] / "reports" / "01-rope.html").read_text()
    assert "<script>document" not in html and "<img src=x" not in html and "<b id=injected>" not in html
    assert "&lt;script&gt;document.body.dataset.pwned=#&lt;/script&gt;&lt;b id=injected&gt;" in html
    assert "=1+1&quot;&gt;&lt;img src=x onerror=" in html
    with open(graded["root"] / "reports" / "index.matrix.csv", newline="") as f:
        students = [row["student"] for row in csv.DictReader(f)]
    assert "'" + HOSTILE_ID in students and HOSTILE_ID not in students  # text, never a formula
    flagged = {r["student"] for r in page_data(graded, "01-rope")["flags"]}
    assert flagged and flagged <= set(ROSTER)  # grades.csv's inert cells read back as the ids
    assert "Content-Security-Policy" in html and "script-src" not in html and "default-src 'none'" in html


@pytest.mark.slow
def test_anonymized_output_holds_no_real_id_or_name(graded):
    folder = graded["root"] / "anon"
    files = sorted(folder.iterdir())
    assert {p.suffix for p in files} == {".html", ".csv", ".json"} and len(files) > 10
    secrets_ = [s for s in ROSTER] + [n for name in NAMES.values() for n in name.split()]
    secrets_ += ["feedback/"]  # links to feedback pages carry ids in their paths
    for path in files:
        text = path.read_text()
        for secret in secrets_:
            assert secret not in path.name and secret not in text, (path.name, secret)
        assert "img src=x onerror" not in text, path.name  # the hostile id, however encoded
    pseudonym = data.Pseudonyms(graded["root"], True)
    matrix = json.loads((folder / "index.json").read_text())["matrix"]
    assert {r["student"] for r in matrix} == {pseudonym(s) for s in ROSTER}


# -- browser: accessibility, phones, the network, hostile text ---------------------------------------
CHROMIUM = Path("/usr/bin/chromium")
AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
PAGES = ["01-rope", "03-causal-mask", "index"]


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.is_file():
        pytest.skip("Chromium not found at /usr/bin/chromium: run `apt-get install chromium`")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                             args=["--headless", "--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


def open_report(browser, path, width, scheme="light", bypass_csp=False):
    """The page at ``width`` px, every request but the page itself recorded and refused.

    ``bypass_csp``: for axe-core, which the test injects as a script the page's policy refuses.
    """
    context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme,
                                  bypass_csp=bypass_csp)
    page = context.new_page()
    requests, errors = [], []
    url = path.as_uri()

    def guard(route):
        if route.request.url == url:
            return route.continue_()
        requests.append(route.request.url)
        return route.abort()
    page.route("**/*", guard)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="load")
    return context, page, requests, errors


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("name", PAGES)
def test_axe_finds_no_violation_light_or_dark(graded, browser, name):
    if not AXE.is_file():
        pytest.skip("axe-core is not installed: run `npm ci --ignore-scripts`")
    for scheme in ("light", "dark"):
        context, page, _, _ = open_report(browser, graded["root"] / "reports" / f"{name}.html", 1280,
                                          scheme, bypass_csp=True)
        page.add_script_tag(content=AXE.read_text())
        found = page.evaluate("""async (tags) => (await axe.run(document, {runOnly: {type: 'tag',
            values: tags}, resultTypes: ['violations']})).violations.map(v => ({id: v.id,
            nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))""", AXE_TAGS)
        context.close()
        assert found == [], f"{name} ({scheme}): {found}"


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("folder", ["reports", "anon"])
@pytest.mark.parametrize("name", PAGES)
def test_fits_a_phone_loads_nothing_and_keeps_hostile_text_inert(graded, browser, folder, name):
    context, page, requests, errors = open_report(browser, graded["root"] / folder / f"{name}.html", 390)
    width = page.evaluate("document.documentElement.scrollWidth")
    smallest = page.evaluate("""() => Math.min(...[...document.querySelectorAll('svg text')].map(t => {
        const svg = t.ownerSVGElement, box = svg.viewBox.baseVal;
        return parseFloat(getComputedStyle(t).fontSize) * svg.getBoundingClientRect().width / box.width;
    }))""")
    inert = page.evaluate("""() => ({pwned: document.body.dataset.pwned || null,
        scripts: document.querySelectorAll('script').length,
        imgs: document.querySelectorAll('body img').length,
        injected: !!document.getElementById('injected')})""")
    text = page.evaluate("document.body.innerText")
    context.close()
    assert width <= 390, f"{name} is {width} px wide on a 390 px phone"
    assert smallest >= 12 * 0.95, f"figure text {smallest:.1f} px on a phone"
    assert requests == [] and errors == []
    assert inert == {"pwned": None, "scripts": 0, "imgs": 0, "injected": False}
    if folder == "reports" and name == "01-rope":
        assert HOSTILE_SHOWN in text  # shown as text, whole


# What a reader cannot see on a report page, measured in the browser: the page or an element
# wider than the viewport; a table cell outside the viewport or outside the visible box of a
# box that clips it (a scroller); a cell whose text overflows it; a figure legend over a bar
# or a marker of its own figure, or cut by the figure's edge. A list of problems, each naming
# its section.
LAYOUT_JS = r"""() => {
  const W = document.documentElement.clientWidth, problems = [];
  const where = el => { const s = el.closest('section'); return s ? s.getAttribute('aria-labelledby') : 'page'; };
  const box = r => `${Math.round(r.left)}..${Math.round(r.right)} x ${Math.round(r.top)}..${Math.round(r.bottom)}`;
  if (document.documentElement.scrollWidth > W)
    problems.push(`page: ${document.documentElement.scrollWidth} px wide in a ${W} px viewport`);
  const outside = new Set();
  for (const el of document.querySelectorAll('main *')) {   // the outermost such element only
    const r = el.getBoundingClientRect();
    if (r.width > 0 && (r.left < -1 || r.right > W + 1)) {
      outside.add(el);
      if (!outside.has(el.parentElement))
        problems.push(`${where(el)}: <${el.tagName.toLowerCase()}> at ${box(r)}, the viewport 0..${W}`);
    }
  }
  for (const table of document.querySelectorAll('table')) {
    const clips = [];
    for (let a = table.parentElement; a; a = a.parentElement) {
      const style = getComputedStyle(a);
      if (style.overflowX !== 'visible' || style.overflowY !== 'visible') clips.push(a);
    }
    // a table shown as cards hides its head row (for screen readers only): then each value
    // must carry its column's name, shown before it
    const head = [...table.querySelectorAll('thead th')].map(th => th.textContent.trim());
    const cards = table.tHead && table.tHead.getBoundingClientRect().width <= 1;
    for (const td of cards ? table.querySelectorAll('tbody td') : []) {
      const label = head[td.cellIndex], before = getComputedStyle(td, '::before').content;
      if (td.dataset.label !== label || before !== JSON.stringify(label + ': '))
        problems.push(`${where(td)}: a card's value "${td.textContent.slice(0, 30)}" is not labelled ${label}`);
    }
    for (const cell of table.querySelectorAll(cards ? 'tbody th, tbody td' : 'th, td')) {
      const r = cell.getBoundingClientRect(), text = cell.textContent.trim().slice(0, 30);
      if (r.width === 0 && r.height === 0) { problems.push(`${where(cell)}: "${text}" not shown`); continue; }
      for (const a of clips) {
        const c = a.getBoundingClientRect();
        if (r.left < c.left - 1 || r.right > c.right + 1)
          problems.push(`${where(cell)}: "${text}" at ${box(r)} outside the box ${box(c)} that clips it`);
      }
      if (r.right > W + 1) problems.push(`${where(cell)}: "${text}" at ${box(r)}, the viewport 0..${W}`);
      if (cell.scrollWidth > cell.clientWidth + 1)
        problems.push(`${where(cell)}: "${text}" clipped (${cell.scrollWidth} px in ${cell.clientWidth})`);
    }
  }
  for (const svg of document.querySelectorAll('svg')) {
    const inLegend = el => el.closest('g[id^="legend"]');
    const marks = [...svg.querySelectorAll('g[id^="patch"] > path, g[id^="line2d"] use, g[id^="PathCollection"] use')]
      .filter(el => !inLegend(el) && !el.closest('g[id^="xtick"], g[id^="ytick"]')
                    && (el.tagName !== 'path' || getComputedStyle(el).fill !== 'none'))
      .map(el => el.getBoundingClientRect()).filter(r => r.width * r.height > 0.5);
    const frame = svg.getBoundingClientRect();
    for (const legend of svg.querySelectorAll('g[id^="legend"]')) {
      const l = legend.getBoundingClientRect();
      if (l.left < frame.left - 1 || l.right > frame.right + 1 || l.top < frame.top - 1 || l.bottom > frame.bottom + 1)
        problems.push(`${where(svg)}: the legend at ${box(l)} is cut by its figure ${box(frame)}`);
      for (const m of marks)
        if (l.left < m.right - 0.5 && m.left < l.right - 0.5 && l.top < m.bottom - 0.5 && m.top < l.bottom - 0.5) {
          problems.push(`${where(svg)}: the legend at ${box(l)} covers data at ${box(m)}`);
          break;
        }
    }
  }
  return problems;
}"""


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("name", PAGES)
def test_every_table_shows_its_columns_and_no_legend_covers_data(graded, browser, name):
    """At 1280 px and on a 390 px phone, light and dark: every cell of every table is on the
    screen and inside any box that clips it (no hidden scroller), no text overflows its cell,
    a table shown as cards labels each value, no element is wider than the viewport, and no
    legend covers a bar or a marker (:data:`LAYOUT_JS`)."""
    found = {}
    for width in (1280, 390):
        context, page, requests, errors = open_report(browser, graded["root"] / "reports" / f"{name}.html", width)
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            found[f"{width} px {scheme}"] = page.evaluate(LAYOUT_JS)
        cards = page.evaluate("document.querySelectorAll('table.cards').length")
        context.close()
        assert requests == [] and errors == []
    assert all(problems == [] for problems in found.values()), found
    assert cards >= 1   # some table of each page is too wide for a phone: its rows are cards


@pytest.mark.browser
def test_legends_cover_no_data_whatever_the_labels(browser, tmp_path):
    """The figures with a legend, drawn with the longest labels and the most series they take
    (8 falling students with 18-character ids, 12 assignments, full bars), on a page of
    their own: at 1280 and 390 px no legend covers data or is cut (:data:`LAYOUT_JS`)."""
    from autograder.host import report_page as ui

    names = [f"student-{i}-{'x' * 12}"[:ui.LABEL_CHARS + 4] for i in range(8)]
    assignments = [f"{i:02}-assignment" for i in range(1, 13)]
    full = [100.0] * len(assignments)
    figures = {
        "falling": ui.trajectories([(n, [100 - 9 * k - i for k in range(12)]) for i, n in enumerate(names)],
                                   assignments, ui.figure_id("falling")),
        "means": ui.assignment_means(assignments, full, full, full, ui.figure_id("means")),
        "scores": ui.histograms([("autograded", ui.ACCENT, [9] * 10), ("final", ui.SECOND, [9] * 10)],
                                [10.0 * k for k in range(11)], "% of the maximum", ui.figure_id("scores"))}
    sections = [ui.Section(name, name, "", svg, [ui.Table("numbers", ["a", "b"], [["1", "2"]])])
                for name, svg in figures.items()]
    path = tmp_path / "legends.html"
    path.write_text(ui.page("legends", "", sections, ""))
    for width in (1280, 390):
        context, page, _, errors = open_report(browser, path, width)
        problems = page.evaluate(LAYOUT_JS)
        legends = page.evaluate("document.querySelectorAll('svg g[id^=\"legend\"]').length")
        context.close()
        assert problems == [] and errors == [] and legends == 3, (width, problems)


def test_a_table_too_wide_for_a_phone_becomes_cards_with_its_column_names():
    from autograder.host.report_page import Table, esc, stacks_on_a_phone, table_html

    narrow = Table("c", ["student", "seconds"], [["ada", 1.5]])
    wide = Table("c", ["part", esc('p "one-sided" <b>')] + [f"column {i}" for i in range(6)],
                 [["Part 1", 0.5] + [1] * 6])
    assert not stacks_on_a_phone(narrow) and stacks_on_a_phone(wide)
    assert stacks_on_a_phone(Table("c", ["student", "message"], [["ada", "x " * 60]]))
    assert "<table>" in table_html(narrow, "a") and '<table class="cards">' in table_html(wide, "a")
    assert '<td data-label="p &quot;one-sided&quot; &lt;b&gt;">0.5</td>' in table_html(wide, "a")


def phone_text_px(width_in=FIG_WIDTH_IN, text_pt=MIN_TEXT_PT, column_px=PHONE_COLUMN_PX):
    """CSS pixels of ``text_pt`` text in a figure ``width_in`` wide shown in ``column_px``."""
    natural_px = width_in * 96
    return text_pt * 96 / 72 * min(1.0, column_px / natural_px)


def test_figures_are_sized_for_a_phone():
    """The report's smallest figure text is at least 12 CSS px on a 390 px phone."""
    assert phone_text_px() >= 12
    assert phone_text_px(text_pt=8) < 12  # the bound can fail: 8 pt text would be too small


@pytest.mark.slow
def test_the_summary_of_grade_names_the_report(graded):
    for aid, out in graded["grade"].items():
        assert f"python -m autograder report {aid} (writes {graded['root']}/reports/{aid}.html)" in out
    assert f"wrote {graded['root']}/reports/index.html" in graded["report"]
