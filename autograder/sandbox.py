"""The operating-system sandbox of every grading kernel (bubblewrap + cgroups).

Run as a script, ``python -I autograder/sandbox.py -f CONNECTION_FILE [kernel
options]`` is the command that :class:`autograder.kernel_manager.SandboxedKernelManager`
launches for each kernel. It reads the run's :class:`~autograder.limits.Limits`
(JSON in ``AUTOGRADER_LIMITS``) and then, in this order:

1. as root, creates a cgroup of its own (``autograder/k<run>-<pid>``, cgroup v2 or the v1
   ``pids`` and ``memory`` controllers) with the process and memory caps, and moves
   itself into it, so everything the kernel ever starts is counted and can be
   killed as one;
2. sets resource limits that are inherited: address space, CPU seconds, file
   size, no core dumps;
3. replaces itself with ``bwrap`` (Debian's ``bubblewrap``), which starts the
   kernel in new mount, PID, network, IPC and UTS namespaces: the file system is
   read-only and holds only the system's ``/usr``, the Python installation and
   the course's virtualenv (whose ``transformer_ref`` and ``autograder`` are not
   in it: they live in the course root, which is not mounted), a private
   size-capped ``/tmp`` that is the kernel's home and working directory and is
   discarded with it, and the one folder of Unix sockets through which the
   worker talks to this kernel. As root the kernel then drops to the unprivileged
   ``nobody`` user (``setpriv``, no capabilities, ``no_new_privs``); as another
   user it runs in a user namespace under that user's id. ``--die-with-parent``
   and the PID namespace make sure nothing it starts outlives it.

The module is also imported by the worker (cgroup clean-up and memory readings);
it uses the standard library only, so the launcher starts in milliseconds.
"""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

NOBODY = 65534
CGROUP = "/sys/fs/cgroup"
GROUP = "autograder"  # every kernel's cgroup lives under <controller>/autograder/
SCRATCH = "/tmp"     # the kernel's home, working directory and only writable place
RUN_ENV = "AUTOGRADER_RUN"  # a grading run's id, in the names of its kernels' cgroups


def kernel_group(pid, run=None):
    """The cgroup name of the kernel launched as ``pid`` (``k<run>-<pid>``, or ``k<pid>``)."""
    run = os.environ.get(RUN_ENV, "") if run is None else run
    return f"k{run}-{pid}" if run else f"k{pid}"


# -- cgroups ---------------------------------------------------------------------------
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


# -- the bwrap command line ------------------------------------------------------------
def _ancestors(path):
    """Parent folders of ``path`` from the top, to create with readable permissions."""
    parts, out = path.strip("/").split("/")[:-1], []
    for i in range(len(parts)):
        out.append("/" + "/".join(parts[:i + 1]))
    return out


def _mount_tree(binds):
    """bwrap options for read-only ``binds`` (host paths mounted at the same place)."""
    args, made = [], {"/", "/usr", "/etc", SCRATCH, "/proc", "/dev"}
    for path in binds:
        for parent in _ancestors(path):
            if parent not in made:
                args += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        args += ["--ro-bind", path, path]
        made.add(path)
    return args


def system_binds():
    """The host's program and library folders, as symlinks where the host has symlinks."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf",
                 "passwd", "group"):
        if os.path.exists("/etc/" + name):
            args += ["--ro-bind", "/etc/" + name, "/etc/" + name]
    return args


def python_roots():
    """The Python installation and the virtualenv the kernel runs from (outside /usr)."""
    roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), sys.prefix}
    return sorted(r for r in roots if not r.startswith("/usr/") and r != "/usr")


def kernel_environment(limits):
    """The kernel's whole environment (bwrap starts from an empty one)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": SCRATCH,
        "TMPDIR": SCRATCH,
        "LANG": "C.UTF-8",
        "IPYTHONDIR": f"{SCRATCH}/.ipython",
        "MPLCONFIGDIR": f"{SCRATCH}/.matplotlib",
        "JUPYTER_PLATFORM_DIRS": "1",
        "MPLBACKEND": "Agg",
        # nothing reaches stderr on its own, and one math thread per kernel
        "PYTHONWARNINGS": "ignore",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
        # large blocks always come from (and go back to) mmap, so memory that a
        # student's function frees is freed: the judge's memory readings stay honest
        "MALLOC_MMAP_THRESHOLD_": "131072",
    }


def bwrap_argv(kernel_argv, socket_dir, limits, *, as_root):
    """The ``bwrap`` command line that runs ``kernel_argv`` in the sandbox."""
    argv = [shutil.which("bwrap") or "bwrap",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session",
            "--hostname", "grader", "--clearenv"]
    if not as_root:
        argv += ["--unshare-user"]
    for key, value in kernel_environment(limits).items():
        argv += ["--setenv", key, value]
    argv += system_binds()
    # the scratch tmpfs first: a Python or a course that lives under /tmp is mounted over it
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(limits["disk_mb"] * 2**20), "--tmpfs", SCRATCH]
    argv += _mount_tree(python_roots())
    for parent in _ancestors(socket_dir):
        if parent != SCRATCH:
            argv += ["--perms", "0755", "--dir", parent]
    argv += ["--bind", socket_dir, socket_dir, "--chdir", SCRATCH]
    if as_root:  # become nobody: no capabilities, and no way to regain any
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                 shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={NOBODY}",
                 f"--regid={NOBODY}", "--clear-groups", "--no-new-privs", "--"]
    else:
        argv += ["--"]
    return argv + list(kernel_argv)


def set_rlimits(limits):
    """Inherited caps: address space, CPU seconds, file size, no core dumps."""
    caps = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, limits["disk_mb"] * 2**20)]
    if limits["memory_mb"] > 0:
        caps.append((resource.RLIMIT_AS, limits["memory_mb"] * 2**20))
    if limits["cpu_limit"] > 0:
        caps.append((resource.RLIMIT_CPU, int(limits["cpu_limit"])))
    for which, value in caps:
        resource.setrlimit(which, (value, value))


def launch(argv):
    """The launcher: cgroup, rlimits, then exec bwrap with the kernel command."""
    limits = json.loads(os.environ["AUTOGRADER_LIMITS"])
    connection_file = argv[argv.index("-f") + 1]
    socket_dir = os.path.dirname(os.path.abspath(connection_file))
    as_root = os.geteuid() == 0
    if as_root:
        sweep_cgroups()
        if cgroup_version() and not create_cgroup(kernel_group(os.getpid()), limits["max_tasks"],
                                                  limits["memory_mb"] * 2**20):
            sys.exit("autograder sandbox: cannot create the kernel's cgroup; not starting a kernel "
                     "without its process and memory caps")
    set_rlimits(limits)
    kernel = [sys.executable, "-P", "-X", "frozen_modules=off", "-m", "ipykernel_launcher", *argv]
    command = bwrap_argv(kernel, socket_dir, limits, as_root=as_root)
    os.execv(command[0], command)


def unavailable_reason():
    """None if kernels can be sandboxed here, else one line that says why and what to install."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv is not installed (apt-get install util-linux)"
    probe = bwrap_argv(["/bin/true"], "/tmp", {"disk_mb": 1, "memory_mb": 0},
                       as_root=os.geteuid() == 0)
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, text=True)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap cannot start a sandbox: {error}"
    if done.returncode != 0:
        return f"bwrap cannot start a sandbox: {done.stderr.strip()[:200]}"
    return None


if __name__ == "__main__":
    launch(sys.argv[1:])
