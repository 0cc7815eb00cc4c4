"""The self-check package and what it prints, in-process (fast; the parity with the real
grader is ``test_self_check.py``).

* the package the site offers is the committed ``release/selfcheck`` wheel, made from the
  grader's own files; it imports and runs where nbgrader and the course repository are not;
* ``course.toml``'s ``self_check``: ``full`` ships the checks and the hidden test cells,
  ``visible`` only what the student version shows, ``off`` nothing and no check cells;
  no mode puts a hidden test, an expected value or a solution into a student notebook;
* a check prints each test cell's verdict and points with the grader's message, and says when
  a part fails because it calls an earlier part's failing function, when the notebook uses
  ``transformer_ref`` (and what that costs), what a memory check measured here, and shows a
  written answer's model answer only where the course reveals it.
"""

import json
import re
import subprocess
import sys
import zipfile

import nbformat
import numpy as np
import pytest
from notebooks import FORBIDDEN_MARKERS, ROOT, read, solution_lines, solved_namespace, source_path

from autograder.checks import rope
from autograder.core.policy import SelfCheckSettings, load_self_check
from autograder.host.release import (SELFCHECK_DIR, SELFCHECK_WHEEL, generate, is_self_check_cell,
                                     selfcheck_bank, selfcheck_files, selfcheck_wheel, stale_selfcheck)
from autograder.selfcheck import SelfCheck

WHEEL = ROOT / "release" / SELFCHECK_DIR / SELFCHECK_WHEEL
OFF_BY_ONE = [("i = np.arange(head_dim // 2)", "i = np.arange(1, head_dim // 2 + 1)")]


def checker(aid="01-rope", edits=(), mode="full", answers="reveal", **kwargs):
    printed = []
    ns = solved_namespace(aid, edits)
    check = SelfCheck(aid, bank=selfcheck_bank(read(source_path(aid)), aid, mode, answers),
                      user_ns=ns, out=printed.append, watch=False, **kwargs)
    return check, ns, printed


def message_of(check, fn):
    with pytest.raises(AssertionError) as failed:
        check(fn)
    return str(failed.value)


# -- the package -----------------------------------------------------------------------------
def test_committed_package_is_not_stale():
    assert stale_selfcheck(ROOT) == [], "run python -m autograder generate --all"


def test_package_is_reproducible_and_made_of_the_graders_own_files():
    files = selfcheck_files(ROOT)
    assert selfcheck_wheel(files) == selfcheck_wheel(dict(reversed(list(files.items()))))
    for name in ("judge/verdict.py", "kernel/probe.py", "checks/rope.py", "selfcheck/__init__.py"):
        assert files[f"autograder/{name}"] == (ROOT / "autograder" / name).read_bytes(), name
    names = set(zipfile.ZipFile(WHEEL).namelist())
    assert not {n for n in names if n.startswith(("autograder/host", "autograder/worker",
                                                  "autograder/sandbox", "autograder/core"))}


def test_package_runs_without_nbgrader_or_the_course_repository(tmp_path):
    """What a learner has: the wheel, NumPy, nbformat, transformer_ref; no nbgrader, no repo."""
    honest = next(c for c in read(source_path("01-rope")).cells
                  if c.metadata.get("nbgrader", {}).get("grade_id") == "p1_solution")
    code = f"""
import sys
sys.modules["nbgrader"] = None  # not in a learner's environment
sys.path.insert(0, {str(WHEEL)!r})
import numpy as np
from attention_selfcheck import SelfCheck  # what the notebooks' self-check set-up cell imports
import autograder
assert autograder.__file__.startswith({str(WHEEL)!r}), autograder.__file__
src = {honest['source']!r}.replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", "")
ns = {{"np": np}}
exec(src, ns)
SelfCheck("01-rope", user_ns=ns, watch=False)("p1")
exec(src.replace("np.arange(head_dim // 2)", "np.arange(1, head_dim // 2 + 1)"), ns)
SelfCheck("01-rope", user_ns=ns, watch=False)("p1")
"""
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = done.stdout.split("Part 1:")[1:]
    assert "PASS p1_visible: 1/1" in first and "PASS p1_hidden: 1/1" in first
    assert "FAIL p1_hidden: 0/1 - CheckFailure: rope_inv_freq(head_dim=2" in second
    assert "[mistake: rope-freq-off-by-one]" in second  # the grader's diagnosis, named by the wheel too


# -- course.toml's self_check -----------------------------------------------------------------
def test_self_check_setting_is_read_from_course_toml(tmp_path):
    assert load_self_check(tmp_path) == SelfCheckSettings("full", "reveal")
    (tmp_path / "course.toml").write_text('self_check = "visible"\nself_check_answers = "hide"\n')
    assert load_self_check(tmp_path) == SelfCheckSettings("visible", "hide")
    (tmp_path / "course.toml").write_text('self_check = "hidden"\n')
    with pytest.raises(ValueError, match="self_check: write one of 'full', 'visible', 'off'"):
        load_self_check(tmp_path)


