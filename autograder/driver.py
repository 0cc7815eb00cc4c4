"""``python -m autograder grade``: grade a whole class, in parallel, safely.

The parent process

1. generates the student version into a scratch folder (to audit submissions
   against it) and registers the assignment in the class gradebook and in a
   scratch *template* gradebook;
2. starts ``jobs`` worker processes (:mod:`autograder.worker`), each with its own
   copy of the template gradebook, and hands them one student at a time;
3. copies every result into the class gradebook as it arrives (only the parent
   writes there, so parallel workers cannot corrupt it), replacing any earlier
   grades of that student (re-grading is idempotent; manual scores are kept);
4. replaces a worker that dies or runs past its watchdog (the student is
   recorded as an error with zero marks, the class goes on);
5. writes ``grades.csv`` and prints the class summary.
"""

import multiprocessing
import os
import re
import shutil
import signal
import tempfile
import warnings
from collections import deque
from multiprocessing.connection import wait
from pathlib import Path
from time import monotonic

import nbformat

from . import summary, worker
from .audit import grade_id, is_locked
from .kernel import make_run_cgroup, remove_run_cgroup
from .nbgrader_config import SOURCE, SUBMITTED, default_db_url
from .release import generate


def find_students(root, assignment, only=None):
    """Students with at least one notebook in ``submitted/<student>/<assignment>/``."""
    base = Path(root) / SUBMITTED
    found = sorted(d.name for d in base.iterdir()
                   if any((d / assignment).glob("*.ipynb"))) if base.is_dir() else []
    if only:
        unknown = sorted(set(only) - set(found))
        if unknown:
            raise SystemExit(f"no submission of {assignment} for: {', '.join(unknown)}")
        found = [s for s in found if s in only]
    return found


