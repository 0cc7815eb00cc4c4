"""Graded on submission: ``python -m autograder serve``'s time to feedback, and a deadline burst.

On a course root of one assignment (default ``01-rope``: solved notebooks, each varied by a
comment, as ``bench_grading.py`` makes them) with a filesystem exchange:

1. ``grade``: ``python -m autograder grade --jobs J --force`` of the burst's notebooks, one
   per student folder: its wall time and notebooks per second (the baseline), run before
   the service and again after it (the machine's load drifts; the ratio uses the mean);
2. idle: ``serve --jobs J`` on the exchange; one hand-in to start its workers (not counted),
   then ``--idle`` hand-ins one after another, each waiting for its feedback: the time from
   the hand-in landing in ``inbound/`` (written as ``nbgrader submit`` writes it: one
   rename) to its page appearing in the exchange's ``feedback/`` (p50, p95, max);
3. burst: ``--students`` students hand in ``--per-student`` notebooks each, spread evenly
   over ``--window`` seconds (every student's first before anyone's second), into the same
   running service: time to feedback per hand-in, the burst's notebooks per second (first
   hand-in to last page) against ``grade``'s, and how many first attempts were started after
   a later-received second attempt of another student (the fairness rule says none).

Usage: python benchmarks/bench_service.py [--assignment 01-rope] [--jobs 2] [--idle 10]
       [--students 100] [--per-student 2] [--window 120]
Timings depend on the machine's load; run it on an otherwise idle machine.
"""

import argparse
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_grading import make_class  # noqa: E402
from nbgrader.utils import notebook_hash  # noqa: E402

COURSE_ID = "bench"
POLL = 0.02


def env():
    return {**os.environ, "PYTHONPATH": str(REPO)}


def hand_in(exchange, student, assignment, notebook_path):
    """What ``nbgrader submit`` writes; returns (secret, the time it landed)."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    name = f"{student}+{assignment}+{stamp}+{secrets.token_hex(6)}"
    staging = exchange / COURSE_ID / f".{name}"
    staging.mkdir()
    shutil.copy(notebook_path, staging / f"{assignment}.ipynb")
    (staging / "timestamp.txt").write_text(stamp)
    secret = secrets.token_hex(64)
    (staging / "submission_secret.txt").write_text(secret)
    os.rename(staging, exchange / COURSE_ID / "inbound" / name)
    return secret, time.perf_counter()


def page(exchange, secret, assignment):
    return exchange / COURSE_ID / "feedback" / f"{notebook_hash(secret=secret, notebook_id=assignment)}.html"


def wait_pages(exchange, assignment, pending, landed, timeout):
    """Wait for each secret's page; {secret: seconds from landing to page}."""
    got, deadline = {}, time.perf_counter() + timeout
    while len(got) < len(pending):
        if time.perf_counter() > deadline:
            raise SystemExit(f"{len(pending) - len(got)} page(s) not released within {timeout} s")
        for secret in pending:
            if secret not in got and page(exchange, secret, assignment).exists():
                got[secret] = time.perf_counter() - landed[secret]
        time.sleep(POLL)
    return got


def grade(root, assignment, jobs, students):
    """Wall seconds of ``grade --jobs J --force`` of ``students``' notebooks (printed)."""
    n = len(students)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autograder", "grade", assignment, "--root", str(root),
                    "--jobs", str(jobs), "--no-progress", "--force", "--students", ",".join(students)],
                   cwd=REPO, env=env(),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    print(f"grade --jobs {jobs}: {n} notebooks in {seconds:.1f} s = {n / seconds:.3f} notebooks/s "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    return seconds


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def line(name, waits):
    return (f"{name}: n={len(waits)} p50 {statistics.median(waits):.2f} s, "
            f"p95 {percentile(waits, 0.95):.2f} s, max {max(waits):.2f} s")


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--assignment", default="01-rope")
    a.add_argument("--jobs", type=int, default=2)
    a.add_argument("--idle", type=int, default=10)
    a.add_argument("--students", type=int, default=100)
    a.add_argument("--per-student", type=int, default=2)
    a.add_argument("--window", type=float, default=120.0)
    args = a.parse_args()
    n = args.students * args.per_student
    base = Path(tempfile.mkdtemp(prefix="bench-service-"))
    root, exchange, assignment = base / "course", base / "exchange", args.assignment
    try:
        make_class(root, assignment, REPO, n)
        notebooks = sorted(root.glob(f"submitted/*/{assignment}/{assignment}.ipynb"))
        for folder in ("inbound", "feedback"):
            (exchange / COURSE_ID / folder).mkdir(parents=True)
        students = sorted(p.parent.parent.name for p in notebooks)
        graded = grade(root, assignment, args.jobs, students)
        log = open(base / "serve.log", "w")
        serve = subprocess.Popen([sys.executable, "-m", "autograder", "serve", "--root", str(root),
                                  "--exchange", str(exchange), "--course-id", COURSE_ID,
                                  "--jobs", str(args.jobs), "--state", str(base / "state")],
                                 cwd=REPO, env=env(), stdout=log, stderr=log)
        try:
            secret, landed = hand_in(exchange, "warmup", assignment, notebooks[0])
            wait_pages(exchange, assignment, [secret], {secret: landed}, 600)
            waits = []
            for i in range(args.idle):
                secret, landed = hand_in(exchange, f"idle{i:03d}", assignment, notebooks[i % n])
                waits += wait_pages(exchange, assignment, [secret], {secret: landed}, 600).values()
            print(line(f"idle, one {assignment} notebook at a time", waits), flush=True)
            landed, order = {}, []
            gap = args.window / max(1, n - 1)
            for k in range(args.per_student):
                for s in range(args.students):
                    secret, t = hand_in(exchange, f"s{s:03d}", assignment,
                                        notebooks[k * args.students + s])
                    landed[secret] = t
                    order.append((k, s))
                    time.sleep(gap)
            first = min(landed.values())
            got = wait_pages(exchange, assignment, list(landed), landed, 3600)
            span = max(landed[s] + got[s] for s in got) - first
            print(line(f"burst, {args.students} students x {args.per_student} within {args.window:g} s",
                       list(got.values())), flush=True)
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=120)
        again = grade(root, assignment, args.jobs, students)  # the load drifts: grade before and after
        mean = (graded + again) / 2
        print(f"burst throughput: {n} notebooks in {span:.1f} s = {n / span:.3f} notebooks/s "
              f"= {(n / span) / (n / mean):.0%} of grade's (mean of its two runs)", flush=True)
        fairness(base / "state")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def fairness(state):
    """First attempts started after a second attempt (of another student) received later."""
    from autograder.service.journal import Journal

    journal = Journal(state)
    rows = [a for a in journal.rows() if a.student.startswith("s")]
    journal.close()
    by = {}
    for a in rows:
        by.setdefault(a.student, []).append(a)
    firsts = [v[0] for v in by.values()]
    seconds = [a for v in by.values() for a in v[1:]]
    late = sum(any(b.received > f.received and b.started < f.started for b in seconds
                   if b.student != f.student) for f in firsts)
    print(f"fairness: {late} of {len(firsts)} first attempts started after a later second attempt",
          flush=True)


if __name__ == "__main__":
    main()
