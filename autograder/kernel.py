"""The grading kernel: an ordinary IPython kernel started under limits.

``python -m autograder.kernel -f CONNECTION_FILE [ipykernel options]`` is what
:class:`LimitedKernelManager` launches for every submission. Before any student
code runs it

1. caps the address space (``RLIMIT_AS``, from ``AUTOGRADER_MEMORY_MB``) and
   disables core dumps, so a memory bomb ends in ``MemoryError`` or a dead
   kernel, never in a machine that swaps;
2. moves into a fresh network namespace with no interfaces
   (``unshare(CLONE_NEWNET)``, when ``AUTOGRADER_NO_NETWORK=1`` and the OS
   allows it). The kernel talks to the grader over Unix sockets (``ipc``
   transport), which do not need a network;
3. writes its pid into ``AUTOGRADER_PIDDIR`` so that a grader which has to give
   up on a kernel can kill its whole process group, and, as root, joins a pids
   cgroup of its own (at most ``AUTOGRADER_MAX_TASKS`` tasks: no fork bomb);
4. initialises IPython and imports ``autograder.checks._guard`` (when the
   course has one) before the first cell, so the guard snapshots pristine
   NumPy/torch functions before a student can monkeypatch them. A guard that
   exists but fails to import stops the kernel: grading without it is unsafe;
5. registers :func:`pristine_restorer`, which undoes monkeypatching of NumPy,
   ``transformer_ref`` and the checks before every cell.

``python -m autograder.kernel --serve SOCKET [module ...]`` is the *kernel
server* of a grading worker: it imports ipykernel, the given modules (NumPy,
torch) and the checks once, then forks a fresh kernel per request, which then
does steps 1-5. Kernel start-up and ``import torch`` are paid once per worker.
"""

import ctypes
import importlib.util
import json
import os
import resource
import select
import signal
import socket
import sys
import time
import uuid

from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning import LocalProvisioner

CLONE_NEWNET = 0x40000000
GUARD = "autograder.checks._guard"
SERVER = "AUTOGRADER_KERNEL_SERVER"  # environment variable: the kernel server's socket


def limit_memory(megabytes):
    """Cap this process's address space at ``megabytes`` MiB (0 = no cap)."""
    if megabytes > 0:
        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def join_process_cgroup(maximum):
    """Move this process into its own pids cgroup of at most ``maximum`` tasks.

    The run's cgroup (``AUTOGRADER_CGROUP``, a folder of the cgroup-v1 ``pids``
    controller created by the driver when it runs as root) gets one sub-group per
    kernel, named by its pid, so a fork bomb stops at ``maximum`` tasks (threads
    count too) and :func:`kill_process_cgroup` can kill every descendant, even
    those that left the kernel's process group. Returns False when unavailable.
    """
    base = os.environ.get("AUTOGRADER_CGROUP")
    if not base or maximum <= 0:
        return False
    path = os.path.join(base, str(os.getpid()))
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(maximum))
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        return True
    except OSError:
        return False


