"""The grading clock: the seconds a notebook is charged, which a busy host cannot move.

Every time limit of a notebook (a cell's, the notebook's, a judged call's, a replay's) is
measured on one :class:`ChargedClock`, not on the wall clock. Over any interval the clock
advances by

    max(CPU seconds of the watched processes,
        wall seconds - the longest run-queue wait of any of their threads)

capped at the wall seconds. The watched processes are the notebook's kernels (every process
of their cgroups) and the grading process itself (the judge, which computes the expected
values while the cell's time runs). A process that waits for a CPU because the host runs
other work (another student's kernel, a neighbour's build) is not charged that wait, so an
honest cell takes the same charged time on a loaded host as on an idle one; a cell that
computes is charged its CPU time, a cell that sleeps or blocks its wall time, as on an idle
host. No notebook slows its own clock: a thread can wait in the run queue behind the
kernel's own threads only while those threads use every CPU, which is charged at least as
fast as the wall clock; threads that wait for the GIL sleep, and sleep is charged.

The wall clock still bounds a notebook: the driver's watchdog gives up a student after
``LOAD_ALLOWANCE`` times the notebook's limit (plus margins) on the wall clock, and a
student given up is an error, never a grade (a host so loaded is the host's fault).

Where a kernel's figures cannot be read (no cgroup: not root; a Linux without
``schedstat``) only the grading process's waits are left out.
"""

import os
from time import monotonic

from ..sandbox.cgroups import kernel_cpu, process_cpu

SAMPLE_SECONDS = 0.05  # the kernels' figures are read at most this often
GRADER = ""            # the key of the grading process itself among the watched


class ChargedClock:
    """A monotonic clock (call it: seconds) that runs at the pace of the watched kernels'
    own work (see the module). :meth:`watch` a kernel's cgroup when it starts,
    :meth:`forget` it before it is killed."""

    def __init__(self):
        self._groups = {}  # cgroup name -> its last reading (kernel_cpu), or None
        self._groups[GRADER] = process_cpu([os.getpid()], children=False)
        self._wall = monotonic()
        self._now = 0.0

    def watch(self, name):
        if name:
            self()
            self._groups[name] = kernel_cpu(name)

    def forget(self, name):
        if name in self._groups and name != GRADER:
            self()
            del self._groups[name]

    def __call__(self):
        wall = monotonic()
        passed = wall - self._wall
        if passed < SAMPLE_SECONDS:
            return self._now
        cpu, wait = 0.0, 0.0
        for name, before in list(self._groups.items()):
            now = self._groups[name] = (process_cpu([os.getpid()], children=False) if name == GRADER
                                        else kernel_cpu(name))
            if now is None or before is None:
                continue
            cpu += max(0.0, now[0] - before[0])
            for thread, seconds in now[1].items():
                if seconds is not None:
                    wait = max(wait, seconds - (before[1].get(thread) or 0.0))
        self._wall = wall
        self._now += min(passed, max(cpu, passed - wait))
        return self._now