def course(tmp_path, setting):
    (tmp_path / "solutions").mkdir(parents=True)
    for aid in ("01-rope",):
        (tmp_path / "solutions" / aid).mkdir()
        (tmp_path / "solutions" / aid / f"{aid}.ipynb").write_bytes(source_path(aid).read_bytes())
    (tmp_path / "course.toml").write_text(setting)
    return tmp_path


def package_text(root):
    return json.dumps({k: v.decode() for k, v in selfcheck_files(root).items()})


@pytest.mark.parametrize("mode", ["full", "visible", "off"])
def test_no_mode_puts_hidden_tests_or_solutions_into_the_student_notebook(tmp_path, mode):
    root = course(tmp_path, f'self_check = "{mode}"\n')
    nb = nbformat.read(generate("01-rope", root) / "01-rope.ipynb", 4)
    text = json.dumps([c.source for c in nb.cells])
    for marker in FORBIDDEN_MARKERS:
        assert marker not in text
    assert not [line for line in solution_lines("01-rope") if line in text]
    checks = [c for c in nb.cells if is_self_check_cell(c)]
    assert len(checks) == (0 if mode == "off" else 7)
    package = package_text(root)
    if mode == "off":
        assert package == "{}"
    hidden = "_checks.check_rope_inv_freq(rope_inv_freq)" in package
    checks_shipped = "autograder/checks/rope.py" in package
    assert hidden == checks_shipped == (mode == "full")
    model = "which breaks the translation invariance RoPE was designed for" in package
    assert model == (mode == "full")


def test_hidden_answers_are_not_shipped_when_the_course_hides_them(tmp_path):
    root = course(tmp_path, 'self_check = "full"\nself_check_answers = "hide"\n')
    package = package_text(root)
    assert "_checks.check_rope_inv_freq" in package
    assert "which breaks the translation invariance RoPE was designed for" not in package


# -- what a check prints ----------------------------------------------------------------------
def test_a_check_prints_every_test_cell_with_the_graders_message():
    check, ns, printed = checker(edits=OFF_BY_ONE)
    check("p1")
    text = printed[-1]
    assert text.startswith("Part 1: `rope_inv_freq`: 0 of 2 points")
    expected = message_of(rope.check_rope_inv_freq, ns["rope_inv_freq"])
    assert f"FAIL p1_hidden: 0/1 - CheckFailure: {expected}" in text
    assert "FAIL p1_visible: 0/1 - AssertionError" in text
    check, _, printed = checker()
    check("p1")
    assert "PASS p1_visible: 1/1" in printed[-1] and "PASS p1_hidden: 1/1" in printed[-1]


def test_a_part_that_calls_a_failing_earlier_part_says_so():
    check, _, printed = checker(edits=OFF_BY_ONE)
    check("p3")
    assert ("note: your `ntk_inv_freq` calls your `rope_inv_freq`, which fails Part 1: "
            "fix Part 1 first") in printed[-1]
    assert ("note: this test calls your `rope_inv_freq`, which fails Part 1: fix Part 1 first"
            in printed[-1]), "p3's visible test calls Part 1's function itself"
    check, _, printed = checker(edits=[("base * scale ** (head_dim / (head_dim - 2))", "base * scale")])
    check("p3")  # its own mistake: Part 1 passes, no blame
    assert "FAIL p3_hidden" in printed[-1] and "note:" not in printed[-1]


def test_wrong_numeric_answers_fail_with_a_tolerance_and_a_hint():
    check, ns, printed = checker()
    ns["ANSWER_SLOWEST_WAVELENGTH"] = 600.0  # of no known kind (584.7 is the -i/D exponent's, a named mistake)
    ns["ANSWER_FULL_TURN_PAIRS"] = 63
    check("p4")
    text = printed[-1]
    assert "ANSWER_SLOWEST_WAVELENGTH is not correct (checked to within 0.001 of the answer" in text
    assert "its wavelength is 2 * pi / inv_freq[63]" in text
    assert "ANSWER_FULL_TURN_PAIRS is not correct (checked exactly). Hint" not in text
    assert "ANSWER_FULL_TURN_PAIRS is not correct (checked exactly). Count the pairs" in text
    assert str(int(np.sum(4096 * ns["rope_inv_freq"](128) >= 2 * np.pi))) not in text.split("FULL_TURN")[1]


