"""``python -m autograder grade``: grade a whole class, in parallel, safely.

The parent process

1. takes the course's lock (a second ``grade`` on the same course is refused with
   a message naming the running one), generates the student version once, into a
   scratch folder, registering the assignment in the class gradebook, and copies that
   registration into a scratch *template* gradebook (:func:`prepare`);
2. starts ``jobs`` worker processes (:mod:`autograder.worker.pipeline`), each with its own
   copy of the template gradebook, and hands them one student at a time
   (students whose submission is unchanged since it was last graded are skipped,
   unless ``force``) in the scheduling loop of :mod:`autograder.host.schedule`
   (:func:`run_class`);
3. records every :class:`~autograder.core.results.StudentResult` in the class
   gradebook as it arrives, then writes its autograded notebook and feedback
   page (only the parent writes under the course root, so the gradebook and the
   files always agree, and parallel workers cannot corrupt anything);
4. replaces a worker that dies or runs past its watchdog (the student is
   recorded as an error, the earlier grade kept, and the class goes on);
5. on SIGINT, SIGTERM or SIGHUP stops at once: workers and their sandboxed
   kernels are killed, scratch folders and cgroups removed, and what was recorded
   so far stays recorded (running ``grade`` again finishes the rest);
6. writes the late penalties, ``grades.csv`` and the class summary (:func:`finish`); keeps
   the worker log of every student whose grading failed under ``logs/``.

The grading host's faults are never a student's grade: a student whose kernel cannot start
is ``error`` with the earlier grade kept; a run where no kernel can start, or whose kernels
stop starting, stops within a minute (:class:`autograder.host.schedule.HostFault`); a course
folder that cannot be written (a full disk, a read-only ``feedback/``) stops the run. Each
stop is one line and exit status 1, keeps what was recorded, and the next ``grade``
finishes the rest.

With ``scheduler`` (``--scheduler tcp://HOST:8786``), step 2 runs on an existing Dask
cluster instead (:mod:`autograder.host.cluster`): one task per submission, the same
per-submission pipeline on every Dask worker; everything else stays in this process.
Students go longest-expected-first, by the time their last grading took.
"""

import fcntl
import glob
import json
import os
import shutil
import signal
import socket
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from time import monotonic

import nbformat

from ..core.cells import grade_id, is_test_cell
from ..core.feedback_page import install_mathjax, render_feedback, rewrite_feedback_html
from ..core.grading_run import Settings, make_socket_root, sweep_dead_runs
from ..core.scratch import make_scratch, remove_scratch
from ..core.submission_folder import submission_digest
from ..core.gradebook import (GradebookError, advisory_lock, check_url, copy_assignment, engine_url,
                              fault_line, gradebook_faults, is_postgres, keep_similarity,
                              lock_holder, open_gradebook, record, sqlite_url, standings, writing)
from ..core.limits import LOAD_ALLOWANCE, Limits, Retries
from ..core.course_files import AUTOGRADED, FEEDBACK, GRADES_CSV, LOCK, LOGS, ROSTER_CSV, SOURCE, STAMP, SUBMITTED
from ..core.nbgrader_config import default_db_url
from ..core.policy import CourseSettings, apply_late_policy, late_note, load_settings
from ..core.results import Status
from ..core.untrusted import printable
from ..sandbox.cgroups import kill_run_cgroups, sweep_cgroups
from ..sandbox.launcher import unavailable_reason
from ..core.similarity import fingerprints, pairs_with
from . import summary
from .pool import LocalWorkers
from .schedule import HostFault, TransportError, run_schedule
from .release import generate
from .roster import COLUMNS as ROSTER_COLUMNS
from .roster import RosterEntry, read_roster, roster_report, sync_roster



class Interrupted(Exception):
    """The driver received SIGINT, SIGTERM or SIGHUP."""


