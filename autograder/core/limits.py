"""The limits of a grading run: one value, one source of every default.

The command line (``python -m autograder grade --timeout-cell ...``), the driver,
the workers, the executor, the sandbox launcher and the course's
``nbgrader_config.py`` all read these defaults from here; the sandbox's part
(:meth:`Limits.sandbox`, a :class:`~autograder.sandbox.limits.SandboxLimits`) travels to
the sandbox launcher as JSON in one environment variable.
"""

import os
import resource
from dataclasses import dataclass, fields

from ..sandbox.limits import SandboxLimits

# Memory of one local grading worker process, its own cap apart from its kernels': the
# soft RLIMIT_DATA (heap and private writable mappings, what a decoded reply costs; not the
# address space merely reserved by PyTorch and thread arenas). A worker grading normally uses
# 125-300 MiB; a reply is bounded before it is decoded (autograder.kernel.probe.check_bounds),
# and anything that still asks for more gets a MemoryError inside the judge, which fails that
# test cell, not the worker. A Dask worker's cap is its nanny's ``--memory-limit``.
WORKER_MEMORY_MB = 4096

# How much longer than its limit a notebook may take on the wall clock while the host gives
# its kernel less than a CPU (limits are charged on autograder.judge.clock.ChargedClock, which
# does not count the waits for a CPU): the driver's watchdog gives up a student after this
# many times the notebook's limit (plus margins), as an error, never a grade.
LOAD_ALLOWANCE = 3


def cap_worker_memory(mb=WORKER_MEMORY_MB):
    """Set this process's soft ``RLIMIT_DATA`` to ``mb`` MiB (the hard limit stays: the sandbox
    launcher gives each kernel its own caps, see ``launcher.set_rlimits``)."""
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    cap = mb * 2**20
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))


@dataclass(frozen=True)
class Limits:
    """What one submission may use.

    * ``cell_timeout``: seconds per cell (the judge's calls of one test cell included);
    * ``notebook_timeout``: seconds for the whole notebook (both charged on
      :class:`autograder.judge.clock.ChargedClock`: time the host gave to other work is not
      counted; the watchdog allows :data:`LOAD_ALLOWANCE` times the wall seconds);
    * ``memory_mb``: memory of the kernel and everything it starts (cgroup), and its
      address space (``RLIMIT_AS``);
    * ``output_limit``: bytes of output kept per cell;
    * ``max_tasks``: processes and threads of one kernel (cgroup ``pids``);
    * ``disk_mb``: size of the kernel's private scratch folder (and largest file);
    * ``cpu_seconds``: CPU time of each kernel process (``RLIMIT_CPU``; 0 = the
      notebook's wall clock).
    """

    cell_timeout: int = 30
    notebook_timeout: float = 600.0
    memory_mb: int = 4096
    output_limit: int = 200_000
    max_tasks: int = 128
    disk_mb: int = 256
    cpu_seconds: int = 0

    def sandbox(self) -> SandboxLimits:
        """What the sandbox enforces on each kernel (``cpu_seconds`` resolved: 0 becomes the
        notebook's wall clock plus a minute)."""
        return SandboxLimits(memory_mb=self.memory_mb, max_tasks=self.max_tasks,
                             disk_mb=self.disk_mb,
                             cpu_seconds=self.cpu_seconds or int(self.notebook_timeout) + 60)

    def environment(self):
        """How the sandbox's part reaches the launcher: ``{AUTOGRADER_LIMITS: json}``."""
        return self.sandbox().environment()


RETRIES_ENV = "AUTOGRADER_RETRIES"  # the grade process's environment variable that sets Retries


@dataclass(frozen=True)
class Retries:
    """How hard the grading host tries before a failure is its own fault, never a student's.

    * ``kernel_start_tries``: a kernel that does not come up (no reply to ``kernel_info``
      within the start-up timeout, its process dead) is tried this often, at least once;
      then the notebook is the host's fault
      (:class:`~autograder.judge.execute.KernelStartError`) and, in a worker's preflight,
      the run stops;
    * ``kernel_start_pause``: seconds between two tries.

    The defaults suit a grading host; ``AUTOGRADER_RETRIES`` in the environment of
    ``python -m autograder grade`` overrides them for the whole run, Dask workers included
    (they receive them with the run's settings), e.g.
    ``AUTOGRADER_RETRIES="kernel_start_tries=1,kernel_start_pause=0"`` (what the fault
    tests use: an injected fault is certain, a retry would only wait for it again).
    """

    kernel_start_tries: int = 3
    kernel_start_pause: float = 1.0

    def __post_init__(self):
        if type(self.kernel_start_tries) is not int or self.kernel_start_tries < 1:
            raise ValueError(f"kernel_start_tries={self.kernel_start_tries!r}: a whole number >= 1")
        if not isinstance(self.kernel_start_pause, (int, float)) or not 0 <= self.kernel_start_pause <= 60:
            raise ValueError(f"kernel_start_pause={self.kernel_start_pause!r}: seconds from 0 to 60")

    @classmethod
    def parse(cls, text: str) -> "Retries":
        """The settings spelled ``name=value,name=value`` (names of the fields; the others keep
        their defaults); ``ValueError`` with one line naming what is wrong."""
        kinds = {f.name: f.type for f in fields(cls)}
        values = {}
        for part in (p.strip() for p in text.split(",")):
            name, equals, value = part.partition("=")
            if not equals or name.strip() not in kinds:
                raise ValueError(f"{RETRIES_ENV}: {part!r} is not one of "
                                 f"{', '.join(f'{n}=VALUE' for n in kinds)}")
            try:
                values[name.strip()] = (int if kinds[name.strip()] in (int, "int") else float)(value)
            except ValueError:
                raise ValueError(f"{RETRIES_ENV}: {name.strip()}={value!r} is not a number") from None
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"{RETRIES_ENV}: {error}") from None

    @classmethod
    def from_environment(cls, environ=None) -> "Retries":
        """The settings of ``environ`` (default ``os.environ``): the defaults without
        :data:`RETRIES_ENV`; ``ValueError`` (one line) if it is malformed."""
        text = (os.environ if environ is None else environ).get(RETRIES_ENV, "").strip()
        return cls.parse(text) if text else cls()
