"""Grading on a Dask cluster, the client: ``grade ASSIGNMENT --scheduler tcp://HOST:8786``.

The client (the ``grade`` process, on the instructor's machine) does everything it does
for a local run — the course lock, the student version, the class gradebook, the files,
the progress bar and the summary — except the grading itself: each submission becomes one
Dask task (:func:`autograder.worker.plugin.grade_task`), which runs the very pipeline a local
worker runs on whichever Dask worker the scheduler picks. A score never depends on where it was
graded. What runs on the workers is :mod:`autograder.worker.plugin`.

* A task carries the student's folder as intake read it here (:func:`read_handed_in`: no link
  followed, sizes bounded) and returns a
  :class:`~autograder.core.results.StudentResult` (scores, status, flags, the autograded
  notebook and the feedback page as bytes) as its ``to_dict()``. Only the client records.
* A worker that dies mid-task (SIGKILL, a lost host) is replaced by its nanny and the
  scheduler sends the task elsewhere; a submission whose grading kills two workers fails
  with ``KilledWorker`` (the grading cluster runs with ``allowed-failures 1``: the settings in
  ``autograder/README.md``, *Grading on a cluster*) and is recorded as an error, and the class
  goes on.
* Tasks are submitted in the driver's order (longest-expected-first; Dask's work stealing
  evens out the rest), one per worker thread at a time, so a class of 60,000 notebooks never
  sits in the scheduler's memory at once: :class:`DaskCluster` is the
  :class:`~autograder.host.schedule.Transport` that
  :func:`autograder.host.schedule.run_schedule` drives, as it drives local workers.
"""

from pathlib import Path
from time import monotonic

from distributed import WorkerPlugin

from ..core.course_files import SUBMITTED
from ..core.grading_run import RunPayload, call_by_name, forget_plugin, grader_digest, plugin_name
from ..core.submission_folder import read_submission
from .schedule import TransportError, failed, parse_result

CONNECT_TIMEOUT = 10  # seconds to reach the scheduler, and again to find a worker
RUN_TIMEOUT = 60      # seconds every worker has to answer a function run on it (client.run)
# Tasks the cluster holds at once, per worker thread. One: a worker holds only the submission
# it grades, so a worker's death (which Dask blames on every task the worker holds, with
# allowed-failures 1) is blamed on that submission alone.
IN_FLIGHT_PER_THREAD = 1


def grading_task(key, *args):
    """The graph of one submission's task: ``{key: grade_task(*args)}``, marked a *data
    producer*, which makes the scheduler queue it (``worker-saturation 1.0``) until a worker
    has a free thread.

    The rule: a worker holds only the task it runs, also while its nanny replaces a killed
    worker, so a task is never blamed for a death behind which it merely waited. Dask
    queues on the scheduler only tasks that ``Scheduler.is_rootish`` accepts; a task marked
    with ``dask._task_spec.Task``'s ``_data_producer`` flag is one (``Client.submit`` has no
    argument for it), whatever the size of its group.
    """
    from dask._task_spec import Task

    return {key: Task(key, call_by_name, "worker.plugin", "grade_task", *args, _data_producer=True)}


class PluginByName(WorkerPlugin):
    """A Dask worker plugin named by module and class: the host registers this; it arrives on
    each worker as ``autograder.<module>.<cls>(payload)``, built there (:func:`autograder.core.grading_run.call_by_name`).

    ``name`` is :func:`plugin_name` of the payload's run, the name the real plugin has too.
    """

    def __init__(self, module, cls, payload):
        self.module, self.cls, self.payload = module, cls, payload
        self.name = plugin_name(payload.settings.run_id)

    def __reduce__(self):
        return call_by_name, (self.module, self.cls, self.payload)


class ClusterError(TransportError):
    """The cluster cannot grade (unreachable, no workers, no sandbox): one line for the instructor."""


def read_handed_in(root, assignment, student):
    """What a task carries: the student's folder as intake reads it, once, here.

    :func:`autograder.core.submission_folder.read_submission` follows no link out of
    ``submitted/<student>/<assignment>`` and bounds what it reads, so a linked folder, a FIFO,
    a hard link or a sparse file never reaches the task (their entries say what they were).
    """
    root = Path(root)
    return read_submission(root / SUBMITTED / student / assignment, within=root / SUBMITTED)


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


