"""How fast the one client of a cluster run records results: gradebook rows, files, stamp.

On a cluster only the ``grade`` process writes (:func:`autograder.host.driver.record_result`: the
gradebook first, then the autograded notebook and the feedback page, then the stamp), one
result after another, so its recording rate caps the class's throughput however many
workers grade. This grades one submission of the fixture course, then records that result
again under N fresh student ids into a new SQLite gradebook and into a PostgreSQL gradebook
on a throwaway local server (Debian's ``postgresql``; skipped with a hint when absent),
and prints the median and 95th percentile per result and the results per second that one
client can record; then the results per second of ``--runs`` clients recording different
assignments of one PostgreSQL gradebook at once (runs of different assignments do not
wait for each other, except to create a student both meet).

Usage: python benchmarks/bench_recording.py [-n 300] [--runs 2]
The PostgreSQL server runs with fsync off (a test server): a production server that syncs
its log on every commit is slower per row; measure yours with ``--db-url``.
"""

import argparse
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autograder.host.driver import grade, record_result  # noqa: E402
from autograder.core.gradebook import open_gradebook, writing  # noqa: E402
from tests.servers import POSTGRES_HINT, postgres_bin, postgres_server  # noqa: E402
from autograder.host.release import generate  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "course"
ASSIGNMENT = "toy"


def graded_result(root):
    """One real, graded result of the fixture course's solved notebook."""
    shutil.copytree(FIXTURE / "solutions", root / "solutions")
    source = root / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    folder = root / "submitted" / "model" / ASSIGNMENT
    folder.mkdir(parents=True)
    nbformat.write(nbformat.read(source, as_version=4), folder / f"{ASSIGNMENT}.ipynb")
    [result] = grade(ASSIGNMENT, root=root, db_url=f"sqlite:///{root}/first.db", jobs=1,
                     progress=False, out=open("/dev/null", "w"))
    return result


def as_student(result, student, assignment=ASSIGNMENT):
    """The same result, as if ``student`` had handed it in for ``assignment`` (file paths too)."""
    files = {path.replace(f"/{result.student}/{ASSIGNMENT}/", f"/{student}/{assignment}/"): data
             for path, data in result.files.items()}
    return replace(result, student=student, files=files)


def record_many(root, db_url, result, n, assignment=ASSIGNMENT):
    """Seconds per :func:`record_result` of ``n`` fresh students into the gradebook at ``db_url``."""
    with writing(db_url), open_gradebook(db_url):  # made ready as ``grade`` makes it
        pass
    if assignment != ASSIGNMENT and not (root / "solutions" / assignment).exists():
        shutil.copytree(root / "solutions" / ASSIGNMENT, root / "solutions" / assignment)
    with writing(db_url):
        generate(assignment, root, release_dir=Path(tempfile.mkdtemp(dir=root)), db_url=db_url)
    times = []
    for i in range(n):
        student = as_student(result, f"s{i:05d}", assignment)
        start = time.perf_counter()
        record_result(root, db_url, assignment, student, "bench")
        times.append(time.perf_counter() - start)
    return times


def record_at_once(root, db_url, result, n, runs):
    """Results per second of ``runs`` clients recording different assignments at once.

    Each client is a process of its own, as the ``grade`` runs of different assignments
    are; all of them record the same ``n`` students, so every new student is met by
    every run (the write lock's case).
    """
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(runs, mp_context=context) as pool:
        start = time.perf_counter()
        list(pool.map(record_many, [root] * runs, [db_url] * runs, [result] * runs, [n] * runs,
                      [f"{ASSIGNMENT}{k}" for k in range(runs)]))
        return runs * n / (time.perf_counter() - start)


def line(name, times):
    median = statistics.median(times)
    p95 = sorted(times)[int(0.95 * (len(times) - 1))]
    print(f"{name:34} {median * 1000:8.1f} {p95 * 1000:8.1f} {1 / median:10.0f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=300, help="results recorded per gradebook")
    parser.add_argument("--runs", type=int, default=2,
                        help="clients recording different assignments at once (default 2)")
    parser.add_argument("--db-url", default=None, help="also time this (empty) gradebook")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-recording-") as tmp:
        root = Path(tmp)
        result = graded_result(root)
        size = sum(map(len, result.files.values()))
        print(f"\nRecording {args.n} results ({size:,} bytes of files each) by one client")
        print(f"{'gradebook':34} {'median ms':>8} {'p95 ms':>8} {'results/s':>10}")
        line("SQLite (file)", record_many(root, f"sqlite:///{root}/class.db", result, args.n))
        if postgres_bin() is None:
            print(f"PostgreSQL skipped: {POSTGRES_HINT}")
        else:
            with postgres_server("bench_recording") as url:
                line("PostgreSQL (local, fsync off)", record_many(root, url, result, args.n))
            with postgres_server("bench_recording") as url:
                rate = record_at_once(root, url, result, args.n, args.runs)
                print(f"PostgreSQL, {args.runs} runs of different assignments at once: "
                      f"{rate:.0f} results/s in all")
        if args.db_url:
            line(args.db_url.split("@")[-1], record_many(root, args.db_url, result, args.n))


if __name__ == "__main__":
    main()
