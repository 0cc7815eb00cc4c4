"""The charged clock, on real processes in a real kernel cgroup (``autograder.judge.clock``).

A process that sleeps is charged its wall time, less only what a watched thread waited for a CPU;
one that spins beside ``3 x cores`` CPU hogs is charged about its own CPU time, far less than
the wall time, and never less than its CPU time.
"""

import os
import subprocess
import sys
import time
import uuid

import pytest

from autograder.judge.clock import ChargedClock
from autograder.sandbox.cgroups import cgroup_version, kernel_cpu, kill_cgroup, process_cpu
from tests.hogs import cpu_hogs

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or cgroup_version() == 0,
                                reason="kernel cgroups need root and cgroups")

IN_CGROUP = """
import sys, time
from autograder.sandbox.cgroups import create_cgroup
assert create_cgroup(sys.argv[1], 0, 0)
print("in", flush=True)
while sys.argv[2] == "spin":
    pass
time.sleep(60)
"""


def waited(name):
    """Seconds the threads of this process and of cgroup ``name`` have waited for a CPU."""
    return sum(seconds or 0.0 for usage in (process_cpu([os.getpid()], children=False), kernel_cpu(name))
               for seconds in usage[1].values())


def charged_over(seconds, what):
    """``(charged, wall, cpu, waited)`` of a process doing ``what`` ('spin' or 'sleep') in a
    cgroup of its own, over ``seconds``; ``waited``: the seconds it and this process (the
    clock watches the grading process too) waited for a CPU meanwhile, all threads summed."""
    name = f"kclocktest-{uuid.uuid4().hex[:8]}"
    process = subprocess.Popen([sys.executable, "-c", IN_CGROUP, name, what],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "in"
        clock = ChargedClock()
        clock.watch(name)
        cpu0, waited0, start, charged0 = kernel_cpu(name)[0], waited(name), time.monotonic(), clock()
        while time.monotonic() - start < seconds:
            time.sleep(0.1)
            clock()
        return (clock() - charged0, time.monotonic() - start, kernel_cpu(name)[0] - cpu0,
                waited(name) - waited0)
    finally:
        process.kill()
        process.wait()
        kill_cgroup(name)


def test_a_sleeping_kernel_is_charged_its_wall_time():
    """Less only the seconds a watched thread waited for a CPU (none on an idle host)."""
    charged, wall, _, waits = charged_over(2.0, "sleep")
    assert wall - waits - 0.1 <= charged <= wall + 0.01, (charged, wall, waits)


def test_a_computing_kernel_beside_hogs_is_charged_its_own_work_only():
    with cpu_hogs():
        time.sleep(0.5)
        charged, wall, cpu, _ = charged_over(4.0, "spin")
    assert charged < 0.75 * wall, (charged, wall, cpu)  # the host's load is not charged
    assert charged >= cpu - 0.1

