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
the failing cell. Before Sphinx starts, the course library is packed into a wheel,
``_build/downloads/transformer_ref-<version>-py3-none-any.whl``, which the page
``run-yourself.md`` offers for download; it is rebuilt only when ``lib/transformer_ref`` or
``pyproject.toml`` changed (with what the venv holds: nothing is downloaded). MathJax 3 is not fetched from a CDN: the pinned ``sphinx-mathjax-offline``
extension copies it into ``_build/html/_static/mathjax`` (see ``_config.yml``). Exit status 0
on success; on failure it is non-zero and the script lists the notebook error logs that say
which cell failed.
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.environment import wheel_name

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
HTML = BUILD / "html"
REPORTS = HTML / "reports"
# Sphinx re-reads only changed pages, and so repeats no warning of an unchanged one: after a
# failed build the saved environment is dropped, so the next build re-reads every page (the
# executed outputs still come from the cache) and cannot pass by forgetting the warnings.
ENVIRONMENT = BUILD / ".doctrees" / "environment.pickle"
STRICT = ["-W", "-n", "--keep-going"]
LIBRARY = ROOT / "lib" / "transformer_ref"
DOWNLOADS = BUILD / "downloads"            # the wheel; run-yourself.md links it with {download}
WHEEL_STAMP = DOWNLOADS / ".sources.sha256"  # fingerprint of the sources the wheel was built from


# ``jupyter-book``'s own entry point, run by the venv's Python after marking rfc3987_syntax
# absent: jsonschema (which Jupyter Book and nbformat import) builds that package's grammar at
# import, 1.4 s of the build, only to check "iri" string formats, which nothing here uses.
JUPYTER_BOOK = ("import sys; sys.modules['rfc3987_syntax'] = None; sys.argv[0] = 'jupyter-book'; "
                "from jupyter_book.cli.main import main; sys.exit(main())")


def jupyter_book_command(builder="html"):
    """The ``jupyter-book build`` command line, run by the venv's own Python."""
    return [sys.executable, "-c", JUPYTER_BOOK, "build", str(ROOT), "--builder", builder, *STRICT]


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


def library_sources():
    """The files the wheel is built from: ``pyproject.toml`` and the package, sorted."""
    package = sorted(path for path in LIBRARY.rglob("*")
                     if path.is_file() and "__pycache__" not in path.parts)
    return [ROOT / "pyproject.toml", *package]


def library_fingerprint():
    """SHA-256 over the relative path and bytes of every file of :func:`library_sources`."""
    digest = hashlib.sha256()
    for path in library_sources():
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build_wheel():
    """Pack the library into ``_build/downloads/<wheel>`` unless it is up to date; return 0/1.

    A copy of ``pyproject.toml`` and ``lib/transformer_ref`` is built with the venv's own
    setuptools (``pip wheel --no-deps --no-build-isolation --no-index``: nothing is
    fetched), so the working tree gets no ``build/`` or ``.egg-info`` folder, and with a
    fixed ``SOURCE_DATE_EPOCH``, so the same sources give the same bytes.
    """
    target = DOWNLOADS / wheel_name(ROOT)
    fingerprint = library_fingerprint()
    if target.is_file() and WHEEL_STAMP.is_file() and WHEEL_STAMP.read_text() == fingerprint:
        return 0
    start = time.perf_counter()
    shutil.rmtree(DOWNLOADS, ignore_errors=True)  # a wheel of an older version must not linger
    DOWNLOADS.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="wheel-src-") as tmp:
        shutil.copy2(ROOT / "pyproject.toml", tmp)
        shutil.copytree(LIBRARY, Path(tmp) / "lib" / LIBRARY.name,
                        ignore=shutil.ignore_patterns("__pycache__"))
        env = dict(os.environ, SOURCE_DATE_EPOCH="315532800")  # 1980-01-01, zip's first date
        status = subprocess.call(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
             "--no-index", "--wheel-dir", str(DOWNLOADS), tmp], env=env)
    if status != 0 or not target.is_file():
        print(f"building the wheel {target.name} FAILED", flush=True)
        return 1
    WHEEL_STAMP.write_text(fingerprint)
    print(f"wheel {target.relative_to(ROOT)} built in {time.perf_counter() - start:.1f} s",
          flush=True)
    return 0


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
    if build_wheel() != 0:
        return 1
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
