"""Assignment 07-flash-triton: the checks against the solution and typical wrong kernels, and grading.

The assignment needs triton (``requirements-triton.lock``), so the shared assignment tests leave
it out (``needs`` in the registry) and this module tests it:

* the set-up and solution cells of the source notebook, run in-process (Triton's interpreter on
  CPU tensors), pass every check; the student version's stubs fail them with "not implemented";
* typical wrong kernels (no rescaling of the accumulator, the top-left causal mask, no ragged
  mask, no final division, a wrong lse, NaN for rows that see no key, ...) fail exactly the
  checks that should catch them, with a message that says what is wrong, and pass the others;
* end to end (``slow``): the source notebook, the student version, a partial and a wrong
  submission graded in the sandbox by ``autograder.host.driver.grade`` score exactly as expected.
"""

import importlib.util
import os
import shutil

import pytest

# find_spec, not importorskip: importing triton before TRITON_INTERPRET=1 is set would leave
# triton's own library compiled and the interpreter unusable (conftest sets it without a GPU)
if importlib.util.find_spec("triton") is None:
    pytest.skip("07-flash-triton needs triton: pip install -r requirements-triton.lock", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")  # what the notebook's set-up cell does

import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from notebooks import ROOT, meta, read, release_path, source_path  # noqa: E402

from autograder.checks import flash_triton  # noqa: E402

AID = "07-flash-triton"
# The checks send CPU tensors: the notebook's kernels must run under the interpreter, which is
# impossible in this process if triton was imported compiled before (on a GPU machine, by an
# earlier test module). The end-to-end test does not depend on it (its kernels are sandboxed).
in_process = pytest.mark.skipif(
    not isinstance(tl.zeros, InterpretedFunction),
    reason="triton was imported compiled before this module: run it alone, with TRITON_INTERPRET=1")

# slow: the checks run the student's Triton kernels, on a CPU under the interpreter: about 2 s each (make test runs them; make test-fast does not)
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]


def namespace(path=None, replace=()):
    """Run the set-up and solution cells of the notebook (default: the source), optionally edited."""
    nb = read(path or source_path(AID))
    code = "\n\n".join([nb.cells[1].source] + [c.source for c in nb.cells
                                                if meta(c).get("solution") and c.cell_type == "code"])
    for old, new in replace:
        assert old in code, f"mutation target not found: {old!r}"
        code = code.replace(old, new)
    ns = {"__name__": "__main__"}
    exec(compile(code, f"<{AID}>", "exec"), ns)  # noqa: S102 - the course's own notebook
    return ns


@pytest.fixture(scope="module")
def solution():
    return namespace()


CHECKS = [
    (flash_triton.check_row_logsumexp, "row_logsumexp"),
    (flash_triton.check_tiles, "flash_forward"),
    (flash_triton.check_ragged, "flash_forward"),
    (flash_triton.check_causal, "flash_forward"),
    (flash_triton.check_lse, "flash_forward"),
    (flash_triton.check_float16, "flash_forward"),
]


@in_process
@pytest.mark.parametrize("check, name", CHECKS, ids=[c.__name__ for c, _ in CHECKS])
def test_check_passes_the_solution(solution, check, name, capfd):
    check(solution[name])
    assert capfd.readouterr().err == "", "a passing check must print nothing on stderr"


@in_process
def test_visible_tests_pass_the_solution(solution, capfd):
    ns = dict(solution)
    for cell in read(source_path(AID)).cells:
        if meta(cell).get("grade_id", "").endswith("_visible"):
            exec(compile(cell.source, meta(cell)["grade_id"], "exec"), ns)  # noqa: S102
    assert capfd.readouterr().out.count("visible tests passed") == 2


@in_process
def test_stubs_are_not_implemented():
    """The student version: every check fails, and says the function is not implemented yet."""
    stubs = namespace(release_path(AID))
    for check, name in CHECKS:
        with pytest.raises(AssertionError, match="not implemented yet"):
            check(stubs[name])


@in_process
def test_a_kernel_left_as_a_stub_is_reported_as_not_implemented():
    """The launcher written, the kernel not: the interpreter wraps the kernel's NotImplementedError."""
    body = next(c.source for c in read(source_path(AID)).cells if meta(c).get("grade_id") == "p1_solution")
    kernel_body = body.split("### BEGIN SOLUTION\n", 1)[1].split("    ### END SOLUTION", 1)[0]
    ns = namespace(replace=[(kernel_body, "    raise NotImplementedError()\n")])
    with pytest.raises(AssertionError, match="row_logsumexp .* is not implemented yet"):
        flash_triton.check_row_logsumexp(ns["row_logsumexp"])


