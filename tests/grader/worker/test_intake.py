"""Which notebook of a submission folder is graded, and how (``autograder.worker.intake``).

Every folder is written under pytest's ``tmp_path`` from the course's real release and
source notebooks, with fixed modification times. The cases: a notebook under its own
name, under the names Jupyter, Colab and browsers give copies, under any name; several
notebooks (the newest is graded); none; unreadable files; names that are glob patterns;
notebooks that lost their nbgrader metadata (re-seated into the release notebook, then
executed to show the student's code lands where the tests need it).
"""

import ast
import copy
import dataclasses
import os
import random
import string
from datetime import datetime, timezone

import nbformat
import pytest

from autograder.worker.audit import grade_id, is_locked
from autograder.worker.intake import Intake, take_in
from tests.grader.handins import OWN, ROOT, T0, hand_in, part1, release, source, worked

REUSED = ["01-rope", "04-transformer-block"]
WRITTEN_HEADING = {"01-rope": "## Part 5", "04-transformer-block": "## Part 7"}
NBFORMAT_3 = {"metadata": {"name": ""}, "nbformat": 3, "nbformat_minor": 0,
              "worksheets": [{"cells": [], "metadata": {}}]}


def meta(cell):
    return cell.metadata.get("nbgrader", {})


def stripped(nb):
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
    return nb


def without_markers(code):
    return "\n".join(line for line in code.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


def solution_code(nb):
    return [c.source for c in nb.cells if c.cell_type == "code" and meta(c).get("solution")]


def written_answer(nb):
    return next(c.source for c in nb.cells if c.cell_type == "markdown" and meta(c).get("solution"))


def top_level_names(code):
    return {t.id for node in ast.parse(code).body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)} | \
        {node.name for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)}


def run_setup_and_solutions(nb):
    """Execute the set-up and solution code cells in order; the namespace they leave."""
    namespace = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and (meta(cell).get("solution") or grade_id(cell) == "setup"):
            exec(compile(cell.source, grade_id(cell), "exec"), namespace)
    return namespace


def run_all_code(nb):
    """Execute every code cell (set-up, solutions, visible tests) in one namespace."""
    namespace = {}
    for cell in nb.cells:
        if cell.cell_type == "code":
            exec(compile(cell.source, grade_id(cell) or "cell", "exec"), namespace)
    return namespace


def assert_release_layout(nb, rel):
    assert [c.get("id") for c in nb.cells] == [c.get("id") for c in rel.cells]
    assert [grade_id(c) for c in nb.cells] == [grade_id(c) for c in rel.cells]
    for mine, theirs in zip(nb.cells, rel.cells):
        if is_locked(theirs):
            assert mine.source == theirs.source


# -- one notebook ------------------------------------------------------------------------
def test_a_notebook_under_its_own_name_is_graded_as_it_is(tmp_path):
    hand_in(tmp_path, OWN, worked("mine"))
    got = take_in(tmp_path, release())
    assert got == Intake("ok", got.notebook, OWN, (), False, "graded '01-rope.ipynb'")
    assert got.notebook == worked("mine")
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.status = "missing"


@pytest.mark.parametrize("name", ["01-rope-Copy1.ipynb", "Copy of 01-rope.ipynb",
                                  "01-rope (1).ipynb"])
def test_copies_named_by_jupyterlab_colab_and_browsers_are_graded(tmp_path, name):
    hand_in(tmp_path, name, worked("copy"))
    got = take_in(tmp_path, release())
    assert (got.status, got.original_name, got.others, got.reseated) == ("ok", name, (), False)
    assert got.message == f"graded '{name}'"
    assert "# copy" in part1(got.notebook)


def test_any_name_is_graded_by_what_the_notebook_holds(tmp_path):
    rng = random.Random(11)
    name = "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(12)) + ".ipynb"
    hand_in(tmp_path, name, worked("random"))
    got = take_in(tmp_path, release())
    assert (got.status, got.original_name, got.message) == ("ok", name, f"graded '{name}'")


