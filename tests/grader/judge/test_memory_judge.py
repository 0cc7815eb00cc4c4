"""Memory tests measured from outside the kernel cannot be dodged from inside it.

One class of 06-flash-attention, graded in the sandbox, its kernels' memory read from
their cgroups (the grader's one meter, on which the checks' memory bounds are tested here):
an honest tiled ``flash_attention`` and ``sliding_window_attention`` earn the memory points;
the naive versions, which build the full T x S score matrix, do not, although their values are
right (so they keep the value tests' points); nor do three that build it while hiding it from
an in-process measurement:

* ``torch``: computes the scores with torch (invisible to ``tracemalloc``);
* ``workspace``: allocates a T x S buffer when the cell runs and reuses it;
* ``untraced``: stops ``tracemalloc`` (and patches it to report nothing) first.

Only the call is charged, not how the notebook got there: the honest solution with ``import
torch`` at the top of Part 1 (the import runs before the window), with its function's helper in
a code cell the student inserted (replayed like a solution cell), and with a slow earlier cell
(replayed in its own time, not the memory test's) keeps every point.

On a host whose cgroups cannot measure a window (no memory controller, cgroup v2 before
Linux 6.12) a memory test is the host's fault: no student is scored (no zeros recorded) and
the run stops with one line that names the host. The families
of evasions are in ``test_measurement_evasions.py``.
"""

import nbformat
import pytest

from autograder.core.limits import Limits
from autograder.sandbox.cgroups import MemoryMeter, meter_unavailable
from autograder.sandbox.launcher import unavailable_reason
from tests.grader.judge.classes import NAIVE, grade_students, replaced, solved

AID = "06-flash-attention"
MISSING = unavailable_reason()

pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]

# the naive versions of Parts 2 and 3: right values, the whole T x S score matrix
NAIVE_WINDOW = '''
def sliding_window_attention(q, k, v, window, block=64):
    T = q.shape[-2]
    offset = np.arange(T)[None, :] - np.arange(T)[:, None]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    scores = np.where((offset <= 0) & (offset > -window), scores, -np.inf)
    w = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v
'''
NAIVE_FLASH = NAIVE + '''
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    return _full(q, k, v, causal)
'''

CHEATS = {
    "torch": NAIVE + '''
import torch
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
    T, S = q.shape[-2], k.shape[-2]
    scores = tq @ tk.transpose(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        allowed = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + S - T
        scores = scores.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (w @ tv).numpy()
''',
    "workspace": NAIVE + '''
_WORK = np.ones((3, 1024, 1024))  # the full score matrices of the memory test, made in advance
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    return _full(q, k, v, causal)
''',
    "untraced": NAIVE + '''
import tracemalloc
tracemalloc.stop()
tracemalloc.start = lambda *a, **k: None
tracemalloc.get_traced_memory = lambda: (0, 0)
def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
    return _full(q, k, v, causal)
''',
}


# The honest solution, each with something that is not the judged call: imported torch
# (~125 MiB, 30 times the memory test's 4 MiB bound); a helper in an inserted cell (no
# nbgrader metadata); a Part 1 cell whose replay in the measuring kernel of Part 2's memory
# test takes SLOW s, and a call that takes SLOW s there too (each alone fits the test's 60 s,
# together they do not: the replay had to use its own time)
SLOW = 31
SLOW_REPLAY = f"""
_g = get_ipython().user_ns.get("__grader__")
_MEASURING = _g is not None and len(_g._KEPT.get("staged", ((),))[0]) == 6  # Part 2's measured call
if _MEASURING:
    import time
    time.sleep({SLOW})
"""
SLOW_CALL = f"""
_flash_attention = flash_attention
def flash_attention(*args, **kwargs):
    if _MEASURING:
        time.sleep({SLOW})
    return _flash_attention(*args, **kwargs)
"""


