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

Usage: python benchmarks/bench_grading.py [--assignment ID] [-n 100] [--jobs 2] [--skip-stock]
       [--scheduler tcp://HOST:8786 | --dask-workers 1,2]
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
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autograder.host.release import generate  # noqa: E402


def solved(source, release):
    """The student version with every solution cell filled in from the source."""
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    nb = copy.deepcopy(release)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution") and gid in solutions:
            cell.source = "\n".join(line for line in solutions[gid].splitlines()
                                    if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)
    return nb


def make_class(root, assignment, course, n):
    shutil.copytree(course / "solutions" / assignment, root / "solutions" / assignment)
    source = nbformat.read(root / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    release_dir = generate(assignment, root, release_dir=root / "release")
    release = nbformat.read(release_dir / f"{assignment}.ipynb", as_version=4)
    base = solved(source, release)
    first = next(c for c in base.cells if c.metadata.get("nbgrader", {}).get("solution"))
    for i in range(n):
        nb = copy.deepcopy(base)
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                    == first.metadata["nbgrader"]["grade_id"])
        cell.source = f"# submission {i}\n" + cell.source + "\n" * (i % 3)
        folder = root / "submitted" / f"student{i:03d}" / assignment
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{assignment}.ipynb")


def run(cmd, cwd):
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                        "PYTHONPATH": str(REPO)})
    return time.perf_counter() - start


def stock(root, assignment, n):
    """Seconds for stock nbgrader autograde, and for autograde + feedback."""
    common = ["--CourseDirectory.root=" + str(root), "--CourseDirectory.source_directory=solutions",
              f"--CourseDirectory.db_url=sqlite:///{root}/stock.db", "--Execute.timeout=30"]
    nbgrader = [sys.executable, "-m", "nbgrader"]
    run(nbgrader + ["generate_assignment", assignment, "--force",
                    "--CourseDirectory.release_directory=release-stock"] + common, root)
    autograde = run(nbgrader + ["autograde", assignment, "--force"] + common, root)
    feedback = run(nbgrader + ["generate_feedback", assignment, "--force"] + common, root)
    return autograde, autograde + feedback


def driver(root, assignment, jobs, scheduler=None):
    """Seconds for ``grade`` of the whole class (every submission graded again)."""
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "01-rope" if (REPO / "solutions" / "01-rope").is_dir() else "toy"
    parser.add_argument("--assignment", default=default)
    parser.add_argument("-n", type=int, default=100, help="submissions (default 100)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--skip-stock", action="store_true", help="time only the driver")
    parser.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                        help="also time grading on the Dask cluster of this scheduler")
    parser.add_argument("--dask-workers", default=None, metavar="K,K",
                        help="also time grading on a local Dask cluster of K workers, for each K")
    args = parser.parse_args()
    course = REPO / "tests" / "fixtures" / "course" if args.assignment == "toy" else REPO
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        root = Path(tmp)
        make_class(root, args.assignment, course, args.n)
        ours = progress("driver", driver(root, args.assignment, args.jobs))
        with open(root / "grades.csv", newline="") as f:
            scores = Counter((row["score"], row["status"]) for row in csv.DictReader(f))
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
                    dask_rows.append((name, progress(name, driver(root, args.assignment,
                                                                  args.jobs, address))))
                    overheads.append((f"{k} local worker(s)",
                                      progress(f"Dask round trip, {k} worker(s)",
                                               dask_overhead(address, files))))
        if not args.skip_stock:
            auto, both = stock(root, args.assignment, args.n)
            progress("stock nbgrader autograde + generate_feedback", both)
            rows += [("stock nbgrader autograde (sequential)", auto),
                     ("stock nbgrader autograde + generate_feedback", both)]
    print(f"\nGrading {args.n} submissions of {args.assignment} on {os.cpu_count()} cores "
          f"(load average at the end {os.getloadavg()[0]:.1f})")
    print(f"{'':55} {'seconds':>8} {'s/student':>10}")
    for name, seconds in rows + dask_rows:
        print(f"{name:55} {seconds:8.1f} {seconds / args.n:10.2f}")
    for name, seconds in dask_rows:
        print(f"{name}: {ours / seconds:.0%} of the local driver's throughput")
    for where, seconds in overheads:
        print(f"Dask's own cost per submission ({where}, a {sum(map(len, files.values())):,}-byte "
              f"submission in and out, median of 200 round trips): {seconds * 1000:.1f} ms")
    print(f"sandboxed kernel start-up (launch to first reply, median of 5): "
          f"{sandbox_startup():.2f} s")
    print("driver's scores (score, status): count = "
          + ", ".join(f"{k}: {v}" for k, v in sorted(scores.items())))
    if len(rows) == 3:
        print(f"speed-up of the driver: {rows[1][1] / ours:.2f}x over stock autograde, "
              f"{rows[2][1] / ours:.2f}x over stock autograde + feedback")


if __name__ == "__main__":
    main()
