"""Check my work = the grader: the self-check's verdicts are ``python -m autograder grade``'s.

For each assignment one class is graded by the real sandboxed grader (``python -m autograder
grade``, module-scoped, one run per assignment): the honest solution, the untouched student
version and every mutant of ``test_checks.MUTANTS`` for that assignment as students. The same
notebooks are then self-checked in this process (:class:`autograder.selfcheck.SelfCheck` on a
namespace made by running the notebook's cells, as a learner's kernel holds it), and for every
test cell the two must agree: passed or not, the points, and the message (error name and text).

The mutants are chosen by ``test_checks`` to fail their own check with a given message; here they
also fail every other test cell that calls the broken function, which the parity covers too.
"""

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import nbformat
import pytest
from notebooks import ASSIGNMENTS, ROOT, read, source_path
from test_checks import KNOWN, MUTANTS

from autograder.checks._common import diagnosis_key
from autograder.core.cells import grade_id, is_solution, is_test_cell, visible_source
from autograder.host.release import generate, is_self_check_cell, selfcheck_bank
from notebooks import solution_source
from autograder.sandbox.launcher import unavailable_reason
from autograder.selfcheck import SelfCheck

SANDBOX_MISSING = unavailable_reason()
TRITON = "07-flash-triton"  # needs triton (requirements-triton.lock): its own table of mutants
if importlib.util.find_spec("triton") is not None:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # as its set-up cell does, before triton loads
    import test_assignment_07
    PARITY = ASSIGNMENTS + [TRITON]
else:
    test_assignment_07 = None
    PARITY = ASSIGNMENTS


def mutants(aid):
    """``[(label, edits)]`` of ``aid``: ``test_checks.MUTANTS``, or 07's own table."""
    if aid == TRITON:
        return [(label, edits) for label, edits, _ in test_assignment_07.MUTANTS]
    return [(label, edits) for label, a, _, _, edits, _ in MUTANTS if a == aid]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SANDBOX_MISSING is not None, reason=str(SANDBOX_MISSING))]


def students(aid, source, release):
    """``{student: notebook}``: the honest solution, the untouched version, every mutant of ``aid``
    (:func:`mutants`)."""
    answers = {grade_id(c): solution_source(c.source) for c in source.cells if is_solution(c)}

    def solved(edits=()):
        nb = copy.deepcopy(release)
        for cell in nb.cells:
            if grade_id(cell) in answers:
                cell.source = answers[grade_id(cell)]
        for old, new in edits:
            hits = [c for c in nb.cells if c.cell_type == "code" and old in c.source]
            assert hits, f"mutation target not found: {old!r}"
            for cell in hits:  # every occurrence, as test_checks' solved_namespace edits them
                cell.source = cell.source.replace(old, new)
        return nb

    found = {"honest": solved(), "untouched": copy.deepcopy(release)}
    found.update({label: solved(edits) for label, edits in mutants(aid)})
    return found


@pytest.fixture(scope="module", params=PARITY)
def graded(request, tmp_path_factory):
    """One class of ``aid`` graded by ``python -m autograder grade``: ``(aid, {student: nb},
    {student: {grade_id: (passed, points, ename, message)}})``."""
    aid = request.param
    root = tmp_path_factory.mktemp(f"parity-{aid}")
    shutil.copytree(ROOT / "solutions" / aid, root / "solutions" / aid)
    release = nbformat.read(generate(aid, root) / f"{aid}.ipynb", 4)
    source = read(source_path(aid))
    klass = students(aid, source, release)
    for student, nb in klass.items():
        folder = root / "submitted" / student / aid
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{aid}.ipynb")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", aid, "--root", str(root),
                           "--jobs", "2", "--no-progress"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return aid, source, klass, grader_verdicts(root, aid, klass), root


def grader_verdicts(root, aid, klass):
    """Every test cell's verdict as the grader recorded it: points from the gradebook, the
    message from the autograded notebook's error output."""
    from nbgrader.api import Gradebook

    verdicts = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for student in klass:
            points = {g.name: g.auto_score for g in gb.find_submission_notebook(aid, aid, student).grades}
            nb = nbformat.read(root / "autograded" / student / aid / f"{aid}.ipynb", 4)
            cells = {}
            for cell in nb.cells:
                if is_test_cell(cell):
                    errors = [o for o in cell.outputs if o.get("output_type") == "error"]
                    ename, message = (errors[-1]["ename"], errors[-1]["evalue"]) if errors else (None, None)
                    cells[grade_id(cell)] = (ename is None, points[grade_id(cell)], ename, message)
            verdicts[student] = cells
            checks = [c for c in nb.cells if is_self_check_cell(c)]
            assert checks, "the student version carries the check cells"
            for cell in checks:  # in the sandbox the check cells find no self-check
                text = "".join(o.get("text", "") for o in cell.outputs)
                assert not [o for o in cell.outputs if o.get("output_type") == "error"], cell.outputs
                if cell.source.startswith("check("):
                    assert "Self-check not available" in text, text
    return verdicts