def find_students(root, assignment, only=None):
    """Students with at least one ``*.ipynb`` entry in ``submitted/<student>/<assignment>/``.

    Looked at without following links: a student or assignment folder that is a link
    is listed, so that grading refuses it by name (``unreadable``) instead of grading
    what it points to. A folder name that is not UTF-8 cannot be a student id: it is
    skipped with one line on stderr.
    """
    base = Path(root) / SUBMITTED
    if not base.is_dir():
        raise SystemExit(f"no {SUBMITTED}/ folder under {root}: collect submissions into "
                         f"{SUBMITTED}/<student>/{assignment}/ first")
    found = []
    with os.scandir(base) as folders:
        for folder in folders:
            if not (folder.is_symlink() or folder.is_dir(follow_symlinks=False)):
                continue
            if not folder.name.isprintable():  # bytes that are not UTF-8 are surrogates
                print(f"skipped {SUBMITTED}/{printable(folder.name)}: not a student id "
                      "(not valid UTF-8, or control characters)", file=sys.stderr)
            elif folder.is_symlink() or has_notebook(Path(folder.path) / assignment):
                found.append(folder.name)
    found.sort()
    if only:
        unknown = sorted(set(only) - set(found))
        if unknown:
            raise SystemExit(f"no submission of {assignment} for: {', '.join(unknown)}")
        found = [s for s in found if s in only]
    return found


def has_notebook(folder):
    """Whether ``folder`` is a link, or a folder with a ``*.ipynb`` entry (by ``lstat``)."""
    try:
        if os.path.islink(folder):
            return True
        with os.scandir(folder) as entries:
            return any(entry.name.lower().endswith(".ipynb") for entry in entries)
    except (NotADirectoryError, FileNotFoundError):
        return False


def release_test_cells(release_dir):
    """(notebook, grade_id) of every autograded test cell of the student version."""
    tests = []
    for path in sorted(Path(release_dir).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        tests += [(path.stem, grade_id(c)) for c in nb.cells if is_test_cell(c)]
    return tests


def flag_similar(db_url, assignment, results):
    """Flag students whose functions look copied from each other (for a human to look at),
    against the whole class: ``{student: [description]}`` of every student of ``assignment``.

    Each graded result's fingerprints replace what was kept of that student and are
    compared with every kept submission of the class, graded in this run or an earlier one
    (:func:`autograder.core.gradebook.keep_similarity` with
    :func:`autograder.core.similarity.pairs_with`); a missing or unreadable submission
    keeps none, one whose grading failed keeps its earlier ones and its pairs. A pair's
    flag is on both students' rows and goes when the two are no longer similar. Returns
    that dict and the class's pairs ``[(student, other, function, share)]`` (the summary
    groups them into clusters).
    """
    graded = {r.student: fingerprints(r.functions) if r.status == Status.OK else {}
              for r in results if r.status != Status.ERROR}
    similar, pairs = {}, keep_similarity(db_url, assignment, graded, pairs_with)
    for student, other, function, share in pairs:
        for me, them in ((student, other), (other, student)):
            similar.setdefault(me, []).append(f"{function} ~ {them} ({share:.0%})")
    for result in results:
        flags = [f for f in result.flags if f != summary.SIMILAR_FLAG]
        result.similar = similar.get(result.student, [])
        result.flags = sorted(flags + [summary.SIMILAR_FLAG]) if result.similar else flags
    return similar, pairs


def write_files(root, files):
    """Write ``{path under root: bytes}``, each file atomically, replacing what a re-grade replaces."""
    folders = {Path(p).parts[:3] for p in files}  # (kind, student, assignment)
    for parts in folders:
        shutil.rmtree(Path(root, *parts), ignore_errors=True)
    for relative, data in files.items():
        path = Path(root) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def stamp_path(root, student, assignment):
    return Path(root) / AUTOGRADED / student / assignment / STAMP


def up_to_date(root, db_url, assignment, students):
    """Students whose submission is unchanged since it was graded and recorded."""
    from nbgrader.api import MissingEntry

    fresh = []
    with open_gradebook(db_url) as gb:
        for student in students:
            try:
                stamp = json.loads(stamp_path(root, student, assignment).read_text())
                gb.find_submission(assignment, student)
            except (OSError, ValueError, MissingEntry):
                continue
            folder = Path(root) / SUBMITTED / student / assignment
            if stamp.get("digest") == submission_digest(folder):
                fresh.append(student)
    return fresh


class CourseLock:
    """Who may change the course now: one command per course, or per assignment with a
    PostgreSQL gradebook.

    ``grade``, ``collect``, ``feedback``, ``export`` and ``report`` all take it, so none of
    them reads or writes what another is changing. With an SQLite gradebook (one file on
    one machine) the lock is ``<root>/.autograder.lock``, exclusive for the whole course:
    the file says who holds it (command, assignment, host, pid, start time), and the kernel
    releases it when that process ends, however it ends. With a PostgreSQL gradebook the
    lock is a PostgreSQL advisory lock per assignment (``assignment`` may be a list: each
    is held), so it holds across every host that grades into that gradebook: commands on
    *different* assignments go on at once (their writes are serialized by
    :func:`autograder.core.gradebook.writing`), a second one on the same assignment is
    refused, and the server releases the lock when the holder's connection ends.
    """

    def __init__(self, root, assignment, db_url, command="grade"):
        self.path, self.db_url, self.command = Path(root) / LOCK, db_url, command
        self.assignments = [assignment] if isinstance(assignment, str) else list(assignment)
        self.fd, self.held = None, []

    def label(self):
        return (f"{self.command} {', '.join(self.assignments) or 'the course'}, pid {os.getpid()} "
                f"on {socket.gethostname()}, since {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC")

    def refuse(self, holder):
        raise SystemExit(f"another command holds this course: {holder or 'another run'}; "
                         f"wait for it to finish (or stop it) and run {self.command} again")

    def __enter__(self):
        if is_postgres(self.db_url):
            for assignment in self.assignments:
                name = f"autograder:grade:{assignment}"
                held = advisory_lock(self.db_url, name, label=self.label(), wait=False)
                if held.__enter__() is None:
                    held.__exit__(None, None, None)
                    self.__exit__()
                    self.refuse(lock_holder(self.db_url, name))
                self.held.append(held)
            return self
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(self.fd, 1000).decode(errors="replace").strip()
            os.close(self.fd)
            self.fd = None
            self.refuse(holder)
        os.ftruncate(self.fd, 0)
        os.write(self.fd, (self.label() + "\n").encode())
        return self

    def __exit__(self, *exc):
        while self.held:
            self.held.pop().__exit__(None, None, None)
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)
            self.fd = None


