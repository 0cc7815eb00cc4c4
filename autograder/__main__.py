"""Command line: ``python -m autograder {generate,grade,feedback,export} --help``."""

import argparse
import logging
import os
import sys
from pathlib import Path

from .limits import Limits
from .nbgrader_config import default_db_url

DESCRIPTION = """\
Grade the course's nbgrader assignments at class scale.

Instructor workflow (run from the course root, the repository root):
  1. python -m autograder generate --all     student versions: solutions/ -> release/
  2. hand out release/<assignment>/<assignment>.ipynb (the book links them)
  3. collect each student's notebook into submitted/<student>/<assignment>/
  4. python -m autograder grade 01-rope      autograde everyone in parallel
  5. grade manual answers in nbgrader's formgrader if needed, then
     python -m autograder feedback 01-rope   regenerate feedback/ with those scores
  6. python -m autograder export             one CSV of the whole gradebook
See autograder/README.md for the details of limits and of the summary."""

GRADE_HELP = """\
Autograde every submitted/<student>/<ASSIGNMENT>/*.ipynb under the course root.

Each notebook runs in a fresh, limited kernel (per-cell timeout, notebook wall
clock, memory cap, output cap, no network when run as root). A cell that hangs,
crashes or floods scores 0 and grading goes on with the next cell; one bad
submission never stops the class. Edited or deleted test cells are restored and
reported. Results go to the gradebook, autograded/, feedback/ (HTML without
hidden tests) and grades.csv; a class summary is printed at the end. Re-grading
replaces the earlier autograded scores (manual scores are kept)."""


def _students(text):
    return [s for s in text.split(",") if s] if text else None


def known_assignment(root, assignment):
    """Exit with one line unless ``assignment`` has source notebooks under ``root``."""
    from .release import source_assignments

    known = source_assignments(root)
    if assignment not in known:
        sys.exit(f"unknown assignment {assignment!r}: {Path(root).resolve() / 'solutions'} has "
                 f"{', '.join(known) or 'none'}")


def cmd_generate(args):
    from .release import generate, source_assignments, stale_notebooks

    names = source_assignments(args.root) if args.all else args.assignment
    if not names:
        sys.exit("name an assignment or use --all")
    for name in names:
        known_assignment(args.root, name)
    stale = []
    for name in names:
        if args.check:
            stale += stale_notebooks(name, args.root)
        else:
            print(f"generated {generate(name, args.root, db_url=args.db)}")
    for path in stale:
        print(f"stale: {path}")
    if stale:
        sys.exit(1)


def cmd_grade(args):
    from .driver import grade
    from .limits import Limits

    limits = Limits(cell_timeout=args.timeout_cell, notebook_timeout=args.timeout_notebook,
                    memory_mb=args.memory_mb, output_limit=args.output_limit,
                    max_tasks=args.max_tasks, disk_mb=args.disk_mb)
    grade(args.assignment, root=args.root, db_url=args.db, jobs=args.jobs, limits=limits,
          students=_students(args.students), progress=not args.no_progress, force=args.force)


def cmd_feedback(args):
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory

    from .nbgrader_config import course_config

    known_assignment(args.root, args.assignment)
    for student in _students(args.students) or ["*"]:
        c = course_config(args.root, args.db or default_db_url(args.root), args.assignment, student)
        c.BaseConverter.force = True
        GenerateFeedback(coursedir=CourseDirectory(config=c), config=c).start()
    print(f"feedback written to {Path(args.root).resolve() / 'feedback'}")


def cmd_export(args):
    from nbgrader.plugins import CsvExportPlugin

    from .gradebook import GradebookError, open_gradebook

    if args.assignment:
        known_assignment(args.root, args.assignment)
    to = Path(args.to) if Path(args.to).is_absolute() else Path(args.root).resolve() / args.to
    db_url = args.db or default_db_url(args.root)
    if db_url.startswith("sqlite:///") and not Path(db_url[len("sqlite:///"):]).exists():
        sys.exit(f"no gradebook at {db_url[len('sqlite:///'):]}: grade something first")
    plugin = CsvExportPlugin(to=str(to), assignment=[args.assignment] if args.assignment else [])
    try:
        with open_gradebook(db_url) as gb:
            plugin.export(gb)
    except GradebookError as error:
        sys.exit(str(error))
    print(f"exported to {to}")


