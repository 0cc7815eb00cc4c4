"""How long ``python -m autograder report`` takes on a large term, and its peak memory.

Makes a synthetic gradebook of N students (default 10,000) x the course's 7 assignments:
the assignments, notebooks and graded cells of the real source notebooks (registered through
nbgrader's API: a few hundred rows), then every student, submission, notebook and grade as
bulk SQL inserts into nbgrader's tables (executemany, 20,000 rows a statement batch, not
the ORM row by row). Students have an ability and a trend across the term; each test cell
passes with a probability from them, a few hand in nothing, some are late (with a penalty),
some written answers have a manual grade. Then it runs ``report`` (every assignment page and
the term) in a fresh process and prints its wall time and peak resident memory, for SQLite
and for PostgreSQL on a throwaway local server (skipped with a hint without one).

Memory stays flat if the report streams: run with ``-n 1000`` and ``-n 10000`` and compare
the peaks (what grows is a few numbers per student, not the rows read).

Usage: python benchmarks/bench_report.py [-n 10000] [--seed 0] [--no-postgres]
Target: <= 30 s for the term of 10,000 students on 2 cores.
"""

import argparse
import random
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autograder.core.assignments import ASSIGNMENTS  # noqa: E402
from autograder.core.cells import grade_id, is_grade  # noqa: E402
from autograder.core.gradebook import open_gradebook  # noqa: E402
from tests.servers import POSTGRES_HINT, postgres_bin, postgres_server  # noqa: E402

BATCH = 20_000
GNU_TIME = "/usr/bin/time"
TERM_START = datetime(2026, 9, 14, 23, 59)


def graded_cells(assignment):
    """``[(notebook, grade id, points, 'code' | 'markdown')]`` of the source notebook."""
    path = REPO / "solutions" / assignment / f"{assignment}.ipynb"
    nb = nbformat.read(path, as_version=4)
    return [(path.stem, grade_id(c), float(c.metadata.nbgrader.get("points") or 0), c.cell_type)
            for c in nb.cells if is_grade(c)]


def register(db_url, assignments):
    """The assignments, their notebooks and graded cells, through nbgrader's API."""
    structure = {}
    with open_gradebook(db_url) as gb:
        for k, aid in enumerate(assignments):
            gb.add_assignment(aid, duedate=TERM_START + timedelta(weeks=2 * k))
            cells = graded_cells(aid)
            for nb in dict.fromkeys(c[0] for c in cells):
                gb.add_notebook(nb, aid)
            ids = {}
            for nb, gid, points, kind in cells:
                cell = gb.add_grade_cell(gid, nb, aid, max_score=points, cell_type=kind)
                if kind == "markdown":
                    gb.add_solution_cell(gid, nb, aid)
                ids[(nb, gid)] = (cell.id, cell.notebook.id, points, kind)
            structure[aid] = (gb.find_assignment(aid).id, TERM_START + timedelta(weeks=2 * k), ids)
    return structure


def synthetic_rows(n_students, structure, seed):
    """Rows of ``student``, ``submitted_assignment``, ``submitted_notebook`` and ``grade``."""
    rng = random.Random(seed)
    students, subs, notebooks, grades = [], [], [], []
    names = list(structure)
    for i in range(n_students):
        sid = f"s{i:06d}"
        students.append({"id": sid, "first_name": f"First{i}", "last_name": f"Last{i}",
                         "email": f"{sid}@example.edu", "lms_user_id": None})
        ability = rng.betavariate(5, 2)
        falling = rng.random() < 0.05
        for k, aid in enumerate(names):
            if rng.random() < (0.04 + (0.08 * k if falling else 0)):
                continue  # handed in nothing
            assignment_id, due, cells = structure[aid]
            late = rng.random() < 0.08
            sub_id = uuid.uuid4().hex
            subs.append({"id": sub_id, "assignment_id": assignment_id, "student_id": sid,
                         "timestamp": due + (timedelta(hours=rng.uniform(1, 60)) if late
                                             else -timedelta(hours=rng.uniform(1, 100))),
                         "extension": None})
            level = max(0.0, ability - (0.12 * k if falling else 0.0))
            by_notebook = {}
            for (nb, gid), (cell_id, notebook_id, points, kind) in cells.items():
                if notebook_id not in by_notebook:
                    by_notebook[notebook_id] = uuid.uuid4().hex
                    notebooks.append({"id": by_notebook[notebook_id], "assignment_id": sub_id,
                                      "notebook_id": notebook_id, "flagged": False,
                                      "late_submission_penalty": 1.0 if late else 0.0})
                if kind == "code":
                    auto = points if rng.random() < level else 0.0
                    manual = None
                else:
                    auto = None
                    manual = round(points * rng.random() * level) if rng.random() < 0.7 else None
                grades.append({"id": uuid.uuid4().hex, "notebook_id": by_notebook[notebook_id],
                               "cell_id": cell_id, "auto_score": auto, "manual_score": manual,
                               "extra_credit": None, "needs_manual_grade": kind != "code" and manual is None})
    return students, subs, notebooks, grades


