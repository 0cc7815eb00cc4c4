"""The kernel manager of grading: every kernel starts inside the OS sandbox.

:class:`SandboxedKernelManager` is what nbgrader's executor (the driver's workers
and stock ``nbgrader autograde`` through the course's ``nbgrader_config.py``)
uses instead of jupyter_client's default. For each kernel it

* makes a fresh private folder (owned by the sandbox's user) that holds the
  connection file and the kernel's Unix sockets: the only folder the kernel and
  the worker share (``transport = "ipc"``: the kernel has no network at all);
* launches :mod:`autograder.sandbox.launcher` (see there) with the run's limits, which
  starts the kernel under bubblewrap as ``nobody`` in its own cgroup;
* interrupts by message (a signal to the launcher would not cross the sandbox's
  PID namespace), and on shutdown kills the kernel's whole cgroup and removes
  its folder, so nothing the student started survives the kernel.

Without bubblewrap (and only when the caller explicitly allows unsandboxed
kernels, e.g. to run the instructor's own solutions) it starts a plain kernel.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Bool, Unicode

from ..core.limits import Limits
from ..sandbox import cgroups
from ..sandbox.launcher import BOOT, NOBODY, kernel_argv


class SandboxedKernelManager(AsyncKernelManager):
    """Starts each grading kernel in the sandbox of :mod:`autograder.sandbox.launcher`."""

    sandboxed = Bool(True, help="Start kernels under bubblewrap (False: plain local kernels, "
                                "for trusted notebooks only).").tag(config=True)
    socket_root = Unicode("", help="Where the per-kernel socket folders are made "
                                   "(default: the system's temporary folder).").tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.transport = "ipc"
        self._private = None

    def format_kernel_cmd(self, extra_arguments=None):
        extra = list(extra_arguments or [])
        if not self.sandboxed:
            return kernel_argv(["-f", self.connection_file, *extra])  # the boot code, unsandboxed
        return [sys.executable, "-I", "-c", BOOT, "-f", self.connection_file, *extra]

    async def _async_pre_start_kernel(self, **kw):
        # a fresh folder for this kernel's connection file and sockets
        self._private = Path(tempfile.mkdtemp(prefix="kernel-", dir=self.socket_root or None))
        self.connection_file = str(self._private / "connection.json")
        self.ip = str(self._private / "k")
        env = dict(kw.pop("env", None) or os.environ)
        env.update(Limits.from_environment(env).environment())
        kw["env"] = env
        result = await super()._async_pre_start_kernel(**kw)
        if self.sandboxed:
            self.kernel_spec.interrupt_mode = "message"
            if os.geteuid() == 0:  # the kernel runs as nobody: let it use its own folder
                for path in (self._private, Path(self.connection_file)):
                    os.chown(path, NOBODY, NOBODY)
        return result

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

    async def _async_cleanup_resources(self, restart=False):
        self.kill_everything()
        await super()._async_cleanup_resources(restart=restart)
        if self._private is not None and not restart:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None
