"""Memory tests measured from outside the kernel cannot be dodged from inside it.

One class of 06-flash-attention, graded in the sandbox, its kernels' memory read from
their cgroups: an honest tiled ``flash_attention`` earns the memory point; three that
build the full T x S score matrix while hiding it from an in-process measurement do
not, although their values are right (so they keep the value tests' points):

* ``torch``: computes the scores with torch (invisible to ``tracemalloc``);
* ``workspace``: allocates a T x S buffer when the cell runs and reuses it;
* ``untraced``: stops ``tracemalloc`` (and patches it to report nothing) first.

On a host whose cgroups cannot measure a window (no memory controller, cgroup v2 before
Linux 6.12) a memory test is the host's fault: no student is scored (no zeros recorded) and
the run stops with one line that names the host. The families
of evasions are in ``test_measurement_evasions.py``.
"""

import pytest

from autograder.core.limits import Limits
from autograder.sandbox.cgroups import MemoryMeter, meter_unavailable
from autograder.sandbox.launcher import unavailable_reason
from tests.grader.judge.classes import NAIVE, grade_class, replaced, solved

AID = "06-flash-attention"
MISSING = unavailable_reason()

pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]

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


def no_window(self, group):
    """A host whose cgroups cannot open a measuring window."""
    raise OSError("no memory.peak that can be reset")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One class graded with the cgroup's measuring window."""
    if meter_unavailable():
        pytest.skip(f"memory cannot be measured here: {meter_unavailable()}")
    honest = solved(AID)
    students = {"honest": honest, **{name: replaced(honest, p2_solution=code)
                                     for name, code in CHEATS.items()}}
    _, cells = grade_class(tmp_path_factory.mktemp("memory"), AID, students, jobs=2,
                           limits=Limits(cell_timeout=60))
    return cells


def test_the_honest_tiled_function_earns_the_memory_point(graded):
    cells = graded
    assert cells["honest"]["p2_hidden"].score == 3.0
    assert cells["honest"]["p2_hidden_memory"].score == 1.0
    assert cells["honest"]["p3_hidden_memory"].score == 1.0


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
        grade_class(tmp_path, AID, students, jobs=1, limits=Limits(cell_timeout=60))
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        assert list(gb.assignment_submissions(AID)) == []
