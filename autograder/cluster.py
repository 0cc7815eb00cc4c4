"""Grading on a Dask cluster: ``python -m autograder grade ASSIGNMENT --scheduler tcp://HOST:8786``.

The client (the ``grade`` process, on the instructor's machine) does everything it does
for a local run — the course lock, the student version, the class gradebook, the files,
the progress bar and the summary — except the grading itself: each submission becomes one
Dask task, and the task runs the very pipeline a local worker runs
(:func:`autograder.worker.grade_student`: intake, audit, sandboxed kernels, the outside
judge, the same :class:`~autograder.limits.Limits`, feedback) on whichever Dask worker the
scheduler picks. A score never depends on where it was graded.

* :class:`GradingPlugin` is a Dask worker plugin, registered by the client for one run (its
  name carries the run id, so runs of different assignments share a cluster). On every
  worker process it sets up a private scratch course: the student version and the template
  gradebook arrive as bytes in the plugin, so the grading hosts need the course's *code*
  (the checkout and ``.venv`` at the same path, or the wheel), not its files. When the run
  ends the client unregisters it (and removes it from any worker Dask left it on:
  :func:`forget_plugin`), and each worker removes its scratch and kills the run's kernels.
* A task carries the student's handed-in files as bytes and returns a
  :class:`~autograder.results.StudentResult` (scores, status, flags, the autograded notebook
  and the feedback page as bytes). Workers never touch the class gradebook or the course
  root: only the client records.
* A worker that dies mid-task (SIGKILL, a lost host) is replaced by its nanny and the
  scheduler sends the task elsewhere; a submission whose grading kills two workers fails
  with ``KilledWorker`` (the grading cluster runs with ``allowed-failures 1``:
  :func:`autograder.local_servers.grading_cluster_env`) and is recorded as an error, and
  the class goes on.
* Tasks are submitted longest-expected-first (the last run's time of each student; Dask's
  work stealing evens out the rest), one per worker thread at a time, so a class
  of 60,000 notebooks never sits in the scheduler's memory at once.
"""

import hashlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from time import monotonic

from distributed import WorkerPlugin

from . import sandbox, worker
from .nbgrader_config import SUBMITTED, prepare_nbgrader
from .results import ERROR, StudentResult

CONNECT_TIMEOUT = 10  # seconds to reach the scheduler, and again to find a worker
# Tasks the cluster holds at once, per worker thread. One: a worker then holds only the
# submission it grades. A second task waiting on the same worker would count as "suspicious"
# when that worker dies, so an honest submission queued behind two worker-killing ones would
# be failed for them (allowed-failures 1).
IN_FLIGHT_PER_THREAD = 1


class ClusterError(Exception):
    """The cluster cannot grade (unreachable, no workers, no sandbox): one line for the instructor."""


@dataclass(frozen=True)
class RunPayload:
    """What every worker of one run needs, as plain data: settings, student version, template."""

    settings: worker.Settings       # paths in it are the client's; the plugin rewrites them
    release: dict[str, bytes]       # notebook file name -> bytes of the student version
    template_db: bytes              # SQLite gradebook that knows the assignment


