"""Check my work in JupyterLab: a student notebook filled in wrongly, then rightly.

The learner's environment made from the site's downloads (``tests/book/test_learner_env.py``'s
``learner`` venv and its ``jupyterlab`` server on 127.0.0.1), plus the self-check package of
``release/selfcheck`` installed the way the exercise page says (a kernel that finds it), and
the released ``01-rope`` notebook driven in headless Chromium as a student would:

1. wrongly: Part 1 off by one, Part 2 taken from ``transformer_ref``, Part 3 right but calling
   Part 1. The Part 2 cell warns about ``transformer_ref`` the moment it runs; ``check("p1")``
   shows the grader's own message for the hidden test (computed here by the check itself);
   ``check("p3")`` says that Part 3 fails because it calls Part 1;
2. rightly: the same check cells pass, with the test cells' points and no blame.
"""

import json
import re
import subprocess
from pathlib import Path

import nbformat
import pytest

from autograder.checks import rope
from autograder.host.release import SELFCHECK_DIR, SELFCHECK_WHEEL, is_self_check_cell
from notebooks import solution_source
from tests.book.test_learner_env import (CHROMIUM, clean_env, jupyterlab, learner,  # noqa: F401
                                         with_solutions)

ROOT = Path(__file__).resolve().parents[3]
WHEEL = ROOT / "release" / SELFCHECK_DIR / SELFCHECK_WHEEL
AID = "01-rope"
KERNEL = "python3-selfcheck"
OFF_BY_ONE = ("i = np.arange(head_dim // 2)", "i = np.arange(1, head_dim // 2 + 1)")
FROM_REFERENCE = ("from transformer_ref import numpy as ref\n\n\n"
                  "def apply_rope(x, positions, inv_freq):\n"
                  "    return ref.apply_rope(x, positions, inv_freq)\n")


@pytest.fixture(scope="module")
def self_check_kernel(learner):  # noqa: F811 - the learner venv fixture
    """A kernel that finds the self-check package (``pip install`` into a folder of its own and
    a kernel spec, :data:`KERNEL`, that puts it on the path): the shared learner venv is left as
    it is. The notebook under test names this kernel."""
    folder, python = learner
    target = folder / "selfcheck-site"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                    "--target", str(target), str(WHEEL)], check=True, env=clean_env(), timeout=300)
    spec = folder / "lab-data" / "kernels" / KERNEL / "kernel.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps({"argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                                "display_name": "Python 3 (ipykernel)", "language": "python",
                                "env": {"PYTHONPATH": str(target)}}))
    return target


def the_check_message(source):
    """The message of ``check_rope_inv_freq`` on ``source``'s ``rope_inv_freq``: the grader's
    (``test_self_check.py`` holds the self-check to the grader's messages)."""
    import numpy as np

    ns = {"np": np}
    exec(source, ns)  # noqa: S102 - the course's own solution, edited
    with pytest.raises(AssertionError) as failed:
        rope.check_rope_inv_freq(ns["rope_inv_freq"])
    return str(failed.value)


