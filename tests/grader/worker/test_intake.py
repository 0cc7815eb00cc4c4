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
import json
import os
import random
import string
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import pytest

from autograder.worker.audit import grade_id, is_locked
from autograder.worker.intake import Intake, take_in

ROOT = Path(__file__).resolve().parents[3]
T0 = 1_700_000_000  # modification time of every handed-in file, plus offsets
OWN = "01-rope.ipynb"
REUSED = ["01-rope", "04-transformer-block"]
WRITTEN_HEADING = {"01-rope": "## Part 5", "04-transformer-block": "## Part 7"}
NBFORMAT_3 = {"metadata": {"name": ""}, "nbformat": 3, "nbformat_minor": 0,
              "worksheets": [{"cells": [], "metadata": {}}]}


def release(aid="01-rope"):
    return nbformat.read(ROOT / "release" / aid / f"{aid}.ipynb", as_version=4)


def source(aid):
    return nbformat.read(ROOT / "solutions" / aid / f"{aid}.ipynb", as_version=4)


def meta(cell):
    return cell.metadata.get("nbgrader", {})


def hand_in(folder, name, content, mtime=T0):
    """Write ``content`` (a notebook, bytes or JSON data) as ``folder/name``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if isinstance(content, nbformat.NotebookNode):
        nbformat.write(content, path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(json.dumps(content), encoding="utf-8")
    os.utime(path, (mtime, mtime))
    return path


def worked(marker):
    """The 01-rope release notebook with ``marker`` written into its part 1 cell."""
    nb = release()
    cell = next(c for c in nb.cells if grade_id(c) == "p1_solution")
    cell.source = cell.source.replace("# YOUR CODE HERE", f"# {marker}")
    return nb


def part1(nb):
    return next(c.source for c in nb.cells if grade_id(c) == "p1_solution")


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


# -- what lands in submitted/ is hostile ---------------------------------------------------
# Each family is handed in beside (or instead of) an honest notebook; intake must name it,
# read nothing it points to, never block and stay within its caps.
from autograder.worker import intake as intake_module  # noqa: E402
from autograder.worker.intake import (NOTEBOOK_BYTES, NOTEBOOK_CELLS, SUBMISSION_BYTES,  # noqa: E402
                                      handed_in_time, read_submission)
from autograder.worker.pipeline import submission_digest  # noqa: E402


class Deadline:
    """Fail (instead of hanging the suite) if the block takes more than ``seconds``."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __enter__(self):
        import signal

        def expired(*_):
            raise TimeoutError(f"intake took more than {self.seconds} s")

        self.previous = signal.signal(signal.SIGALRM, expired)
        signal.alarm(self.seconds)

    def __exit__(self, *_):
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


def course_tree(tmp_path):
    """A course root with solutions/, and two students' folders of 01-rope (bob's honest)."""
    solutions = tmp_path / "solutions" / "01-rope"
    solutions.mkdir(parents=True)
    nbformat.write(source("01-rope"), solutions / OWN)
    hand_in(tmp_path / "submitted" / "bob" / "01-rope", OWN, worked("bob's work"))
    return tmp_path, solutions


def take_in_course(root, student):
    """Intake as grading does it: the folder opened below the course's submitted/."""
    folder = root / "submitted" / student / "01-rope"
    return take_in(read_submission(folder, within=root / "submitted"), release())


@pytest.mark.parametrize("target", ["solutions", "classmate"])
@pytest.mark.parametrize("linked", ["assignment folder", "student folder"])
def test_a_linked_folder_is_refused_not_graded(tmp_path, target, linked):
    root, solutions = course_tree(tmp_path)
    goal = solutions if target == "solutions" else root / "submitted" / "bob" / "01-rope"
    if linked == "assignment folder":
        (root / "submitted" / "eve").mkdir()
        os.symlink(goal, root / "submitted" / "eve" / "01-rope")
        where = "eve/01-rope"
    else:
        os.symlink(goal.parent, root / "submitted" / "eve")
        where = "eve"
    assert take_in(goal, release()).status == "ok"  # what the link points to would be graded
    got = take_in_course(root, "eve")
    assert got == Intake("unreadable", None, None, (), False,
                         f"the submission folder {where} is a symbolic link, which the grader "
                         "does not follow; nothing in it was read")
    folder = root / "submitted" / "eve" / "01-rope"
    assert submission_digest(folder) != submission_digest(goal)  # the digest does not follow either
    assert take_in_course(root, "bob").status == "ok"