class GradingPlugin(WorkerPlugin):
    """Dask worker plugin: one run's scratch course and scratch gradebook on a worker process.

    ``setup`` also does what a local worker has done before its first student: nbgrader and
    the executor imported, and a sandboxed kernel launched and waiting (the *spare*, which
    the first notebook takes; :class:`autograder.execute.Spare`).
    """

    def __init__(self, payload):
        self.payload = payload
        self.name = f"autograder-{payload.settings.run_id}"
        self.settings = None  # made on the worker, in setup()

    def setup(self, worker=None):
        if self.payload.settings.sandboxed and (reason := sandbox.unavailable_reason()):
            raise RuntimeError(f"cannot grade untrusted notebooks safely on this worker: {reason}")
        workdir = Path(tempfile.mkdtemp(prefix=f"autograder-{self.payload.settings.run_id}-"))
        os.chmod(workdir, 0o711)  # kernels (user nobody) reach their socket folders, nothing else
        release = workdir / "release"
        release.mkdir()
        for name, data in self.payload.release.items():
            (release / name).write_bytes(data)
        (workdir / "course").mkdir()
        template = workdir / "template.db"
        template.write_bytes(self.payload.template_db)
        (workdir / "grader").mkdir()
        shutil.copy(template, workdir / "grader" / "gradebook.db")
        self.settings = replace(self.payload.settings, root=str(workdir / "course"),
                                release_dir=str(release), template_db=str(template),
                                workdir=str(workdir))
        prepare_nbgrader()
        import nbgrader.converters  # noqa: F401

        if _GRADING.acquire(blocking=False):  # never wait here: this is the worker's event loop
            try:
                # The newest run takes the process's one spare: a kernel waiting here is another
                # run's, or a dead one (a run whose plugin Dask left behind has had its kernels
                # killed by its teardown on another worker). Another live run on this worker
                # starts its next kernel on demand, once.
                self.enter()
                _launch_spare(self.config())
            finally:
                _GRADING.release()

    def teardown(self, worker=None):
        from .execute import Spare

        if self.settings is None:
            return
        if _GRADING.acquire(blocking=False):
            try:
                if _State.run == self.name:
                    Spare.discard()
                    _State.run = None
            finally:
                _GRADING.release()
        sandbox.kill_run_cgroups(self.settings.run_id)  # the spare too, if a task holds the lock
        shutil.rmtree(self.settings.workdir, ignore_errors=True)

    def enter(self):
        """Make this run the one whose kernels this process starts (environment, directory)."""
        from .execute import Spare

        if _State.run != self.name:  # a spare kernel of another run has its limits: not ours
            Spare.discard()
            _State.run = self.name
        os.environ.update(self.settings.limits.environment())
        os.environ[sandbox.RUN_ENV] = self.settings.run_id
        os.chdir(self.settings.root)

    def grader_dir(self):
        return Path(self.settings.workdir) / "grader"

    def config(self):
        return worker.autograde_config(self.settings, f"sqlite:///{self.grader_dir() / 'gradebook.db'}",
                                       worker.INTERNAL_ID, self.grader_dir() / "submitted")

    def grade(self, student, files):
        """Grade one submission (``files``: name -> bytes) in this worker's scratch course."""
        with _GRADING:
            self.enter()
            settings = self.settings
            submitted = Path(settings.root) / SUBMITTED
            shutil.rmtree(submitted, ignore_errors=True)
            folder = submitted / student / settings.assignment
            folder.mkdir(parents=True)
            for name, data in files.items():
                (folder / name).write_bytes(data)
            try:
                return worker.grade_student(settings, student, self.grader_dir(),
                                            f"sqlite:///{self.grader_dir() / 'gradebook.db'}")
            finally:
                shutil.rmtree(submitted, ignore_errors=True)


_GRADING = threading.Lock()  # one submission at a time per worker process, whatever the run


class _State:
    run = None  # the plugin whose environment (and spare kernel) this worker process has


def _launch_spare(config):
    """Launch a sandboxed kernel now, kept as the spare for this process's first notebook."""
    from .execute import LimitedExecute, Spare

    executor = LimitedExecute(config=config)
    executor.kernel_name = "python3"  # the course's notebooks' kernel (nbgrader's default too)
    Spare.keep(executor._launch())


def grade_task(plugin_name, student, files):
    """The Dask task: grade ``student``'s ``files`` with this worker's plugin of the run."""
    from distributed import get_worker

    return get_worker().plugins[plugin_name].grade(student, files)


def handed_in(root, assignment, student):
    """The files a student handed in (top level of their folder), by name: what a task carries."""
    folder = Path(root) / SUBMITTED / student / assignment
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def connect(address):
    """A ``distributed.Client`` for the scheduler at ``address`` with at least one worker.

    Raises :class:`ClusterError` with one line when the scheduler cannot be reached or has
    no worker; nothing is written anywhere before this succeeds.
    """
    from distributed import Client

    try:
        client = Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as error:
        raise ClusterError(f"--scheduler: cannot reach the Dask scheduler at {address} "
                           f"({str(error).splitlines()[0] if str(error) else type(error).__name__})"
                           ) from None
    try:
        client.wait_for_workers(1, timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError):
        client.close()
        raise ClusterError(f"--scheduler: the Dask scheduler at {address} has no workers: start "
                           f"them with `dask worker {address} --nworkers N --nthreads 1`") from None
    return client


def grader_digest():
    """SHA-256 of the code a verdict depends on, as this process imports it.

    The grader (``autograder/``, its checks included) and the reference library the checks
    compare with (``transformer_ref``).
    """
    import transformer_ref

    digest = hashlib.sha256()
    for package in (Path(__file__).resolve().parent, Path(transformer_ref.__file__).resolve().parent):
        for path in sorted(package.rglob("*.py")):
            digest.update(f"{package.name}/{path.relative_to(package)}".encode() + b"\0"
                          + path.read_bytes())
    return digest.hexdigest()