def learner_namespace(nb):
    """What a learner's kernel holds after Run All: every code cell run in order (a cell that
    raises stops there, as in Jupyter, and the next cell runs), the check cells left out."""
    namespace = {"__name__": "__main__"}
    for cell in nb.cells:
        if cell.cell_type != "code" or is_self_check_cell(cell):
            continue
        try:
            exec(compile(visible_source(cell.source), "<cell>", "exec"), namespace)  # noqa: S102
        except Exception:  # noqa: BLE001 - a failing visible test, a stub's NotImplementedError
            pass
    return namespace


def self_check_verdicts(aid, source, nb):
    """``{grade id: (passed, points, error name, message)}``; a memory test, which the self-check
    cannot measure (one meter: the sandbox's), as ``None`` where its result is right."""
    checker = SelfCheck(aid, bank=selfcheck_bank(source, aid), user_ns=learner_namespace(nb),
                        watch=False, out=lambda text: None)
    return {r.grade_id: None if r.unchecked and r.passed else (r.passed, r.points, r.ename, r.message)
            for part in checker.parts for r in checker.run(part)}


def memory_verdict(verdict):
    """True for the grader's verdict on a memory test whose result was right: a pass, or a
    failure on the memory bound alone (what the self-check leaves to the grader's meter)."""
    passed, _, _, message = verdict
    return passed or "at peak" in (message or "")


def test_self_check_gives_the_graders_verdict_on_every_test_cell(graded, capsys):
    aid, source, klass, grader, _ = graded
    differ = []
    for student, nb in klass.items():
        mine = self_check_verdicts(aid, source, nb)
        assert set(mine) == set(grader[student]), student
        differ += [f"{student} {gid}: grader {grader[student][gid]} / self-check {mine[gid]}"
                   for gid in grader[student] if mine[gid] != grader[student][gid]
                   and not (mine[gid] is None and memory_verdict(grader[student][gid]))]
    assert not differ, "\n".join(differ)
    # the class is not trivial: the honest solution earns every point, each mutant loses some
    full = {gid: v[1] for gid, v in grader["honest"].items()}
    assert all(v[0] for v in grader["honest"].values()), grader["honest"]
    for student in klass:
        if student != "honest":
            assert any(not v[0] for v in grader[student].values()), student
    assert sum(full.values()) > 0
    json.dumps(grader)  # verdicts are plain data


def test_every_known_mistake_is_named_and_counted_once(graded):
    """The graded class (every mutant a student, each a known mistake): every hidden test a mutant
    fails names its mistake (a part that fails through an earlier part's function names that
    mistake too), its fix among them, and the report's *What went wrong* has one row per mutant
    kind, counting its one student once whatever cells it failed, and no other row holds a mutant
    (cascades and the visible tests beside a diagnosed hidden one are folded into the mistake)."""
    from autograder.host import report_data

    aid, source, klass, grader, root = graded
    planted = {label for label in klass if label not in ("honest", "untouched")}
    assert planted <= set(KNOWN) or aid == TRITON, planted - set(KNOWN)
    planted &= set(KNOWN)  # 07-flash-triton's mutants have their own table, no diagnosis yet
    hidden = {grade_id(c) for c in source.cells if is_test_cell(c) and "BEGIN HIDDEN TESTS" in c.source}
    for label in planted:
        failed = {gid: v[3] for gid, v in grader[label].items() if not v[0] and gid in hidden}
        assert failed and {diagnosis_key(m) for m in failed.values()} == {label}, (label, failed)
        assert KNOWN[label][1].fix in " ".join(failed.values())
    for student in ("honest", "untouched"):  # nothing is diagnosed where no mistake was planted
        assert not {diagnosis_key(v[3]) for v in grader[student].values()} - {None}, student
    stats = report_data.assignment_stats(root, f"sqlite:///{root / 'gradebook.db'}", aid)
    rows = {g.mistake: (g.count, g.examples) for g in stats.messages if g.mistake}
    assert rows == {label: (1, [label]) for label in planted}, rows
    stray = [(g.cell, g.message, sorted(g.students & planted)) for g in stats.messages
             if not g.mistake and g.students & planted]
    assert not stray, stray


def test_every_mutant_is_in_a_parity_class():
    assert {a for _, a, *_ in MUTANTS} <= set(ASSIGNMENTS)


def test_source_notebooks_end_every_part_with_a_check_cell():
    """The source notebooks (and so the student versions) carry the self-check cells: one set-up
    cell after the set-up, and a ``check("pN")`` cell after the last graded cell of each part."""
    for aid in ASSIGNMENTS:
        nb = read(source_path(aid))
        checks = [c.source for c in nb.cells if is_self_check_cell(c)]
        assert f'SelfCheck("{aid}")' in checks[0], aid
        bank = selfcheck_bank(nb, aid)
        assert [s.split(")")[0] for s in checks[1:]] == [f'check("{p["id"]}"' for p in bank["parts"]]
        assert is_self_check_cell(nb.cells[2])
        # each check cell comes right after its part's last graded cell
        for i, cell in enumerate(nb.cells):
            if is_self_check_cell(cell) and cell.source.startswith("check("):
                part = cell.source.split('"')[1]
                assert (grade_id(nb.cells[i - 1]) or "").startswith(part + "_"), (aid, part)
