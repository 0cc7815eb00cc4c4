"""Build the course website into ``_build/html`` (what ``make book`` runs).

    python -m scripts.build_book            # incremental: unchanged chapters come from the cache
    python -m scripts.build_book --fresh    # drop _build (HTML and execution cache) first
    python -m scripts.build_book --jobs 1   # execute chapters one at a time (as MyST-NB alone)

The build is Jupyter Book 1 with Sphinx's strictest settings, ``-W -n --keep-going``: every
warning and every cell error fails it, after all pages have been tried. Chapters execute at
build time and their outputs are cached in ``_build/.jupyter_cache`` (``execute_notebooks:
cache``), so a rebuild re-runs only the chapters whose code changed. Chapters that need
running are executed ``--jobs`` at a time (default 2, one thread each) into that same cache
before Sphinx reads them (``scripts/book_ext.py``), so a cold build takes about half the time
of running them one by one; a chapter that fails there is run again by MyST-NB, which reports
the failing cell. MathJax 3 is not fetched from a CDN: the pinned ``sphinx-mathjax-offline``
extension copies it into ``_build/html/_static/mathjax`` (see ``_config.yml``). Exit status 0
on success; on failure it is non-zero and the script lists the notebook error logs that say
which cell failed.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
HTML = BUILD / "html"
REPORTS = HTML / "reports"
# Sphinx re-reads only changed pages, and so repeats no warning of an unchanged one: after a
# failed build the saved environment is dropped, so the next build re-reads every page (the
# executed outputs still come from the cache) and cannot pass by forgetting the warnings.
ENVIRONMENT = BUILD / ".doctrees" / "environment.pickle"
STRICT = ["-W", "-n", "--keep-going"]


def jupyter_book_command(builder="html"):
    """The ``jupyter-book build`` command line, with the venv's own executable."""
    exe = Path(sys.executable).with_name("jupyter-book")
    return [str(exe), "build", str(ROOT), "--builder", builder, *STRICT]


def build_env(jobs=2):
    """Environment of the build's kernels.

    MPLBACKEND is removed: a kernel that inherits e.g. ``Agg`` from the shell would not use
    IPython's inline backend, and ``plt.show()`` would then put no figure on the page.
    ``BOOK_EXECUTION_JOBS`` tells ``scripts/book_ext.py`` how many chapters to run at once.
    """
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # silences a debugpy note on stderr
    env["PYTHONHASHSEED"] = "0"
    env["BOOK_EXECUTION_JOBS"] = str(jobs)
    return env


def error_logs():
    """The per-notebook execution error logs MyST-NB writes when a cell fails."""
    return sorted(REPORTS.glob("**/*.err.log")) if REPORTS.is_dir() else []


def run_build(fresh=False, jobs=2):
    """Run the build; return its exit status (0 = success)."""
    if fresh and BUILD.exists():
        shutil.rmtree(BUILD)
    for log in error_logs():  # stale logs from an earlier failed build would mislead
        log.unlink()
    start = time.perf_counter()
    status = subprocess.call(jupyter_book_command(), cwd=ROOT, env=build_env(jobs))
    elapsed = time.perf_counter() - start
    logs = error_logs()
    if status == 0 and logs:  # belt and braces: a cell error must never pass silently
        status = 1
    if status != 0:
        ENVIRONMENT.unlink(missing_ok=True)
    print(f"\nbook build {'succeeded' if status == 0 else 'FAILED'} in {elapsed:.1f} s "
          f"-> {HTML.relative_to(ROOT)}/index.html", flush=True)
    if logs:
        print("Notebook execution errors (which cell failed, with its traceback):")
        for log in logs:
            print(f"  {log.relative_to(ROOT)}")
    elif status != 0:
        print("See the warnings above; with -W every warning fails the build.")
    return status


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fresh", action="store_true",
                        help="remove _build (HTML and execution cache) before building")
    parser.add_argument("--jobs", type=int, default=2, metavar="N",
                        help="chapters executed at once (default 2; 1 = one after another)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return run_build(fresh=args.fresh, jobs=args.jobs)


if __name__ == "__main__":
    sys.exit(main())