@pytest.mark.slow
@pytest.mark.browser
def test_check_cells_show_the_graders_messages_wrong_then_right(self_check_kernel, jupyterlab):  # noqa: F811
    if not CHROMIUM.is_file():
        pytest.skip("Chromium not found at /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    from tests.book.test_site_browser import loopback_chromium

    base, token, work = jupyterlab
    notebook = work / f"{AID}.ipynb"
    release = nbformat.read(ROOT / "release" / AID / f"{AID}.ipynb", as_version=4)
    release.metadata.kernelspec.name = KERNEL
    nbformat.write(release, notebook)
    index = {c.metadata.get("nbgrader", {}).get("grade_id"): i for i, c in enumerate(release.cells)}
    checks = {c.source.split('"')[1] if c.source.startswith("check(") else "setup": i
              for i, c in enumerate(release.cells) if is_self_check_cell(c)}
    solved = with_solutions(AID)
    right = {gid: solution_source(solved.cells[index[gid]].source)
             for gid in ("p1_solution", "p2_solution", "p3_solution")}
    wrong_p1 = right["p1_solution"].replace(*OFF_BY_ONE)
    assert wrong_p1 != right["p1_solution"]
    message = the_check_message(wrong_p1)

    with loopback_chromium() as chromium:
        with chromium.new_context(viewport={"width": 1280, "height": 900}) as context:
            page = context.new_page()
            page.goto(f"{base}/lab/tree/{notebook.name}?token={token}")
            cells = page.locator(".jp-Notebook .jp-Cell")
            cells.nth(index["p1_solution"]).wait_for(timeout=90_000)
            sync_api.expect(page.locator(".jp-StatusBar-Widget", has_text="| Idle")).to_be_visible(
                timeout=90_000)
            news = page.get_by_role("button", name="No", exact=True)
            if news.count():
                news.click()

            def type_into(i, source):
                cells.nth(i).locator(".cm-content").click()
                page.keyboard.press("Control+A")
                page.keyboard.insert_text(source)   # as a paste: no auto-indent

            def execute(i):
                """Run cell ``i`` as a student does (click, Shift+Enter); the kernel queues it."""
                cells.nth(i).locator(".cm-content").click()
                page.keyboard.press("Shift+Enter")

            def output(i, expect_text):
                found = cells.nth(i).locator(".jp-OutputArea")
                sync_api.expect(found).to_contain_text(expect_text, timeout=120_000)
                return " ".join(found.inner_text().split())

            # 1. wrongly, run cell by cell (Run All would stop at Part 1's failing visible test)
            type_into(index["p1_solution"], wrong_p1)
            type_into(index["p2_solution"], FROM_REFERENCE)
            type_into(index["p3_solution"], right["p3_solution"])
            for i in (index["setup"], checks["setup"], index["p1_solution"], checks["p1"],
                      index["p2_solution"], index["p3_solution"], checks["p3"]):
                execute(i)
            p1 = output(checks["p1"], "FAIL p1_hidden")
            assert f"FAIL p1_hidden: 0/1 - CheckFailure: {message}" in p1, p1
            assert "FAIL p1_visible: 0/1" in p1 and "0 of 2 points" in p1
            warned = output(index["p2_solution"], "WARNING: your notebook uses the reference library")
            assert "`ref` (is transformer_ref's)" in warned and "It cannot be imported when" in warned
            p3 = output(checks["p3"], "fix Part 1 first")
            assert ("your `ntk_inv_freq` calls your `rope_inv_freq`, which fails Part 1: fix Part 1 "
                    "first") in p3, p3
            assert "WARNING: your notebook uses the reference library" in p3  # and in every check

            # 2. rightly: Parts 1 and 2 fixed, then Kernel -> Restart Kernel and Run All Cells
            # (it stops at Part 4, still a stub: the check cells of Parts 1 to 3 run before it)
            type_into(index["p1_solution"], right["p1_solution"])
            type_into(index["p2_solution"], right["p2_solution"])
            page.keyboard.press("Escape")
            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Kernel$")).click()
            page.locator(".lm-Menu-itemLabel",
                         has_text=re.compile("^Restart Kernel and Run All Cells")).click()
            page.locator(".jp-Dialog-button.jp-mod-accept").click()
            p1 = output(checks["p1"], "PASS p1_hidden: 1/1")
            assert "Part 1: `rope_inv_freq`: 2 of 2 points" in p1 and "FAIL" not in p1, p1
            p2 = output(checks["p2"], "PASS p2_hidden_relative: 1/1")
            assert "4 of 4 points" in p2 and "WARNING" not in p2, p2
            p3 = output(checks["p3"], "PASS p3_hidden: 1/1")
            assert "fix Part 1" not in p3 and "2 of 2 points" in p3, p3
    assert not chromium.offsite, chromium.offsite
