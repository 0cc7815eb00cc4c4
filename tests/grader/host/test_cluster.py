"""Grading on a Dask cluster into a PostgreSQL gradebook, with real servers (no mocks).

A PostgreSQL server (Debian's ``postgresql``, a temporary data directory, an unprivileged
user, 127.0.0.1) and a Dask scheduler with two single-threaded workers run as separate
processes for this module (:mod:`tests.servers`); they die with the test process.

* The same hostile class, graded by the local driver into SQLite and through Dask into
  PostgreSQL, gets identical grades, flags, feedback and CSV; no worker is lost to it.
* A worker killed with SIGKILL mid-class: its submission is graded again elsewhere, once;
  a submission whose grading kills two workers is an error with its reason; no duplicate rows.
  The kill tests act on the workers' task transitions as the scheduler forwards them
  (:class:`TaskEvents`, a worker plugin's events) and stop when the run they watch has ended.
* Unchanged submissions are not sent again; a changed one is.
* An unreachable scheduler, or an unreachable database: one line, exit 1, nothing written.
* The course lock holds across hosts (a PostgreSQL advisory lock); runs of different
  assignments write one PostgreSQL gradebook at the same time.
"""

import copy
import difflib
import csv
import io
import itertools
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from autograder.host.driver import expected_seconds, grade
from autograder.core.gradebook import advisory_lock, engine_url, libpq_url
from autograder.core.limits import LOAD_ALLOWANCE
from tests.servers import DASK_HINT, POSTGRES_HINT, dask_cluster, free_port, postgres_bin
from autograder.host.release import generate
from autograder.sandbox.launcher import unavailable_reason
from tests.grader.test_grading_e2e import (EXIT, FIXTURE, FLOOD, FORKBOMB, HANG, LIMITS, LOOP, MEMORY, Class,
                              points, process_cgroups_work)

ROOT = Path(__file__).resolve().parents[3]
SANDBOX_MISSING = unavailable_reason()

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SANDBOX_MISSING is not None, reason=str(SANDBOX_MISSING)),
              pytest.mark.skipif(postgres_bin() is None, reason=POSTGRES_HINT)]
