"""Class-scale grading throughput: ``python -m autograder grade`` vs stock nbgrader.

Builds a class of N submissions of one assignment (the solved source notebook,
each copy varied by a comment and blank lines so no two are identical), then
times

* stock: ``nbgrader autograde`` (one process, students one after another), and
  ``nbgrader generate_feedback`` after it, since the driver writes feedback too;
* driver: ``python -m autograder grade --jobs J`` (autograde + feedback + CSV);
* Dask: the same command with ``--scheduler``, on a Dask cluster: the one at ``--scheduler
  ADDRESS``, or, with ``--dask-workers 1,2``, a local cluster of K single-threaded workers
  started for each K (``benchmarks/start_cluster.py`` starts the same cluster by hand);
  and Dask's own cost per submission: the round trip of a task that carries a submission's
  bytes in and a result's bytes out through the scheduler and does nothing else.

With ``--profile`` it grades a few submissions of each assignment (or of ``--assignment``)
in this process, as one ``--jobs 1`` worker would, and splits one submission's wall and CPU
time (the sandboxed kernels' included) into the phases of grading: kernel start, set-up
cells, the student's cells, judged calls (round trips and bytes), fresh kernels for memory
checks, nbgrader's own preprocessors, the feedback page, recording (see :class:`Profile`);
and the kernels the worker started from its preflight to its end, per notebook: how many
graded a notebook, ran a memory check, or were never used.

Usage: python benchmarks/bench_grading.py [--assignment ID] [-n 100] [--jobs 2] [--rounds 1] [--skip-stock]
       [--scheduler tcp://HOST:8786 | --dask-workers 1,2]
       python benchmarks/bench_grading.py --profile [--assignment ID]
Timings depend on the machine's load; run it on an otherwise idle machine.
"""

import argparse
import copy
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import NamedTuple
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autograder.core.assignments import ASSIGNMENTS  # noqa: E402
from autograder.core.cells import grade_id, is_solution  # noqa: E402
from autograder.host.release import generate  # noqa: E402
from tests.notebooks import solved  # noqa: E402


