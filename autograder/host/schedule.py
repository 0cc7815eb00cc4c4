"""One grading run's scheduling loop, whatever grades: local worker processes or a Dask cluster.

:func:`run_schedule` keeps a window of students in flight on a :class:`Transport` and hands
each :class:`~autograder.core.results.StudentResult` to the driver as it arrives. It is the
same for both ways of grading, and so are its rules:

* the window is as wide as the transport's grading slots (a worker holds only the
  submission it grades);
* a slot that frees gets its next student *before* the driver records the result, so
  recording never leaves a worker idle;
* a student not back after the watchdog is given up (the transport kills or restarts what
  grades it) and recorded as an error, and the class goes on;
* results that keep being the grading host's fault stop the run (:class:`Breaker`);
* any exception, an interruption included, aborts the transport at once (every worker and
  kernel of the run killed or cancelled).

The transports: :class:`autograder.host.pool.LocalWorkers` (forked processes) and
:class:`autograder.host.cluster.DaskCluster` (one Dask task per submission).
"""

from collections import deque
from time import monotonic
from typing import Protocol

from ..core.results import Status, StudentResult

HOST_FAULTS_IN_A_ROW = 3  # results that are the host's fault, with no other between: stop
POLL_SECONDS = 1.0        # the longest wait for a result before the watchdog looks again


class HostFault(Exception):
    """The grading host cannot grade (no kernel starts): one line for the instructor."""


class TransportError(Exception):
    """What should grade cannot (a cluster's workers fail their set-up): one line, nothing
    recorded."""


class Breaker:
    """Stops a run whose results keep being the host's fault (no kernel could start).

    :data:`HOST_FAULTS_IN_A_ROW` such results with no other result between them raise
    :class:`HostFault`: a host whose kernels stopped starting midway (its memory, its disk)
    stops the run instead of marking the rest of the class ``error`` one by one.
    """

    def __init__(self, limit=HOST_FAULTS_IN_A_ROW):
        self.limit, self.count = limit, 0

    def see(self, result):
        self.count = self.count + 1 if result.host_fault else 0
        if self.count >= self.limit:
            raise HostFault(f"{self.count} submissions in a row could not be graded: {result.error}")


def failed(student, error, seconds, log=""):
    """The result of a student whose grading failed outside nbgrader (``log``: the end of
    its worker's log, which the driver keeps under ``logs/``)."""
    return StudentResult(student=student, status=Status.ERROR, error=error, seconds=seconds,
                         log=log)


def parse_result(data, student, seconds):
    """The :class:`StudentResult` a worker sent for ``student`` (its ``to_dict()``), or an
    error result saying that the answer was something else."""
    try:
        result = StudentResult.from_dict(data)
    except (TypeError, KeyError, ValueError):
        result = None
    if result is None or result.student != student:
        return failed(student, "the worker returned something else than this student's result",
                      seconds)
    return result


class Transport(Protocol):
    """What grades the students of one run: the loop's only view of workers."""

    def start(self, count: int) -> int:
        """Make ready to grade ``count`` students; return how many may be in flight at once."""

    def submit(self, student: str, more: bool) -> None:
        """Start grading ``student`` in a free slot; ``more``: whether students still wait
        after it (if not, what grades it starts no kernel for a next one)."""

    def finished(self, timeout: float) -> list[StudentResult]:
        """Results that came back within ``timeout`` seconds (a worker that died: its error)."""

    def give_up(self, student: str) -> str:
        """Stop grading ``student`` (kill or restart what grades it); the end of its log."""

    def stop(self) -> None:
        """The run is over: let the workers go."""

    def abort(self) -> None:
        """An exception: kill or cancel everything of the run, at once."""


def run_schedule(transport: Transport, students, watchdog: float, on_result) -> None:
    """Grade ``students`` (in this order) on ``transport``; ``on_result(result)`` for each.

    ``watchdog``: seconds after which a student not back is given up as an error
    (``gave up after N s``). :class:`HostFault` when the results keep being the host's fault.
    """
    pending, running, breaker = deque(students), {}, Breaker()  # running: student -> since
    try:
        window = transport.start(len(pending))

        def fill_window():
            while pending and len(running) < window:
                student = pending.popleft()
                transport.submit(student, more=bool(pending))
                running[student] = monotonic()

        fill_window()
        while running:
            done = transport.finished(POLL_SECONDS)
            for result in done:
                running.pop(result.student)
            done += overdue(transport, running, watchdog)
            fill_window()  # the freed slots get their next student before the driver records
            for result in done:
                on_result(result)
                breaker.see(result)
    except BaseException:
        transport.abort()
        raise
    transport.stop()


def overdue(transport, running, watchdog):
    """Give up every student of ``running`` out for longer than ``watchdog``; their results."""
    results = []
    for student, since in list(running.items()):
        if (elapsed := monotonic() - since) > watchdog:
            del running[student]
            log = transport.give_up(student)
            results.append(failed(student, f"gave up after {elapsed:.0f} s (the watchdog: "
                                  f"{watchdog:.0f} s; its worker stopped answering, or never "
                                  "finished)", elapsed, log))
    return results
