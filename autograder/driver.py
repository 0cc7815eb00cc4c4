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
import shutil
import tempfile
import warnings
from collections import deque
from multiprocessing.connection import wait
from pathlib import Path
from time import monotonic

import nbformat

from . import sandbox, summary, worker
from .audit import grade_id, is_locked
from .limits import Limits
from .nbgrader_config import SOURCE, SUBMITTED, default_db_url
from .release import generate
from .similarity import similar_pairs


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
        self.student, self.started = None, 0.0

    def kill(self):
        """Kill the worker; its kernels die with it (bubblewrap's ``--die-with-parent``)."""
        self.process.kill()
        self.process.join()
        sandbox.sweep_cgroups()


def failed(student, error, seconds):
    """The result of a student whose grading crashed outside nbgrader."""
    return dict(student=student, status="error", error=error, events=[], tampered=[], deleted=[],
                flags=[], unreadable=[], missing=[], resemblances=[], functions={}, timestamp=None,
                notebooks=[], seconds=seconds)


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


def flag_similar(results):
    """Flag students whose functions look copied from each other (for a human to look at)."""
    by_student = {r["student"]: r for r in results}
    pairs = similar_pairs({r["student"]: r.get("functions", {}) for r in results})
    for student, other, function, share in pairs:
        for me, them in ((student, other), (other, student)):
            result = by_student[me]
            result["flags"] = sorted(set(result["flags"]) | {"similar-to-classmate"})
            result.setdefault("similar", []).append(f"{function} ~ {them} ({share:.0%})")


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


def grade(assignment, root=".", db_url=None, jobs=None, limits=None, students=None,
          progress=True, out=None, sandboxed=True):
    """Grade every submission of ``assignment``; return the list of result dicts.

    Writes the gradebook, ``autograded/``, ``feedback/`` and ``grades.csv``
    under ``root`` and prints the class summary to ``out`` (default stdout).
    ``sandboxed=False`` runs kernels without the OS sandbox: only for notebooks
    you trust (e.g. checking the instructor's own solutions).
    """
    root = Path(root).resolve()
    limits = limits or Limits()
    db_url = db_url or default_db_url(root)
    if not (root / SOURCE / assignment).is_dir():
        raise SystemExit(f"no source notebooks in {root / SOURCE / assignment}")
    if sandboxed and (reason := sandbox.unavailable_reason()):
        raise SystemExit(f"cannot grade untrusted notebooks safely: {reason}")
    names = find_students(root, assignment, students)
    jobs = max(1, jobs or os.cpu_count() or 1)
    workdir = Path(tempfile.mkdtemp(prefix="autograder-"))
    os.chmod(workdir, 0o711)  # kernels (user nobody) reach their socket folders, nothing else
    start = monotonic()
    try:
        release = generate(assignment, root, release_dir=workdir / "release",
                           db_url=f"sqlite:///{workdir}/template.db")
        settings = worker.Settings(
            root=str(root), assignment=assignment, template_db=str(workdir / "template.db"),
            release_dir=str(release), workdir=str(workdir), limits=limits, sandboxed=sandboxed)
        n_notebooks = max(1, len(list(release.glob("*.ipynb"))))
        watchdog = n_notebooks * (limits.notebook_timeout + 60) + 60
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
        flag_similar(results)
        tests = test_cells(release)
        summary.write_csv(root / "grades.csv", assignment, results, tests)
        summary.report(assignment, results, tests, monotonic() - start, jobs, settings, out=out)
        return results
    finally:
        sandbox.sweep_cgroups()
        shutil.rmtree(workdir, ignore_errors=True)
