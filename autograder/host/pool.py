"""Local grading workers: forked processes, one student at a time each.

:class:`LocalWorkers` is the :class:`~autograder.host.schedule.Transport` of a local run:
:func:`autograder.host.schedule.run_schedule` hands students to ``jobs`` worker processes
(:mod:`autograder.worker.loop`) through it. A worker that dies, or that the watchdog gives
up, is killed (its kernels die with it) and replaced; its student is recorded as an error
and the class goes on.

The grading host's own faults stop the run instead
(:class:`~autograder.host.schedule.HostFault`): each worker first starts a kernel
(:func:`autograder.worker.pipeline.preflight`) and says whether it could, so a host where no
kernel can start is told within a minute, before any student is graded. Every wait is bounded.
"""

import multiprocessing
from multiprocessing.connection import wait
from pathlib import Path
from time import monotonic

from ..core.grading_run import call_by_name, last_bytes
from ..core.results import WorkerStart
from ..sandbox.cgroups import kill_run_cgroups, sweep_cgroups
from .schedule import HostFault, failed, parse_result

PREFLIGHT_SECONDS = 90  # a new worker's preflight ends well within this (its kernel: ~50 s at most)
LOG_TAIL = 4000         # bytes of a failed worker's log kept for the driver's logs/
JOIN_SECONDS = 10       # a worker told to stop has this long to exit before it is killed


class Worker:
    """A worker process and the parent's end of its pipe."""

    def __init__(self, settings, index):
        # fork: the worker starts with nbgrader already imported, and grade() works
        # from scripts without a ``__main__`` guard. The parent holds no open
        # gradebook connection or threads while it forks. The worker imports its own code
        # (``worker.loop``) once forked: the host names it, never imports it.
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=call_by_name, args=("worker.loop", "main", child, settings, index),
                                   daemon=True)
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
                start = WorkerStart.from_dict(self.conn.recv())
            except (EOFError, OSError, TypeError, KeyError):
                pass
        if start is None:
            why = "died" if not self.process.is_alive() else f"did not start in {timeout:.0f} s"
            raise HostFault(f"a grading worker {why} before it could grade")
        if start.fault:
            raise HostFault(f"no grading kernel can start on this host: {start.fault}")

    def send(self, student, more):
        self.student, self.started = student, monotonic()
        self.conn.send((student, more))

    def receive(self):
        """Its student's result if one came (an error result if the worker's answer is not
        one); an error result if the worker died; else None. The worker is then free."""
        data = None
        if self.conn.poll():
            try:
                data = self.conn.recv()
            except (EOFError, OSError):
                pass
        elapsed = monotonic() - self.started
        if data is None and self.process.is_alive():
            return None
        if data is None:
            result = failed(self.student, "the grading worker died", elapsed, self.log_tail())
        else:
            result = parse_result(data, self.student, elapsed)
        self.student = None
        return result

    def log_tail(self):
        return last_bytes(self.log, LOG_TAIL)

    def kill(self):
        """Kill the worker; its kernels die with it (bubblewrap's ``--die-with-parent``)."""
        self.process.kill()
        self.process.join()
        sweep_cgroups()


class LocalWorkers:
    """Forked worker processes as a :class:`~autograder.host.schedule.Transport`.

    ``jobs`` workers at most (never more than students), each grading one student at a
    time in its own scratch gradebook; a worker that dies or is given up is replaced by a
    new one, which must pass its preflight too.
    """

    def __init__(self, settings, jobs):
        self.settings, self.jobs = settings, jobs
        self.workers, self.spawned = [], 0

    def spawn(self):
        self.spawned += 1
        return Worker(self.settings, self.spawned - 1)

    def start(self, count):
        self.workers = [self.spawn() for _ in range(min(self.jobs, count))]
        for w in self.workers:  # they start their first kernels at once
            w.ready(max(1.0, PREFLIGHT_SECONDS - (monotonic() - w.started)))
        return len(self.workers)

    def submit(self, student, more):
        next(w for w in self.workers if w.student is None).send(student, more)

    def finished(self, timeout):
        busy = [w for w in self.workers if w.student is not None]
        wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=timeout)
        results = []
        for i, w in enumerate(self.workers):
            if w.student is not None and (result := w.receive()) is not None:
                if not w.process.is_alive():
                    self.replace(i)
                results.append(result)
        return results

    def give_up(self, student):
        i = next(i for i, w in enumerate(self.workers) if w.student == student)
        log = self.workers[i].log_tail()
        self.replace(i)
        return log

    def replace(self, i):
        """Kill worker ``i`` and start a new one in its place, ready to grade."""
        self.workers[i].kill()
        w = self.workers[i] = self.spawn()
        w.ready(PREFLIGHT_SECONDS)

    def stop(self):
        for w in self.workers:
            if w.process.is_alive():
                try:
                    w.conn.send(None)
                except OSError:  # it died since: nothing to tell it
                    pass
        for w in self.workers:
            w.process.join(timeout=JOIN_SECONDS)
            w.kill()

    def abort(self):
        for w in self.workers:
            w.kill()
        kill_run_cgroups(self.settings.run_id)
