"""What the sandbox enforces on one kernel, as the launcher receives it.

:class:`SandboxLimits` is the part of a run's limits that the launcher
(:mod:`autograder.sandbox.launcher`) turns into cgroup caps, resource limits and the size
of the scratch folder. It crosses into the launcher's process as JSON in one environment
variable (:data:`ENV`), written by the worker or the kernel manager and read back by the
launcher; :meth:`SandboxLimits.from_json` refuses anything that is not exactly such a record.
The default values live in :class:`autograder.core.limits.Limits` alone
(``Limits().sandbox()``); this module is standard library only, as all of ``sandbox/``.
"""

import json
from dataclasses import asdict, dataclass, fields

ENV = "AUTOGRADER_LIMITS"  # the environment variable that carries the limits to the launcher


@dataclass(frozen=True)
class SandboxLimits:
    """Caps of one kernel and everything it starts (0: no cap).

    * ``memory_mb``: the cgroup's memory cap and each process's address space (``RLIMIT_AS``);
    * ``max_tasks``: processes and threads (cgroup ``pids``);
    * ``disk_mb``: size of the private scratch folder, and of the largest file (``RLIMIT_FSIZE``);
    * ``cpu_seconds``: CPU time of each process (``RLIMIT_CPU``).
    """

    memory_mb: int
    max_tasks: int
    disk_mb: int
    cpu_seconds: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "SandboxLimits":
        """The record :meth:`to_json` wrote; ``ValueError`` (one line) for anything else."""
        try:
            values = json.loads(text)
        except (TypeError, ValueError):
            raise ValueError(f"{ENV} is not JSON: {str(text)[:80]!r}") from None
        names = [f.name for f in fields(cls)]
        if not isinstance(values, dict) or sorted(values) != sorted(names):
            raise ValueError(f"{ENV} must hold exactly {', '.join(names)}")
        bad = [n for n in names if type(values[n]) is not int or values[n] < 0]
        if bad:
            raise ValueError(f"{ENV}: {', '.join(bad)} must be whole numbers >= 0")
        return cls(**values)

    def environment(self) -> dict:
        """``{ENV: json}``: how the limits reach the launcher."""
        return {ENV: self.to_json()}

    @classmethod
    def from_environment(cls, environ) -> "SandboxLimits | None":
        """The limits in ``environ``, or None when it holds none (``ValueError`` if malformed)."""
        text = environ.get(ENV)
        return cls.from_json(text) if text else None
