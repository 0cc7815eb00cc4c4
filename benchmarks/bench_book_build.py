"""Time the book build: cold, warm, and each chapter's execution.

    python benchmarks/bench_book_build.py             # cold + warm (removes _build first!)
    python benchmarks/bench_book_build.py --warm      # only an unchanged rebuild
    python benchmarks/bench_book_build.py --serial    # also a cold build with --jobs 1, to compare

Cold = after removing ``_build`` (the HTML *and* the jupyter-cache in ``_build/.jupyter_cache``),
so every chapter executes; by default two at a time (``python -m scripts.build_book --jobs 2``),
with ``--serial`` also one after another as MyST-NB alone would. Warm = the same command again
with nothing changed: the chapters' outputs come from the cache. Per-chapter execution times
are read from the jupyter-cache records (``execution_seconds``), i.e. the time nbclient spent
running each notebook (with two running at once, each takes longer than alone).
Budgets (benchmarks/README.md, 2 CPU cores): cold <= 60 s, warm <= 10 s, each chapter <= 60 s.
Timings on a shared machine are noisy; run it twice before drawing conclusions.
"""

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
CACHE = BUILD / ".jupyter_cache"
BUDGET_COLD_S, BUDGET_WARM_S, BUDGET_CHAPTER_S = 60.0, 10.0, 60.0


def timed_build(jobs=2):
    """Run ``python -m scripts.build_book --jobs N`` quietly; return (seconds, exit status)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "scripts.build_book", "--jobs", str(jobs)],
                          cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
    return elapsed, proc.returncode


def cold_build(jobs):
    """Remove ``_build`` and build; exit if the build fails."""
    shutil.rmtree(BUILD, ignore_errors=True)
    seconds, status = timed_build(jobs)
    if status:
        sys.exit(f"cold build (--jobs {jobs}) failed")
    return seconds


def chapter_execution_times():
    """``{chapter: seconds}`` from the execution cache (the last successful run of each)."""
    from jupyter_cache import get_cache

    if not CACHE.is_dir():
        return {}
    times = {}
    for record in get_cache(CACHE).list_cache_records():
        name = Path(record.uri).relative_to(ROOT).as_posix()
        times[name] = record.data.get("execution_seconds")
    return dict(sorted(times.items()))


def verdict(value, budget):
    if budget is None:
        return ""
    return "ok" if value is not None and value <= budget else "OVER BUDGET"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", action="store_true", help="skip the cold build")
    parser.add_argument("--serial", action="store_true",
                        help="also time a cold build that executes one chapter at a time")
    parser.add_argument("--jobs", type=int, default=2, help="chapters executed at once (2)")
    args = parser.parse_args(argv)

    rows = []
    if args.serial and not args.warm:
        serial = cold_build(1)
        serial_chapters = chapter_execution_times()
        rows.append(("cold build, --jobs 1 (chapters one by one)", serial, None))
        rows.append(("  sum of chapter execution times, --jobs 1",
                     sum(s for s in serial_chapters.values() if s), None))
    if not args.warm:
        cold = cold_build(args.jobs)
        rows.append((f"cold build, --jobs {args.jobs} (no _build, no cache)", cold,
                     BUDGET_COLD_S))
    warm, status = timed_build(args.jobs)
    if status:
        sys.exit("warm build failed")
    rows.append(("warm rebuild (unchanged)", warm, BUDGET_WARM_S))
    for name, seconds in chapter_execution_times().items():
        rows.append((f"execute {name}", seconds, BUDGET_CHAPTER_S))

    print(f"\n{'measurement':<52} {'seconds':>8} {'budget':>7}  verdict")
    print("-" * 80)
    for label, seconds, budget in rows:
        shown = f"{seconds:8.1f}" if seconds is not None else "     n/a"
        limit = f"{budget:7.0f}" if budget is not None else "      -"
        print(f"{label:<52} {shown} {limit}  {verdict(seconds, budget)}")
    print("(wall-clock on this machine; other processes on shared cores add noise)")


if __name__ == "__main__":
    main()
