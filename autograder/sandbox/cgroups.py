"""Kernel cgroups, from outside the sandbox: create, cap, measure, kill, sweep.

Every grading kernel runs in a cgroup of its own, ``autograder/k<run>-<pid>`` (cgroup v2, or
the v1 ``pids`` and ``memory`` controllers). The launcher (:mod:`autograder.sandbox.launcher`)
creates it and moves itself into it before it starts bubblewrap; the judge reads its memory
(:class:`MemoryMeter`), and the worker and the driver kill it as a whole when a kernel stops or a
run ends. Standard library only: the launcher imports it, and starts in milliseconds.
"""

import os
import re
import signal
import time

CGROUP = "/sys/fs/cgroup"
GROUP = "autograder"  # every kernel's cgroup lives under <controller>/autograder/
RUN_ENV = "AUTOGRADER_RUN"  # a grading run's id, in the names of its kernels' cgroups
WINDOW = "window"  # v1: the memory cgroup inside a kernel's that charges one measured window


def kernel_group(pid, run=None):
    """The cgroup name of the kernel launched as ``pid`` (``k<run>-<pid>``, or ``k<pid>``)."""
    run = os.environ.get(RUN_ENV, "") if run is None else run
    return f"k{run}-{pid}" if run else f"k{pid}"


def cgroup_version():
    """2 (unified hierarchy), 1 (v1 ``pids``/``memory`` controllers), or 0 (none usable)."""
    if os.path.exists(os.path.join(CGROUP, "cgroup.controllers")):
        return 2
    if os.path.isdir(os.path.join(CGROUP, "pids")):
        return 1
    return 0


def _group_dirs(name):
    """The folders of cgroup ``name`` (one per v1 controller, one for v2)."""
    version = cgroup_version()
    if version == 2:
        return [os.path.join(CGROUP, GROUP, name)]
    if version == 1:
        return [os.path.join(CGROUP, c, GROUP, name) for c in ("pids", "memory")
                if os.path.isdir(os.path.join(CGROUP, c))]
    return []


def _write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def _delegate_v2():
    """cgroup v2: make the ``autograder`` parent and let its children use ``pids`` and
    ``memory``; False if the parent cannot be made."""
    parent = os.path.join(CGROUP, GROUP)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError:
        return False
    for path in (CGROUP, parent):
        try:
            _write(os.path.join(path, "cgroup.subtree_control"), "+pids +memory")
        except OSError:
            pass
    return True


def _join_and_cap(path, max_tasks, memory_bytes):
    """Make cgroup folder ``path``, move this process into it and write the caps it has
    knobs for (0: no cap); v1 and v2 knob names alike, and no swap where it can be set."""
    os.makedirs(path, exist_ok=True)
    _write(os.path.join(path, "cgroup.procs"), os.getpid())
    knobs = [("pids.max", max_tasks)] if max_tasks > 0 else []
    if memory_bytes > 0:
        knobs += [("memory.max", memory_bytes), ("memory.limit_in_bytes", memory_bytes),
                  ("memory.swap.max", 0)]
    for knob, value in knobs:
        if os.path.exists(os.path.join(path, knob)):
            _write(os.path.join(path, knob), value)


def create_cgroup(name, max_tasks, memory_bytes):
    """Create cgroup ``name`` with the caps and move this process into it; True on success.

    Another launcher's :func:`sweep_cgroups` may remove the new, still empty folder
    before this process has joined it: then the folder is made again (a few tries).
    """
    if cgroup_version() == 2 and not _delegate_v2():
        return False
    dirs = _group_dirs(name)
    for _ in range(5):
        try:
            for path in dirs:
                _join_and_cap(path, max_tasks, memory_bytes)
            return bool(dirs)
        except FileNotFoundError:  # swept away before we joined it: make it again
            continue
        except OSError:
            return False
    return False


def _tasks(path):
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def kill_cgroup(name, timeout=5.0):
    """SIGKILL every process of cgroup ``name`` and remove it (no-op if it does not exist)."""
    deadline = time.monotonic() + timeout
    for path in [g for d in _group_dirs(name) for g in (os.path.join(d, WINDOW), d)]:
        while os.path.isdir(path):  # the measured window first: its parent cannot go before it
            for pid in _tasks(path):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                os.rmdir(path)
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)


