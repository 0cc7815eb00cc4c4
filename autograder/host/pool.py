"""Local grading workers: forked processes, one student at a time each, with a watchdog.

:func:`run_pool` hands students to ``jobs`` worker processes (:mod:`autograder.worker.loop`)
and calls back with each :class:`~autograder.core.results.StudentResult` in the driver. A
worker that dies or runs past the watchdog is killed (its kernels die with it) and replaced;
its student is recorded as an error and the class goes on.

The grading host's own faults stop the run instead (:class:`HostFault`): each worker first
starts a kernel (:func:`autograder.worker.pipeline.preflight`) and says whether it could, so
a host where no kernel can start is told within a minute, before any student is graded; and
:class:`Breaker` stops a run whose kernels stop starting midway. Every wait is bounded.
"""

import multiprocessing
from collections import deque
from multiprocessing.connection import wait
from pathlib import Path
from time import monotonic

from ..core.results import Status, StudentResult, WorkerStart
from ..sandbox.cgroups import kill_run_cgroups, sweep_cgroups
from ..worker import loop
from ..worker.pipeline import last_bytes


PREFLIGHT_SECONDS = 90  # a new worker's preflight ends well within this (its kernel: ~50 s at most)
HOST_FAULTS_IN_A_ROW = 3  # results that are the host's fault, with no success between: stop


class HostFault(Exception):
    """The grading host cannot grade (no kernel starts): one line for the instructor."""


class Breaker:
    """Stops a run whose results keep being the host's fault (no kernel could start).

    :data:`HOST_FAULTS_IN_A_ROW` such results with no graded one between them raise
    :class:`HostFault`: a host whose kernels stopped starting midway (its memory, its disk)
    stops the run instead of marking the rest of the class ``error`` one by one.
    """

    def __init__(self, limit=HOST_FAULTS_IN_A_ROW):
        self.limit, self.count = limit, 0

    def see(self, result):
        self.count = self.count + 1 if result.host_fault else 0
        if self.count >= self.limit:
            raise HostFault(f"{self.count} submissions in a row could not be graded: {result.error}")


class Worker:
    """A worker process and the parent's end of its pipe."""

    def __init__(self, settings, index):
        # fork: the worker starts with nbgrader already imported, and grade() works
        # from scripts without a ``__main__`` guard. The parent holds no open
        # gradebook connection or threads while it forks.
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=loop.main, args=(child, settings, index), daemon=True)
        self.process.start()
        child.close()
        self.student, self.started = None, monotonic()
        self.log = Path(settings.workdir) / f"worker{index}" / "log.txt"  # loop.serve's

    def ready(self, timeout):
        """Wait (at most ``timeout`` s) for the worker's :class:`WorkerStart`; HostFault unless
        its preflight kernel started."""
        start = None
        if wait([self.conn, self.process.sentinel], timeout=timeout) and self.conn.poll():
            try:
                start = self.conn.recv()
            except (EOFError, OSError):
                pass
        if not isinstance(start, WorkerStart):
            why = "died" if not self.process.is_alive() else f"did not start in {timeout:.0f} s"
            raise HostFault(f"a grading worker {why} before it could grade")
        if start.fault:
            raise HostFault(f"no grading kernel can start on this host: {start.fault}")

    def kill(self):
        """Kill the worker; its kernels die with it (bubblewrap's ``--die-with-parent``)."""
        self.process.kill()
        self.process.join()
        sweep_cgroups()


def failed(student, error, seconds, log=""):
    """The result of a student whose grading crashed outside nbgrader (``log``: the end of
    its worker's log, which the driver keeps under ``logs/``)."""
    return StudentResult(student=student, status=Status.ERROR, error=error, seconds=seconds,
                         log=log)


def run_pool(settings, students, jobs, watchdog, on_result):
    """Grade ``students`` on ``jobs`` workers; call ``on_result(result)`` in the parent.

    Any exception (an interruption included) kills every worker, and with them
    their kernels, at once. :class:`HostFault` when no kernel can start (a worker's
    preflight), or when the results keep being the host's fault (:class:`Breaker`).
    """
    pending = deque(students)
    workers, next_index, breaker = [], 0, Breaker()
    try:
        for _ in range(min(jobs, len(students))):
            workers.append(Worker(settings, next_index))
            next_index += 1
        for w in workers:  # they start their first kernels at once
            w.ready(max(1.0, PREFLIGHT_SECONDS - (monotonic() - w.started)))
        for w in workers:
            w.student, w.started = pending.popleft(), monotonic()
            w.conn.send(w.student)
        while any(w.student for w in workers):
            busy = [w for w in workers if w.student]
            wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=1.0)
            for i, w in enumerate(workers):
                if w.student is None:
                    continue
                result = None
                if w.conn.poll():
                    try:
                        result = w.conn.recv()
                    except (EOFError, OSError):
                        pass
                elapsed = monotonic() - w.started
                received = result is not None
                if result is None and not w.process.is_alive():
                    result = failed(w.student, "the grading worker died", elapsed,
                                    last_bytes(w.log, 4000))
                elif result is None and elapsed > watchdog:
                    result = failed(w.student, f"gave up after {elapsed:.0f} s", elapsed,
                                    last_bytes(w.log, 4000))
                if result is None:
                    continue
                if not received:  # dead or stuck: replace it
                    w.kill()
                    w = workers[i] = Worker(settings, next_index)
                    next_index += 1
                    w.ready(PREFLIGHT_SECONDS)
                w.student = None
                if pending:  # the worker's next student first, then the parent records
                    w.student, w.started = pending.popleft(), monotonic()
                    w.conn.send(w.student)
                on_result(result)
                breaker.see(result)
    except BaseException:
        for w in workers:
            w.kill()
        kill_run_cgroups(settings.run_id)
        raise
    for w in workers:
        if w.process.is_alive():
            try:
                w.conn.send(None)
            except OSError:  # it died since: nothing to tell it
                pass
    for w in workers:
        w.process.join(timeout=10)
        w.kill()
