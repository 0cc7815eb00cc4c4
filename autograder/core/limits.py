"""The limits of a grading run: one value, one source of every default.

The command line (``python -m autograder grade --timeout-cell ...``), the driver,
the workers, the executor, the sandbox launcher and the course's
``nbgrader_config.py`` all read these defaults from here; the value travels to
the sandbox launcher as JSON in one environment variable.
"""

import json
import os
from dataclasses import asdict, dataclass, fields

ENV = "AUTOGRADER_LIMITS"


@dataclass(frozen=True)
class Limits:
    """What one submission may use.

    * ``cell_timeout``: seconds per cell (the judge's calls of one test cell included);
    * ``notebook_timeout``: wall-clock seconds for the whole notebook;
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

    def for_sandbox(self):
        """The JSON the sandbox launcher reads (``cpu_seconds`` resolved)."""
        values = asdict(self)
        values["cpu_limit"] = self.cpu_seconds or int(self.notebook_timeout) + 60
        return json.dumps(values)

    def environment(self):
        """``{ENV: json}``: how the limits reach the sandbox launcher."""
        return {ENV: self.for_sandbox()}

    @classmethod
    def from_environment(cls, environ=None):
        """The limits in ``environ`` (default ``os.environ``), else the defaults."""
        text = (environ or os.environ).get(ENV)
        if not text:
            return cls()
        values = json.loads(text)
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})
