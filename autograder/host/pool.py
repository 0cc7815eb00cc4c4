"""Local grading workers: forked processes, one student at a time each, with a watchdog.

:func:`run_pool` hands students to ``jobs`` worker processes (:mod:`autograder.worker.loop`)
and calls back with each :class:`~autograder.core.results.StudentResult` in the driver. A
worker that dies or runs past the watchdog is killed (its kernels die with it) and replaced;
its student is recorded as an error and the class goes on.
"""

import multiprocessing
from collections import deque
from multiprocessing.connection import wait
from time import monotonic

from ..core.results import Status, StudentResult
from ..sandbox.cgroups import kill_run_cgroups, sweep_cgroups
from ..worker import loop


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
        self.student, self.started = None, 0.0

    def kill(self):
        """Kill the worker; its kernels die with it (bubblewrap's ``--die-with-parent``)."""
        self.process.kill()
        self.process.join()
        sweep_cgroups()


def failed(student, error, seconds):
    """The result of a student whose grading crashed outside nbgrader."""
    return StudentResult(student=student, status=Status.ERROR, error=error, seconds=seconds)


def run_pool(settings, students, jobs, watchdog, on_result):
    """Grade ``students`` on ``jobs`` workers; call ``on_result(result)`` in the parent.

    Any exception (an interruption included) kills every worker, and with them
    their kernels, at once.
    """
    pending = deque(students)
    workers, next_index = [], 0
    for _ in range(min(jobs, len(students))):
        workers.append(Worker(settings, next_index))
        next_index += 1
    try:
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
                    result = failed(w.student, "the grading worker died", elapsed)
                elif result is None and elapsed > watchdog:
                    result = failed(w.student, f"gave up after {elapsed:.0f} s", elapsed)
                if result is None:
                    continue
                if not received:  # dead or stuck: replace it
                    w.kill()
                    w = workers[i] = Worker(settings, next_index)
                    next_index += 1
                w.student = None
                if pending:  # the worker's next student first, then the parent records
                    w.student, w.started = pending.popleft(), monotonic()
                    w.conn.send(w.student)
                on_result(result)
    except BaseException:
        for w in workers:
            w.kill()
        kill_run_cgroups(settings.run_id)
        raise
    for w in workers:
        if w.process.is_alive():
            w.conn.send(None)
    for w in workers:
        w.process.join(timeout=10)
        w.kill()