@pytest.mark.parametrize("target", ["/etc/shadow", "solution", "classmate", "dangling"])
def test_a_linked_notebook_is_named_and_never_read(tmp_path, target):
    root, solutions = course_tree(tmp_path)
    goal = {"/etc/shadow": Path("/etc/shadow"), "solution": solutions / OWN,
            "classmate": root / "submitted" / "bob" / "01-rope" / OWN,
            "dangling": root / "nowhere"}[target]
    folder = root / "submitted" / "eve" / "01-rope"
    folder.mkdir(parents=True)
    os.symlink(goal, folder / OWN)
    got = take_in_course(root, "eve")
    assert got == Intake("unreadable", None, OWN, (), False,
                         "01-rope.ipynb is a symbolic link, which the grader does not follow")


def test_a_hard_link_to_the_solution_is_refused(tmp_path):
    root, solutions = course_tree(tmp_path)
    folder = root / "submitted" / "eve" / "01-rope"
    folder.mkdir(parents=True)
    os.link(solutions / OWN, folder / OWN)
    got = take_in_course(root, "eve")
    assert got.status == "unreadable" and got.notebook is None
    assert got.message == ("01-rope.ipynb is a hard link (one file with 2 names, maybe outside "
                           "the folder), which the grader does not read; hand in a copy")


def test_fifos_devices_and_folders_named_like_notebooks_are_never_opened(tmp_path):
    hand_in(tmp_path, OWN, worked("honest"))
    os.mkfifo(tmp_path / "pipe.ipynb")  # opening it for reading would block forever
    os.mkfifo(tmp_path / "timestamp.txt")
    (tmp_path / "folder.ipynb").mkdir()
    hand_in(tmp_path / "folder.ipynb", OWN, worked("inside a folder"))
    device = "a device.ipynb"
    try:
        os.mknod(tmp_path / device, 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 5))  # /dev/zero
    except PermissionError:
        device = None  # not root: no device file to hand in
    with Deadline(20):
        got = take_in(tmp_path, release())
        moment, problem = handed_in_time(read_submission(tmp_path), datetime.now(timezone.utc))
    assert (got.status, got.original_name) == ("ok", OWN) and "# honest" in part1(got.notebook)
    assert "folder.ipynb is a folder, not a notebook file" in got.message
    assert "pipe.ipynb is not a regular file (a FIFO, socket or device), never opened" in got.message
    if device:
        assert f"{device} is not a regular file (a FIFO, socket or device), never opened" in got.message
    assert problem == ("timestamp.txt is not a regular file (a FIFO, socket or device), never "
                       "opened; the time of grading counts")


def test_a_multi_gigabyte_sparse_file_is_refused_by_its_size(tmp_path):
    hand_in(tmp_path, OWN, worked("honest"))
    with open(tmp_path / "huge.ipynb", "wb") as f:
        f.truncate(8 * 2**30)  # 8 GiB that take no disk
    with Deadline(10):
        got = take_in(tmp_path, release())
    assert got.status == "ok" and "# honest" in part1(got.notebook)
    assert f"huge.ipynb is larger than the {NOTEBOOK_BYTES // 2**20} MiB the grader reads" in got.message


def test_the_notebooks_of_one_folder_are_read_up_to_a_total(tmp_path):
    for name in ("a.ipynb", "b.ipynb", "c.ipynb"):
        with open(tmp_path / name, "wb") as f:
            f.truncate(NOTEBOOK_BYTES - 1)  # each under the file cap, three over the total
    got = take_in(tmp_path, release())
    assert 2 * (NOTEBOOK_BYTES - 1) < SUBMISSION_BYTES < 3 * (NOTEBOOK_BYTES - 1)
    assert got.message.split("; ") == [
        "a.ipynb is not a notebook (not JSON)", "b.ipynb is not a notebook (not JSON)",
        f"c.ipynb is not read: the folder's notebooks exceed {SUBMISSION_BYTES // 2**20} MiB together"]


def tiny_cells(count):
    cell = {"cell_type": "code", "source": "", "metadata": {}, "outputs": [], "execution_count": None}
    return {"cells": [cell] * count, "metadata": {}, "nbformat": 4, "nbformat_minor": 4}


@pytest.mark.parametrize("case", ["200k cells", "deep JSON", "very deep JSON", "too large"])
def test_amplification_is_bounded_before_nbformat_reads(tmp_path, case):
    import resource
    import time

    deep = {"deep JSON": 200, "very deep JSON": 100_000}.get(case, 0)
    content = {"200k cells": json.dumps(tiny_cells(200_000)).encode(),
               "too large": b" " * (NOTEBOOK_BYTES + 1)}.get(case) or (
        b'{"nbformat": 4, "cells": [], "metadata": {"x": ' + b"[" * deep + b"]" * deep + b"}}")
    hand_in(tmp_path, OWN, content)
    start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with Deadline(60):
        got = take_in(tmp_path, release())
    seconds = time.monotonic() - start
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    expected = {"200k cells": f"a notebook of 200000 cells, more than the {NOTEBOOK_CELLS} the "
                              "grader takes",
                "deep JSON": "JSON nested deeper than the 100 levels the grader takes",
                "very deep JSON": "not a notebook (not JSON)",
                "too large": f"larger than the {NOTEBOOK_BYTES // 2**20} MiB the grader reads"}[case]
    assert got == Intake("unreadable", None, OWN, (), False, f"{OWN} is {expected}")
    # before the caps: 336 s and 2.5 GB for 200k cells (generous margins for 2 shared cores)
    assert seconds < 20 and grown_mb < 1000, (seconds, grown_mb)


