"""The launcher of every grading kernel: cgroup, rlimits, then bubblewrap.

:data:`BOOT` run as ``python -I -c BOOT -f CONNECTION_FILE [kernel options]`` is the command
that :class:`autograder.judge.kernel_manager.SandboxedKernelManager` launches for each kernel
(it imports this package alone, by path: ``-I`` puts nothing of the caller's environment on
``sys.path``). It reads the run's :class:`~autograder.sandbox.limits.SandboxLimits` (JSON in
``AUTOGRADER_LIMITS``, written from :class:`autograder.core.limits.Limits`), asks to be killed
when the worker that launched it ends and exits at once if it has ended already
(:func:`die_with_launcher`), and then, in this order:

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
   discarded with it, and, read-only, the one folder of Unix sockets through which
   the worker talks to this kernel (the worker bound them; their listening
   descriptors come in inherited, named in :data:`SOCKETS_ENV`). As root the kernel then drops to the unprivileged
   ``nobody`` user (``setpriv``, no capabilities, ``no_new_privs``); as another
   user it runs in a user namespace under that user's id. ``--die-with-parent``
   and the PID namespace make sure nothing it starts outlives it.

The worker and the driver import it too (:func:`unavailable_reason`); like all of
:mod:`autograder.sandbox` it uses the standard library only, so a kernel's launch costs
milliseconds before bubblewrap.
"""

import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys

from .cgroups import cgroup_version, create_cgroup, kernel_group, sweep_cgroups
from .limits import SandboxLimits

NOBODY = 65534
SCRATCH = "/tmp"     # the kernel's home, working directory and only writable place
# JSON {socket path: inherited listening descriptor}: the kernel's ZeroMQ sockets, bound by
# the worker in the read-only socket folder (kept equal to autograder.kernel.boot.SOCKETS_ENV)
SOCKETS_ENV = "AUTOGRADER_SOCKETS"
# the pid of the process that launches the kernel (the worker): the launcher dies with it
PARENT_ENV = "AUTOGRADER_LAUNCHED_BY"
GRADER_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the launcher's whole program: import this module from the grader's own folder, launch
BOOT = (f"import sys; sys.path.insert(0, {GRADER_ROOT!r}); "
        "from autograder.sandbox.launcher import launch; launch(sys.argv[1:])")


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


def kernel_environment():
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


def bwrap_argv(kernel_argv, socket_dir, limits: SandboxLimits, *, as_root, sockets=None):
    """The ``bwrap`` command line that runs ``kernel_argv`` in the sandbox (``sockets``: the
    value of :data:`SOCKETS_ENV` the kernel gets, if any)."""
    argv = [shutil.which("bwrap") or "bwrap",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session",
            "--hostname", "grader", "--clearenv"]
    if not as_root:
        argv += ["--unshare-user"]
    for key, value in kernel_environment().items():
        argv += ["--setenv", key, value]
    if sockets:
        argv += ["--setenv", SOCKETS_ENV, sockets]
    argv += system_binds()
    # the scratch tmpfs first: a Python or a course that lives under /tmp is mounted over it
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(limits.disk_mb * 2**20), "--tmpfs", SCRATCH]
    argv += _mount_tree(python_roots())
    for parent in _ancestors(socket_dir):
        if parent != SCRATCH:
            argv += ["--perms", "0755", "--dir", parent]
    # read-only: nothing the kernel writes is a path the host acts on, or outside its caps
    argv += ["--ro-bind", socket_dir, socket_dir, "--chdir", SCRATCH]
    if as_root:  # become nobody: no capabilities, and no way to regain any
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                 shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={NOBODY}",
                 f"--regid={NOBODY}", "--clear-groups", "--no-new-privs", "--"]
    else:
        argv += ["--"]
    return argv + list(kernel_argv)