def sweep_cgroups(min_age=10.0):
    """Remove empty kernel cgroups left behind (e.g. by a killed stock nbgrader run).

    Only groups older than ``min_age`` seconds: a launcher that has just made its
    group has not joined it yet.
    """
    now = time.time()
    for path in _group_dirs(""):
        try:
            names = os.listdir(path)
        except OSError:
            continue
        for name in names:
            group = os.path.join(path, name)
            try:
                young = now - os.stat(group).st_mtime < min_age
            except OSError:
                continue
            window = os.path.join(group, WINDOW)
            if name.startswith("k") and not young and not _tasks(group) and not _tasks(window):
                for folder in (window, group):
                    try:
                        os.rmdir(folder)
                    except OSError:
                        pass


def kernel_cgroups():
    """Names of the kernel cgroups that exist now (of every run on this host)."""
    names = set()
    for path in _group_dirs(""):
        try:
            names.update(n for n in os.listdir(path) if n.startswith("k"))
        except OSError:
            continue
    return names


def kill_run_cgroups(run):
    """Kill every kernel of grading run ``run`` and remove their cgroups."""
    if not run:
        return
    for name in kernel_cgroups():
        if name.startswith(f"k{run}-"):
            kill_cgroup(name)


class MeterUnavailable(Exception):
    """This host's cgroups cannot measure a window of a kernel's memory: fail closed."""


def meter_unavailable():
    """None if :class:`MemoryMeter` can measure kernels on this host, else one line saying why."""
    if os.geteuid() != 0:
        return "kernels get cgroups only when grading runs as root"
    version = cgroup_version()
    if version == 1 and os.path.isdir(os.path.join(CGROUP, "memory")):
        return None
    if version == 2:
        try:
            with open(os.path.join(CGROUP, "cgroup.controllers")) as f:
                memory = "memory" in f.read().split()
        except OSError:
            memory = False
        release = tuple(int(n) for n in re.findall(r"\d+", os.uname().release)[:2])
        if memory and release >= (6, 12):
            return None
        if memory:
            return (f"cgroup v2 on Linux {os.uname().release}: a memory peak can be reset "
                    "only from Linux 6.12")
    return "no cgroup memory controller"


class MemoryMeter:
    """The memory charged to one kernel inside a window, read from outside the sandbox.

    The window is opened (:meth:`start`) before any student code has run in the kernel
    and read (:meth:`peak`) after the result has been encoded, so everything in between
    counts: anonymous memory of every process and thread of the kernel, files in its
    ``/tmp`` (tmpfs pages are charged as shared memory), memory-mapped files, kernel
    memory such as pipe buffers, child processes. The figure is

    * cgroup v1 (``memory`` controller): the peak of a fresh cgroup ``<kernel>/window``
      into which every process of the kernel is moved when the window opens. Charges
      made before stay with the kernel's own cgroup (``memory.move_charge_at_immigrate``
      0), so memory held before the window and freed inside it cannot make room: the
      peak is only what the window itself allocated at most at once;
    * cgroup v2 from Linux 6.12: ``memory.peak`` reset through one open file (the
      kernel keeps a peak per file descriptor) minus ``memory.current`` at the reset.
      Memory held before the window and freed inside it lowers this figure; before any
      student code runs the kernel holds only the interpreter, the set-up cells and the
      inputs.

    Elsewhere (no memory controller, v2 before 6.12, no root) :meth:`start` raises
    :class:`MeterUnavailable`: no process-level figure can see child processes or
    ``/tmp``, so the check fails closed instead of passing.
    """

    def __init__(self, name):
        self.name = name
        self._peak_file = None  # v2: the open memory.peak whose peak was reset
        self._base = 0
        self._window = None     # v1: the window's cgroup folder

    def start(self):
        """Open the window (see the class); :class:`MeterUnavailable` if this host cannot."""
        reason = meter_unavailable()
        if reason:
            raise MeterUnavailable(reason)
        version = cgroup_version()
        groups = [p for p in _group_dirs(self.name or "") if self.name]
        memory = [p for p in groups if os.path.exists(os.path.join(p, "memory.usage_in_bytes"))
                  or os.path.exists(os.path.join(p, "memory.current"))]
        if not memory:
            raise MeterUnavailable("the kernel has no memory cgroup (grade as root, with cgroups)")
        group = memory[0]
        try:
            if version == 1:
                self._window = self._open_v1(group)
            else:
                self._open_v2(group)
        except OSError as error:
            self.close()
            raise MeterUnavailable(f"this host's cgroups cannot measure a window ({error})") from None

    def _open_v1(self, group):
        window = os.path.join(group, WINDOW)
        os.makedirs(window, exist_ok=True)
        with open(os.path.join(window, "memory.move_charge_at_immigrate")) as f:
            if int(f.read()) != 0:
                raise OSError("charges would move with the processes")
        moved = False
        for pid in _tasks(group):
            try:
                _write(os.path.join(window, "cgroup.procs"), pid)
                moved = True
            except ProcessLookupError:
                continue
        if not moved or _tasks(group):
            raise OSError("the kernel's processes could not all be moved into the window")
        return window

    def _open_v2(self, group):
        self._peak_file = open(os.path.join(group, "memory.peak"), "r+")
        with open(os.path.join(group, "memory.current")) as f:
            self._base = int(f.read())
        self._peak_file.write("reset\n")
        self._peak_file.flush()  # Linux 6.12+: the peak of this file descriptor starts again

    def peak(self):
        """Bytes charged inside the window at most at once, since :meth:`start`."""
        try:
            if self._window is not None:
                with open(os.path.join(self._window, "memory.max_usage_in_bytes")) as f:
                    return int(f.read())
            if self._peak_file is not None:
                self._peak_file.seek(0)
                return max(0, int(self._peak_file.read()) - self._base)
        except (OSError, ValueError) as error:
            raise MeterUnavailable(f"the window's peak cannot be read ({error})") from None
        raise MeterUnavailable("the window was not opened")

    def close(self):
        """Forget the window (its cgroup goes with the kernel's, see :func:`kill_cgroup`)."""
        if self._peak_file is not None:
            self._peak_file.close()
            self._peak_file = None