distributed = pytest.importorskip("distributed", reason=DASK_HINT)
psycopg = pytest.importorskip("psycopg", reason=DASK_HINT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``(scheduler address, client)`` of a two-worker Dask cluster for this module."""
    logs = tmp_path_factory.mktemp("dask-logs")
    with dask_cluster(2, log_dir=logs) as (address, _):
        with distributed.Client(address, set_as_default=False) as client:
            yield address, client


@pytest.fixture(scope="module")
def toy_release(tmp_path_factory):
    """The toy assignment's student version, generated once for this module."""
    folder = tmp_path_factory.mktemp("toy-release")
    return nbformat.read(generate("toy", FIXTURE, release_dir=folder) / "toy.ipynb", as_version=4)


@pytest.fixture
def hostile_class(toy_release):
    return lambda: toy_class(toy_release)


def toy_class(release):
    """The toy assignment's class: honest students and the hostile ones, with expected scores."""
    source = nbformat.read(FIXTURE / "solutions" / "toy" / "toy.ipynb", as_version=4)
    release = copy.deepcopy(release)
    c = Class(source, release)
    lost_last = c.total - points(c.parts[-1])
    half = (len(c.parts) + 1) // 2
    c.add("correct", c.notebook(), c.total)
    c.add("untouched", copy.deepcopy(release), 0)
    c.add("partial", c.notebook(solved=[p[0] for p in c.parts[:half]]),
          sum(points(p) for p in c.parts[:half]))
    c.add("timeout", c.notebook(change=c.prepend(-1, LOOP)), lost_last, limits={"timeout"})
    c.add("hang", c.notebook(change=c.prepend(-1, HANG)), lost_last, limits={"timeout", "hang"})
    c.add("membomb", c.notebook(change=c.prepend(-1, MEMORY)), lost_last)
    c.add("crash", c.notebook(change=c.prepend(-1, EXIT)), lost_last, limits={"crash"})
    c.add("flood", c.notebook(change=c.prepend(-1, FLOOD)), lost_last, limits={"output"})
    if process_cgroups_work():
        c.add("forkbomb", c.notebook(change=c.prepend(-1, FORKBOMB)), c.total)
    return c


def make_course(root, klass, assignment="toy"):
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(FIXTURE / "solutions" / "toy", root / "solutions" / assignment)
    if assignment != "toy":
        (root / "solutions" / assignment / "toy.ipynb").rename(
            root / "solutions" / assignment / f"{assignment}.ipynb")
    for student, nb in klass.submissions.items():
        folder = root / "submitted" / student / assignment
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{assignment}.ipynb")
    return root


def csv_rows(root):
    """grades.csv without the wall-clock columns (what differs run to run): ``seconds``, and
    ``submitted_at``, the time of grading for these submissions without a timestamp.txt."""
    with open(root / "grades.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k not in ("seconds", "submitted_at")}
                for row in csv.DictReader(f)]


def feedback(root):
    """Feedback pages by path. Prompt numbers (``In [5]:``) are blanked: a kernel that dies
    mid-cell (``os._exit``) may or may not have sent that cell's execution count first, in any
    run, local or not."""
    return {p.relative_to(root): re.sub(rb'(input_prompt">In(?: |&nbsp;|\xc2\xa0)\[)[^\]<]*(\]:)', rb"\1\2", p.read_bytes())
            for p in sorted((root / "feedback").rglob("*.html")) if "mathjax" not in p.parts}


def page_diff(path, local, remote, lines=40):
    """The first ``lines`` lines of a unified diff of one feedback page, local against Dask."""
    diff = difflib.unified_diff(local.decode(errors="replace").splitlines(),
                                remote.decode(errors="replace").splitlines(),
                                f"local/{path}", f"dask/{path}", lineterm="", n=1)
    return "\n".join(line[:300] for line in itertools.islice(diff, lines))


def worker_pids(client):
    """Process id of each live worker (one that is dying or just died is left out)."""
    return client.run(os.getpid, on_error="ignore")


def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


# -- the same class, here and on the cluster --------------------------------------------------
@pytest.fixture(scope="module")
def both(tmp_path_factory, postgres, cluster, toy_release):
    klass = toy_class(toy_release)
    base = tmp_path_factory.mktemp("same-class")
    local_root = make_course(base / "local", klass)
    dask_root = make_course(base / "dask", klass)
    address, client = cluster
    before = worker_pids(client)
    local = grade("toy", local_root, progress=False, out=io.StringIO(), **LIMITS)
    url = postgres("same_class")
    out = io.StringIO()
    remote = grade("toy", dask_root, db_url=url, scheduler=address, progress=False, out=out,
                   **LIMITS)
    return dict(klass=klass, local=local, remote=remote, local_root=local_root,
                dask_root=dask_root, url=url, out=out.getvalue(), before=before,
                after=worker_pids(client))


def test_dask_and_postgres_give_the_local_grades_flags_feedback_and_csv(both):
    local = {r.student: r for r in both["local"]}
    remote = {r.student: r for r in both["remote"]}
    assert sorted(remote) == sorted(both["klass"].submissions)
    for student, result in remote.items():
        mine = local[student]
        assert (result.status, result.score, result.max_score) == (mine.status, mine.score,
                                                                   mine.max_score), student
        assert result.score == pytest.approx(both["klass"].expected[student]["score"]), student
        assert sorted(result.flags) == sorted(mine.flags), student
        assert sorted(result.limits) == sorted(mine.limits), student
        assert result.notebooks == mine.notebooks, student
    assert csv_rows(both["dask_root"]) == csv_rows(both["local_root"])
    remote_pages, local_pages = feedback(both["dask_root"]), feedback(both["local_root"])
    assert remote_pages.keys() == local_pages.keys()
    differ = [page_diff(path, local_pages[path], remote_pages[path])
              for path in local_pages if local_pages[path] != remote_pages[path]]
    assert not differ, "\n".join(differ)
    assert "with 2 job(s)" in both["out"]


def test_hostile_students_cost_only_their_own_cells_and_no_worker(both):
    remote = {r.student: r for r in both["remote"]}
    for student, expect in both["klass"].expected.items():
        assert expect.get("limits", set()) <= set(remote[student].limits), student
    assert both["after"] == both["before"]  # the same two worker processes, none restarted


def test_postgres_gradebook_holds_one_row_per_submission(both):
    with psycopg.connect(libpq_url(both["url"])) as conn:
        rows = conn.execute(
            "SELECT s.student_id, count(*) FROM submitted_assignment s"
            " JOIN assignment a ON a.id = s.assignment_id WHERE a.name = 'toy'"
            " GROUP BY s.student_id").fetchall()
    assert dict(rows) == {s: 1 for s in both["klass"].submissions}


def test_rerun_sends_only_changed_submissions_longest_first(both, cluster):
    address, _ = cluster
    root, url = both["dask_root"], both["url"]
    expected = expected_seconds(root, "toy", list(both["klass"].submissions))
    assert set(expected) == set(both["klass"].submissions)
    assert max(expected, key=expected.get) in {"timeout", "hang"}  # the slowest go first next time
    assert grade("toy", root, db_url=url, scheduler=address, progress=False,
                 out=io.StringIO(), **LIMITS) == []
    nb = both["klass"].submissions["untouched"]
    changed = both["klass"].notebook()  # the student finishes the work after the deadline
    assert changed != nb
    nbformat.write(changed, root / "submitted" / "untouched" / "toy" / "toy.ipynb")
    again = grade("toy", root, db_url=url, scheduler=address, progress=False, out=io.StringIO(),
                  **LIMITS)
    assert [(r.student, r.score) for r in again] == [("untouched", both["klass"].total)]


# -- workers that die --------------------------------------------------------------------------
TASK_TOPIC = "autograder-test-task-states"


def task_state_plugin():
    """A worker plugin that logs every task transition of its worker to the scheduler's
    :data:`TASK_TOPIC` (key, worker address and pid, start and finish states). Made here, so
    Dask ships the class by value (workers lack ``tests/``); a replacement worker gets it too."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class TaskStates(WorkerPlugin):
        name = "autograder-test-task-states"
        idempotent = True

        def setup(self, worker):
            self.worker = worker

        def transition(self, key, start, finish, **kwargs):
            self.worker.log_event(TASK_TOPIC, dict(key=str(key), worker=self.worker.address,
                                                   pid=os.getpid(), start=start, finish=finish))

    return TaskStates()


class TaskEvents:
    """What the workers' task transitions say, as the scheduler forwards them: no polling.

    :meth:`watch` gives a queue of every event from now on (``None`` once :meth:`close`).
    Every event is also checked: no worker may hold more than the one submission it grades
    (the grader's tasks wait on the scheduler, ``cluster.grading_task``): Dask counts a
    worker's death against every task the worker holds, so a task queued behind the killed
    one would be blamed too. :attr:`crowded` lists the violations.
    """

    HELD = {"waiting", "ready", "constrained", "executing", "long-running", "fetch", "flight"}

    def __init__(self, client):
        self.client, self.queues, self.crowded, self.held = client, [], [], {}
        self.lock = threading.Lock()
        client.register_plugin(task_state_plugin())
        client.subscribe_topic(TASK_TOPIC, self._event)

    def _event(self, event):
        _, msg = event
        with self.lock:
            held = self.held.setdefault((msg["worker"], msg["pid"]), set())
            (held.add if msg["finish"] in self.HELD else held.discard)(msg["key"])
            if len(held) > 1:
                self.crowded.append((msg["worker"], sorted(held)))
            for q in self.queues:
                q.put(msg)

    def watch(self):
        q = queue.Queue()
        with self.lock:
            self.queues.append(q)
        return q

    def close(self):
        with self.lock:
            for q in self.queues:
                q.put(None)
            self.queues = []


@pytest.fixture(scope="module")
def task_events(cluster):
    _, client = cluster
    events = TaskEvents(client)
    yield events
    client.unsubscribe_topic(TASK_TOPIC)


def signal_worker_running(events, key_part, times, sig=signal.SIGKILL):
    """Send ``sig`` to the worker process that starts executing a task whose key contains
    ``key_part``, ``times`` times (each time on the worker the scheduler moved it to), as
    the task starts; returns how many it signalled. Stops when the watch ends (the run
    exited: :meth:`TaskEvents.close`)."""
    signalled, seen, watch = 0, set(), events.watch()
    while signalled < times and (msg := watch.get()) is not None:
        if msg["finish"] == "executing" and key_part in msg["key"] and msg["pid"] not in seen:
            try:
                os.kill(msg["pid"], sig)
            except ProcessLookupError:  # died meanwhile, by another kill: not this one's
                continue
            seen.add(msg["pid"])
            signalled += 1
    return signalled


def run_watched(argv, events):
    """Start ``argv``; returns ``(process, ended)``: ``ended()`` is its output once it has
    exited, and its exit closes the watches of ``events`` (the watchers stop with the run)."""
    run = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    out = []

    def wait():
        try:
            out.append(run.communicate()[0])
        finally:
            events.close()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()

    def ended(timeout):
        waiter.join(timeout)
        assert not waiter.is_alive(), "the grading run did not end"
        return out[0]

    return run, ended


def test_killed_workers_reschedule_once_and_two_kills_make_an_error(tmp_path, postgres, cluster,
                                                                    hostile_class, task_events):
    address, client = cluster
    klass = hostile_class()
    klass.submissions = {s: klass.submissions[s] for s in ("correct", "partial", "timeout", "hang")}
    root = make_course(tmp_path / "course", klass)
    url = postgres("killed_workers")
    task_events.crowded.clear()
    once = [None]

    def kill_twice():
        try:
            once[0] = signal_worker_running(task_events, "-timeout", 2)
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            once[0] = error

    twice = threading.Thread(target=kill_twice)
    twice.start()
    hang = [None]
    hang_thread = threading.Thread(target=lambda: hang.__setitem__(
        0, signal_worker_running(task_events, "-hang", 1)))
    hang_thread.start()
    run, ended = run_watched([sys.executable, "-m", "autograder", "grade", "toy", "--root",
                              str(root), "--db", url, "--scheduler", address, "--no-progress",
                              "--jobs", "2", "--timeout-cell", "10", "--timeout-notebook", "90"],
                             task_events)
    out = ended(600)
    twice.join()
    hang_thread.join()
    assert hang[0] == 1 and once[0] == 2, (hang, once, out)
    assert task_events.crowded == []
    # the submission that killed two workers is not graded: one line, exit status 1
    assert run.returncode == 1 and "Traceback" not in out, out
    assert "1 submission(s) not graded" in out.strip().splitlines()[-1], out
    with open(root / "grades.csv", newline="") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == ["correct", "hang", "partial", "timeout"]
    assert rows["timeout"]["status"] == "error"
    assert "killed two workers" in rows["timeout"]["error"]
    lost_last = klass.expected["hang"]["score"]
    assert (rows["hang"]["status"], float(rows["hang"]["score"])) == ("ok", lost_last)
    assert float(rows["correct"]["score"]) == klass.total
    with psycopg.connect(libpq_url(url)) as conn:
        counts = dict(conn.execute("SELECT student_id, count(*) FROM submitted_assignment"
                                   " GROUP BY student_id").fetchall())
    # one row per graded student; none for the error, which records no zeros
    assert counts == {s: 1 for s in rows if rows[s]["status"] == "ok"}
    client.wait_for_workers(2, timeout=120)  # the nannies replaced what was killed


def test_a_stopped_worker_is_given_up_within_the_watchdog_and_said_so(tmp_path, postgres, cluster,
                                                                     hostile_class, task_events):
    """A Dask worker SIGSTOPped as it starts grading: its student is given up once the
    watchdog's time has passed (the notebook's limit plus its margins; Dask itself would wait
    minutes for the lost heartbeat), the worker is restarted, the rest of the class is graded,
    and the run ends with one line naming the student and exit status 1."""
    address, client = cluster
    klass = hostile_class()
    klass.submissions = {s: klass.submissions[s] for s in ("correct", "hang")}
    root = make_course(tmp_path / "course", klass)
    notebook = 10
    watchdog = (notebook * LOAD_ALLOWANCE + 60) + 60  # one notebook: autograder.host.driver.prepare
    stopped = []

    def stop():
        watch = task_events.watch()
        while (msg := watch.get()) is not None:
            if msg["finish"] == "executing" and "-hang-" in msg["key"]:
                os.kill(msg["pid"], signal.SIGSTOP)
                stopped.append((msg["pid"], time.monotonic()))
                return

    stopper = threading.Thread(target=stop)
    stopper.start()
    run, ended = run_watched([sys.executable, "-m", "autograder", "grade", "toy", "--root",
                              str(root), "--db", postgres("stopped_worker"), "--scheduler",
                              address, "--no-progress", "--timeout-cell", "10",
                              "--timeout-notebook", str(notebook)], task_events)
    try:
        out = ended(watchdog + 240)
    finally:
        run.kill()
        stopper.join()
        for pid, _ in stopped:
            try:
                os.kill(pid, signal.SIGCONT)  # if it was not restarted, let it go on
            except ProcessLookupError:
                pass
    assert stopped, f"the hang submission never ran: {out}"
    seconds = time.monotonic() - stopped[0][1]
    assert run.returncode == 1 and "Traceback" not in out, out
    last = out.strip().splitlines()[-1]
    assert "1 submission(s) not graded" in last and "hang" in last and "gave up after" in last, last
    given_up = int(re.search(r"gave up after (\d+) s", last).group(1))
    assert watchdog <= given_up <= watchdog + 10, last
    assert seconds < watchdog + 120, seconds
    with open(root / "grades.csv", newline="") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert rows["correct"]["status"] == "ok" and rows["hang"]["status"] == "error", rows
    client.wait_for_workers(2, timeout=120)  # the stopped worker was replaced


# -- bad clusters and databases: one line, nothing written -------------------------------------
def listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_unreachable_scheduler_is_one_line_and_writes_nothing(tmp_path, hostile_class):
    root = make_course(tmp_path / "course", hostile_class())
    before = listing(root)
    port = free_port()
    done = cli("grade", "toy", "--root", str(root), "--scheduler", f"tcp://127.0.0.1:{port}")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("--scheduler: cannot reach the Dask scheduler"), \
        done.stderr
    assert listing(root) == before


def test_unreachable_database_is_one_line_and_writes_nothing(tmp_path, hostile_class):
    root = make_course(tmp_path / "course", hostile_class())
    before = listing(root)
    done = cli("grade", "toy", "--root", str(root),
               "--db", f"postgresql://nobody@127.0.0.1:{free_port()}/gradebook")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot connect to the PostgreSQL gradebook" in lines[0], done.stderr
    assert listing(root) == before


# -- the course lock across hosts, and concurrent assignments ---------------------------------
def test_lock_holds_across_hosts_and_names_the_holder(tmp_path, postgres, hostile_class):
    url = postgres("locked")
    root = make_course(tmp_path / "course", hostile_class())
    label = "grade toy, pid 4242 on grading-host-2"
    with advisory_lock(engine_url(url), "autograder:grade:toy", label=label, wait=False) as held:
        assert held
        done = cli("grade", "toy", "--root", str(root), "--db", url)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"another command holds this course: {label}; wait for it "
                                   "to finish (or stop it) and run grade again")
    assert not (root / "grades.csv").exists()


def test_runs_of_different_assignments_share_one_postgres_gradebook(tmp_path, postgres,
                                                                   hostile_class):
    url = postgres("two_assignments")
    klass = hostile_class()
    klass.submissions = {s: klass.submissions[s] for s in ("correct", "partial", "untouched")}
    root = make_course(tmp_path / "course", klass, "toy")
    make_course(root, klass, "toy-b")
    runs = [subprocess.Popen([sys.executable, "-m", "autograder", "grade", name, "--root",
                              str(root), "--db", url, "--jobs", "1", "--no-progress"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for name in ("toy", "toy-b")]
    outs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outs
    with psycopg.connect(libpq_url(url)) as conn:
        rows = conn.execute("SELECT a.name, s.student_id FROM submitted_assignment s"
                            " JOIN assignment a ON a.id = s.assignment_id").fetchall()
        students = [r[0] for r in conn.execute("SELECT id FROM student").fetchall()]
    assert sorted(rows) == sorted((a, s) for a in ("toy", "toy-b") for s in klass.submissions)
    assert sorted(students) == sorted(klass.submissions)
    with open(root / "grades.csv", newline="") as f:
        found = sorted((r["assignment"], r["student"], float(r["score"])) for r in csv.DictReader(f))
    assert found == sorted((a, s, float(klass.expected[s]["score"]))
                           for a in ("toy", "toy-b") for s in klass.submissions)
    assert not re.search(r"Traceback", "".join(outs))


# -- the worker plugin ---------------------------------------------------------------------------
def plugin_workdirs(client, name):
    return client.run(lambda dask_worker: dask_worker.plugins[name].settings.workdir)


def test_plugin_preloads_a_sandboxed_kernel_and_removes_everything_at_the_end(tmp_path, cluster):
    """Also when a run's plugin was left behind on the workers, with its kernels killed: Dask
    can leave one on a worker that joined as that run ended, whose teardown on another worker
    of the host then killed the run's kernels. It must not keep the next run from its spare,
    and ``forget_plugin`` (which the client calls after unregistering) removes it."""
    from autograder.core.grading_run import RunPayload, Settings, forget_plugin
    from autograder.sandbox.cgroups import kernel_cgroups, kill_run_cgroups
    from autograder.worker.plugin import GradingPlugin

    def spare_state():  # defined here, so Dask ships it by value (workers lack tests/)
        from jupyter_core.utils import run_sync

        from autograder.worker.plugin import _ProcessRun
        from autograder.judge.execute import SpareKernel

        return dict(run=_ProcessRun.run, spare=SpareKernel.km is not None,
                    alive=SpareKernel.km is not None and run_sync(SpareKernel.km.is_alive)())

    _, client = cluster
    release = generate("toy", FIXTURE, release_dir=tmp_path / "release")
    generate("toy", FIXTURE, release_dir=tmp_path / "r2", db_url=f"sqlite:///{tmp_path}/t.db")

    def plugin(run_id):
        settings = Settings(root=str(FIXTURE), assignment="toy", template_db=str(tmp_path / "t.db"),
                            release_dir=str(release), workdir=str(tmp_path), run_id=run_id)
        return GradingPlugin(RunPayload(settings=settings,
                                        release={"toy.ipynb": (release / "toy.ipynb").read_bytes()},
                                        template_db=(tmp_path / "t.db").read_bytes()))

    left = plugin("leftover")

    async def add_without_the_scheduler(dask_worker):  # as the racing worker got it
        return (await dask_worker.plugin_add(left, name=left.name))["status"]

    assert set(client.run(add_without_the_scheduler).values()) == {"OK"}
    deadline = time.monotonic() + 30  # each spare's launcher has made its cgroup
    while (len([g for g in kernel_cgroups() if g.startswith("kleftover-")]) < len(client.scheduler_info()["workers"])
           and time.monotonic() < deadline):
        time.sleep(0.1)
    kill_run_cgroups("leftover")
    assert not any(s["alive"] for s in client.run(spare_state).values())
    left_dirs = plugin_workdirs(client, left.name)

    run = plugin("plugintest")
    client.register_plugin(run, name=run.name)
    try:
        workdirs = plugin_workdirs(client, run.name)
        assert all(Path(w).is_dir() for w in workdirs.values())
        deadline = time.monotonic() + 30
        while (not all(s["alive"] for s in client.run(spare_state).values())
               and time.monotonic() < deadline):
            time.sleep(0.5)
        states = client.run(spare_state)
        assert all(s == dict(run=run.name, spare=True, alive=True) for s in states.values()), states
    finally:
        client.unregister_worker_plugin(run.name)
    assert not any(s["spare"] for s in client.run(spare_state).values())
    assert not any(Path(w).exists() for w in workdirs.values())
    assert all(Path(w).is_dir() for w in left_dirs.values())
    assert set(client.run(forget_plugin, left.name).values()) == {True}
    assert set(client.run(forget_plugin, left.name).values()) == {False}
    assert not any(Path(w).exists() for w in left_dirs.values())


def test_a_worker_that_does_not_answer_is_one_line_after_the_bound(cluster):
    """client.run waits for as long as a stuck worker takes; run_on_workers gives up in time."""
    from autograder.host.cluster import ClusterError, run_on_workers

    _, client = cluster
    start = time.monotonic()
    with pytest.raises(ClusterError, match="did not answer a nap within 1 s"):
        run_on_workers(client, time.sleep, 4, what="a nap", timeout=1)
    assert time.monotonic() - start < 3
    assert sorted(run_on_workers(client, os.getpid, what="their pids").values()) != []


SERVER_OWNER = """\
import sys, time
sys.path.insert(0, sys.argv[1])
from tests.servers import postgres_server
with postgres_server() as url:
    print(url.rsplit(":", 1)[1].split("/")[0], flush=True)
    time.sleep(600)
"""


def test_the_postgres_server_dies_with_a_test_process_killed_outright(tmp_path):
    """A test process killed with SIGKILL runs no finalizer: the server it started must still
    stop by itself (``PR_SET_PDEATHSIG``, set after the switch to the ``postgres`` user, since
    changing credentials clears it)."""
    owner = subprocess.Popen([sys.executable, "-c", SERVER_OWNER, str(Path(__file__).parents[3])],
                             stdout=subprocess.PIPE, text=True)
    port = int(owner.stdout.readline())
    found = subprocess.run(["pgrep", "-af", f"postgres -D .* -p {port} "], capture_output=True,
                           text=True).stdout.splitlines()
    assert found, "the server did not start"
    server = [line.split()[0] for line in found]
    data = Path(found[0].split(" -D ", 1)[1].split()[0])  # postgres_server's own temporary folder
    assert data.parent.name.startswith("autograder-pg-"), data
    try:
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in server):
            time.sleep(0.2)
        assert not any(Path(f"/proc/{pid}").exists() for pid in server), "the server outlived its test"
    finally:
        shutil.rmtree(data.parent, ignore_errors=True)  # what the killed owner could not remove