@pytest.mark.parametrize("name, decoy", [
    ("01 rope final version.ipynb", "01.ipynb"),
    ("01-rope[2].ipynb", "01-rope2.ipynb"),          # the glob 01-rope[2].ipynb matches the decoy
    ("rope*?.ipynb", "rope-all.ipynb"),               # so does rope*?.ipynb
    ("résumé é 01-rope.ipynb", "resume e 01-rope.ipynb"),
])
def test_names_with_spaces_brackets_wildcards_and_accents(tmp_path, name, decoy):
    hand_in(tmp_path, name, worked("odd name"))
    hand_in(tmp_path, decoy, release("04-transformer-block"), mtime=T0 + 60)
    got = take_in(tmp_path, release())
    assert (got.status, got.original_name, got.others) == ("ok", name, (decoy,))
    assert got.message == f"graded '{name}'; also handed in: {decoy}"
    assert "# odd name" in part1(got.notebook)


# -- several notebooks -------------------------------------------------------------------
@pytest.mark.parametrize("newer, older", [("01-rope (1).ipynb", OWN), (OWN, "01-rope (1).ipynb")])
def test_of_two_notebooks_the_newest_by_modification_time_is_graded(tmp_path, newer, older):
    hand_in(tmp_path, older, worked("older"), mtime=T0)
    hand_in(tmp_path, newer, worked("newer"), mtime=T0 + 3600)
    got = take_in(tmp_path, release())
    assert (got.status, got.original_name, got.others, got.reseated) == ("ok", newer, (older,), False)
    assert got.message == f"graded '{newer}', the newest of 2 notebooks; also handed in: {older}"
    assert "# newer" in part1(got.notebook)


def with_timing(nb, moment, kind):
    cell = next(c for c in nb.cells if grade_id(c) == "p1_visible")
    if kind == "jupyterlab":
        iso = datetime.fromtimestamp(moment, timezone.utc).isoformat().replace("+00:00", "Z")
        cell.metadata["execution"] = {"iopub.execute_input": iso, "shell.execute_reply": iso}
    else:
        cell.metadata["executionInfo"] = {"status": "ok", "timestamp": moment * 1000}
    return nb


@pytest.mark.parametrize("kind", ["jupyterlab", "colab"])
def test_a_time_saved_in_the_notebook_beats_the_modification_time(tmp_path, kind):
    hand_in(tmp_path, OWN, worked("copied later"), mtime=T0 + 100)
    hand_in(tmp_path, "01-rope-Copy1.ipynb",
            with_timing(worked("run last"), T0 + 500, kind), mtime=T0)
    got = take_in(tmp_path, release())
    assert got.original_name == "01-rope-Copy1.ipynb" and got.others == (OWN,)
    assert "# run last" in part1(got.notebook)
    # a saved time after the hand-in is not believed: the modification times decide
    handed = datetime.fromtimestamp(T0 + 200, timezone.utc).replace(tzinfo=None)
    got = take_in(tmp_path, release(), timestamp=handed)
    assert got.original_name == OWN and "# copied later" in part1(got.notebook)


def test_checkpoints_and_collection_files_are_not_candidates(tmp_path):
    hand_in(tmp_path, OWN, worked("submitted"))
    hand_in(tmp_path / ".ipynb_checkpoints", "01-rope-checkpoint.ipynb", worked("autosave"),
            mtime=T0 + 60)
    (tmp_path / "timestamp.txt").write_text("2024-01-01 10:00:00 UTC")
    got = take_in(tmp_path, release())
    assert (got.original_name, got.others, got.message) == (OWN, (), "graded '01-rope.ipynb'")


def test_a_link_is_not_read(tmp_path):
    hand_in(tmp_path, OWN, worked("submitted"))
    os.symlink(ROOT / "solutions" / "01-rope" / "01-rope.ipynb", tmp_path / "01-rope (1).ipynb")
    got = take_in(tmp_path, release())
    assert (got.original_name, got.others) == (OWN, ("01-rope (1).ipynb",))
    assert got.message == ("graded '01-rope.ipynb'; also handed in: 01-rope (1).ipynb; "
                           "01-rope (1).ipynb is a symbolic link, which the grader does not follow")
    assert "# submitted" in part1(got.notebook)


# -- nothing to grade ------------------------------------------------------------------
def test_a_text_file_and_another_assignment_are_missing(tmp_path):
    hand_in(tmp_path, "notes.txt", b"my notes")
    hand_in(tmp_path, "04-transformer-block.ipynb", release("04-transformer-block"))
    got = take_in(tmp_path, release())
    assert got == Intake("missing", None, None, ("04-transformer-block.ipynb",), False,
                         "no notebook of this assignment; the folder held: "
                         "04-transformer-block.ipynb, notes.txt")


