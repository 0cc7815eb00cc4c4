"""Kernel cgroups, from outside the sandbox: create, cap, measure, kill, sweep.

Every grading kernel runs in a cgroup of its own, ``autograder/k<run>-<pid>`` (cgroup v2, or
the v1 ``pids`` and ``memory`` controllers). The launcher (:mod:`autograder.sandbox.launcher`)
creates it and moves itself into it before it starts bubblewrap; the judge reads its memory
(:class:`MemoryMeter`), and the worker and the driver kill it as a whole when a kernel stops or a
run ends. Standard library only: the launcher imports it, and starts in milliseconds.
"""

import os
import signal
import time

CGROUP = "/sys/fs/cgroup"
GROUP = "autograder"  # every kernel's cgroup lives under <controller>/autograder/
RUN_ENV = "AUTOGRADER_RUN"  # a grading run's id, in the names of its kernels' cgroups


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


def create_cgroup(name, max_tasks, memory_bytes):
    """Create cgroup ``name`` with the caps and move this process into it; True on success.

    Another launcher's :func:`sweep_cgroups` may remove the new, still empty folder
    before this process has joined it: then the folder is made again (a few tries).
    """
    version = cgroup_version()
    if version == 2:
        parent = os.path.join(CGROUP, GROUP)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError:
            return False
        for path in (CGROUP, parent):  # let the children use pids and memory
            try:
                _write(os.path.join(path, "cgroup.subtree_control"), "+pids +memory")
            except OSError:
                pass
    dirs = _group_dirs(name)
    for _ in range(5):
        try:
            for path in dirs:
                os.makedirs(path, exist_ok=True)
                _write(os.path.join(path, "cgroup.procs"), os.getpid())
                if os.path.exists(os.path.join(path, "pids.max")) and max_tasks > 0:
                    _write(os.path.join(path, "pids.max"), max_tasks)
                if memory_bytes > 0:
                    for knob in ("memory.max", "memory.limit_in_bytes"):
                        if os.path.exists(os.path.join(path, knob)):
                            _write(os.path.join(path, knob), memory_bytes)
                    if os.path.exists(os.path.join(path, "memory.swap.max")):
                        _write(os.path.join(path, "memory.swap.max"), 0)
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
    for path in _group_dirs(name):
        while os.path.isdir(path):
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
            if name.startswith("k") and not young and not _tasks(group):
                try:
                    os.rmdir(group)
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


class MemoryMeter:
    """The memory of the kernel in cgroup ``name``, read from outside it.

    The whole cgroup (every process, tmpfs files included) where the kernel lets a
    peak be reset (cgroup v1, and v2 from Linux 6.12); elsewhere the kernel's own
    process, whose high-water mark ``/proc/<pid>/clear_refs`` resets (what its
    children allocate is then not counted: the summary of such a host says so).
    ``usage()`` and ``peak()`` are in bytes; ``start()`` begins a new peak.
    """

    def __init__(self, name):
        self.name, self.pid = name, None

    def _cgroup_files(self):
        for path in _group_dirs(self.name):
            for current, peak in (("memory.current", "memory.peak"),
                                  ("memory.usage_in_bytes", "memory.max_usage_in_bytes")):
                if os.path.exists(os.path.join(path, current)):
                    return os.path.join(path, current), os.path.join(path, peak)
        return None

    def _kernel_pid(self):
        for path in _group_dirs(self.name):
            for pid in _tasks(path):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = f.read().split(b"\0")
                except OSError:
                    continue
                # the Python process itself, not bwrap or setpriv, whose arguments name it too
                if os.path.basename(argv[0]).startswith(b"python") and b"ipykernel_launcher" in argv:
                    return pid
        return None

    def _status(self, field):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise OSError(f"no {field} for process {self.pid}")

    def usage(self):
        """Bytes in use now (None if nothing can be read)."""
        if self.pid is not None:
            return self._status("VmRSS")
        files = self._cgroup_files()
        if files is None:
            return None
        with open(files[0]) as f:
            return int(f.read())

    def start(self):
        """Begin a new peak; False if neither the cgroup nor the process allows it."""
        files = self._cgroup_files()
        if files is not None:
            try:
                _write(files[1], 0)
                return True
            except OSError:
                pass
        self.pid = self._kernel_pid()
        if self.pid is None:
            return False
        try:
            _write(f"/proc/{self.pid}/clear_refs", 5)  # 5: reset the peak resident set size
            return True
        except OSError:
            self.pid = None
            return False

    def peak(self):
        """The peak in bytes since :meth:`start`."""
        if self.pid is not None:
            return self._status("VmHWM")
        with open(self._cgroup_files()[1]) as f:
            return int(f.read())