def honest_variants(honest):
    """name -> the honest notebook with one thing outside the judged call (see above)."""
    source = {c.metadata.nbgrader.grade_id: c.source for c in honest.cells
              if c.metadata.get("nbgrader", {}).get("grade_id")}
    variants = {"torch-imported": replaced(honest, p1_solution="import torch\n" + source["p1_solution"]),
                "slow-cell": replaced(honest, p1_solution=source["p1_solution"] + SLOW_REPLAY,
                                      p2_solution=source["p2_solution"] + SLOW_CALL)}
    helper = replaced(honest, p2_solution="def flash_attention(q, k, v, causal=False, block_q=64, "
                      "block_k=64):\n    return _tiled(q, k, v, causal, block_q, block_k)\n")
    at = next(i for i, c in enumerate(helper.cells) if c.metadata.get("nbgrader", {}).get("grade_id")
              == "p2_solution")
    helper.cells.insert(at, nbformat.v4.new_code_cell(
        source["p2_solution"].replace("def flash_attention(", "def _tiled(")))
    variants["inserted-helper"] = helper
    return variants


def no_window(self, group):
    """A host whose cgroups cannot open a measuring window."""
    raise OSError("no memory.peak that can be reset")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One class graded with the cgroup's measuring window."""
    if meter_unavailable():
        pytest.skip(f"memory cannot be measured here: {meter_unavailable()}")
    honest = solved(AID)
    students = {"honest": honest, **honest_variants(honest),
                **{name: replaced(honest, p2_solution=code) for name, code in CHEATS.items()},
                "naive": replaced(honest, p2_solution=NAIVE_FLASH, p3_solution=NAIVE_WINDOW)}
    _, cells = grade_students(tmp_path_factory.mktemp("memory"), AID, students, jobs=2,
                           limits=Limits(cell_timeout=60))
    return cells


def test_the_honest_tiled_function_earns_the_memory_point(graded):
    cells = graded
    assert cells["honest"]["p2_hidden"].score == 3.0
    assert cells["honest"]["p2_hidden_memory"].score == 1.0
    assert cells["honest"]["p3_hidden_memory"].score == 1.0


@pytest.mark.parametrize("student", ["torch-imported", "inserted-helper", "slow-cell"])
def test_what_the_notebook_does_outside_the_call_is_not_charged_to_it(graded, student):
    cells = graded
    assert cells[student]["p2_hidden"].score == 3.0, cells[student]["p2_hidden"]
    assert cells[student]["p2_hidden_memory"].score == 1.0, cells[student]["p2_hidden_memory"]
    assert cells[student]["p3_hidden_memory"].score == 1.0, cells[student]["p3_hidden_memory"]


def test_the_naive_versions_lose_only_the_memory_points(graded):
    """Right values, T x S memory: on the grader's meter both bounds catch the score matrix
    (flash: 8 MiB against a 4 MiB bound; window: 128 MiB against 16 MiB)."""
    cells = graded
    assert cells["naive"]["p2_hidden"].score == 3.0
    assert cells["naive"]["p3_hidden"].score == cells["honest"]["p3_hidden"].score > 0
    assert cells["naive"]["p2_hidden_memory"].score == 0.0
    assert "never build a T x S" in cells["naive"]["p2_hidden_memory"].message
    assert cells["naive"]["p3_hidden_memory"].score == 0.0
    assert "Only compute the scores of the window" in cells["naive"]["p3_hidden_memory"].message


@pytest.mark.parametrize("cheat", list(CHEATS))
def test_hiding_the_score_matrix_from_the_kernel_earns_nothing(graded, cheat):
    cells = graded
    assert cells[cheat]["p2_hidden"].score == 3.0  # right values ...
    assert cells[cheat]["p2_hidden_memory"].score == 0.0  # ... with the T x S matrix


def test_a_host_that_cannot_measure_grades_no_one_and_stops(tmp_path, monkeypatch):
    """A fault of the grading host, never a score: each student is error (no row, no zeros),
    and three of them in a row stop the run with one line."""
    from nbgrader.api import Gradebook

    monkeypatch.setattr(MemoryMeter, "_open_v1", no_window)  # the workers are forked from here
    monkeypatch.setattr(MemoryMeter, "_open_v2", no_window)
    honest = solved(AID)
    students = {f"s{i}": honest for i in range(4)}
    with pytest.raises(SystemExit, match="memory cannot be measured on this grading host"):
        grade_students(tmp_path, AID, students, jobs=1, limits=Limits(cell_timeout=60))
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        assert list(gb.assignment_submissions(AID)) == []