@pytest.mark.parametrize("jupyter_files", [False, True])
def test_an_empty_folder_is_missing(tmp_path, jupyter_files):
    if jupyter_files:  # what Jupyter and the collection write is not the student's
        hand_in(tmp_path / ".ipynb_checkpoints", "01-rope-checkpoint.ipynb", worked("autosave"))
        (tmp_path / "timestamp.txt").write_text("2024-01-01 10:00:00 UTC")
    got = take_in(tmp_path, release())
    assert got == Intake("missing", None, None, (), False,
                         "no notebook of this assignment; the folder was empty")


UNREADABLE = {
    "empty file": (b"", "01-rope.ipynb is empty"),
    "not JSON": (b"\x89PNG\r\n not a notebook {", "01-rope.ipynb is not a notebook (not JSON)"),
    "nbformat 5": (dict(NBFORMAT_3, nbformat=5),
                   "01-rope.ipynb is an nbformat 5 notebook, newer than the grader reads"),
    "JSON object": ({"cells": [], "name": "rope"}, "01-rope.ipynb is JSON but not a Jupyter notebook"),
    "JSON list": ([1, 2, 3], "01-rope.ipynb is JSON but not a Jupyter notebook"),
}


@pytest.mark.parametrize("case", UNREADABLE)
def test_an_unreadable_notebook_is_reported_by_name(tmp_path, case):
    content, message = UNREADABLE[case]
    hand_in(tmp_path, OWN, content)
    got = take_in(tmp_path, release())
    assert got == Intake("unreadable", None, OWN, (), False, message)


def test_a_readable_notebook_is_graded_beside_an_unreadable_one(tmp_path):
    hand_in(tmp_path, OWN, b"{", mtime=T0 + 3600)
    hand_in(tmp_path, "01-rope (1).ipynb", worked("readable"))
    got = take_in(tmp_path, release())
    assert (got.status, got.original_name, got.others) == ("ok", "01-rope (1).ipynb", (OWN,))
    assert got.message == ("graded '01-rope (1).ipynb'; also handed in: 01-rope.ipynb; "
                           "01-rope.ipynb is not a notebook (not JSON)")


def test_an_unreadable_notebook_beside_another_assignment_is_unreadable(tmp_path):
    hand_in(tmp_path, OWN, b"")
    hand_in(tmp_path, "04-transformer-block.ipynb", release("04-transformer-block"))
    got = take_in(tmp_path, release())
    assert got == Intake("unreadable", None, OWN, ("04-transformer-block.ipynb",), False,
                         "01-rope.ipynb is empty; also handed in: 04-transformer-block.ipynb")


# -- metadata kept, metadata lost -------------------------------------------------------
def test_a_notebook_with_metadata_and_a_deleted_cell_is_not_reseated(tmp_path):
    nb = worked("kept")
    nb.cells = [c for c in nb.cells if grade_id(c) != "p2_solution"]
    hand_in(tmp_path, OWN, nb)
    got = take_in(tmp_path, release())
    assert (got.status, got.reseated, got.message) == ("ok", False, "graded '01-rope.ipynb'")
    assert got.notebook == nb


def test_a_scratch_notebook_without_metadata_loses_to_one_with_it(tmp_path):
    scratch = nbformat.v4.new_notebook()
    scratch.cells = [nbformat.v4.new_code_cell("def rope_inv_freq(head_dim):\n    return 1")]
    hand_in(tmp_path, OWN, worked("the real one"))
    hand_in(tmp_path, "scratch.ipynb", scratch, mtime=T0 + 3600)
    got = take_in(tmp_path, release())
    assert (got.original_name, got.others, got.reseated) == (OWN, ("scratch.ipynb",), False)
    assert got.message == "graded '01-rope.ipynb'; also handed in: scratch.ipynb"