def test_a_notebook_at_the_cell_cap_is_still_read(tmp_path):
    nb = worked("long")
    nb.cells += [nbformat.v4.new_markdown_cell("filler") for _ in range(NOTEBOOK_CELLS - len(nb.cells))]
    hand_in(tmp_path, OWN, nb)
    got = take_in(tmp_path, release())
    assert got.status == "ok" and len(got.notebook.cells) == NOTEBOOK_CELLS


@pytest.mark.parametrize("where", ["beside the notebook", "a notebook's own name"])
def test_file_names_that_are_not_utf8(tmp_path, where):
    if where == "beside the notebook":
        hand_in(tmp_path, OWN, worked("honest"))
        (tmp_path / os.fsdecode(b"notes-\xff\xfe.txt")).write_bytes(b"x")
        name, shown = OWN, None
    else:
        name = os.fsdecode(b"01-rope-\xe9.ipynb")  # latin-1 bytes
        hand_in(tmp_path, name, worked("honest"))
        shown = "01-rope-\\xe9.ipynb"
    got = take_in(tmp_path, release())
    assert (got.status, got.original_name) == ("ok", name) and "# honest" in part1(got.notebook)
    assert got.message == (f"graded '{shown}'" if shown else "graded '01-rope.ipynb'")
    got.message.encode("utf-8")  # printable: no surrogate is left
    assert len(submission_digest(tmp_path)) == 64


def test_nbformat_3_is_upgraded_and_graded(tmp_path):
    old = nbformat.convert(worked("saved by an old Jupyter"), 3)
    assert old.nbformat == 3 and "worksheets" in old
    hand_in(tmp_path, OWN, nbformat.writes(old).encode())
    got = take_in(tmp_path, release())
    assert (got.status, got.original_name, got.reseated) == ("ok", OWN, False)
    assert got.notebook.nbformat == 4 and "# saved by an old Jupyter" in part1(got.notebook)
    assert [grade_id(c) for c in got.notebook.cells] == [grade_id(c) for c in release().cells]


NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text, expected, problem", [
    ("2026-12-01 10:00:00.123456 UTC", datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=timezone.utc), None),
    ("2026-12-03 13:00:00 +0100", datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc), None),
    ("yesterday, promise", NOW, "timestamp.txt is not a time ('yesterday, promise'); the time of grading counts"),
    ("\x1b]0;owned\x07 2026", NOW, "timestamp.txt is not a time ('\\x1b]0;owned\\x07 2026'); the time of grading counts"),
    ("2099-01-01 00:00:00 UTC", NOW, "timestamp.txt is in the future (2099-01-01 00:00:00 UTC); the time of grading counts"),
    ("9999-12-31T23:59:59+00:00", NOW, "timestamp.txt is in the future (9999-12-31T23:59:59+00:00); the time of grading counts"),
])
def test_a_timestamp_that_is_not_a_time_or_in_the_future_counts_as_the_time_of_grading(
        tmp_path, text, expected, problem):
    (tmp_path / "timestamp.txt").write_text(text)
    assert handed_in_time(read_submission(tmp_path), NOW) == (expected, problem)


def test_no_timestamp_is_no_time(tmp_path):
    assert handed_in_time(read_submission(tmp_path), NOW) == (None, None)
    (tmp_path / "timestamp.txt").write_bytes(b"\xff" * (intake_module.COLLECTION_BYTES + 1))
    moment, problem = handed_in_time(read_submission(tmp_path), NOW)
    assert moment == NOW and problem.startswith("timestamp.txt is larger than the 4096 bytes")


def test_a_folder_of_too_many_entries_is_not_looked_through(tmp_path):
    folder = tmp_path / "eve" / "01-rope"
    hand_in(folder, OWN, worked("honest"))
    for number in range(intake_module.FOLDER_ENTRIES):
        (folder / f"junk-{number:04}").touch()
    got = take_in(read_submission(folder, within=tmp_path), release())
    assert got == Intake("unreadable", None, None, (), False,
                         f"the submission folder eve/01-rope holds more than "
                         f"{intake_module.FOLDER_ENTRIES} entries, more than the grader looks at; "
                         "nothing in it was read")
