"""The kernel manager of grading: every kernel starts inside the OS sandbox.

:class:`SandboxedKernelManager` is what nbgrader's executor (the driver's workers
and stock ``nbgrader autograde`` through the course's ``nbgrader_config.py``)
uses instead of jupyter_client's default. For each kernel it

* makes a fresh private folder that holds the connection file and the kernel's Unix
  sockets: the only folder the kernel and the worker share (``transport = "ipc"``: the
  kernel has no network at all). The folder and everything in it belong to the grader,
  and the sandbox mounts it read-only: the kernel cannot create, rename, unlink or grow
  anything there, so every operation of the host on a path in it (bind, chmod, unlink,
  connect, remove) acts on what the host itself made. The host binds and listens on the
  kernel's five ZeroMQ sockets itself and passes the listening descriptors into the
  sandbox (:data:`SOCKETS_ENV`; the kernel's boot code hands each to ZeroMQ with
  ``ZMQ_USE_FD``), so the kernel needs no write access to bind them. It is made under a
  short fixed root (:data:`SOCKET_BASE`, or a run's folder made there by
  :func:`autograder.core.grading_run.make_socket_root`), never under ``TMPDIR`` or the course: a Unix socket's path
  must fit in 107 bytes, however long the host's paths are (:func:`check_socket_path`);
* launches :mod:`autograder.sandbox.launcher` (see there) with the run's limits, which
  starts the kernel under bubblewrap as ``nobody`` in its own cgroup;
* interrupts by message (a signal to the launcher would not cross the sandbox's
  PID namespace), and on shutdown kills the kernel's whole cgroup and removes
  its folder, so nothing the student started survives the kernel.

Without bubblewrap (and only when the caller explicitly allows unsandboxed
kernels, e.g. to run the instructor's own solutions) it starts a plain kernel.
"""

import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Bool, Unicode

from ..core.grading_run import SOCKET_BASE
from ..core.limits import Limits
from ..sandbox import cgroups
from ..sandbox.launcher import BOOT, NOBODY, PARENT_ENV, SOCKETS_ENV, kernel_argv
from ..sandbox.limits import SandboxLimits


SUN_PATH_MAX = 107    # bytes of a Unix socket's path (Linux's sun_path, less its final NUL)
PORT_SUFFIX = "-65535"  # what zmq's ipc transport appends to ``ip`` for each channel, at most
KILLED_POLL = 0.005     # seconds between looks at a killed kernel's process (see _async_wait)


class SocketPathError(OSError):
    """A kernel's socket path would not fit in a Unix socket address."""


def check_socket_path(ip):
    """Raise :class:`SocketPathError` unless every socket ``ip-PORT`` fits in ``sun_path``."""
    if len((ip + PORT_SUFFIX).encode()) > SUN_PATH_MAX:
        raise SocketPathError(f"the kernel's socket path {ip}{PORT_SUFFIX} is longer than "
                              f"{SUN_PATH_MAX} bytes (socket_root is too deep)")


class SandboxedKernelManager(AsyncKernelManager):
    """Starts each grading kernel in the sandbox of :mod:`autograder.sandbox.launcher`."""

    sandboxed = Bool(True, help="Start kernels under bubblewrap (False: plain local kernels, "
                                "for trusted notebooks only).").tag(config=True)
    socket_root = Unicode("", help="Where the per-kernel socket folders are made (default: "
                                   f"{SOCKET_BASE}, never TMPDIR: socket paths must stay short)."
                          ).tag(config=True)
    startup_log = Unicode("", help="A file that gets the kernel's stderr (default: the "
                                   "worker's): for a kernel that runs no student code, to tell "
                                   "why it could not start (the preflight's).").tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.transport = "ipc"
        self._private = None
        self._listening = []  # the kernel's listening sockets, until they are passed in

    def format_kernel_cmd(self, extra_arguments=None):
        extra = list(extra_arguments or [])
        if not self.sandboxed:
            return kernel_argv(["-f", self.connection_file, *extra])  # the boot code, unsandboxed
        return [sys.executable, "-I", "-c", BOOT, "-f", self.connection_file, *extra]

    async def _async_pre_start_kernel(self, **kw):
        # a fresh folder for this kernel's connection file and sockets: the grader's, 0711
        self._private = Path(tempfile.mkdtemp(prefix="kernel-", dir=self.socket_root or SOCKET_BASE))
        os.chmod(self._private, 0o711)  # the kernel's user reaches its files by name
        self.connection_file = str(self._private / "connection.json")
        self.ip = str(self._private / "k")
        try:
            check_socket_path(self.ip)
        except SocketPathError:
            shutil.rmtree(self._private, ignore_errors=True)
            raise
        if self.startup_log:
            kw["stderr"] = open(self.startup_log, "ab")  # the kernel's copy; ours closes at launch
        env = dict(kw.pop("env", None) or os.environ)
        env.update((SandboxLimits.from_environment(env) or Limits().sandbox()).environment())
        env[PARENT_ENV] = str(os.getpid())  # the launcher dies with this process
        kw["env"] = env
        cmd, kw = await super()._async_pre_start_kernel(**kw)
        if self.sandboxed:
            self.kernel_spec.interrupt_mode = "message"
            kw["env"][SOCKETS_ENV] = json.dumps(self._listen())
            if os.geteuid() == 0:  # the kernel runs as nobody: it reads its connection file
                os.chown(self.connection_file, NOBODY, NOBODY, follow_symlinks=False)
        return cmd, kw

    def _listen(self):
        """Bind and listen on the kernel's five sockets (paths in this kernel's folder, which
        only the grader can write); ``{path: descriptor}`` for the kernel's boot code."""
        self._close_listening()
        passed = {}
        for port in self.ports:
            path = f"{self.ip}-{port}"
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listening.append(listener)
            if os.path.lexists(path):
                os.unlink(path)
            listener.bind(path)
            listener.listen(64)
            passed[path] = listener.fileno()
        return passed

    def _close_listening(self):
        for listener in self._listening:
            listener.close()
        self._listening = []

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        if self._listening:  # inherited by the launcher, bwrap and the kernel
            kw["pass_fds"] = tuple(listener.fileno() for listener in self._listening)
        try:
            await super()._async_launch_kernel(kernel_cmd, **kw)
        finally:
            self._close_listening()  # the kernel holds them now; the paths stay bound
            if self.startup_log and kw.get("stderr") is not None:
                kw["stderr"].close()

    @property
    def cgroup(self):
        """The name of this kernel's cgroup (see :func:`autograder.sandbox.cgroups.kernel_group`), or None."""
        pid = getattr(self.provisioner, "pid", None) if self.provisioner else None
        return cgroups.kernel_group(pid) if pid else None

    def kill_everything(self):
        """SIGKILL the kernel and every process it started (its whole cgroup)."""
        name = self.cgroup
        if self.provisioner is not None and self.provisioner.process is not None:
            try:
                self.provisioner.process.kill()
            except OSError:
                pass
        if name:
            cgroups.kill_cgroup(name)

    async def _async_wait(self, pollinterval=0.1):
        """Wait for a killed kernel's process to end, looking every :data:`KILLED_POLL` s.

        It ends within milliseconds of its SIGKILL. jupyter_client looks once right after the
        signal, too early, and then every 0.1 s: a tenth of a second of every notebook in
        which the worker waits for nothing.
        """
        await super()._async_wait(pollinterval=min(pollinterval, KILLED_POLL))

    async def _async_cleanup_resources(self, restart=False):
        self._close_listening()
        self.kill_everything()
        await super()._async_cleanup_resources(restart=restart)
        if self._private is not None and not restart:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None
