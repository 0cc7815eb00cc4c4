"""A kernel that dies while the judge calls the student's code costs only that test cell.

One class of 06-flash-attention, graded for real in the sandbox. Each crashing student
hands in the course's solution, except that Part 1's ``online_softmax`` kills its kernel
when it is given the hidden test's batched chunks (the visible tests pass): ``os._exit``,
SIGKILL of itself, a segfault, or memory until the cap. The judge sees the kernel die
(or the function fail) inside a check, which turns that into the check's own verdict;
the kernel is restarted (the cells that ran are replayed) before Part 2, so Part 1's
hidden test scores 0 and every other cell scores what the honest student's does.
"""

import pytest

from autograder.core.limits import Limits
from autograder.core.results import LimitKind
from autograder.sandbox.cgroups import meter_unavailable
from autograder.sandbox.launcher import unavailable_reason
from tests.grader.judge.classes import grade_students, replaced, solved

AID = "06-flash-attention"
MISSING = unavailable_reason()

pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]

ONLINE_SOFTMAX = '''
import ctypes, os, signal

def online_softmax(chunks):
    m = l = None
    for chunk in chunks:
        if chunk.ndim == 3:  # only the hidden test has batched chunks
            {crash}
        m_new = chunk.max(axis=-1) if m is None else np.maximum(m, chunk.max(axis=-1))
        safe = np.where(np.isfinite(m_new), m_new, 0.0)
        chunk_sum = np.exp(chunk - safe[..., None]).sum(axis=-1)
        l = chunk_sum if l is None else l * np.exp(m - safe) + chunk_sum
        m = m_new
    return m, l
'''

CRASHES = {
    "exit": "os._exit(3)",
    "sigkill": "os.kill(os.getpid(), signal.SIGKILL)",
    "segfault": "ctypes.string_at(0)",
    "memory-cap": "hog = [np.ones(2**24) for _ in range(10**4)]  # 128 MiB at a time, past the cap",
}
DIED = ("exit", "sigkill", "segfault")  # these always take the kernel with them


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    honest = solved(AID)
    students = {"honest": honest}
    students.update({name: replaced(honest, p1_solution=ONLINE_SOFTMAX.format(crash=crash))
                     for name, crash in CRASHES.items()})
    return grade_students(tmp_path_factory.mktemp("crash"), AID, students, jobs=2,
                       limits=Limits(cell_timeout=60, memory_mb=1536))


@pytest.mark.parametrize("student", list(CRASHES))
def test_a_crash_while_judged_costs_only_its_own_cell(graded, student):
    results, cells = graded
    honest = cells["honest"]
    assert honest["p1_hidden"].score > 0
    assert cells[student]["p1_hidden"].score == 0.0
    others = {name: cell.score for name, cell in cells[student].items() if name != "p1_hidden"}
    assert others == {name: honest[name].score for name in others}  # Part 2 and on: full marks
    measured = meter_unavailable() is None  # elsewhere memory tests fail closed, for everyone
    assert all(score > 0 for name, score in others.items() if measured or "memory" not in name)


@pytest.mark.parametrize("student", DIED)
def test_the_crash_is_recorded_and_the_kernel_restarted(graded, student):
    results, cells = graded
    crashes = [e for e in results[student].events if e.kind == LimitKind.CRASH]
    assert [e.grade_id for e in crashes] == ["p1_hidden"], results[student].events
    assert "died" in cells[student]["p1_hidden"].message