def _proc_numbers(path):
    """The numbers of a ``/proc`` stat line after the command name (which may hold spaces)."""
    with open(path) as f:
        return f.read().rpartition(")")[2].split()


def kernel_cpu(name):
    """``(cpu, waits)`` of cgroup ``name`` now, or None where it cannot be read.

    ``cpu``: CPU seconds (user and system) of every process of the cgroup, its ended threads
    and the children it has reaped included; ``waits``: for each thread (keyed by
    ``(pid, tid)``), the seconds it has spent runnable but waiting for a CPU (the run-queue
    delay of ``/proc/<pid>/task/<tid>/schedstat``), or None for every thread when this
    Linux keeps no such figure. Read from outside the sandbox.
    """
    dirs = _group_dirs(name or "") if name else []
    if not dirs or not os.path.isdir(dirs[0]):
        return None
    return process_cpu(_tasks(dirs[0]))


def process_cpu(pids, children=True):
    """:func:`kernel_cpu`'s ``(cpu, waits)`` of the processes ``pids`` (and their threads;
    the children they have reaped only with ``children``)."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu, waits = 0.0, {}
    for pid in pids:
        try:
            fields = _proc_numbers(f"/proc/{pid}/stat")
            # after the name: state ppid ... utime(11) stime(12) cutime(13) cstime(14)
            cpu += sum(int(v) for v in fields[11:15 if children else 13]) / tick
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        waits[(pid, int(tid))] = int(f.read().split()[1]) / 1e9
                except (OSError, ValueError, IndexError):
                    waits[(pid, int(tid))] = None
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    return cpu, waits


def memory_events(name):
    """``(capped, oom_kills)`` of cgroup ``name``: whether it has ever been at its memory cap,
    and how many of its processes an OOM killer killed (the host's included); None where
    they cannot be read (the cgroup is gone, or has no memory controller)."""
    for path in _group_dirs(name or "") if name else []:
        capped, kills, found = False, 0, False
        for group in (path, os.path.join(path, WINDOW)):
            try:
                if os.path.exists(os.path.join(group, "memory.events")):  # v2
                    with open(os.path.join(group, "memory.events")) as f:
                        counts = {k: int(v) for k, v in (line.split() for line in f if line.strip())}
                    capped |= counts.get("max", 0) > 0 or counts.get("oom", 0) > 0
                    kills += counts.get("oom_kill", 0)
                    found = True
                elif os.path.exists(os.path.join(group, "memory.failcnt")):  # v1
                    with open(os.path.join(group, "memory.failcnt")) as f:
                        capped |= int(f.read()) > 0
                    with open(os.path.join(group, "memory.oom_control")) as f:
                        counts = {k: int(v) for k, v in (line.split() for line in f if line.strip())}
                    kills += counts.get("oom_kill", 0)
                    found = True
            except (OSError, ValueError):
                return None
        if found:
            return capped, kills
    return None