class Signals:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Interrupted` while grading."""

    NAMES = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __enter__(self):
        self.saved = {s: signal.signal(s, self.handle) for s in self.NAMES}
        return self

    def handle(self, signum, frame):
        for s in self.NAMES:  # a second signal during the clean-up must not cut it short
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signal.Signals(signum).name)

    def __exit__(self, *exc):
        for s, handler in self.saved.items():
            signal.signal(s, handler)


@dataclass
class Job:
    """One grading run's inputs, checked: what every phase of :func:`grade` reads."""

    assignment: str
    root: Path
    db_url: str
    names: list[str]           # students with a submission (``--students`` applied)
    course: CourseSettings     # due dates and late policies
    roster: list[RosterEntry] | None  # roster.csv, when the course has one
    limits: Limits
    retries: Retries = field(default_factory=Retries)  # AUTOGRADER_RETRIES of the environment
    jobs: int = 1              # grading slots: local workers, or the cluster's threads
    sandboxed: bool = True
    force: bool = False
    progress: bool = True
    out: object = None         # where the summary goes (None: stdout)
    client: object = None      # a Dask client (``--scheduler``), else local workers


@dataclass
class Run:
    """What :func:`prepare` made for the scheduling loop and the summary."""

    settings: Settings
    tests: list                # (notebook, grade_id) of every test cell
    todo: list[str]            # students to grade, longest-expected-first
    skipped: list[str]         # students unchanged since they were graded
    watchdog: float            # seconds after which a student is given up


def grade(assignment, root=".", db_url=None, jobs=None, limits=None, students=None,
          progress=True, out=None, sandboxed=True, force=False, late_policy=None, scheduler=None):
    """Grade every submission of ``assignment``; return the list of :class:`StudentResult`.

    Writes the gradebook, ``autograded/``, ``feedback/`` and ``grades.csv``
    under ``root`` and prints the class summary to ``out`` (default stdout).
    Submissions unchanged since they were graded are skipped unless ``force``.
    Due dates and the late policy come from ``course.toml`` (``late_policy``, a
    :class:`~autograder.core.policy.LatePolicy`, overrides its policy); names come from
    ``roster.csv`` when the course has one, and its students with no submission
    are listed as missing.
    ``sandboxed=False`` runs kernels without the OS sandbox: only for notebooks
    you trust (e.g. checking the instructor's own solutions). Bad input (an
    unknown assignment, no submissions, a gradebook URL that cannot work) raises
    ``SystemExit`` with one line and changes nothing; an interrupted run raises
    ``SystemExit`` after recording what was finished.
    ``scheduler``: the address of a Dask scheduler (``tcp://HOST:8786``) whose workers
    grade instead of local processes (``jobs`` is then the cluster's); a scheduler that
    cannot be reached, or workers that cannot grade, is one line and changes nothing.
    """
    job = read_job(assignment, Path(root).resolve(), db_url, limits or Limits(), students,
                   late_policy)
    job.progress, job.out, job.sandboxed, job.force = progress, out, sandboxed, force
    job.client = connect_cluster(scheduler, sandboxed) if scheduler else None
    try:
        job.jobs = grading_slots(job.client, jobs, sandboxed)
        with CourseLock(job.root, assignment, job.db_url, "grade"), Signals():
            return grade_job(job)
    except OSError as error:  # the host's disk or folders, before or after the class
        raise SystemExit(f"grading stopped: {unwritable(error)}") from None
    except gradebook_faults() as error:  # locked, corrupt or gone before the class
        raise SystemExit(f"grading stopped: {fault_line(error)}") from None
    finally:
        if job.client is not None:
            job.client.close()


def read_job(assignment, root, db_url, limits, students, late_policy):
    """The run's :class:`Job` from the course's files, or ``SystemExit`` with one line."""
    from ..core.assignments import source_assignments

    db_url = engine_url(db_url or default_db_url(root))
    known = source_assignments(root)
    if assignment not in known:
        raise SystemExit(f"unknown assignment {assignment!r}: {root / SOURCE} has "
                         f"{', '.join(known) or 'none'}")
    try:
        check_url(db_url)
        course = load_settings(root)
        retries = Retries.from_environment()
        roster = read_roster(root / ROSTER_CSV) if (root / ROSTER_CSV).is_file() else None
    except (GradebookError, ValueError) as error:
        raise SystemExit(str(error)) from None
    if isinstance(late_policy, str):  # the command line's spelling: the course's grace inherited
        try:
            course = course.with_policy(assignment, late_policy)
        except ValueError as error:
            raise SystemExit(f"--late-policy: {error}") from None
    elif late_policy is not None:
        course = replace(course, policies={**course.policies, assignment: late_policy})
    names = find_students(root, assignment, students)
    if not names:
        raise SystemExit(f"no submissions of {assignment} under {root / SUBMITTED}: nothing graded")
    if roster and not students and not {e.student_id for e in roster} & set(names):
        raise SystemExit(f"{root / ROSTER_CSV} matches none of the {len(names)} student folder(s) under "
                         f"{root / SUBMITTED}: its student_id column must hold those folder names "
                         f"(columns expected: {', '.join(ROSTER_COLUMNS)})")
    return Job(assignment, root, db_url, names, course, roster, limits, retries)


def grading_slots(client, jobs, sandboxed):
    """How many students are graded at once: ``jobs`` local workers (default: the cores), or
    the cluster's worker threads. Local grading without the sandbox's parts is one line."""
    if client is None and sandboxed and (reason := unavailable_reason()):
        raise SystemExit(f"cannot grade untrusted notebooks safely: {reason}")
    if client is not None:
        from .cluster import worker_threads

        jobs = worker_threads(client)
    return max(1, jobs or os.cpu_count() or 1)


def connect_cluster(scheduler, sandboxed):
    """A Dask client whose workers can all grade with this grader, or one line and exit."""
    from .cluster import ClusterError, check_workers, connect, run_on_workers

    try:
        client = connect(scheduler)
    except ClusterError as error:
        raise SystemExit(str(error)) from None
    try:
        check_workers(client)
        if sandboxed:
            reasons = {r for r in run_on_workers(client, unavailable_reason,
                                                 what="whether they can run the sandbox").values() if r}
            if reasons:
                raise ClusterError(f"--scheduler: cannot grade untrusted notebooks safely on the "
                                   f"workers: {'; '.join(sorted(reasons))}")
    except ClusterError as error:
        client.close()
        raise SystemExit(str(error)) from None
    return client


def expected_seconds(root, assignment, students):
    """How long each student's last grading took (from the stamps), for longest-first order."""
    seconds = {}
    for student in students:
        try:
            seconds[student] = float(json.loads(stamp_path(root, student, assignment)
                                                .read_text()).get("seconds", 0.0))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    return seconds


def grade_job(job):
    """The three phases of a run: :func:`prepare`, :func:`run_class`, :func:`finish`.

    The run's scratch folder (student version, template gradebook, the workers' scratch),
    its kernel sockets and cgroups are removed whatever happens; first, those of runs that
    were killed outright (:func:`~autograder.core.grading_run.sweep_dead_runs`).
    """
    start = monotonic()
    sweep_dead_runs()
    workdir = make_scratch()  # 0700: no kernel needs it
    sockets = None
    try:
        sockets = make_socket_root(run_id(workdir))  # short, whatever TMPDIR's length
        run = prepare(job, workdir, sockets)
        results, stopped = run_class(job, run)
    finally:
        kill_run_cgroups(run_id(workdir))
        sweep_cgroups()
        remove_scratch(workdir)
        if sockets:
            remove_scratch(sockets)
    return finish(job, run, results, stopped, monotonic() - start)


def run_id(workdir):
    """The id of a run: the random end of its scratch folder ``autograder-<run>``. It names
    everything else the run makes outside the course (its workers' scratch folders
    ``autograder-<run>-*``, its socket folder, its kernels' cgroups ``k<run>-*``) and is
    written in each stamp, so whatever a run leaves behind says which run it was."""
    return workdir.name.rsplit("-", 1)[-1]


def prepare(job, workdir, sockets):
    """Phase 1: the student version and both gradebooks, the roster, the students to grade."""
    settings, watchdog = worker_settings(job, workdir, sockets)
    skipped = [] if job.force else up_to_date(job.root, job.db_url, job.assignment, job.names)
    todo = [n for n in job.names if n not in skipped]
    expected = expected_seconds(job.root, job.assignment, todo)
    todo.sort(key=lambda s: (-expected.get(s, 0.0), s))
    return Run(settings, release_test_cells(settings.release_dir), todo, skipped, watchdog)


def worker_settings(job, workdir, sockets):
    """What every worker of a run grades with (the student version and the template
    gradebook, made in ``workdir``; the roster synced, MathJax installed for the pages), and
    the watchdog: ``(Settings, seconds after which a student is given up)``. ``grade``'s runs
    and ``serve``'s lanes (:mod:`autograder.service.engine`) both start here."""
    release, template = student_version(job.assignment, job.root, job.db_url, workdir)
    settings = Settings(
        root=str(job.root), assignment=job.assignment, template_db=str(template),
        release_dir=str(release), workdir=str(workdir), limits=job.limits, retries=job.retries,
        sandboxed=job.sandboxed, run_id=run_id(workdir), course=job.course, socket_root=sockets)
    if job.roster:
        sync_roster(job.db_url, job.roster)
    install_mathjax(job.root / FEEDBACK)
    notebooks = max(1, len(list(release.glob("*.ipynb"))))
    # a notebook's limits are charged time: on a loaded host it may take LOAD_ALLOWANCE times
    # as long on the wall clock (autograder.judge.clock)
    return settings, notebooks * (job.limits.notebook_timeout * LOAD_ALLOWANCE + 60) + 60


def student_version(assignment, root, db_url, workdir):
    """Generate the student version, once: ``(its folder, the template gradebook)``.

    nbgrader's ``generate_assignment`` registers the assignment in the class gradebook as it
    writes the student version into the run's scratch folder; the template the workers grade
    in is a copy of that registration (:func:`autograder.core.gradebook.copy_assignment`).
    """
    with writing(db_url):
        with open_gradebook(db_url):  # created (and made ready) before nbgrader writes it
            pass
        release = generate(assignment, root, release_dir=workdir / "release", db_url=db_url)
    template = workdir / "template.db"
    copy_assignment(db_url, sqlite_url(template), assignment)
    return release, template


def run_class(job, run):
    """Phase 2: the scheduling loop on local workers or the cluster, each result recorded as
    it arrives; ``(results, why the run stopped early or None)``."""
    results, stopped = [], None
    bar = summary.Progress(len(run.todo), enabled=job.progress, workers=job.jobs)

    def on_result(result):
        signal.pthread_sigmask(signal.SIG_BLOCK, Signals.NAMES)  # record it whole, or not at all
        try:
            record_result(job.root, job.db_url, job.assignment, result, run.settings.run_id)
            results.append(result)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, Signals.NAMES)
        bar.update(result.student)

    try:
        run_schedule(transport(job, run.settings), run.todo, run.watchdog, on_result)
    except TransportError as error:
        raise SystemExit(str(error)) from None
    except Interrupted as signal_name:
        stopped = f"by {signal_name}"
    except HostFault as error:
        stopped = f"because {error}"
    except gradebook_faults() as error:  # locked, corrupt or gone mid-run
        stopped = f"because {fault_line(error)}"
    except OSError as error:  # record_result() could not write a course file: nothing half-written
        stopped = f"because {unwritable(error)}"
    bar.close()
    return results, stopped


def transport(job, settings):
    """What grades: the Dask cluster of ``--scheduler``, else ``job.jobs`` local workers."""
    if job.client is None:
        return LocalWorkers(settings, job.jobs)
    from .cluster import DaskCluster

    return DaskCluster(job.client, settings)


def finish(job, run, results, stopped, seconds):
    """Phase 3: similarity flags, late penalties, the feedback pages they change,
    ``grades.csv`` and the summary; the results, or ``SystemExit`` when the run stopped early
    or some students could not be graded."""
    results.sort(key=lambda r: r.student)
    try:
        similar, pairs = flag_similar(job.db_url, job.assignment, results)
        apply_late_policy(job.db_url, job.assignment, job.course)
        settled = standings(job.db_url, job.assignment) or {}
        absent = roster_report(job.db_url, job.assignment, job.roster) if job.roster else None
    except gradebook_faults() as error:  # what was recorded is still written and summed up
        similar, pairs, settled, absent = {}, [], {}, None
        stopped = stopped or f"because {fault_line(error)}"
    try:
        stale = [r.student for r in results if r.status == Status.OK and r.student in settled
                 and not r.page_agrees(settled[r.student])]
        if stale:  # an extension or a manual grade the worker's scratch gradebook had not
            write_feedback_pages(job.root, job.db_url, job.assignment, stale, job.course)
        summary.write_csv(job.root / GRADES_CSV, job.assignment, results, run.tests,
                          standings=settled, missing=absent.missing if absent else (), similar=similar)
    except OSError as error:
        stopped = stopped or f"because {unwritable(error)}"
    except gradebook_faults() as error:  # the pages re-rendered from a gradebook lost mid-run
        stopped = stopped or f"because {fault_line(error)}"
    summary.print_summary(job.assignment, results, run.tests, seconds, job.jobs, run.settings,
                   out=job.out, skipped=[] if stopped else run.skipped, standings=settled,
                   roster=absent, similar=pairs)
    if stopped:
        raise SystemExit(f"stopped {stopped}: {len(results)} submission(s) recorded, "
                         f"{len(run.todo) - len(results)} not graded; run grade again to finish")
    if errors := [r for r in results if r.status == Status.ERROR]:
        first = next((r for r in errors if r.host_fault), errors[0])
        raise SystemExit(f"{len(errors)} submission(s) not graded, their earlier grades kept: "
                         f"{printable(first.student)}: {first.error}; run grade again to grade them")
    return results


def write_feedback_pages(root, db_url, assignment, students=None, course=None):
    """Render the feedback pages of ``students`` (default: everyone with an autograded
    notebook) from the class gradebook: its scores, manual ones included, and its late
    penalties, as ``feedback`` does after manual grading, by the workers' own render path
    (:func:`autograder.core.feedback_page.render_feedback`, then
    :func:`autograder.core.feedback_page.rewrite_feedback_html`), a late one saying how late and under which
    policy (``course``'s, default ``course.toml``'s: :func:`load_settings`). Returns the students of the gradebook
    (of ``students``) who have no autograded notebook to render (``nbgrader autograde
    --force`` empties the folder before it looks for a notebook), whose page is left as
    it was."""
    from ..core.nbgrader_config import course_config

    root = Path(root).resolve()
    for student in [glob.escape(s) for s in students] if students else ["*"]:  # ids, not patterns
        c = course_config(root, db_url, assignment, student)
        c.BaseConverter.force = True
        render_feedback(c)
    with open_gradebook(db_url) as gb:
        manual = {(sub.student_id, g.name) for sub in gb.assignment_submissions(assignment)
                  for nb in sub.notebooks for g in nb.grades if g.needs_manual_grade}
    policy = (course or load_settings(root)).policy(assignment)
    late = {s.student: late_note(policy, s.late_by, s.penalty)
            for s in (standings(db_url, assignment) or {}).values() if s.penalty > 0}
    for page in root.glob(f"{FEEDBACK}/*/{assignment}/*.html"):
        student = page.parent.parent.name
        if students and student not in students:
            continue
        graded = root / AUTOGRADED / student / assignment / f"{page.stem}.ipynb"
        if graded.exists():
            nb = nbformat.read(graded, as_version=4)
            needs = {name for who, name in manual if who == student}
            page.write_text(rewrite_feedback_html(page.read_text(), nb, needs, late.get(student)))
    install_mathjax(root / FEEDBACK)
    return sorted(s for s in graded_students(db_url, assignment)
                  if (not students or s in students) and not has_page_source(root, s, assignment))


def graded_students(db_url, assignment):
    """Students with a submission of ``assignment`` in the gradebook."""
    with open_gradebook(db_url) as gb:
        return [sub.student_id for sub in gb.assignment_submissions(assignment)]


def has_page_source(root, student, assignment):
    """Whether ``student``'s page can be rendered again: an autograded notebook, or a stamp
    that says there was none to grade (missing, unreadable: the page says why)."""
    if list((Path(root) / AUTOGRADED / student / assignment).glob("*.ipynb")):
        return True
    try:
        status = json.loads(stamp_path(root, student, assignment).read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return False
    return status in (Status.MISSING, Status.UNREADABLE)


def unwritable(error):
    """One line for an ``OSError`` of the course's folders or the host's disk."""
    where = f" {error.filename}" if error.filename else ""
    return f"cannot write{where}: {error.strerror or error}"


def record_result(root, db_url, assignment, result, run):
    """Record ``result``: gradebook first, then its files, then the stamp that marks it done
    (the digest graded, the status, the seconds it took and ``run``, the id of the run).

    A result of status ``error`` (its grading failed: the host's fault or the grader's)
    changes neither the gradebook nor the files: the earlier grade and its pages stay, and
    agree (``record`` returns their figures); without a stamp, the next run grades it again.
    A write that fails (a full disk, a read-only folder) raises with the stamp removed, so
    the next run grades that student again too.
    """
    stamp = stamp_path(root, result.student, assignment)
    stamp.unlink(missing_ok=True)
    result.score, result.max_score, result.needs_manual = record(db_url, assignment, result)
    if result.status != Status.ERROR:
        write_files(root, result.files)
    if result.status != Status.OK and result.log:
        log = Path(root) / LOGS / assignment / f"{result.student}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(result.log)
    if result.digest and result.status != Status.ERROR:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps({"digest": result.digest, "status": result.status,
                                     "seconds": round(result.seconds, 3), "run": run}))