def test_cells(release_dir):
    """(notebook, grade_id) of every autograded test cell of the student version."""
    tests = []
    for path in sorted(Path(release_dir).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        tests += [(path.stem, grade_id(c)) for c in nb.cells
                  if is_locked(c) and c.metadata.nbgrader.get("grade") and c.cell_type == "code"]
    return tests


def network_isolation_works():
    """True if a child process can enter an empty network namespace (needs root)."""
    from .kernel import isolate_network

    pid = os.fork()
    if pid == 0:
        os._exit(0 if isolate_network() else 1)
    return os.waitpid(pid, 0)[1] == 0


def preloads(source_dir):
    """Modules the kernel server should import: NumPy, and torch if the assignment uses it."""
    text = "".join(p.read_text() for p in Path(source_dir).glob("*.ipynb"))
    return ("numpy", "torch") if re.search(r"\bimport torch\b", text) else ("numpy",)


class Worker:
    """A worker process and the parent's end of its pipe."""

    def __init__(self, settings, index):
        # fork: the worker starts with nbgrader already imported, and grade() works
        # from scripts without a ``__main__`` guard. The parent holds no open
        # gradebook connection or threads while it forks.
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker.main, args=(child, settings, index), daemon=True)
        self.process.start()
        child.close()
        self.piddir = Path(settings.workdir) / f"worker{index}" / "pids"
        self.student, self.started = None, 0.0

    def kill(self):
        """Kill the worker and every kernel it left running."""
        self.process.kill()
        self.process.join()
        for pidfile in self.piddir.glob("*") if self.piddir.is_dir() else []:
            try:
                os.killpg(int(pidfile.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError):
                pass


def failed(student, error, seconds):
    """The result of a student whose grading crashed outside nbgrader."""
    return dict(student=student, status="error", error=error, events=[], tampered=[], deleted=[],
                flags=[], unreadable=[], missing=[], timestamp=None, notebooks=[], seconds=seconds)


def run_pool(settings, students, jobs, watchdog, on_result, meanwhile=None):
    """Grade ``students`` on ``jobs`` workers; call ``on_result(result)`` in the parent.

    ``meanwhile()`` runs in the parent once the workers have their first students.
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
        if meanwhile:
            meanwhile()
        while pending or any(w.student for w in workers):
            for w in workers:
                if w.student is None and pending:
                    w.student, w.started = pending.popleft(), monotonic()
                    w.conn.send(w.student)
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
                if received:
                    w.student = None
                else:  # dead or stuck: replace it
                    w.kill()
                    workers[i] = Worker(settings, next_index)
                    next_index += 1
                on_result(result)
    finally:
        for w in workers:
            if w.process.is_alive() and w.student is None:
                w.conn.send(None)
        for w in workers:
            w.process.join(timeout=10)
            w.kill()


def record(db_url, assignment, result):
    """Copy one student's result into the class gradebook; return (score, max_score, needs_manual)."""
    import sqlalchemy.exc
    from nbgrader.api import Gradebook, MissingEntry

    student = result["student"]
    with warnings.catch_warnings(), Gradebook(db_url) as gb:
        # nbgrader's update_or_create_submission trips harmless SQLAlchemy autoflush warnings
        warnings.simplefilter("ignore", sqlalchemy.exc.SAWarning)
        gb.update_or_create_student(student)
        extra = {"timestamp": result["timestamp"]} if result["timestamp"] else {}
        sub = gb.update_or_create_submission(assignment, student, **extra)
        graded = {nb["name"]: nb for nb in result["notebooks"]}
        for notebook in sub.notebooks:
            data = graded.get(notebook.name)
            scores = {g["name"]: g["auto_score"] for g in data["grades"]} if data else {}
            if data:
                notebook.late_submission_penalty = data["late_penalty"]
            for grade in notebook.grades:
                auto = 0.0 if result["status"] != "ok" else scores.get(grade.name, 0.0)
                grade.auto_score = auto
                grade.needs_manual_grade = grade.manual_score is not None or auto is None
            comments = {c["name"]: c["auto_comment"] for c in data["comments"]} if data else {}
            for comment in notebook.comments:
                comment.auto_comment = comments.get(comment.name)
        gb.db.commit()
        try:
            sub = gb.find_submission(assignment, student)
        except MissingEntry:  # pragma: no cover - just created
            return 0.0, 0.0, False
        return sub.score, sub.max_score, bool(sub.needs_manual_grade)


def grade(assignment, root=".", db_url=None, jobs=None, cell_timeout=30, notebook_timeout=600,
          memory_mb=4096, output_limit=200_000, students=None, progress=True, out=None):
    """Grade every submission of ``assignment``; return the list of result dicts.

    Writes the gradebook, ``autograded/``, ``feedback/`` and ``grades.csv``
    under ``root`` and prints the class summary to ``out`` (default stdout).
    """
    root = Path(root).resolve()
    db_url = db_url or default_db_url(root)
    if not (root / SOURCE / assignment).is_dir():
        raise SystemExit(f"no source notebooks in {root / SOURCE / assignment}")
    names = find_students(root, assignment, students)
    jobs = max(1, jobs or os.cpu_count() or 1)
    workdir = Path(tempfile.mkdtemp(prefix="autograder-"))
    cgroup = make_run_cgroup()
    start = monotonic()
    try:
        release = generate(assignment, root, release_dir=workdir / "release",
                           db_url=f"sqlite:///{workdir}/template.db")
        settings = worker.Settings(
            root=str(root), assignment=assignment, template_db=str(workdir / "template.db"),
            release_dir=str(release), workdir=str(workdir), cell_timeout=cell_timeout,
            notebook_timeout=notebook_timeout, memory_mb=memory_mb, output_limit=output_limit,
            no_network=network_isolation_works(), preload=preloads(root / SOURCE / assignment),
            cgroup=cgroup or "")
        n_notebooks = max(1, len(list(release.glob("*.ipynb"))))
        watchdog = n_notebooks * (notebook_timeout + 60) + 60
        bar = summary.Progress(len(names), enabled=progress)
        results = []

        def on_result(result):
            result["score"], result["max_score"], result["needs_manual"] = record(db_url, assignment, result)
            results.append(result)
            bar.update(result["student"])

        def register():  # the class gradebook learns the assignment while workers start
            generate(assignment, root, release_dir=workdir / "release-db", db_url=db_url)

        run_pool(settings, names, jobs, watchdog, on_result, meanwhile=register)
        bar.close()
        results.sort(key=lambda r: r["student"])
        tests = test_cells(release)
        summary.write_csv(root / "grades.csv", assignment, results, tests)
        summary.report(assignment, results, tests, monotonic() - start, jobs, settings, out=out)
        return results
    finally:
        remove_run_cgroup(cgroup)
        shutil.rmtree(workdir, ignore_errors=True)