def make_gradebook(db_url, n_students, seed=0, assignments=ASSIGNMENTS):
    """A synthetic gradebook at ``db_url``; returns the seconds the inserts took."""
    from sqlalchemy import MetaData

    structure = register(db_url, assignments)
    rows = synthetic_rows(n_students, structure, seed)
    start = time.perf_counter()
    with open_gradebook(db_url) as gb:
        meta = MetaData()
        meta.reflect(gb.engine, only=["student", "submitted_assignment", "submitted_notebook", "grade"])
        with gb.engine.begin() as conn:
            for table, values in zip(("student", "submitted_assignment", "submitted_notebook", "grade"), rows):
                for i in range(0, len(values), BATCH):
                    conn.execute(meta.tables[table].insert(), values[i:i + BATCH])
    return time.perf_counter() - start


def course_root(tmp):
    """A course root with the real source notebooks (the report reads their part headings)."""
    root = Path(tmp) / "course"
    root.mkdir()
    (root / "solutions").symlink_to(REPO / "solutions")
    return root


def run_report(root, db_url):
    """``(wall seconds, CPU seconds, peak MiB)`` of ``python -m autograder report`` in a fresh process.

    CPU seconds (user + system) say what the report costs on a machine whose other load
    stretches the wall time. GNU ``time`` measures the process: a child of this process
    would inherit its resident size until it execs (this one holds the synthetic rows),
    and Linux counts that in the child's peak.
    """
    if not Path(GNU_TIME).is_file():
        raise SystemExit(f"{GNU_TIME} not found: apt-get install time")
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
        proc = subprocess.run([GNU_TIME, "-f", "%e %U %S %M", "-o", out.name, sys.executable, "-m",
                               "autograder", "report", "--root", str(root), "--db", db_url],
                              cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"report failed: {proc.stderr.strip()[-2000:]}")
        wall, user, system, peak_kib = out.read().split()[-4:]
    return float(wall), float(user) + float(system), int(peak_kib) / 1024


def measure(label, db_url, root, n, seed):
    inserted = make_gradebook(db_url, n, seed)
    seconds, cpu, peak = run_report(root, db_url)
    size = sum(p.stat().st_size for p in (root / "reports").iterdir())
    print(f"| {label} | {n:,} x {len(ASSIGNMENTS)} | {inserted:.1f} s | {seconds:.1f} s | "
          f"{cpu:.1f} s | {peak:.0f} MiB | {size / 2**20:.1f} MiB |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10_000, help="students (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    args = parser.parse_args()
    print("| gradebook | students x assignments | bulk insert | report (term + 7 pages) | "
          "its CPU time | peak memory | written |\n|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        root = course_root(tmp)
        measure("SQLite", f"sqlite:///{root}/gradebook.db", root, args.n, args.seed)
    if args.no_postgres:
        return
    if postgres_bin() is None:
        print(f"PostgreSQL skipped: {POSTGRES_HINT}")
        return
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp, postgres_server() as url:
        root = course_root(tmp)
        measure("PostgreSQL", url, root, args.n, args.seed)


if __name__ == "__main__":
    main()
