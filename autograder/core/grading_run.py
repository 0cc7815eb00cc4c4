"""What a grading run hands its grading processes, and how it names the code they run.

The host (``grade``, ``serve``) plans a run; grading workers (forked local workers,
:mod:`autograder.worker.loop`, or Dask workers, :mod:`autograder.worker.plugin`) grade. This
module is what both sides load:

* :class:`Settings`, everything a worker needs, and :class:`RunPayload`, what every Dask
  worker of one run receives (settings, student version, template gradebook): plain,
  picklable data;
* :func:`grader_digest`: the host and every Dask worker must grade with the same code;
* :func:`make_socket_root`: the run's short folder of kernel sockets (the host's, and each
  Dask worker's own), a scratch folder like the run's others (:mod:`autograder.core.scratch`),
  and :func:`sweep_dead_runs`, which removes those of runs whose process was killed outright;
* :func:`last_bytes`: the tail of a worker's log, read by the worker (its preflight's kernel
  log) and by the host (a failed worker's log);
* **the rule for entry points**: the host never imports ``worker/``. It names the worker code
  it starts by module and attribute (:func:`call_by_name` as a process target or a Dask task,
  :class:`autograder.host.cluster.PluginByName` for a Dask worker plugin); the worker process imports that module
  when it runs it. Code the host must hand over as an object (:func:`forget_plugin`, which
  Dask calls with the worker) lives here, in ``core/``, since both processes import it.
"""

import hashlib
import importlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .limits import Limits, Retries
from .policy import CourseSettings
from .scratch import make_scratch, sweep_scratch


@dataclass
class Settings:
    """Everything a worker needs, picklable."""

    root: str
    assignment: str
    template_db: str       # SQLite gradebook that knows the assignment
    release_dir: str       # student version, generated for this run
    workdir: str           # scratch space of the whole run (no kernel can see it)
    limits: Limits = field(default_factory=Limits)
    retries: Retries = field(default_factory=Retries)  # how often kernels are tried (the host's)
    sandboxed: bool = True  # False only for trusted notebooks (the instructor's own)
    run_id: str = ""        # names this run's kernel cgroups, so the driver can kill them all
    course: CourseSettings = field(default_factory=CourseSettings)  # due dates, late policy
    socket_root: str = ""   # the run's short folder of kernel sockets (never under TMPDIR)


@dataclass(frozen=True)
class RunPayload:
    """What every worker of one run needs, as plain data: settings, student version, template."""

    settings: Settings       # paths in it are the client's; the plugin rewrites them
    release: dict[str, bytes]       # notebook file name -> bytes of the student version
    template_db: bytes              # SQLite gradebook that knows the assignment


SOCKET_BASE = "/tmp"  # fixed and short, whatever TMPDIR says: socket paths must stay short


def make_socket_root(run):
    """A fresh folder ``autograder-<run>-sockets-*`` under :data:`SOCKET_BASE` for the kernel
    socket folders of grading run ``run`` (named after it, like the run's scratch folders and
    cgroups, so whatever a run leaves behind says which run it was).

    ``mkdtemp`` creates it atomically with a random name (no one can have made it in
    advance, or swap it: ``/tmp`` is sticky), owned by this user; 0711 lets the kernels
    (user ``nobody``) reach their own folders in it, and list nothing. The caller removes
    it with everything in it when the run ends (:func:`autograder.core.scratch.remove_scratch`),
    the folders of killed workers included; if the caller is killed outright, the next run's
    :func:`sweep_dead_runs` does.
    """
    return str(make_scratch(f"autograder-{run}-sockets-", dir=SOCKET_BASE, mode=0o711))


def sweep_dead_runs():
    """Remove the scratch folders of runs whose process was killed outright (a run's own
    folders, and those of every run still going, are held: :mod:`autograder.core.scratch`).
    Every run calls it as it starts: ``grade``, each ``serve`` lane, each Dask worker."""
    return sweep_scratch((tempfile.gettempdir(), SOCKET_BASE))


def plugin_name(run_id):
    """The name of a run's Dask worker plugin (runs of different assignments share a cluster)."""
    return f"autograder-{run_id}"


def call_by_name(module, name, *args, **kwargs):
    """Import ``autograder.<module>`` in this process and call its ``name`` with the arguments.

    The host's way to start worker code without importing it: a process target, a Dask task.
    """
    return getattr(importlib.import_module(f"autograder.{module}"), name)(*args, **kwargs)


def grader_digest():
    """SHA-256 of the code a verdict depends on, as this process imports it.

    The grader (``autograder/``, its checks included) and the reference library the checks
    compare with (``transformer_ref``).
    """
    import transformer_ref

    digest = hashlib.sha256()
    for package in (Path(__file__).resolve().parents[1], Path(transformer_ref.__file__).resolve().parent):
        for path in sorted(package.rglob("*.py")):
            digest.update(f"{package.name}/{path.relative_to(package)}".encode() + b"\0"
                          + path.read_bytes())
    return digest.hexdigest()


async def forget_plugin(name, dask_worker):
    """Remove plugin ``name`` from this worker (Dask's own removal) if it is still there;
    True if it was.

    Dask can leave an unregistered plugin behind on a worker that joined as the run ended
    (the removal reached the new worker before the plugin it had been sent on joining), with
    the run's scratch folder; the client calls this on every worker after unregistering.
    """
    if name not in dask_worker.plugins:
        return False
    await dask_worker.plugin_remove(name)
    return True


def last_bytes(path, size=2000):
    """The last ``size`` bytes of ``path`` as text ('' if it is not there)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