def kill_process_cgroup(pid, base=None):
    """SIGKILL every task in the kernel ``pid``'s pids cgroup, then remove the group."""
    base = base or os.environ.get("AUTOGRADER_CGROUP")
    if not base:
        return
    path = os.path.join(base, str(pid))
    for _ in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                tasks = [int(line) for line in f if line.strip()]
        except OSError:
            return
        for task in tasks:
            try:
                os.kill(task, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(path)
            return
        except OSError:  # tasks still exiting
            time.sleep(0.02)


def make_run_cgroup():
    """Create a pids cgroup for one grading run; its path, or None without permission."""
    root = "/sys/fs/cgroup/pids"
    path = os.path.join(root, f"autograder-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(path)
        return path
    except OSError:
        return None


def remove_run_cgroup(path):
    """Kill whatever is left in a run's cgroup and remove it."""
    if not path or not os.path.isdir(path):
        return
    for name in os.listdir(path):
        if name.isdigit():
            kill_process_cgroup(int(name), path)
    try:
        os.rmdir(path)
    except OSError:
        pass


def isolate_network():
    """Enter an empty network namespace; return True on success (needs root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.unshare(CLONE_NEWNET) == 0


def main(argv):
    """Start one kernel in this process (a normal launch, or a fork of the server)."""
    limit_memory(int(os.environ.get("AUTOGRADER_MEMORY_MB", "0")))
    join_process_cgroup(int(os.environ.get("AUTOGRADER_MAX_TASKS", "0")))
    if os.environ.get("AUTOGRADER_NO_NETWORK") == "1":
        isolate_network()
    piddir = os.environ.get("AUTOGRADER_PIDDIR")
    if piddir:
        open(os.path.join(piddir, str(os.getpid())), "w").close()

    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(argv)
    if importlib.util.find_spec("autograder.checks") and importlib.util.find_spec(GUARD):
        importlib.import_module(GUARD)
    app.shell.events.register("pre_run_cell", pristine_restorer())
    app.start()


# -- the kernel server: pay for imports once per worker, not once per student ----------
def preload(modules):
    """Import what every kernel would import anyway (ipykernel, NumPy, torch, the checks)."""
    import ipykernel.kernelapp  # noqa: F401
    import IPython  # noqa: F401

    for name in modules:
        importlib.import_module(name)
    if importlib.util.find_spec("autograder.checks") and importlib.util.find_spec(GUARD):
        importlib.import_module(GUARD)


def serve(path, modules):
    """Fork a fresh kernel for every request on the Unix socket ``path``.

    The server imports the heavy modules once and never runs student code; each
    kernel is a fork of that pristine process (copy-on-write: nothing is shared
    between students), in its own session, with the limits of :func:`main`. A
    request is one JSON line ``{"argv", "cwd", "env"}``; the answer is the pid.
    The server exits when its worker (parent) dies.
    """
    import json
    import signal
    import socket

    preload(modules)
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".tmp")
    os.rename(path + ".tmp", path)  # the socket appears only when it is ready
    server.listen(8)
    server.settimeout(1.0)
    signal.signal(signal.SIGCHLD, lambda *_: reap())
    while os.getppid() == parent:
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        with conn, conn.makefile("r") as lines:
            try:
                request = json.loads(lines.readline())
            except ValueError:
                continue
            pid = os.fork()
            if pid == 0:  # the kernel
                server.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.setsid()
                os.chdir(request["cwd"])
                os.environ.clear()
                os.environ.update(request["env"])
                try:
                    main(request["argv"])
                finally:
                    os._exit(0)
            conn.sendall(f"{pid}\n".encode())


def reap():
    """Collect exited kernels so that they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def pristine_restorer():
    """A ``pre_run_cell`` hook that undoes monkeypatching before every cell.

    It snapshots, now (before any student code), the attributes of every loaded
    module of NumPy, ``math``, ``transformer_ref`` and ``autograder`` (and of torch's
    main namespaces when torch is loaded), the code of
    their functions, their ``sys.modules`` entries and the common builtins. Before
    each cell it puts back whatever a previous cell replaced, so a test cell always
    runs against pristine libraries and checks, whatever the student patched
    (``np.allclose = ...``, ``checks.rope.check_apply_rope = ...``,
    ``fn.__code__ = ...``). The hook holds its own references to everything it
    uses, so rebinding ``setattr``, ``sys.modules`` or a module does not defeat it.
    """
    import builtins
    import types

    prefixes = ("numpy", "math", "transformer_ref", "autograder")
    torch_api = ("torch", "torch.nn", "torch.nn.functional", "torch.linalg", "torch.testing")
    modules = {name: m for name, m in sys.modules.items()
               if m is not None and (name.split(".")[0] in prefixes or name in torch_api)}
    saved = [(vars(m), [(k, v) for k, v in vars(m).items() if not k.startswith("__")])
             for m in modules.values()]
    code = [(f, f.__code__, f.__defaults__, f.__kwdefaults__)
            for _, items in saved for _, f in items
            if isinstance(f, types.FunctionType) and f.__module__ in modules]
    ipython_owned = {"exit", "quit", "get_ipython", "display", "help", "copyright", "credits", "license"}
    names = [n for n in dir(builtins) if not n.startswith("_") and n not in ipython_owned]
    names += ["__import__", "__build_class__"]
    saved.append((vars(builtins), [(n, getattr(builtins, n)) for n in names]))
    sys_modules, missing = sys.modules, object()

    def restore(*_):
        for namespace, items in saved:
            for key, value in items:
                if namespace.get(key, missing) is not value:
                    namespace[key] = value
        for name, module in modules.items():
            if sys_modules.get(name) is not module:
                sys_modules[name] = module
        for fn, c, defaults, kwdefaults in code:
            if fn.__code__ is not c or fn.__defaults__ is not defaults or fn.__kwdefaults__ is not kwdefaults:
                fn.__code__, fn.__defaults__, fn.__kwdefaults__ = c, defaults, kwdefaults

    return restore


class ForkedKernel:
    """The ``Popen`` interface jupyter_client needs, for a kernel forked by the server."""

    stdin = stdout = stderr = None

    def __init__(self, pid):
        self.pid, self.returncode = pid, None
        self._fd = os.pidfd_open(pid)  # becomes readable when the process exits

    def poll(self):
        if self.returncode is None and select.select([self._fd], [], [], 0)[0]:
            self.returncode = -signal.SIGKILL
            os.close(self._fd)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            select.select([self._fd], [], [], timeout)
        return self.poll()

    def send_signal(self, signum):
        os.kill(self.pid, signum)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)


class ForkingProvisioner(LocalProvisioner):
    """Launches kernels by asking the worker's kernel server to fork one."""

    async def launch_kernel(self, cmd, **kwargs):
        argv = cmd[cmd.index("autograder.kernel") + 1:]
        request = dict(argv=argv, cwd=str(kwargs.get("cwd") or os.getcwd()),
                       env=dict(kwargs.get("env") or os.environ))
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(30)
                conn.connect(os.environ[SERVER])
                conn.sendall((json.dumps(request) + "\n").encode())
                pid = int(conn.makefile("r").readline())
        except (OSError, ValueError):  # no server (any more): start a process as usual
            return await super().launch_kernel(cmd, **kwargs)
        self.process = ForkedKernel(pid)
        self.pid = self.pgid = pid  # the kernel leads its own session and group
        self.cwd = request["cwd"]
        return self.connection_info


class LimitedKernelManager(AsyncKernelManager):
    """Starts :mod:`autograder.kernel` kernels instead of ``ipykernel_launcher`` ones.

    The limits travel in the environment (set by the grading worker), so the
    command line stays the one nbclient expects: ``-f {connection_file}`` plus
    nbgrader's extra arguments. When the worker runs a kernel server
    (``AUTOGRADER_KERNEL_SERVER`` names its socket), kernels are forked from it;
    otherwise each is a new process. ``-P`` keeps the kernel's working directory
    (the submission) off ``sys.path``.
    """

    def format_kernel_cmd(self, extra_arguments=None):
        return [
            sys.executable, "-P", "-X", "frozen_modules=off", "-m", "autograder.kernel",
            "-f", self.connection_file, *(extra_arguments or []),
        ]

    async def _async_pre_start_kernel(self, **kw):
        if self.provisioner is None and os.environ.get(SERVER):
            self.kernel_id = self.kernel_id or str(uuid.uuid4())
            self.provisioner = ForkingProvisioner(
                kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self)
        return await super()._async_pre_start_kernel(**kw)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], sys.argv[3:])
    else:
        main(sys.argv[1:])
