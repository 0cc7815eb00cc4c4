"""The grading clock: the seconds a notebook is charged, which a busy host cannot move.

Every time limit of a notebook (a cell's, the notebook's, a judged call's, a replay's) is
measured on one :class:`ChargedClock`, not on the wall clock. Over any interval the clock
advances by

    max(CPU seconds of the watched kernels,
        wall seconds - the longest run-queue wait of any of their threads,
        wall seconds / LOAD_ALLOWANCE)

capped at the wall seconds. A kernel that waits for a CPU because the host runs other work
(another student's kernel, a neighbour's build) is not charged that wait, so an honest cell
takes the same charged time on a loaded host as on an idle one; a cell that computes is
charged its CPU time, a cell that sleeps or blocks its wall time, as on an idle host. No
notebook gains by load or by its own threads: waits behind its own threads come with at
least as much CPU time of those threads, and the clock never runs slower than
``wall / LOAD_ALLOWANCE``, so every limit still ends within ``LOAD_ALLOWANCE`` times its
wall seconds (what the driver's watchdog allows for).

Where the kernels' figures cannot be read (no cgroup: not root; a Linux without
``schedstat``) the clock is the wall clock, as every limit was before.
"""

from time import monotonic

from ..core.limits import LOAD_ALLOWANCE
from ..sandbox.cgroups import kernel_cpu

SAMPLE_SECONDS = 0.05  # the kernels' figures are read at most this often


class ChargedClock:
    """A monotonic clock (call it: seconds) that runs at the pace of the watched kernels'
    own work (see the module). :meth:`watch` a kernel's cgroup when it starts,
    :meth:`forget` it before it is killed."""

    def __init__(self, allowance=LOAD_ALLOWANCE):
        self.allowance = allowance
        self._groups = {}  # cgroup name -> its last reading (kernel_cpu), or None
        self._wall = monotonic()
        self._now = 0.0

    def watch(self, name):
        if name:
            self()
            self._groups[name] = kernel_cpu(name)

    def forget(self, name):
        if name in self._groups:
            self()
            del self._groups[name]

    def __call__(self):
        wall = monotonic()
        passed = wall - self._wall
        if passed < SAMPLE_SECONDS:
            return self._now
        cpu, wait = 0.0, 0.0
        for name, before in list(self._groups.items()):
            now = self._groups[name] = kernel_cpu(name)
            if now is None or before is None:
                continue
            cpu += max(0.0, now[0] - before[0])
            for thread, seconds in now[1].items():
                if seconds is not None:
                    wait = max(wait, seconds - (before[1].get(thread) or 0.0))
        self._wall = wall
        self._now += min(passed, max(cpu, passed - wait, passed / self.allowance))
        return self._now
