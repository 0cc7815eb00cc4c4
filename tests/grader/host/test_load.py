"""Load never changes a grade: the same class graded on an idle host and beside CPU hogs.

The toy assignment's class of three honest students (one of them slow: two CPU seconds
in a cell whose limit is six) and three hostile ones (an endless loop, a sleep past the
limit, a memory bomb) is graded once on an idle host, then beside ``3 x cores`` CPU hogs
(:func:`tests.hogs.cpu_hogs`: each a scheduling entity beside the kernels'), locally and on a real Dask cluster
(``test_cluster``'s fixtures: a scheduler and two workers on 127.0.0.1). Every grade, status
and limit hit is the same in the three runs, and the scores are the hand-computed ones.

The loaded runs are slow enough to matter: the slow student's cell alone takes longer on the
wall clock than its limit (a wall-clock verdict would have failed it; the kernel gets at most
``cores / (hogs + 1)`` of a CPU, so 2 CPU s take at least 7 s), and the endless loop
and the sleeper still time out (a clock that stopped while the host was busy would let them
run for ever). Limits are charged on :class:`autograder.judge.clock.ChargedClock`. The hogs
and their cgroups go when the test process is killed.
"""

import copy
import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
from datetime import datetime

import nbformat
import pytest

from autograder.core.limits import Limits
from autograder.host.driver import grade
from autograder.sandbox.launcher import unavailable_reason
from tests.grader.host.test_cluster import ROOT, cluster, make_course, toy_release  # noqa: F401 - fixtures
from tests.grader.test_grading_e2e import FIXTURE, LOOP, MEMORY, Class, points
from tests.hogs import cpu_hogs

SANDBOX_MISSING = unavailable_reason()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SANDBOX_MISSING is not None, reason=str(SANDBOX_MISSING))]
distributed = pytest.importorskip("distributed", reason="Dask not installed: run `make venv`")

# a class's limits, shorter than the other grading tests' (they cost this module's time)
LIMITS = dict(jobs=2, limits=Limits(cell_timeout=6, notebook_timeout=60, memory_mb=2048,
                                     output_limit=100_000))
SLOW_CPU = 2.0  # CPU seconds of the slow honest cell: within its limit on any host
SLOW = f"import time\n_t = time.process_time()\nwhile time.process_time() - _t < {SLOW_CPU}:\n    pass\n"
BUSY = 0.9 * SLOW_CPU  # CPU seconds past which a kernel is in the slow cell (a start-up takes < 1)
SLEEP = "import time\ntime.sleep(1000)\n"


def load_class(release):
    source = nbformat.read(FIXTURE / "solutions" / "toy" / "toy.ipynb", as_version=4)
    c = Class(source, copy.deepcopy(release))
    lost_last = c.total - points(c.parts[-1])
    half = (len(c.parts) + 1) // 2
    c.add("correct", c.notebook(), c.total)
    c.add("partial", c.notebook(solved=[p[0] for p in c.parts[:half]]),
          sum(points(p) for p in c.parts[:half]))
    c.add("slow", c.notebook(change=c.prepend(-1, SLOW)), c.total, limits=[])
    c.add("timeout", c.notebook(change=c.prepend(-1, LOOP)), lost_last, limits=["timeout"])
    c.add("sleeper", c.notebook(change=c.prepend(-1, SLEEP)), lost_last, limits=["timeout"])
    c.add("membomb", c.notebook(change=c.prepend(-1, MEMORY)), lost_last)
    return c


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cluster, toy_release):  # noqa: F811 - test_cluster's fixtures
    klass = load_class(toy_release)
    base = tmp_path_factory.mktemp("load")
    address, _ = cluster

    def run(name, **where):
        root = make_course(base / name, klass)
        return {r.student: r for r in grade("toy", root, progress=False, out=io.StringIO(),
                                            **where, **LIMITS)}

    graded = dict(idle=run("idle"))
    with cpu_hogs() as hogs:
        graded["loaded"] = run("loaded")
        graded["loaded-dask"] = run("loaded-dask", scheduler=address)
        load = os.getloadavg()[0]
    return klass, graded, load, hogs.placement


def test_a_loaded_host_gives_the_idle_grades_locally_and_on_dask(runs):
    klass, graded, load, _ = runs
    for student, expect in klass.expected.items():
        idle = graded["idle"][student]
        assert (idle.status, idle.score) == ("ok", pytest.approx(expect["score"])), student
        if "limits" in expect:
            assert idle.limits == expect["limits"], (student, idle.events)
        for name in ("loaded", "loaded-dask"):
            other = graded[name][student]
            assert (other.status, other.score, other.max_score, other.limits) == \
                (idle.status, idle.score, idle.max_score, idle.limits), (name, student, other.events)
    assert load >= 2 * (os.cpu_count() or 1), load  # the hogs did load the host


