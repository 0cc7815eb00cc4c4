"""Time the book build: cold, warm, and each chapter's execution.

    python benchmarks/bench_book_build.py            # cold + warm (removes _build first!)
    python benchmarks/bench_book_build.py --warm     # only an unchanged rebuild

Cold = after removing ``_build`` (the HTML *and* the jupyter-cache in ``_build/.jupyter_cache``),
so every chapter executes. Warm = the same command again with nothing changed: the chapters'
outputs come from the cache. Per-chapter execution times are read from the jupyter-cache
records (``execution_seconds``), i.e. the time nbclient spent running each notebook.
Budgets (DESIGN.md, 2 CPU cores): cold <= 180 s, warm <= 30 s, each chapter <= 60 s.
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
BUDGET_COLD_S, BUDGET_WARM_S, BUDGET_CHAPTER_S = 180.0, 30.0, 60.0


def timed_build():
    """Run ``python -m scripts.build_book`` quietly; return (seconds, exit status)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "scripts.build_book"], cwd=ROOT,
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
    return elapsed, proc.returncode


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
    return "ok" if value is not None and value <= budget else "OVER BUDGET"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", action="store_true", help="skip the cold build")
    args = parser.parse_args(argv)

    rows = []
    if not args.warm:
        shutil.rmtree(BUILD, ignore_errors=True)
        cold, status = timed_build()
        if status:
            sys.exit("cold build failed")
        rows.append(("cold build (no _build, no cache)", cold, BUDGET_COLD_S))
    warm, status = timed_build()
    if status:
        sys.exit("warm build failed")
    rows.append(("warm rebuild (unchanged)", warm, BUDGET_WARM_S))
    for name, seconds in chapter_execution_times().items():
        rows.append((f"execute {name}", seconds, BUDGET_CHAPTER_S))

    print(f"\n{'measurement':<52} {'seconds':>8} {'budget':>7}  verdict")
    print("-" * 80)
    for label, seconds, budget in rows:
        shown = f"{seconds:8.1f}" if seconds is not None else "     n/a"
        print(f"{label:<52} {shown} {budget:7.0f}  {verdict(seconds, budget)}")
    print("(wall-clock on this machine; other processes on shared cores add noise)")


if __name__ == "__main__":
    main()