def check_workers(client):
    """Raise :class:`ClusterError` unless every worker grades with the client's own grader code."""
    try:
        theirs = client.run(grader_digest)
    except Exception as error:  # noqa: BLE001 - e.g. a worker that cannot import autograder
        raise ClusterError(f"--scheduler: the workers cannot run the grader ({type(error).__name__}: "
                           f"{error}); start them with the course on PYTHONPATH") from None
    mine = grader_digest()
    differ = sorted(address for address, digest in theirs.items() if digest != mine)
    if differ:
        raise ClusterError(f"--scheduler: {len(differ)} worker(s) run other grader code than this "
                           f"checkout ({', '.join(differ[:3])}): update their course copy")


def worker_threads(client):
    """Grading slots of the cluster: the sum of its workers' threads."""
    return max(1, sum(w["nthreads"] for w in client.scheduler_info()["workers"].values()))


def run_cluster(client, settings, students, expected, watchdog, on_result):
    """Grade ``students`` on the Dask cluster of ``client``; ``on_result(result)`` in the client.

    ``expected``: seconds each student is expected to take (the longest go first).
    ``watchdog``: seconds after which a task that has not come back is given up as an error
    (its worker is restarted). Any exception (an interruption included) cancels the run's
    tasks and removes its plugin, which kills the run's kernels on every worker.
    """
    from distributed import wait

    payload = RunPayload(
        settings=settings,
        release={p.name: p.read_bytes() for p in sorted(Path(settings.release_dir).glob("*.ipynb"))},
        template_db=Path(settings.template_db).read_bytes())
    plugin = GradingPlugin(payload)
    try:
        client.register_plugin(plugin, name=plugin.name)
    except Exception as error:  # noqa: BLE001 - any failure of setup on a worker
        raise ClusterError(f"--scheduler: the workers cannot grade: {error}") from None
    pending = sorted(students, key=lambda s: (-expected.get(s, 0.0), s))
    window = IN_FLIGHT_PER_THREAD * worker_threads(client)
    running = {}  # future -> (student, submitted at)

    def fill_window():
        while pending and len(running) < window:
            student = pending.pop(0)
            future = client.submit(grade_task, plugin.name, student,
                                   handed_in(settings.root, settings.assignment, student),
                                   key=f"grade-{settings.run_id}-{student}", pure=False,
                                   retries=0)
            running[future] = (student, monotonic())

    try:
        while pending or running:
            fill_window()
            try:
                with client.as_current():
                    done = wait(list(running), timeout=1.0, return_when="FIRST_COMPLETED").done
            except TimeoutError:
                done = ()
            finished = [(future, *running.pop(future)) for future in done]
            fill_window()  # the freed threads get their next submission before the client records
            for future, student, since in finished:
                on_result(collect(future, student, monotonic() - since))
            for future, (student, since) in list(running.items()):
                if monotonic() - since > watchdog:
                    running.pop(future)
                    give_up(client, future)
                    on_result(StudentResult(student=student, status=ERROR,
                                            error=f"gave up after {monotonic() - since:.0f} s",
                                            seconds=monotonic() - since))
    except BaseException:
        client.cancel(list(running), force=True)
        raise
    finally:
        try:
            client.unregister_worker_plugin(plugin.name)
            client.run(forget_plugin, plugin.name, on_error="ignore")
        except Exception:  # noqa: BLE001 - the cluster may be gone; workers clean up at exit
            pass


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


def collect(future, student, seconds):
    """The StudentResult of a finished task, or an error result saying why there is none."""
    from distributed import KilledWorker

    try:
        result = future.result()
    except KilledWorker:
        return StudentResult(student=student, status=ERROR, seconds=seconds,
                             error="grading this submission killed two workers")
    except Exception as error:  # noqa: BLE001 - a task that raised: the class goes on
        return StudentResult(student=student, status=ERROR, seconds=seconds,
                             error=f"{type(error).__name__}: {error}"[:500])
    if not isinstance(result, StudentResult) or result.student != student:
        return StudentResult(student=student, status=ERROR, seconds=seconds,
                             error="the worker returned something else than this student's result")
    return result


def give_up(client, future):
    """Cancel a task that ran past the watchdog and restart the worker that runs it."""
    key = future.key
    busy = [address for address, keys in client.processing().items() if key in keys]
    client.cancel([future], force=True)
    if busy:
        try:
            client.restart_workers(busy, timeout=60)
        except Exception:  # noqa: BLE001 - a worker that cannot be restarted is the cluster's
            pass