def parser():
    top = argparse.ArgumentParser(prog="python -m autograder", description=DESCRIPTION,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", default=".", help="course root (default: the current directory)")
    common.add_argument("--db", default=None,
                        help="gradebook SQLAlchemy URL (default: sqlite:///ROOT/gradebook.db)")
    common.add_argument("-v", "--verbose", action="store_true", help="show nbgrader's log")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    raw = argparse.RawDescriptionHelpFormatter

    p = sub.add_parser("generate", parents=[common], formatter_class=raw,
                       help="generate student versions into release/",
                       description="Run nbgrader generate_assignment from solutions/<id>/ into "
                                   "release/<id>/ (hidden tests and solutions removed).\n"
                                   "With --check, write nothing and list committed student "
                                   "versions that are stale (exit status 1 if any).")
    p.add_argument("assignment", nargs="*", help="assignment id(s), e.g. 01-rope")
    p.add_argument("--all", action="store_true", help="every assignment under solutions/")
    p.add_argument("--check", action="store_true", help="only report stale student versions")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("grade", parents=[common], formatter_class=raw,
                       help="autograde every submission of an assignment", description=GRADE_HELP)
    p.add_argument("assignment", help="assignment id, e.g. 01-rope")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count(),
                   help="submissions graded in parallel (default: number of cores)")
    d = Limits()
    p.add_argument("--timeout-cell", type=int, default=d.cell_timeout, metavar="S",
                   help=f"seconds one cell may run, its tests included (default {d.cell_timeout})")
    p.add_argument("--timeout-notebook", type=float, default=d.notebook_timeout, metavar="S",
                   help=f"seconds a whole notebook may run (default {d.notebook_timeout:g})")
    p.add_argument("--memory-mb", type=int, default=d.memory_mb, metavar="M",
                   help=f"memory of each kernel in MiB, 0 = none (default {d.memory_mb})")
    p.add_argument("--output-limit", type=int, default=d.output_limit, metavar="BYTES",
                   help="output kept per cell; beyond it the cell is stopped and scores 0 "
                        f"(default {d.output_limit})")
    p.add_argument("--max-tasks", type=int, default=d.max_tasks, metavar="N",
                   help=f"processes and threads of each kernel (default {d.max_tasks})")
    p.add_argument("--disk-mb", type=int, default=d.disk_mb, metavar="M",
                   help=f"size of each kernel's private scratch folder in MiB (default {d.disk_mb})")
    p.add_argument("--students", default=None, metavar="A,B",
                   help="grade only these students (comma-separated ids)")
    p.add_argument("--force", action="store_true",
                   help="re-grade submissions that are unchanged since they were last graded")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_grade)

    p = sub.add_parser("feedback", parents=[common], formatter_class=raw,
                       help="regenerate feedback HTML from the gradebook",
                       description="Write feedback/<student>/<ASSIGNMENT>/*.html from autograded/ "
                                   "and the gradebook's current scores (manual grades included). "
                                   "Hidden tests are removed. `grade` already writes feedback; run "
                                   "this after manual grading.")
    p.add_argument("assignment", help="assignment id, e.g. 01-rope")
    p.add_argument("--students", default=None, metavar="A,B", help="only these students")
    p.set_defaults(func=cmd_feedback)

    p = sub.add_parser("export", parents=[common], formatter_class=raw,
                       help="export the gradebook to CSV",
                       description="Export scores from the gradebook (nbgrader's CSV format: one "
                                   "row per student and assignment, manual grades and late "
                                   "penalties applied).")
    p.add_argument("assignment", nargs="?", help="only this assignment (default: all)")
    p.add_argument("--to", default="gradebook_export.csv", help="output file, relative to the "
                   "course root or absolute (default gradebook_export.csv)")
    p.set_defaults(func=cmd_export)
    return top


def main(argv=None):
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(message)s")
    if not args.verbose:
        logging.getLogger("traitlets").setLevel(logging.ERROR)
    args.func(args)


if __name__ == "__main__":
    main()