def run_on_workers(client, function, *args, what, timeout=RUN_TIMEOUT, **kwargs):
    """``client.run(function, *args, **kwargs)``, bounded: :class:`ClusterError` naming ``what``
    when the workers have not all answered within ``timeout`` seconds (``Client.run`` itself
    waits for as long as a stuck worker takes)."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as Late

    pool = ThreadPoolExecutor(1, thread_name_prefix="client-run")
    try:
        return pool.submit(client.run, function, *args, **kwargs).result(timeout=timeout)
    except Late:
        raise ClusterError(f"--scheduler: the workers did not answer {what} within {timeout} s") from None
    finally:
        pool.shutdown(wait=False)


def check_workers(client):
    """Raise :class:`ClusterError` unless every worker grades with the client's own grader code."""
    try:
        theirs = run_on_workers(client, grader_digest, what="which grader code they run")
    except ClusterError:
        raise
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


class DaskCluster:
    """The Dask cluster of ``client`` as a :class:`~autograder.host.schedule.Transport`.

    :meth:`start` registers the run's :class:`~autograder.worker.plugin.GradingPlugin` (a
    worker where no kernel can start fails its set-up: :class:`ClusterError`); each student
    is one :func:`~autograder.worker.plugin.grade_task`. Giving a student up cancels its task
    and restarts its worker; :meth:`abort` cancels the run's tasks; both ends remove the
    plugin, which kills the run's kernels on every worker.
    """

    def __init__(self, client, settings):
        self.client, self.settings = client, settings
        self.plugin, self.running = None, {}  # student -> (future, submitted at)
        self.sent = 0  # tasks submitted: a key is never reused (serve grades a student again)

    def start(self, count):
        settings = self.settings
        payload = RunPayload(
            settings=settings,
            release={p.name: p.read_bytes() for p in sorted(Path(settings.release_dir).glob("*.ipynb"))},
            template_db=Path(settings.template_db).read_bytes())
        plugin = PluginByName("worker.plugin", "GradingPlugin", payload)
        try:
            self.client.register_plugin(plugin, name=plugin.name)
        except Exception as error:  # noqa: BLE001 - any failure of setup on a worker
            raise ClusterError(f"--scheduler: the workers cannot grade: {error}") from None
        self.plugin = plugin
        return IN_FLIGHT_PER_THREAD * worker_threads(self.client)

    def submit(self, student, more):
        settings = self.settings
        self.sent += 1
        key = f"grade-{settings.run_id}-{student}-{self.sent}"
        graph = grading_task(key, self.plugin.name, student,
                             read_handed_in(settings.root, settings.assignment, student), more)
        future = self.client.get(graph, key, sync=False, retries=0)
        self.running[student] = (future, monotonic())

    def finished(self, timeout):
        from distributed import wait

        students = {future: student for student, (future, _) in self.running.items()}
        try:
            with self.client.as_current():
                done = wait(list(students), timeout=timeout, return_when="FIRST_COMPLETED").done
        except TimeoutError:
            done = ()
        results = []
        for future in done:
            student = students[future]
            _, since = self.running.pop(student)
            results.append(result_of(future, student, monotonic() - since))
        return results

    def give_up(self, student):
        future, _ = self.running.pop(student)
        give_up(self.client, future)
        return ""

    def stop(self):
        self.remove_plugin()

    def abort(self):
        self.client.cancel([future for future, _ in self.running.values()], force=True)
        self.remove_plugin()

    def remove_plugin(self):
        if self.plugin is None:
            return
        try:
            self.client.unregister_worker_plugin(self.plugin.name)
            run_on_workers(self.client, forget_plugin, self.plugin.name, on_error="ignore",
                           what="the removal of the run's plugin")
        except Exception:  # noqa: BLE001 - the cluster may be gone; workers clean up at exit
            pass


def result_of(future, student, seconds):
    """The StudentResult of a finished task, or an error result saying why there is none."""
    from distributed import KilledWorker

    try:
        data = future.result()
    except KilledWorker:
        return failed(student, "grading this submission killed two workers", seconds)
    except Exception as error:  # noqa: BLE001 - a task that raised: the class goes on
        return failed(student, f"{type(error).__name__}: {error}"[:500], seconds)
    return parse_result(data, student, seconds)


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