def make_class(root, assignment, course, n):
    shutil.copytree(course / "solutions" / assignment, root / "solutions" / assignment)
    source = nbformat.read(root / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    release_dir = generate(assignment, root, release_dir=root / "release")
    release = nbformat.read(release_dir / f"{assignment}.ipynb", as_version=4)
    base = solved(release, source)
    first = grade_id(next(c for c in base.cells if is_solution(c)))
    for i in range(n):
        nb = copy.deepcopy(base)
        cell = next(c for c in nb.cells if grade_id(c) == first)
        cell.source = f"# submission {i}\n" + cell.source + "\n" * (i % 3)
        folder = root / "submitted" / f"student{i:03d}" / assignment
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{assignment}.ipynb")


class Measured(NamedTuple):
    """A command's wall seconds, and the CPU seconds of it and everything it started (None
    where they cannot be counted): on a shared machine the wall time mostly measures the
    others' load, the CPU seconds what grading itself costs."""

    seconds: float
    cpu: float | None

    def __add__(self, other):
        cpu = None if self.cpu is None or other.cpu is None else self.cpu + other.cpu
        return Measured(self.seconds + other.seconds, cpu)


CPUACCT = "/sys/fs/cgroup/cpuacct"  # cgroup v1: kernels' own cgroups are pids and memory only


def run(cmd, cwd):
    """Run ``cmd`` in a cpuacct cgroup of its own (as root, cgroup v1), so that the CPU of
    every process it starts counts, the sandboxed kernels' included (their launcher moves
    them into pids and memory cgroups only): a Measured."""
    group = Path(CPUACCT) / f"bench-grading-{os.getpid()}"
    try:
        group.mkdir()
    except OSError:
        group = None

    def join():  # in the child, before it runs the command
        (group / "cgroup.procs").write_text(str(os.getpid()))

    start = time.perf_counter()
    try:
        subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       preexec_fn=join if group else None,
                       env={**os.environ, "PYTHONPATH": str(REPO), "PATH": (
                           f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")})
        seconds = time.perf_counter() - start
        cpu = int((group / "cpuacct.usage").read_text()) / 1e9 if group else None
    finally:
        if group:
            try:
                group.rmdir()
            except OSError:  # a process of the command still in it: leave the empty-to-be group
                pass
    return Measured(seconds, cpu)


def stock(root, assignment, n):
    """Measured stock nbgrader autograde, and autograde + feedback."""
    common = ["--CourseDirectory.root=" + str(root), "--CourseDirectory.source_directory=solutions",
              f"--CourseDirectory.db_url=sqlite:///{root}/stock.db", "--Execute.timeout=30"]
    nbgrader = [sys.executable, "-m", "nbgrader"]
    run(nbgrader + ["generate_assignment", assignment, "--force",
                    "--CourseDirectory.release_directory=release-stock"] + common, root)
    autograde = run(nbgrader + ["autograde", assignment, "--force"] + common, root)
    feedback = run(nbgrader + ["generate_feedback", assignment, "--force"] + common, root)
    return autograde, autograde + feedback


def driver(root, assignment, jobs, scheduler=None):
    """Measured ``grade`` of the whole class (every submission graded again)."""
    extra = ["--scheduler", scheduler] if scheduler else []
    return run([sys.executable, "-m", "autograder", "grade", assignment, "--root", str(root),
                "--jobs", str(jobs), "--no-progress", "--force", *extra], REPO)


def echo(files):
    """A task that does no grading: it returns as many bytes as a graded result carries."""
    return b"r" * sum(len(data) for data in files.values())


def dask_overhead(scheduler, files, n=200):
    """Median seconds Dask adds per submission: submit, schedule, ship bytes both ways, gather."""
    from distributed import Client

    with Client(scheduler, set_as_default=False) as client:
        client.submit(echo, files, pure=False).result()  # warm: connections and the function
        times = []
        for _ in range(n):
            start = time.perf_counter()
            client.submit(echo, files, pure=False).result()
            times.append(time.perf_counter() - start)
    return sorted(times)[n // 2]


def sandbox_startup(n=5):
    """Median seconds from launching a sandboxed grading kernel to its first reply."""
    from jupyter_client.utils import run_sync

    sys.path.insert(0, str(REPO))
    from autograder.judge.kernel_manager import SandboxedKernelManager

    async def once():
        km = SandboxedKernelManager(kernel_name="python3")
        start = time.perf_counter()
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        seconds = time.perf_counter() - start
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
        return seconds

    times = sorted(run_sync(once)() for _ in range(n))
    return times[len(times) // 2]


def progress(name, seconds):
    """Print one measurement as soon as it is taken (the table at the end repeats it)."""
    print(f"measured: {name}: {seconds:.1f} s (load average {os.getloadavg()[0]:.1f})", flush=True)
    return seconds


# -- --profile: where one submission's time goes --------------------------------------------
PHASES = ("kernel launch (Popen)", "kernel boot (ipykernel, until it answers)", "set-up cells",
          "student's cells", "test cells' visible lines", "judged calls", "memory-check kernels",
          "kernel stop", "nbgrader's own preprocessors", "intake + audit", "scratch gradebook",
          "feedback page", "recording (class gradebook + files)", "other")


def process_cpu(pid):
    """CPU seconds of process ``pid`` and of its children it has waited for (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime..cstime


def kernel_cpu(km):
    """CPU seconds of every process in a sandboxed kernel's cgroup (bwrap, its init, the kernel)."""
    from autograder.sandbox.cgroups import CGROUP, GROUP

    name = km.cgroup
    if not name:
        return 0.0
    try:
        with open(f"{CGROUP}/pids/{GROUP}/{name}/cgroup.procs") as f:
            pids = f.read().split()
    except OSError:
        try:
            with open(f"{CGROUP}/{GROUP}/{name}/cgroup.procs") as f:  # cgroup v2
                pids = f.read().split()
        except OSError:
            return 0.0
    return sum(process_cpu(pid) for pid in pids)


class Profile:
    """Exclusive wall and CPU time of each phase of grading, from wrappers put around the
    pipeline's functions in this process (nothing in the library changes).

    CPU is this process's (``time.process_time``) plus the sandboxed kernels': each kernel's
    processes are read from ``/proc`` through its cgroup at every phase boundary while it
    serves the notebook; a spare kernel's CPU up to the moment it is taken is its boot, so
    its start-up is charged to the boot row even though it ran while the previous notebook
    was graded. Round trips and bytes count the judge's requests to the kernels.

    Kernels are counted from the preflight on: each one launched (``_launch``), and each one
    an executor took to grade a notebook or to run a memory check (``_launched``, once the
    preflight is over); the rest were never used (a kernel stopped after the preflight, a
    spare left at the end).
    """

    def __init__(self):
        self.rows = {name: [0.0, 0.0, 0, 0] for name in PHASES}  # wall, cpu, trips, bytes
        self.stack = ["other"]
        self.kernels = {}  # km -> CPU seconds already charged
        self.mark = (time.perf_counter(), time.process_time())
        self.grading = False  # the preflight is over: a kernel taken now grades
        self.launched = Counter()  # started, graded, measured

    def _charge(self):
        wall, cpu = time.perf_counter(), time.process_time()
        kernels = 0.0
        for km, seen in list(self.kernels.items()):
            now = kernel_cpu(km)
            kernels += max(0.0, now - seen)
            self.kernels[km] = max(now, seen)
        row = self.rows[self.stack[-1]]
        row[0] += wall - self.mark[0]
        row[1] += cpu - self.mark[1] + kernels
        self.mark = (time.perf_counter(), time.process_time())

    def enter(self, phase):
        self._charge()
        self.stack.append(phase)

    def leave(self):
        self._charge()
        self.stack.pop()

    def adopt(self, km):
        """Start following ``km``'s CPU; what it used before (its boot) goes to the boot row,
        or to the memory checks' row for the fresh kernel of a measured call."""
        if km is not None and km not in self.kernels:
            self._charge()
            boot = kernel_cpu(km)
            self.rows[PHASES[6] if PHASES[6] in self.stack else PHASES[1]][1] += boot
            self.kernels[km] = boot

    def drop(self, km):
        self._charge()
        self.kernels.pop(km, None)

    def wrap(self, owner, attribute, phase):
        """Charge calls of ``owner.attribute`` to ``phase`` (a name, or a function of the call's
        arguments that returns one)."""
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            self.enter(phase(*args, **kwargs) if callable(phase) else phase)
            try:
                return original(*args, **kwargs)
            finally:
                self.leave()

        setattr(owner, attribute, timed)

    def install(self):
        """Wrap the pipeline's phases (once per process)."""
        from nbgrader.converters import Autograde

        from autograder.core.cells import is_setup_cell, is_solution, is_test_cell
        from autograder.host import driver
        from autograder.judge import execute
        from autograder.judge.kernel_manager import SandboxedKernelManager
        from autograder.judge.transport import KernelTransport
        from autograder.worker import pipeline

        def cell_phase(executor, cell, *rest):
            return (PHASES[2] if is_setup_cell(cell) else PHASES[3] if is_solution(cell)
                    else PHASES[4] if is_test_cell(cell) else "other")

        profile, LE = self, execute.LimitedExecute
        self.wrap(LE, "_run_cell", cell_phase)
        self.wrap(execute.judge, "judge_cell",
                  lambda cell, ns: PHASES[2] if is_setup_cell(cell) else PHASES[5])
        self.wrap(LE, "measure_call", PHASES[6])
        self.wrap(LE, "_launch", PHASES[0])
        launch = LE._launch

        def counted_launch(executor):
            profile.launched["started"] += 1
            return launch(executor)

        LE._launch = counted_launch
        self.wrap(LE, "_start", PHASES[1])
        self.wrap(LE, "_stop", PHASES[7])
        self.wrap(Autograde, "start", PHASES[8])
        self.wrap(pipeline, "stage_submission", PHASES[9])
        for name in ("forget_submission", "apply_late_policy", "read_scores"):
            self.wrap(pipeline, name, PHASES[10])
        self.wrap(pipeline, "render_feedback", PHASES[11])
        self.wrap(pipeline, "collect_files", PHASES[11])
        self.wrap(driver, "record_result", PHASES[12])
        count = KernelTransport._count  # called once per round trip, with what crossed

        def counted(transport, sent, received):
            row = profile.rows[profile.stack[-1]]
            row[2] += 1
            row[3] += len(sent) + len(received)
            return count(transport, sent, received)

        KernelTransport._count = counted
        launched = LE._launched

        def launched_kernel(executor):
            km = launched(executor)
            profile.adopt(km)  # the notebook's own kernel, or a memory check's
            if profile.grading:
                profile.launched["measured" if PHASES[6] in profile.stack else "graded"] += 1
            return km

        LE._launched = launched_kernel
        kill = SandboxedKernelManager.kill_everything

        def killed(km):
            if km in profile.kernels:
                profile.drop(km)
            kill(km)

        SandboxedKernelManager.kill_everything = killed

    def snapshot(self):
        self._charge()
        return {name: list(row) for name, row in self.rows.items()}


def profile_assignment(assignment, measured=3):
    """Grade ``measured`` + 1 submissions of ``assignment`` in this process (one worker, as
    ``--jobs 1`` would), the first to warm up; return (fixed start seconds, per-phase rows
    averaged over the others, their scores)."""
    from autograder.core.gradebook import sqlite_url
    from autograder.core.limits import Limits
    from autograder.core.nbgrader_config import prepare_nbgrader
    from autograder.host import driver
    from autograder.judge.execute import SpareKernel
    from autograder.core.grading_run import make_socket_root
    from autograder.sandbox.cgroups import RUN_ENV, kill_run_cgroups
    from autograder.core.grading_run import Settings
    from autograder.worker.pipeline import grade_student, preflight

    profile = PROFILE
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        root = Path(tmp) / "course"
        make_class(root, assignment, REPO, measured + 1)
        run_id = f"p{os.getpid()}"
        workdir, sockets = Path(tmp) / "work", make_socket_root(run_id)
        workdir.mkdir()
        class_db = sqlite_url(root / "gradebook.db")
        os.environ[RUN_ENV] = run_id
        limits = Limits()
        os.environ.update(limits.environment())
        prepare_nbgrader()
        start = time.perf_counter()
        log = open(Path(tmp) / "log.txt", "w")  # what the kernels and nbgrader print, as a worker's
        saved = [os.dup(1), os.dup(2)]
        sys.stdout.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            release, template = driver.student_version(assignment, root, class_db, workdir)
            settings = Settings(root=str(root), assignment=assignment, template_db=str(template),
                                release_dir=str(release), workdir=str(workdir), limits=limits,
                                run_id=run_id, socket_root=sockets)
            db = sqlite_url(template)
            profile.launched.clear()
            fault = preflight(settings, db, workdir / "submitted")
            if fault:
                raise SystemExit(f"no kernel starts here: {fault}")
            profile.grading = True
            fixed = time.perf_counter() - start
            scores = []
            for i in range(measured + 1):
                if i == 1:
                    before = profile.snapshot()
                result = grade_student(settings, f"student{i:03d}", workdir, db, more=i < measured)
                driver.record_result(root, class_db, assignment, result, run_id)
                scores.append((result.score, result.status))
            after = profile.snapshot()
        finally:
            profile.grading = False
            SpareKernel.discard()
            kill_run_cgroups(run_id)
            shutil.rmtree(sockets, ignore_errors=True)
            sys.stdout.flush()
            for fd, copy_of in enumerate(saved, start=1):
                os.dup2(copy_of, fd)
                os.close(copy_of)
            log.close()
    rows = {name: [(a - b) / measured for a, b in zip(after[name], before[name])]
            for name in PHASES}
    return fixed, rows, scores, dict(profile.launched)


PROFILE = Profile()


def print_profile(assignment, fixed, rows, scores, kernels):
    total = [sum(row[i] for row in rows.values()) for i in range(4)]
    n = len(scores)
    started, graded, measured = (kernels.get(k, 0) for k in ("started", "graded", "measured"))
    print(f"\n{assignment}: one submission, --jobs 1, mean of {n - 1} after a warm-up "
          f"(load average {os.getloadavg()[0]:.1f}); fixed start of a run {fixed:.1f} s; "
          f"scores {sorted(set(scores))}")
    print(f"kernels started for the worker's {n} notebooks, preflight to end: {started} "
          f"({started / n:.2f} per notebook): {graded} graded a notebook, {measured} ran a memory "
          f"check, {started - graded - measured} never used; CPU s per notebook {total[1]:.2f}")
    print(f"{'phase':45} {'wall s':>7} {'CPU s':>7} {'trips':>6} {'bytes':>9}")
    for name, (wall, cpu, trips, size) in list(rows.items()) + [("total", total)]:
        if name == "total" or wall > 0.0005 or cpu > 0.0005 or trips:
            print(f"{name:45} {wall:7.3f} {cpu:7.3f} {trips:6.0f} {size:9,.0f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "01-rope" if (REPO / "solutions" / "01-rope").is_dir() else "toy"
    parser.add_argument("--assignment", default=None,
                        help=f"default {default}; with --profile, every assignment")
    parser.add_argument("-n", type=int, default=100, help="submissions (default 100)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--skip-stock", action="store_true", help="time only the driver")
    parser.add_argument("--rounds", type=int, default=1,
                        help="grade the class this many times, driver and stock in turn, and add "
                             "them up (a shared machine's speed drifts by tens of percent within "
                             "minutes: rounds in turn see the same drift)")
    parser.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                        help="also time grading on the Dask cluster of this scheduler")
    parser.add_argument("--dask-workers", default=None, metavar="K,K",
                        help="also time grading on a local Dask cluster of K workers, for each K")
    parser.add_argument("--profile", action="store_true",
                        help="split one submission's wall and CPU time into the phases of grading")
    args = parser.parse_args()
    if args.profile:
        PROFILE.install()
        for assignment in [args.assignment] if args.assignment else ASSIGNMENTS:
            print_profile(assignment, *profile_assignment(assignment))
        return
    args.assignment = args.assignment or default
    course = REPO / "tests" / "fixtures" / "course" if args.assignment == "toy" else REPO
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        root = Path(tmp)
        make_class(root, args.assignment, course, args.n)
        rounds = []  # (driver, stock autograde, stock autograde + feedback) per round
        for i in range(args.rounds):
            ours = driver(root, args.assignment, args.jobs)
            progress(f"driver (round {i + 1})", ours.seconds)
            if not args.skip_stock:
                auto, both = stock(root, args.assignment, args.n)
                progress(f"stock nbgrader autograde + generate_feedback (round {i + 1})", both.seconds)
                rounds.append((ours, auto, both))
        with open(root / "grades.csv", newline="") as f:
            scores = Counter((row["score"], row["status"]) for row in csv.DictReader(f))
        ours = sum((r[0] for r in rounds[1:]), rounds[0][0]) if rounds else ours
        rows = [(f"driver, --jobs {args.jobs} (autograde + feedback + csv)", ours)]
        files = {p.name: p.read_bytes()
                 for p in (root / "submitted" / "student000" / args.assignment).iterdir()}
        dask_rows, overheads = [], []
        if args.scheduler:
            dask_rows.append((f"driver on Dask at {args.scheduler}",
                              driver(root, args.assignment, args.jobs, args.scheduler)))
            overheads.append((args.scheduler, dask_overhead(args.scheduler, files)))
        if args.dask_workers:
            from tests.servers import dask_cluster

            for k in [int(k) for k in args.dask_workers.split(",")]:
                with dask_cluster(k) as (address, _):
                    name = f"driver on Dask, {k} local worker(s) x 1 thread"
                    dask_rows.append((name, driver(root, args.assignment, args.jobs, address)))
                    progress(name, dask_rows[-1][1].seconds)
                    overheads.append((f"{k} local worker(s)",
                                      progress(f"Dask round trip, {k} worker(s)",
                                               dask_overhead(address, files))))
        if rounds:
            rows += [("stock nbgrader autograde (sequential)", sum((r[1] for r in rounds[1:]), rounds[0][1])),
                     ("stock nbgrader autograde + generate_feedback",
                      sum((r[2] for r in rounds[1:]), rounds[0][2]))]
    graded = args.n * max(len(rounds), 1)
    print(f"\nGrading {args.n} submissions of {args.assignment} on {os.cpu_count()} cores, "
          f"{len(rounds) or 1} round(s) (load average at the end {os.getloadavg()[0]:.1f})")
    for i, (mine, auto, both) in enumerate(rounds if len(rounds) > 1 else []):
        print(f"round {i + 1}: driver {mine.seconds:.1f} s, stock autograde {auto.seconds:.1f} s "
              f"({auto.seconds / mine.seconds:.2f}x), autograde + feedback {both.seconds:.1f} s "
              f"({both.seconds / mine.seconds:.2f}x)")
    print(f"{'':55} {'seconds':>8} {'s/student':>10} {'CPU s/student':>14}")
    for name, (seconds, cpu) in rows:
        per = f"{cpu / graded:14.2f}" if cpu is not None else f"{'n/a':>14}"
        print(f"{name:55} {seconds:8.1f} {seconds / graded:10.2f} {per}")
    for name, (seconds, cpu) in dask_rows:
        per = f"{cpu / args.n:14.2f}" if cpu is not None else f"{'n/a':>14}"
        print(f"{name:55} {seconds:8.1f} {seconds / args.n:10.2f} {per}")
    for name, measured in dask_rows:
        print(f"{name}: {ours.seconds / max(len(rounds), 1) / measured.seconds:.0%} of the local "
              "driver's throughput")
    for where, seconds in overheads:
        print(f"Dask's own cost per submission ({where}, a {sum(map(len, files.values())):,}-byte "
              f"submission in and out, median of 200 round trips): {seconds * 1000:.1f} ms")
    print(f"sandboxed kernel start-up (launch to first reply, median of 5): "
          f"{sandbox_startup():.2f} s")
    print("driver's scores (score, status): count = "
          + ", ".join(f"{k}: {v}" for k, v in sorted(scores.items())))
    if len(rows) == 3:
        print(f"speed-up of the driver: {rows[1][1].seconds / ours.seconds:.2f}x over stock "
              f"autograde, {rows[2][1].seconds / ours.seconds:.2f}x over stock autograde + feedback")
        if ours.cpu and rows[2][1].cpu:
            print(f"CPU per notebook: driver {ours.cpu / graded:.2f} s, stock autograde "
                  f"{rows[1][1].cpu / graded:.2f} s, stock autograde + feedback "
                  f"{rows[2][1].cpu / graded:.2f} s; on {os.cpu_count()} idle cores (stock uses "
                  f"one) that is a speed-up of about {rows[1][1].cpu / ours.cpu * os.cpu_count():.2f}x "
                  f"over stock autograde, {rows[2][1].cpu / ours.cpu * os.cpu_count():.2f}x over "
                  f"autograde + feedback")


if __name__ == "__main__":
    main()
