"""Memory tests measured from outside the kernel cannot be dodged from inside it.

One class of 06-flash-attention, graded in the sandbox, once reading the kernel's
cgroup and once (as on a host whose cgroup peak cannot be reset) the kernel
process's own peak: an honest tiled
``flash_attention`` earns the memory point; three that build the full T x S
score matrix while hiding it from an in-process measurement do not, although
their values are right (so they keep the value tests' points):

* ``torch``: computes the scores with torch (invisible to ``tracemalloc``);
* ``workspace``: allocates a T x S buffer when the cell runs and reuses it;
* ``untraced``: stops ``tracemalloc`` (and patches it to report nothing) first.
"""

import copy
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from autograder.host.driver import grade
from autograder.core.limits import Limits
from autograder.sandbox import cgroups
from autograder.sandbox.cgroups import cgroup_version
from autograder.sandbox.launcher import unavailable_reason

REPO = Path(__file__).resolve().parents[3]
AID = "06-flash-attention"
MISSING = unavailable_reason()

pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]

NAIVE = '''
def _full(q, k, v, causal):
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        scores = np.where(np.arange(S)[None, :] <= np.arange(T)[:, None] + S - T, scores, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(scores - m)
    total = w.sum(axis=-1, keepdims=True)
    return np.divide(w @ v, total, out=np.zeros(q.shape), where=total > 0)
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


def strip(source):
    source = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", "", source, flags=re.S)
    return "\n".join(line for line in source.splitlines() if "SOLUTION" not in line)


def no_peak_reset(path, value):
    """A cgroup whose memory peak cannot be reset (cgroup v2 before Linux 6.12)."""
    if path.endswith(("memory.peak", "memory.max_usage_in_bytes")):
        raise OSError("resetting the peak is not supported")
    return write(path, value)


write = cgroups._write


@pytest.fixture(scope="module", params=["cgroup", "process"])
def graded(request, tmp_path_factory):
    """One class graded with the cgroup's peak, and one with the kernel process's peak."""
    if cgroup_version() == 0:
        pytest.skip("memory is measured through cgroups: none here")
    patch = pytest.MonkeyPatch()
    if request.param == "process":  # the workers are forked from here: they inherit it
        patch.setattr(cgroups, "_write", no_peak_reset)
    root = tmp_path_factory.mktemp("memory")
    shutil.copytree(REPO / "solutions" / AID, root / "solutions" / AID)
    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    honest = copy.deepcopy(nbformat.read(REPO / "release" / AID / f"{AID}.ipynb", as_version=4))
    answers = {c.metadata.nbgrader.grade_id: strip(c.source) for c in source.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in honest.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    students = {"honest": honest}
    for name, code in CHEATS.items():
        nb = copy.deepcopy(honest)
        next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "p2_solution").source = code
        students[name] = nb
    for student, nb in students.items():
        folder = root / "submitted" / student / AID
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{AID}.ipynb")
    try:
        results = grade(AID, root, jobs=2, progress=False, limits=Limits(cell_timeout=60))
    finally:
        patch.undo()
    scores = {}
    for result in results:
        for nb in result.notebooks:
            scores[result.student] = {g.name: g.auto_score for g in nb.grades}
    return scores


def test_the_honest_tiled_function_earns_the_memory_point(graded):
    assert graded["honest"]["p2_hidden_memory"] == 1.0
    assert graded["honest"]["p2_hidden"] == 3.0


@pytest.mark.parametrize("cheat", list(CHEATS))
def test_hiding_the_score_matrix_from_the_kernel_earns_nothing(graded, cheat):
    assert graded[cheat]["p2_hidden"] == 3.0  # right values ...
    assert graded[cheat]["p2_hidden_memory"] == 0.0  # ... with the T x S matrix
