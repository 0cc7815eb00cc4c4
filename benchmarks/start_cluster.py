"""Start a local grading cluster by hand: a Dask scheduler and K single-threaded workers.

    python benchmarks/start_cluster.py -k 2            # prints the scheduler's address
    python -m autograder grade 01-rope --scheduler tcp://127.0.0.1:PORT

Everything binds to 127.0.0.1 and runs with the grading cluster's Dask settings
(:func:`tests.servers.grading_cluster_env`); Ctrl-C stops it all. A department
starts the same programs on its grading hosts (``autograder/README.md``, *Grading on a
cluster*).
"""

import argparse
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.servers import dask_cluster  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", "--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--logs", default=None, help="keep the scheduler and worker logs here")
    args = parser.parse_args()
    if args.workers < 1:
        sys.exit("--workers: at least 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with dask_cluster(args.workers, log_dir=args.logs) as (address, _):
        print(f"scheduler {address} with {args.workers} worker(s); Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