def test_transformer_ref_is_flagged_with_its_cost():
    check, ns, printed = checker()
    assert check.reference_warning() is None
    import transformer_ref.numpy as ref

    ns["ref"] = ref
    ns["apply_rope"] = lambda x, positions, inv_freq: ref.apply_rope(x, positions, inv_freq)
    exec("def rope_inv_freq(head_dim, base=10000.0):\n    return ref.rope_inv_freq(head_dim, base)", ns)
    check._flag_reference()  # what IPython's post_run_cell hook calls after each cell
    warning = printed[-1]
    assert warning.startswith("WARNING: your notebook uses the reference library transformer_ref")
    assert "`rope_inv_freq` (uses transformer_ref)" in warning and "`ref` (is transformer_ref's)" in warning
    # the test cells that name ref, rope_inv_freq or the solution's functions that call it
    # (ntk_inv_freq, llama3_inv_freq): those score 0 when transformer_ref cannot be imported
    tainted = ("ref", "rope_inv_freq", "ntk_inv_freq", "llama3_inv_freq")
    at_stake = sum(t["points"] for p in check.bank["parts"] for t in p["tests"]
                   if any(re.search(rf"\b{n}\b", t["source"]) for n in tainted))
    assert at_stake == 8  # p1 (2), p2's visible test (1), p3 (2), p6 (3)
    assert f"{at_stake:g} of 13 autograded points" in warning
    check._flag_reference()
    assert len([p for p in printed if p.startswith("WARNING")]) == 1, "flagged once, not after every cell"
    check("p1")
    assert "WARNING: your notebook uses the reference library" in printed[-1]


def test_a_memory_check_is_left_to_the_graders_meter():
    """One meter: the self-check judges a memory test's result and leaves its memory (and its
    point) to the sandbox's meter, saying so; the value tests of the same part score as usual."""
    check, _, printed = checker("06-flash-attention")
    part = next(p["id"] for p in check.bank["parts"] if any("memory" in t["grade_id"] for t in p["tests"]))
    memory = next(t["grade_id"] for p in check.bank["parts"] if p["id"] == part for t in p["tests"]
                  if "memory" in t["grade_id"])
    check(part)
    assert f"SEEN {memory}: 0/" in printed[-1]
    assert "is measured only when graded, in the sandbox" in printed[-1]
    assert "PASS" in printed[-1] and "FAIL" not in printed[-1]


def test_written_answers_reveal_the_model_answer_only_where_the_course_does(tmp_path):
    notebook = tmp_path / "01-rope.ipynb"
    nb = nbformat.read(ROOT / "release" / "01-rope" / "01-rope.ipynb", 4)
    nbformat.write(nb, notebook)
    check, _, printed = checker(notebook=notebook)
    check("p5")
    assert "p5_written (written, 2 points, graded by hand): not written yet" in printed[-1]
    next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "p5_written"
         ).source = "Rotating values would mix absolute positions into the output."
    nbformat.write(nb, notebook)
    check("p5")
    assert "you wrote 9 words. The course's model answer" in printed[-1]
    assert "translation invariance RoPE was designed for" in printed[-1]
    check, _, printed = checker(notebook=notebook, answers="hide")
    check("p5")
    assert "the model answer is not shown before grading" in printed[-1]
    assert "translation invariance" not in printed[-1]


def test_visible_mode_runs_only_what_the_student_version_shows():
    check, _, printed = checker(edits=OFF_BY_ONE, mode="visible")
    check("p1")
    text = printed[-1]
    assert "its visible tests" in text and "FAIL p1_visible" in text
    assert "SEEN p1_hidden: 0/1" in text and "its hidden tests run only when your notebook is graded" in text


@pytest.mark.parametrize("aid", [a for a in ("01-rope", "02-gqa-kv-cache", "03-causal-mask",
                                             "04-transformer-block", "05-families", "06-flash-attention",
                                             "07-flash-triton")])
def test_exercise_page_offers_the_self_check_package(aid):
    page = ROOT / "exercises" / f"{aid}.md"
    assert f"<../release/{SELFCHECK_DIR}/{SELFCHECK_WHEEL}>`" in page.read_text()
    built = ROOT / "_build" / "html" / "exercises" / f"{aid}.html"
    if not built.is_file():
        pytest.skip("the book is not built (make book)")
    assert re.search(rf'class="reference download[^"]*"[^>]* href="[^"]*{re.escape(SELFCHECK_WHEEL)}"',
                     built.read_text()), "the built page links the package"


@pytest.mark.slow  # the command line starts nbgrader: about 8 s
def test_generate_refuses_a_bad_self_check_setting_in_one_line(tmp_path):
    root = course(tmp_path, 'self_check = "maybe"\n')
    done = subprocess.run([sys.executable, "-m", "autograder", "generate", "--all", "--root", str(root)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"{root / 'course.toml'}: self_check: write one of 'full', 'visible', 'off', not 'maybe'"]
    assert not (root / "release").exists()


@pytest.mark.parametrize("aid", ["01-rope", "06-flash-attention"])
def test_the_check_cells_are_not_flagged_as_student_code(aid):
    """The audit flags student code that mentions the grader; the course's own check cells,
    handed in unchanged, must not make every honest submission suspicious."""
    from notebooks import solved
    from autograder.worker.audit import audit

    release = nbformat.read(ROOT / "release" / aid / f"{aid}.ipynb", 4)
    assert [c for c in release.cells if is_self_check_cell(c)]
    assert audit(solved(release, read(source_path(aid))), release).flags == []
