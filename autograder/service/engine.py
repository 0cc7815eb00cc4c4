"""The grading loop of ``serve``: attempts from the journal, graded as ``grade`` grades them.

One process, one thread (it forks the grading workers). Each turn of :meth:`Service.turn`:

1. takes the exchange's new folders in (:mod:`autograder.service.exchange`), each as an
   attempt under the course's rules (a refused one gets a page that says why);
2. unless intake is paused, hands free grading slots the next attempts by the journal's
   fairness rule (:meth:`autograder.service.journal.Journal.next_attempts`); an attempt's
   submission is put in ``submitted/<student>/<assignment>/``
   (:func:`autograder.service.attempts.install`) and graded by a *lane*, the assignment's
   transport kept warm between attempts: the local pool
   (:class:`autograder.host.pool.LocalWorkers`) or the Dask cluster
   (:class:`autograder.host.cluster.DaskCluster`), with the same worker settings as a
   ``grade`` run (:func:`autograder.host.driver.worker_settings`);
3. records each result as ``grade`` does (:func:`autograder.host.driver.record_result`, then the late
   penalties and the pages they change), then sets the gradebook back to the attempt that
   counts (``counts = "best"``: a lower score does not replace a higher one), so
   ``submitted/`` always holds the counted attempt and ``grade --force`` gives the same
   scores; hands the exchange its page (before the due date under ``before_due =
   "visible"``: the score and the visible tests' verdicts only, the full page once due);
4. closes lanes idle for :data:`IDLE_SECONDS`; holds the course lock
   (:class:`autograder.host.driver.CourseLock`) while any lane is open, so ``grade`` and
   the service never write the same course at once (a ``grade`` that holds it makes the
   service wait, its queue kept).

A result that is the grading host's fault is graded again (at most :data:`HOST_RETRIES`
times), never recorded as the student's grade. SIGINT, SIGTERM and SIGHUP stop the loop: the
workers are killed, attempts in flight go back to the queue; ``kill -9`` leaves them
``grading``, and the next start puts them back (:meth:`Journal.recover`).
"""

import signal
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from time import monotonic, sleep


from ..core.gradebook import fault_line, gradebook_faults, open_gradebook, standings
from ..core.course_files import FEEDBACK, ROSTER_CSV, SOURCE
from ..core.policy import apply_late_policy, load_service_rules, load_settings, refusal
from ..core.results import Status
from ..core.untrusted import printable
from ..host import driver
from ..host.schedule import Breaker, HostFault, TransportError, overdue
from ..core.grading_run import make_socket_root, sweep_dead_runs
from ..core.scratch import make_scratch, remove_scratch
from ..sandbox.cgroups import kill_run_cgroups, sweep_cgroups
from . import attempts as files
from .journal import DONE, REFUSED, Journal
from .pages import refusal_page, shown_test_cells, summary_page

IDLE_SECONDS = 120.0   # a lane with nothing to grade for this long lets its workers go
LOOK_SECONDS = 0.25    # the longest wait for a result or a new attempt
HOST_RETRIES = 2       # a result that is the host's fault is graded again this often
LOCK_RETRY_SECONDS = 2.0


@dataclass
class Lane:
    """One assignment's warm transport, and the attempts it grades now."""

    assignment: str
    workdir: Path
    sockets: Path
    transport: object
    slots: int
    watchdog: float
    shown: set              # the test cells a withheld page shows
    dated: bool             # a due date (course.toml's or the gradebook's): penalties to settle
    running: dict = field(default_factory=dict)  # student -> (attempt, since)
    breaker: Breaker = field(default_factory=Breaker)
    used: float = field(default_factory=monotonic)

    def close(self, abort=False):
        try:
            self.transport.abort() if abort else self.transport.stop()
        finally:
            kill_run_cgroups(driver.run_id(self.workdir))
            sweep_cgroups()
            remove_scratch(self.workdir)
            remove_scratch(self.sockets)