def cell_seconds(result, marker):
    """The wall seconds the kernel took to run the cell whose source holds ``marker``, as
    nbclient recorded them in the autograded notebook (``execute_input`` to ``execute_reply``)."""
    notebook = json.loads(result.files[f"autograded/{result.student}/toy/toy.ipynb"])
    [timing] = [c["metadata"]["execution"] for c in notebook["cells"]
                if marker in "".join(c["source"])]  # a list of lines, or one string
    start, end = (datetime.fromisoformat(timing[k].replace("Z", "+00:00"))
                  for k in ("iopub.execute_input", "shell.execute_reply"))
    return (end - start).total_seconds()


def test_the_loaded_runs_were_slow_enough_to_matter(runs):
    """The slow student's cell took longer than its limit on the wall clock while loaded (a
    wall-clock verdict would have failed it), locally and on Dask: each hog weighs on the
    scheduler as much as the kernel (:mod:`tests.hogs`), so the kernel gets at most
    ``cores / (hogs + 1)`` of a CPU and the cell's 2 CPU s take at least 7 s of wall time."""
    _, graded, _, placement = runs
    if "cgroups" not in placement:
        pytest.skip(f"the hogs ran in {placement}: no weight beside the kernels' to count on")
    limit = LIMITS["limits"].cell_timeout
    seconds = {name: round(cell_seconds(graded[name]["slow"], SLOW), 1) for name in graded}
    print(f"the slow cell's wall seconds ({placement}): {seconds}")  # for benchmarks/README.md
    for name in ("loaded", "loaded-dask"):
        assert seconds[name] > limit, (name, seconds, placement)


def started_here(threads):
    """Whether any of ``threads`` (``(pid, tid)`` keys) descends from this process: a kernel
    of this test's grading run, never another run's on the same host."""
    for pid, _ in threads:
        while pid > 1:
            if pid == os.getpid():
                return True
            try:
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                break
    return False


def test_a_kernel_killed_from_outside_mid_cell_costs_nothing(tmp_path, toy_release):  # noqa: F811
    """Another process kills the cgroup of the kernel that runs the slow student's cell (as a
    neighbour's cleanup once did): the notebook is executed again and gets its full grade."""
    from autograder.sandbox.cgroups import kernel_cgroups, kernel_cpu, kill_cgroup

    klass = load_class(toy_release)
    klass.submissions = {"slow": klass.submissions["slow"]}
    root = make_course(tmp_path / "course", klass)
    killed, done = [], threading.Event()

    def kill_the_busy_kernel():  # ours, past a kernel's start-up: the slow cell's
        while not done.is_set() and not killed:
            for name in kernel_cgroups():
                usage = kernel_cpu(name)
                if usage is not None and usage[0] > BUSY and started_here(usage[1]):
                    kill_cgroup(name)
                    killed.append(name)
                    break
            done.wait(0.1)

    killer = threading.Thread(target=kill_the_busy_kernel)
    killer.start()
    try:
        [result] = grade("toy", root, progress=False, out=io.StringIO(), **LIMITS)
    finally:
        done.set()
        killer.join()
    assert killed, "no kernel of the run computed that long"
    assert (result.status, result.score, result.limits) == ("ok", klass.total, []), result
    graded = json.loads(result.files["autograded/slow/toy/toy.ipynb"])
    assert "killed (SIGKILL) from outside" in graded["metadata"]["autograder"]["executed_again"]


def wait_gone(pid, timeout=120):
    """Wait until process ``pid`` (any process, not only a child) has ended; whether it has."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


HOLD_HOGS = """
import json, sys, time
from tests.hogs import cpu_hogs
with cpu_hogs(2) as hogs:
    print(json.dumps([hogs.supervisor, list(hogs), hogs.groups]), flush=True)
    time.sleep(1000)
"""


def test_the_hogs_and_their_cgroups_go_when_the_test_process_is_killed():
    """A test process killed with SIGKILL inside ``cpu_hogs`` leaves no hog and no cgroup;
    a supervisor killed so leaves empty cgroups, which the next ``cpu_hogs`` removes."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_HOGS], stdout=subprocess.PIPE,
                              cwd=ROOT, text=True)
    try:
        supervisor, pids, groups = json.loads(holder.stdout.readline())
        assert len(pids) == 2 and all(os.path.isdir(g) for g in groups), (pids, groups)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert wait_gone(supervisor)  # it has killed its hogs and removed their cgroups by then
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert not [g for g in groups if os.path.exists(g)]

    with cpu_hogs(1) as hogs:
        os.kill(hogs.supervisor, signal.SIGKILL)
        assert wait_gone(hogs[0])  # PR_SET_PDEATHSIG: the hog dies with its supervisor
        left = hogs.groups
    if left:
        assert all(os.path.isdir(g) for g in left)  # no one to remove them yet
        with cpu_hogs(1):
            assert not [g for g in left if os.path.exists(g)]