def rlimits(limits: SandboxLimits):
    """``(resource, value)`` caps, soft and hard alike: address space, CPU seconds, file size,
    no core dumps (0 in ``limits``: no cap of that kind; for the address space, none of the
    grading worker's own either, whose data cap the kernel does not inherit)."""
    caps = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, limits.disk_mb * 2**20),
            (resource.RLIMIT_DATA, resource.RLIM_INFINITY),  # not the grading worker's own cap
            (resource.RLIMIT_AS, limits.memory_mb * 2**20 or resource.RLIM_INFINITY)]
    if limits.cpu_seconds > 0:
        caps.append((resource.RLIMIT_CPU, limits.cpu_seconds))
    return caps


def set_rlimits(limits: SandboxLimits):
    """Set :func:`rlimits`: inherited by bubblewrap and the kernel (never above a hard
    limit this process was given)."""
    for which, value in rlimits(limits):
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY and (value == resource.RLIM_INFINITY or value > hard):
            value = hard
        resource.setrlimit(which, (value, value))


def boot_source():
    """The source the kernel runs first: :mod:`autograder.kernel.boot` without its module
    docstring (which documents it for maintainers and would otherwise ride on every kernel's
    command line). The file starts with that docstring, which holds no triple quote."""
    with open(os.path.join(GRADER_ROOT, "autograder", "kernel", "boot.py"), encoding="utf-8") as f:
        source = f.read()
    if source.startswith('"""'):
        source = source[source.index('"""', 3) + 3:].lstrip("\n")
    return source


def kernel_argv(argv):
    """The kernel's own command: the boot code (:func:`boot_source`, which hooks SDPA before
    any student code runs), then ipykernel with ``argv``."""
    return [sys.executable, "-P", "-X", "frozen_modules=off", "-c", boot_source(), *argv]


def die_with_launcher():
    """SIGKILL this process when the process that launched it ends (``PR_SET_PDEATHSIG``,
    kept across ``execve`` into bwrap), and exit now if that process has already ended: a
    worker killed while its kernel was starting must not leave a kernel or a cgroup behind."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    expected = os.environ.get(PARENT_ENV)
    if expected and os.getppid() != int(expected):
        sys.exit("autograder sandbox: the process that launched this kernel has ended; "
                 "not starting a kernel")


def launch(argv):
    """The launcher: cgroup, rlimits, then exec bwrap with the kernel command."""
    die_with_launcher()
    try:
        limits = SandboxLimits.from_environment(os.environ)
    except ValueError as error:
        sys.exit(f"autograder sandbox: {error}; not starting a kernel")
    if limits is None:
        sys.exit("autograder sandbox: no limits in the environment; not starting a kernel")
    connection_file = argv[argv.index("-f") + 1]
    socket_dir = os.path.dirname(os.path.abspath(connection_file))
    as_root = os.geteuid() == 0
    if as_root:
        sweep_cgroups()
        if cgroup_version() and not create_cgroup(kernel_group(os.getpid()), limits.max_tasks,
                                                  limits.memory_mb * 2**20):
            sys.exit("autograder sandbox: cannot create the kernel's cgroup; not starting a kernel "
                     "without its process and memory caps")
    set_rlimits(limits)
    kernel = kernel_argv(argv)
    command = bwrap_argv(kernel, socket_dir, limits, as_root=as_root,
                         sockets=os.environ.get(SOCKETS_ENV))
    os.execv(command[0], command)


def unavailable_reason():
    """None if kernels can be sandboxed here, else one line that says why and what to install."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv is not installed (apt-get install util-linux)"
    probe = bwrap_argv(["/bin/true"], "/tmp", SandboxLimits(memory_mb=0, max_tasks=0, disk_mb=1,
                                                            cpu_seconds=0),
                       as_root=os.geteuid() == 0)
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, text=True)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap cannot start a sandbox: {error}"
    if done.returncode != 0:
        return f"bwrap cannot start a sandbox: {done.stderr.strip()[:200]}"
    return None

