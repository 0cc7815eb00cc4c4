"""Runs of a test command in a row beside CPU hogs: does a timing-dependent test stay green?

Starts ``--hogs K`` processes that spin on a CPU (``while True: pass``; by default
``3 x cores``) for the whole series, then runs ``python -m pytest -q -p no:cacheprovider
ARGS`` ``--runs N`` times one after the other, and records per run the pytest outcome
counts, the wall time and the 1-minute load average at its start and end. Each run's
pytest output goes to ``--log-dir`` (``run-NN.log``); a line per run, and a table at the
end, go to stdout. The hogs die with this script: on its end, on SIGTERM/SIGINT/SIGHUP, and
(``PR_SET_PDEATHSIG``) when it is killed with SIGKILL.

By default the hogs are plain processes of this script's session (the load a busy
neighbour makes); with ``--weighed`` each is a scheduling entity of its own beside the
grading kernels' (:func:`tests.hogs.cpu_hogs`, as ``test_load`` starts them), so that a
kernel gets only ``cores / (hogs + 1)`` of a CPU. A run stopped (SIGTERM, Ctrl-C) stops its
pytest too.

Usage: python benchmarks/loaded_runs.py [--runs 10] [--hogs 6] [--weighed] [--log-dir DIR]
           [--stop-on-failure] -- tests/grader/host/test_cluster.py [pytest args]
The exit status is 0 when every run passed, 1 otherwise.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # as pytest has them (tests/ has no __init__)

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def counts(output):
    """The outcome counts of pytest's summary line (``3 passed, 1 failed in 12.3s``)."""
    lines = [line for line in output.splitlines() if re.search(r"\bin [\d.]+s\b", line)]
    if not lines:
        return {}
    found = {}
    for number, word in re.findall(r"(\d+) (\w+)", lines[-1]):
        word = {"errors": "error", "warnings": "warning"}.get(word, word)
        if word in OUTCOMES:
            found[word] = int(number)
    return found


def stop(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hogs", type=int, default=3 * (os.cpu_count() or 1))
    parser.add_argument("--weighed", action="store_true",
                        help="each hog a scheduling entity beside the kernels' (tests.hogs)")
    parser.add_argument("--log-dir", type=Path, default=ROOT / "loaded-runs")
    parser.add_argument("--stop-on-failure", action="store_true")
    parser.add_argument("pytest_args", nargs="+", help="after --: the test files and pytest options")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.hogs < 0:
        parser.error("--runs must be at least 1 and --hogs at least 0")
    from tests.hogs import cpu_hogs, plain_hogs

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args]
    hogs = cpu_hogs if args.weighed else plain_hogs
    print(f"{datetime.now():%H:%M:%S} {args.hogs} hogs{' (weighed)' if args.weighed else ''}; "
          f"{args.runs} runs of: {' '.join(command[1:])}", flush=True)
    rows = []
    with hogs(args.hogs):
        for run in range(1, args.runs + 1):
            load_start = os.getloadavg()[0]
            started = time.monotonic()
            log = args.log_dir / f"run-{run:02d}.log"
            with open(log, "w") as out:
                pytest = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
                try:
                    rc = pytest.wait()
                finally:  # stopped: the run goes with us (its servers die with it)
                    if pytest.poll() is None:
                        pytest.terminate()
                        pytest.wait()
            wall = time.monotonic() - started
            found = counts(log.read_text(errors="replace"))
            rows.append((run, rc, found, wall, load_start, os.getloadavg()[0]))
            outcome = ", ".join(f"{n} {w}" for w, n in found.items()) or "no summary"
            print(f"{datetime.now():%H:%M:%S} run {run}: exit {rc}, {outcome}, {wall:.0f} s, "
                  f"load {load_start:.1f} -> {rows[-1][5]:.1f} ({log.name})", flush=True)
            if rc and args.stop_on_failure:
                break
    print("\n| run | result | wall | load average at start, end |\n|---:|---|---:|---|")
    for run, rc, found, wall, start, end in rows:
        outcome = ", ".join(f"{n} {w}" for w, n in found.items()) or f"exit {rc}"
        print(f"| {run} | {outcome} | {wall:.0f} s | {start:.1f}, {end:.1f} |")
    green = 0
    for row in reversed(rows):
        if row[1]:
            break
        green += 1
    print(f"\n{green} green runs in a row at the end, of {len(rows)}")
    return 0 if all(row[1] == 0 for row in rows) and len(rows) == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