# (id, [(old, new) edits of the solution code], {check: words its message must contain});
# every other check must still pass, so each mistake costs exactly its own test cells.
ACC = "acc = alpha[:, None] * acc + tl.dot(p.to(v.dtype), v)"
CAUSAL = "visible = visible & (cols[None, :] <= rows[:, None] + S - T)"
RAGGED = "visible = (cols[None, :] < S) & (rows[:, None] >= 0)"
SAFE_FLASH = 'm_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen no key yet'
SAFE_LSE = 'm_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that are still all -inf'
MUTANTS = [
    ("no-rescale-of-acc", [(ACC, "acc = acc + tl.dot(p.to(v.dtype), v)")],
     {"check_tiles": "rescale l and acc", "check_ragged": "values are wrong",
      "check_causal": "values are wrong", "check_float16": "values are wrong"}),
    ("top-left-causal-mask", [(CAUSAL, "visible = visible & (cols[None, :] <= rows[:, None])")],
     {"check_causal": "bottom-right", "check_lse": "values are wrong", "check_float16": "values are wrong"}),
    ("no-ragged-mask", [(RAGGED, "visible = rows[:, None] >= 0")],
     {"check_ragged": "keys j >= S to -inf", "check_lse": "values are wrong",
      "check_float16": "values are wrong"}),
    ("no-final-division", [("out = acc / l_safe[:, None]", "out = acc")],
     {"check_tiles": "divide acc by l once", "check_ragged": "values are wrong",
      "check_causal": "values are wrong", "check_float16": "values are wrong"}),
    ("lse-without-log-l", [('lse = tl.where(seen, m + tl.log(l_safe), float("-inf"))',
                            'lse = tl.where(seen, m, float("-inf"))')],
     {"check_lse": "lse_i = m_i + log(l_i)", "check_float16": "lse"}),
    ("nan-for-rows-that-see-no-key", [(SAFE_FLASH, "m_safe = m_new")],
     {"check_causal": "are NaN", "check_lse": "are NaN", "check_float16": "are NaN"}),
    ("out-always-float32", [("out = torch.empty_like(qf)", "out = torch.empty_like(qf, dtype=torch.float32)")],
     {"check_float16": "expected dtype float16"}),
    ("returns-out-only", [("return out.reshape(q.shape), lse.reshape(q.shape[:-1])", "return out.reshape(q.shape)")],
     {c.__name__: "must return the tuple (out, lse)" for c, n in CHECKS if n == "flash_forward"}),
    ("logsumexp-without-the-max", [("l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe[:, None]), 1)",
                                    "l = l + tl.sum(tl.exp(x), 1)"),
                                   ("m + tl.log(l_safe), mask=rows < R", "tl.log(l_safe), mask=rows < R")],
     {"check_row_logsumexp": "NaN or infinite"}),
    ("logsumexp-nan-for-masked-rows", [(SAFE_LSE, "m_safe = m_new")],
     {"check_row_logsumexp": "subtract 0 instead of m while m is still -inf"}),
    ("logsumexp-no-rescale", [("l = l * tl.exp(m - m_safe) + ", "l = l + ")],
     {"check_row_logsumexp": "rescale l by exp(m_old - m_new)"}),
]


@in_process
@pytest.mark.parametrize("edits, fails", [m[1:] for m in MUTANTS], ids=[m[0] for m in MUTANTS])
def test_mistake_fails_its_checks_only(edits, fails):
    ns = namespace(replace=edits)
    for check, name in CHECKS:
        words = fails.get(check.__name__)
        if words is None:
            check(ns[name])
            continue
        with pytest.raises(AssertionError) as error:
            check(ns[name])
        assert words in str(error.value), (check.__name__, str(error.value))


# -- end to end: the sandbox, the judge, the gradebook ------------------------------------------
@pytest.mark.slow
def test_graded_end_to_end(tmp_path):
    """Source notebook 12 of 14 (the written answer is graded by hand), student version 0,
    Part 1 only 3, a top-left causal mask 8 (it fails the causal, lse and float16 cells: 4 points)."""
    import nbformat

    from autograder.host.driver import grade
    from autograder.core.limits import Limits
    from autograder.sandbox.launcher import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(str(reason))
    shutil.copytree(ROOT / "solutions" / AID, tmp_path / "solutions" / AID)
    source, release = read(source_path(AID)), read(release_path(AID))
    solved = {meta(c)["grade_id"]: "\n".join(line for line in c.source.splitlines() if "### " not in line)
              for c in source.cells if meta(c).get("solution") and c.cell_type == "code"}

    def student_version(parts, replace=()):
        nb = read(release_path(AID))
        for cell in nb.cells:
            gid = meta(cell).get("grade_id")
            if gid in parts:
                cell.source = solved[gid]
                for old, new in replace:
                    cell.source = cell.source.replace(old, new)
        return nb

    submissions = {
        "source": source,
        "untouched": release,
        "part1": student_version({"p1_solution"}),
        "topleft": student_version(set(solved), [(CAUSAL, "visible = visible & (cols[None, :] <= rows[:, None])")]),
    }
    for student, nb in submissions.items():
        folder = tmp_path / "submitted" / student / AID
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{AID}.ipynb")
    results = {r.student: r for r in grade(AID, tmp_path, jobs=2, progress=False,
                                           limits=Limits(cell_timeout=60, notebook_timeout=600))}
    scores = {student: (r.status, r.score, r.max_score, r.limits) for student, r in results.items()}
    assert scores == {"source": ("ok", 12.0, 14.0, []), "untouched": ("ok", 0.0, 14.0, []),
                      "part1": ("ok", 3.0, 14.0, []), "topleft": ("ok", 8.0, 14.0, [])}
    assert results["source"].needs_manual and not results["untouched"].needs_manual