@pytest.mark.parametrize("aid", REUSED)
def test_a_source_notebook_without_metadata_is_reseated(tmp_path, aid):
    src, rel = source(aid), release(aid)
    path = hand_in(tmp_path, f"{aid}.ipynb", stripped(src))
    before = path.read_bytes()
    got = take_in(tmp_path, rel)
    assert (got.status, got.original_name, got.reseated) == ("ok", f"{aid}.ipynb", True)
    assert got.message == (f"graded '{aid}.ipynb'; it had no nbgrader metadata, so its code "
                           "was re-seated into the assignment's notebook")
    assert_release_layout(got.notebook, rel)
    for theirs, mine in zip(solution_code(src), solution_code(got.notebook)):
        assert theirs.strip() in mine
    assert written_answer(got.notebook) == written_answer(src).strip()
    names = set().union(*map(top_level_names, solution_code(src)))
    assert names <= set(run_setup_and_solutions(got.notebook))
    run_all_code(got.notebook)  # the visible tests pass on the re-seated solutions
    assert path.read_bytes() == before and path.stat().st_mtime == T0
    assert rel == release(aid)


def test_an_answer_added_below_the_placeholder_is_the_answer(tmp_path):
    nb = stripped(worked("lost metadata"))
    at = next(i for i, c in enumerate(nb.cells) if c.source == "YOUR ANSWER HERE")
    nb.cells.insert(at + 1, nbformat.v4.new_markdown_cell("The values carry no position."))
    hand_in(tmp_path, OWN, nb)
    got = take_in(tmp_path, release())
    assert got.reseated and "# lost metadata" in part1(got.notebook)
    assert written_answer(got.notebook) == "The values carry no position."


def retyped(aid, rng):
    """A fresh notebook: the solutions in a shuffled cell order, a helper defined after the
    cell that calls it, a scratch cell, and the written answer under a "Part N" heading."""
    cells = [without_markers(code) for code in solution_code(source(aid))]
    cells[-1] = "STUDENT_CHECK = student_helper()\n" + cells[-1]  # ANSWER_ cell calls a helper
    order = list(range(len(cells)))
    while order == sorted(order):
        rng.shuffle(order)
    last_function = sorted(top_level_names(cells[-2]))[0]
    code = [cells[i] for i in order] + [
        f"print({last_function})",  # scratch: defines nothing, dropped
        "import math as m\n\n\ndef student_helper():\n    return m.pi\n\n\nprint(student_helper())",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# My rope exercise")]
    nb.cells += [nbformat.v4.new_code_cell(c) for c in code]
    nb.cells += [nbformat.v4.new_markdown_cell(WRITTEN_HEADING[aid]),
                 nbformat.v4.new_markdown_cell("Rotating the values breaks relative position."),
                 nbformat.v4.new_markdown_cell("## Notes\n\nnot part of the answer")]
    return nb, cells


@pytest.mark.parametrize("aid", REUSED)
def test_a_retyped_notebook_is_reseated(tmp_path, aid):
    nb, cells = retyped(aid, random.Random(5))
    hand_in(tmp_path, "my work.ipynb", nb)
    rel = release(aid)
    got = take_in(tmp_path, rel)
    assert (got.status, got.original_name, got.reseated) == ("ok", "my work.ipynb", True)
    assert_release_layout(got.notebook, rel)
    reseated = solution_code(got.notebook)
    for code, mine in zip(cells, reseated):
        assert top_level_names(code) - {"STUDENT_CHECK"} <= top_level_names(mine)
    assert "def student_helper" in reseated[0] and "print(student_helper())" not in reseated[0]
    assert not any("print(" in mine and "student_helper" not in mine for mine in reseated)
    assert written_answer(got.notebook) == "Rotating the values breaks relative position."
    namespace = run_setup_and_solutions(got.notebook)
    assert set().union(*map(top_level_names, cells)) <= set(namespace)
    run_all_code(got.notebook)


def test_a_cell_that_does_not_parse_goes_where_its_names_are_mentioned(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in [
        "%matplotlib inline",
        "def ntk_inv_freq(head_dim, base, scale):\n    return None",
        "%timeit ntk_inv_freq(64, 10000.0, 2.0)",
    ]]
    hand_in(tmp_path, "retyped.ipynb", nb)
    got = take_in(tmp_path, release())
    code = {grade_id(c): c.source for c in got.notebook.cells}
    assert got.reseated
    assert code["p3_solution"] == ("def ntk_inv_freq(head_dim, base, scale):\n    return None\n\n"
                                   "%timeit ntk_inv_freq(64, 10000.0, 2.0)")
    assert not any("matplotlib" in text for text in code.values())
    assert code["p1_solution"] == part1(release())  # nothing of the student's: the stub stays