class Service:
    """``serve``'s grading loop for the course at ``root`` (see the module)."""

    def __init__(self, root, db_url, state, jobs=None, client=None, exchange=None,
                 limits=None, sandboxed=True, log=sys.stderr):
        from ..core.limits import Limits, Retries
        from ..core.assignments import source_assignments

        self.root, self.db_url, self.state = Path(root).resolve(), db_url, Path(state)
        self.client, self.sandboxed, self.log = client, sandboxed, log
        self.limits = limits or Limits()
        self.kernel_retries = Retries.from_environment()  # AUTOGRADER_RETRIES, as grade reads it
        self.jobs = driver.grading_slots(client, jobs, sandboxed)
        self.exchange = exchange
        self.assignments = source_assignments(self.root)
        self.course = load_settings(self.root)
        self.rules = load_service_rules(self.root)
        self.journal = Journal(self.state)
        self.lanes: dict[str, Lane] = {}
        self.lock = None
        self.lock_note = 0.0
        self.retries: dict[int, int] = {}

    def say(self, line):
        print(f"serve: {line}", file=self.log, flush=True)

    # -- the loop ------------------------------------------------------------------------
    def run(self, until=None):
        """Serve until a signal (or ``until()`` says so); in-flight attempts go back to the queue."""
        if (n := self.journal.recover()):
            self.say(f"{n} attempt(s) in progress when the service stopped: queued again")
        try:
            with driver.Signals():
                while until is None or not until():
                    if not self.turn():
                        sleep(LOOK_SECONDS)
        except driver.Interrupted as name:
            self.say(f"stopped by {name}")
        finally:
            self.shutdown()

    def shutdown(self):
        for lane in self.lanes.values():
            for attempt, _ in lane.running.values():
                self.journal.requeue(attempt.id)
            lane.close(abort=True)
        self.lanes.clear()
        self.unlock()
        self.journal.close()

    def turn(self):
        """One turn of the loop; whether anything happened."""
        busy = self.take_exchange()
        busy |= self.release_due_pages()
        if self.journal.switch("paused") != "yes":
            busy |= self.start_attempts()
        busy |= self.collect_results()
        self.close_idle_lanes()
        return busy

    # -- in --------------------------------------------------------------------------------
    def take_exchange(self):
        if self.exchange is None:
            return False
        fresh = self.exchange.new_submissions(self.journal.known_origins())
        for inbound in fresh:
            token = self.journal.new_token()
            try:
                files.check_student(inbound.student)
                if inbound.assignment not in self.assignments:
                    raise files.Refused(f"the course has no assignment {inbound.assignment!r}")
            except files.Refused as why:  # recorded, so it is looked at once
                self.journal.add(token, "", "", "exchange", inbound.name, REFUSED, str(why))
                continue
            files.from_exchange(self.state, token, inbound.path)
            why = self.refused(inbound.student, inbound.assignment)
            self.journal.add(token, inbound.student, inbound.assignment, "exchange", inbound.name,
                             REFUSED if why else "queued", why or "")
            if why and (secret := files.secret(self.state, token)):
                self.exchange.release(secret, {nb: refusal_page(inbound.assignment, why)
                                               for nb in self.notebook_ids(inbound.assignment)})
        return bool(fresh)

    def refused(self, student, assignment):
        """Why the course's rules refuse a new attempt of ``student`` now, or None."""
        earlier = [datetime.fromtimestamp(t, timezone.utc)
                   for t in self.journal.accepted_times(student, assignment)]
        return refusal(self.rules.rules(assignment), earlier, datetime.now(timezone.utc),
                       self.rules.zone)

    def notebook_ids(self, assignment):
        return [p.stem for p in sorted((self.root / SOURCE / assignment).glob("*.ipynb"))]

    # -- grading -----------------------------------------------------------------------------
    def in_flight(self):
        return sum(len(lane.running) for lane in self.lanes.values())

    def start_attempts(self):
        free = self.jobs - self.in_flight()
        if free <= 0 or not self.journal.queue():
            return False
        if not self.take_lock():
            return False
        started = False
        for attempt in self.journal.next_attempts(free):
            try:
                lane = self.lane(attempt.assignment)
            except (SystemExit, HostFault, TransportError) as error:
                self.journal.requeue(attempt.id)
                self.say(f"cannot grade {attempt.assignment}: {error}")
                sleep(LOOK_SECONDS)
                return started
            files.install(self.root, self.state, attempt.token, attempt.student, attempt.assignment)
            lane.transport.submit(attempt.student, True)  # a service keeps a kernel warm for the next
            lane.running[attempt.student] = (attempt, monotonic())
            lane.used = monotonic()
            started = True
        return started

    def lane(self, assignment):
        if assignment in self.lanes:
            return self.lanes[assignment]
        from ..host.cluster import DaskCluster
        from ..host.pool import LocalWorkers

        sweep_dead_runs()
        workdir = make_scratch()
        sockets = make_socket_root(driver.run_id(workdir))
        job = driver.Job(assignment, self.root, self.db_url, [], self.course, self.roster(),
                         self.limits, self.kernel_retries, jobs=self.jobs,
                         sandboxed=self.sandboxed)
        try:
            settings, watchdog = driver.worker_settings(job, workdir, sockets)
            transport = (LocalWorkers(settings, self.jobs) if self.client is None
                         else DaskCluster(self.client, settings))
            slots = transport.start(self.jobs)
        except BaseException:
            kill_run_cgroups(driver.run_id(workdir))
            remove_scratch(workdir)
            remove_scratch(sockets)
            raise
        lane = Lane(assignment, workdir, sockets, transport, slots, watchdog,
                    shown_test_cells(self.root, assignment, withheld=True), self.dated(assignment))
        self.lanes[assignment] = lane
        self.say(f"{assignment}: {slots} grading slot(s) ready")
        return lane

    def dated(self, assignment):
        """Whether ``assignment`` has a due date, in ``course.toml`` or in the gradebook."""
        if self.course.due(assignment) is not None:
            return True
        with open_gradebook(self.db_url) as gb:
            return gb.find_assignment(assignment).duedate is not None

    def roster(self):
        from ..host.roster import read_roster

        path = self.root / ROSTER_CSV
        return read_roster(path) if path.is_file() else None

    def collect_results(self):
        """Results back from the lanes: the freed slots get their next attempts first (as
        ``grade``'s loop does), then each result is recorded."""
        back = []
        for lane in list(self.lanes.values()):
            if not lane.running:
                continue
            done = lane.transport.finished(LOOK_SECONDS / max(1, len(self.lanes)))
            done += overdue(lane.transport, {s: t for s, (_, t) in lane.running.items()}, lane.watchdog)
            for result in done:
                attempt, _ = lane.running.pop(result.student)
                back.append((lane, attempt, result))
                lane.used = monotonic()
        if back and self.journal.switch("paused") != "yes":
            self.start_attempts()  # never the same student's: theirs is in flight until settled
        for lane, attempt, result in back:
            self.settle(lane, attempt, result)
        return bool(back)

    def settle(self, lane, attempt, result):
        """Record ``result`` of ``attempt``, whole or not at all (signals wait)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, driver.Signals.NAMES)
        try:
            if result.status == Status.ERROR and result.host_fault:
                tries = self.retries.get(attempt.id, 0)
                if tries < HOST_RETRIES:
                    self.retries[attempt.id] = tries + 1
                    self.journal.requeue(attempt.id)
                    self.restore_counted(lane, attempt.student, attempt.assignment)
                    lane.breaker.see(result)
                    return
            self.record(lane, attempt, result)
        except gradebook_faults() as error:
            self.journal.requeue(attempt.id)
            self.say(f"{attempt.assignment}: the gradebook failed ({fault_line(error)}); queued again")
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, driver.Signals.NAMES)
        lane.breaker.see(result)

    def record(self, lane, attempt, result):
        student, assignment = attempt.student, attempt.assignment
        driver.record_result(self.root, self.db_url, assignment, result, driver.run_id(lane.workdir))
        if result.status != Status.ERROR:
            self.settle_page(lane, assignment, student, result)
            files.keep_result(self.state, attempt.token, result)
            files.keep_pages(self.state, attempt.token, self.course_pages(student, assignment))
        message = result.error or result.message or ""
        self.journal.finish(attempt.id, result.status, result.score, result.max_score, message)
        counted = self.counted(student, assignment)
        if counted is not None and counted.id == attempt.id:
            self.journal.set_counted(student, assignment, attempt.id)
        else:
            self.restore_counted(lane, student, assignment)
        if attempt.source == "exchange" and result.status != Status.ERROR:
            self.release(attempt, result, lane.shown)

    def settle_page(self, lane, assignment, student, result):
        """The late penalties of the class gradebook (when the assignment has a due date: the
        class's, as ``grade``'s finish writes them), and the student's page re-rendered if it
        does not show the gradebook's score (a manual grade) or penalty."""
        if lane.dated:
            apply_late_policy(self.db_url, assignment, self.course)
            standing = (standings(self.db_url, assignment) or {}).get(student)
        else:  # no penalty: the score record() returned is the gradebook's
            standing = SimpleNamespace(score=result.score, penalty=0.0)
        if result.status == Status.OK and standing is not None and not result.page_agrees(standing):
            driver.write_feedback_pages(self.root, self.db_url, assignment, [student], self.course)

    def course_pages(self, student, assignment):
        where = self.root / FEEDBACK / student / assignment
        return {p.stem: p.read_bytes() for p in sorted(where.glob("*.html"))}

    def counted(self, student, assignment):
        """The attempt that is the grade of ``student`` for ``assignment``: the newest graded one,
        or (``counts = "best"``) the highest-scoring, the newest of equals; None before any."""
        graded = [a for a in self.journal.attempts_of(student, assignment)
                  if a.state == DONE and a.status != Status.ERROR]
        if not graded:
            return None
        if self.rules.rules(assignment).counts == "best":
            return max(graded, key=lambda a: ((a.score or 0.0), a.id))
        return max(graded, key=lambda a: a.id)

    def restore_counted(self, lane, student, assignment):
        """Set ``submitted/``, the gradebook and the course's files back to the counted attempt."""
        counted = self.counted(student, assignment)
        if counted is None or (kept := files.load_result(self.state, counted.token)) is None:
            return
        files.install(self.root, self.state, counted.token, student, assignment)
        driver.record_result(self.root, self.db_url, assignment, kept, "serve")
        self.settle_page(lane, assignment, student, kept)
        self.journal.set_counted(student, assignment, counted.id)

    # -- out -----------------------------------------------------------------------------
    def withheld(self, assignment):
        """Whether pages of ``assignment`` show only the visible verdicts now."""
        due = self.course.due(assignment)
        return (self.rules.rules(assignment).before_due == "visible" and due is not None
                and datetime.now(timezone.utc) < due)

    def release(self, attempt, result, shown):
        secret = files.secret(self.state, attempt.token)
        if self.exchange is None or secret is None:
            return
        if self.withheld(attempt.assignment):
            due = self.course.due(attempt.assignment)
            page = summary_page(attempt.assignment, result, shown, due)
            self.exchange.release(secret, {nb: page for nb in self.notebook_ids(attempt.assignment)})
            return
        self.exchange.release(secret, files.pages(self.state, attempt.token))
        self.journal.mark_released(attempt.id)

    def release_due_pages(self):
        """Full pages of attempts whose due date has passed since they were graded."""
        if self.exchange is None or monotonic() - getattr(self, "_due_look", 0.0) < 30:
            return False
        self._due_look = monotonic()
        late = [a for a in self.journal.rows("state = ? AND released = 0 AND source = 'exchange'", (DONE,))
                if not self.withheld(a.assignment) and a.status != Status.ERROR]
        for attempt in late:
            if (secret := files.secret(self.state, attempt.token)) is not None:
                self.exchange.release(secret, files.pages(self.state, attempt.token))
            self.journal.mark_released(attempt.id)
        return bool(late)

    # -- the course lock and idle lanes ----------------------------------------------------
    def take_lock(self):
        if self.lock is not None:
            return True
        lock = driver.CourseLock(self.root, self.assignments, self.db_url, "serve")
        try:
            self.lock = lock.__enter__()
        except SystemExit as why:
            if monotonic() - self.lock_note > 60:
                self.say(f"waiting: {printable(why)}")
                self.lock_note = monotonic()
            sleep(LOCK_RETRY_SECONDS)
            return False
        return True

    def unlock(self):
        if self.lock is not None:
            self.lock.__exit__(None, None, None)
            self.lock = None

    def close_idle_lanes(self):
        for name, lane in list(self.lanes.items()):
            if not lane.running and monotonic() - lane.used > IDLE_SECONDS:
                lane.close()
                del self.lanes[name]
        if not self.lanes and not self.journal.queue():
            self.unlock()
