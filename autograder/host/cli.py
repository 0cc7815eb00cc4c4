"""The instructor's command line: ``python -m autograder COMMAND --help``."""

import argparse
import logging
import os
import sys
from pathlib import Path

from ..core.gradebook import engine_url, sqlite_path
from ..core.limits import Limits
from ..core.course_files import GRADEBOOK_EXPORT_CSV, GRADES_CSV, ROSTER_CSV
from ..core.nbgrader_config import default_db_url
from ..core.untrusted import PrintableFormatter, printable

DESCRIPTION = """\
Grade the course's nbgrader assignments at class scale.

Instructor workflow (run from the course root, the repository root):
  1. python -m autograder generate --all     student versions: solutions/ -> release/
  2. hand out release/<assignment>/<assignment>.ipynb (the book links them)
  3. collect each student's notebook into submitted/<student>/<assignment>/, e.g.
     python -m autograder collect 01-rope --from canvas submissions.zip
  4. python -m autograder grade 01-rope      autograde everyone in parallel
  5. grade manual answers in nbgrader's formgrader if needed, then
     python -m autograder feedback 01-rope   regenerate feedback/ with those scores
  6. python -m autograder export             one CSV of the whole gradebook
  7. python -m autograder report             what the class got wrong: reports/*.html
Or grade each submission as it arrives (the JupyterHub exchange, a Hub service page):
  python -m autograder serve --exchange /srv/nbgrader/exchange --course-id attention-2
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
    from ..core.assignments import source_assignments

    known = source_assignments(root)
    if assignment not in known:
        sys.exit(f"unknown assignment {assignment!r}: {Path(root).resolve() / 'solutions'} has "
                 f"{', '.join(known) or 'none'}")


def cmd_generate(args):
    from ..core.assignments import source_assignments
    from .release import generate, stale_notebooks, stale_selfcheck, write_selfcheck

    names = source_assignments(args.root) if args.all else args.assignment
    if not names:
        sys.exit("name an assignment or use --all")
    for name in names:
        known_assignment(args.root, name)
    from ..core.policy import load_self_check

    try:
        load_self_check(args.root)  # a bad self_check in course.toml: one line, before any work
    except ValueError as error:
        sys.exit(str(error))
    stale = []
    for name in names:
        if args.check:
            stale += stale_notebooks(name, args.root)
        else:
            print(f"generated {generate(name, args.root, db_url=args.db)}")
    if args.check:  # the self-check package (course.toml's self_check) is made from every assignment
        stale += stale_selfcheck(args.root)
    else:
        print(f"self-check package: {write_selfcheck(args.root) or 'none (self_check = off)'}")
    for path in stale:
        print(f"stale: {path}")
    if stale:
        sys.exit(1)


def cmd_grade(args):
    if not args.no_progress and sys.stderr.isatty():  # at once: loading and preparing take seconds
        print(f"grade {printable(args.assignment)}: loading the grader, then preparing the student "
              "version, the gradebook and the workers...", file=sys.stderr, flush=True)
    from .driver import grade

    limits = limits_of(args)
    grade(args.assignment, root=args.root, db_url=args.db, jobs=args.jobs, limits=limits,
          students=_students(args.students), progress=not args.no_progress, force=args.force,
          late_policy=args.late_policy, scheduler=args.scheduler)


def course_settings(args):
    """The course's ``course.toml`` (due dates, late policy), or one line and exit 1."""
    from ..core.policy import load_settings

    try:
        return load_settings(args.root)
    except ValueError as error:
        sys.exit(printable(error))


def settle_scores(args, db_url, assignments):
    """Recompute late penalties from the gradebook's current scores, due dates and
    extensions (manual grades, a new due date or policy in ``course.toml`` and extensions
    change them), then rewrite ``grades.csv``'s rows of each assignment to match: every
    command that reads scores runs this first. Assignments not graded yet are left out;
    the assignments graded are returned."""
    from ..core.gradebook import GradebookError, standings
    from ..core.policy import apply_late_policy
    from .summary import write_csv

    settings = course_settings(args)
    graded = []
    try:
        for assignment in assignments:
            if standings(db_url, assignment) is None:
                continue
            apply_late_policy(db_url, assignment, settings)
            write_csv(Path(args.root).resolve() / GRADES_CSV, assignment,
                      standings=standings(db_url, assignment))
            graded.append(assignment)
    except (ValueError, GradebookError) as error:
        sys.exit(printable(error))
    except OSError as error:
        sys.exit(printable(f"cannot write {error.filename or 'grades.csv'}: {error.strerror or error}"))
    return graded


def existing_gradebook(args):
    db_url = args.db or default_db_url(args.root)
    if (path := sqlite_path(db_url)) is not None and not path.exists():
        sys.exit(f"no gradebook at {path}: grade something first")
    return db_url


def course_lock(args, db_url, assignments):
    """The course lock (:class:`autograder.host.driver.CourseLock`) for this command."""
    from .driver import CourseLock

    return CourseLock(Path(args.root).resolve(), assignments, engine_url(db_url), args.command)


def cmd_feedback(args):
    from .driver import write_feedback_pages
    from ..core.course_files import FEEDBACK

    known_assignment(args.root, args.assignment)
    db_url = existing_gradebook(args)
    with course_lock(args, db_url, [args.assignment]):
        if not settle_scores(args, db_url, [args.assignment]):
            sys.exit(f"{args.assignment} is not graded yet: run grade {args.assignment} first")
        unrendered = write_feedback_pages(args.root, db_url, args.assignment, _students(args.students))
    print(f"feedback written to {Path(args.root).resolve() / FEEDBACK}")
    if unrendered:
        from ..core.untrusted import printable

        print(f"no autograded notebook, page left as it was: {', '.join(map(printable, unrendered))} "
              f"(grade {args.assignment} --force --students ... renders it again)")


def cmd_export(args):
    from .exports import export_csv, export_lms
    from ..core.gradebook import GradebookError
    from ..core.assignments import source_assignments

    if args.assignment:
        known_assignment(args.root, args.assignment)
    to = Path(args.to) if Path(args.to).is_absolute() else Path(args.root).resolve() / args.to
    db_url = existing_gradebook(args)
    assignments = [args.assignment] if args.assignment else source_assignments(args.root)
    with course_lock(args, db_url, assignments):
        graded = settle_scores(args, db_url, assignments)
        if not graded:  # not an error: the term has only just begun
            print(f"nothing to export yet: {', '.join(assignments) or 'no assignment'} not graded; "
                  f"{to} not written")
            return
        try:
            if args.lms:
                export_lms(db_url, to, args.lms, graded)
            else:
                export_csv(db_url, to, graded)
        except (ValueError, GradebookError) as error:
            sys.exit(printable(error))
    ungraded = [a for a in assignments if a not in graded]
    print(f"exported to {to}" + (f" (not graded yet, left out: {', '.join(ungraded)})" if ungraded else ""))


def cmd_roster(args):
    from ..core.gradebook import GradebookError
    from ..core.untrusted import printable
    from .roster import COLUMNS, read_roster, roster_report, sync_roster

    path = Path(args.file) if Path(args.file).is_absolute() else Path(args.root).resolve() / args.file
    try:
        entries = read_roster(path)
        db_url = args.db or default_db_url(args.root)
        sync_roster(db_url, entries)
        print(f"{len(entries)} student(s) from {path} in the gradebook")
        if args.check:
            known_assignment(args.root, args.check)
            report = roster_report(db_url, args.check, entries)
            if report.not_on_roster and len(report.missing) == len(entries):
                sys.exit(f"{path} matches none of the {len(report.not_on_roster)} student(s) who "
                         f"submitted {args.check}: its student_id column must hold their ids "
                         f"(columns expected: {','.join(COLUMNS)})")
            print(f"on the roster, no submission of {args.check}: "
                  f"{', '.join(map(printable, report.missing)) or 'none'}")
            print(f"submitted, not on the roster: {', '.join(map(printable, report.not_on_roster)) or 'none'}")
    except (OSError, ValueError, GradebookError) as error:
        sys.exit(printable(error))


def cmd_report(args):
    from ..core.gradebook import GradebookError
    from ..core.untrusted import printable
    from .report import write_report

    from ..core.assignments import source_assignments

    db_url = existing_gradebook(args)
    assignments = [args.assignment] if args.assignment else source_assignments(args.root)
    with course_lock(args, db_url, assignments):
        settle_scores(args, db_url, assignments)
        try:
            written = write_report(args.root, db_url, args.assignment, to=args.to,
                                   anonymize=args.anonymize)
        except (ValueError, GradebookError) as error:
            sys.exit(printable(error))
    for path in written.pages:
        print(f"wrote {printable(path)}")


def cmd_collect(args):
    from ..core.untrusted import printable
    from .collect import Lms, collect_into_course

    known_assignment(args.root, args.assignment)
    db_url = args.db or default_db_url(args.root)
    try:
        with course_lock(args, db_url, [args.assignment]):
            lines = collect_into_course(Path(args.root), args.assignment, Lms(args.lms),
                                        Path(args.archive))
    except (OSError, ValueError) as error:
        sys.exit(f"collect: {printable(error)}")
    for line in lines:
        print(line)


def late_policy(text):
    """``--late-policy``: the spelling, checked (the course's grace is added when read)."""
    from ..core.policy import LatePolicy

    try:
        LatePolicy.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


RAW = argparse.RawDescriptionHelpFormatter


def parser():
    top = argparse.ArgumentParser(prog="python -m autograder", description=DESCRIPTION,
                                  formatter_class=RAW)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", default=".", help="course root (default: the current directory)")
    common.add_argument("--db", default=None, type=engine_url,
                        help="gradebook SQLAlchemy URL (default: sqlite:///ROOT/gradebook.db); "
                             "postgresql://USER@HOST:PORT/DB for a PostgreSQL server")
    common.add_argument("-v", "--verbose", action="store_true", help="show nbgrader's log")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (add_generate, add_grade, add_serve, add_feedback, add_export, add_roster, add_collect,
                add_report):
        add(sub, common)
    return top


def add_generate(sub, common):
    """The ``generate`` command's options."""
    p = sub.add_parser("generate", parents=[common], formatter_class=RAW,
                       help="generate student versions into release/",
                       description="Run nbgrader generate_assignment from solutions/<id>/ into "
                                   "release/<id>/ (hidden tests and solutions removed), and the "
                                   "self-check package release/selfcheck/*.whl.\n"
                                   "course.toml's self_check = \"full\" | \"visible\" | \"off\" decides "
                                   "what the student versions' check cells can run (off: no check "
                                   "cells, no package); self_check_answers = \"reveal\" | \"hide\" "
                                   "whether a check shows written answers' model answers.\n"
                                   "With --check, write nothing and list committed student "
                                   "versions and a self-check package that are stale (exit status 1 if any).")
    p.add_argument("assignment", nargs="*", help="assignment id(s), e.g. 01-rope")
    p.add_argument("--all", action="store_true", help="every assignment under solutions/")
    p.add_argument("--check", action="store_true", help="only report stale student versions")
    p.set_defaults(func=cmd_generate)


def add_grade(sub, common):
    """The ``grade`` command's options."""
    p = sub.add_parser("grade", parents=[common], formatter_class=RAW,
                       help="autograde every submission of an assignment", description=GRADE_HELP)
    p.add_argument("assignment", help="assignment id, e.g. 01-rope")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count(),
                   help="submissions graded in parallel (default: number of cores)")
    p.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                   help="grade on the workers of this Dask scheduler instead of local processes "
                        "(see autograder/README.md, 'Grading on a cluster')")
    add_limits(p)
    p.add_argument("--students", default=None, metavar="A,B",
                   help="grade only these students (comma-separated ids)")
    p.add_argument("--force", action="store_true",
                   help="re-grade submissions that are unchanged since they were last graded")
    p.add_argument("--late-policy", type=late_policy, default=None, metavar="SPEC",
                   help="late policy for this assignment, overriding course.toml: none, zero, "
                        "'zero,grace=15m', '10%%/day,cap=50%%,grace=1h', '2/hour,cap=10'")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_grade)


def add_limits(p):
    """Each kernel's limits (``grade``'s and ``serve``'s)."""
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


def limits_of(args):
    return Limits(cell_timeout=args.timeout_cell, notebook_timeout=args.timeout_notebook,
                  memory_mb=args.memory_mb, output_limit=args.output_limit,
                  max_tasks=args.max_tasks, disk_mb=args.disk_mb)


SERVE_HELP = """\
Grade each submission as it arrives, and hand its feedback back: a long-running service
for the course root, with grade's gradebook, settings, sandbox and workers.

Ways in: the JupyterHub exchange (--exchange, --course-id: a student's `nbgrader submit`
is graded and its feedback released for `nbgrader fetch_feedback`), and, run as a
JupyterHub service, a web page and JSON API under the service's prefix (upload, queue
position, result, feedback, every earlier attempt; the Hub's OAuth says who the student
is; Hub admins and course.toml's [service] instructors see the live queue and can pause
intake). course.toml's [service] table sets the attempt rules (attempts, per_day,
cooldown, counts = last | best, before_due = all | visible). Students are served round
robin, one submission each in flight; the queue lives in --state and survives a restart
(a grade in progress is graded again). SIGINT/SIGTERM stop it; nothing accepted is lost.
See autograder/README.md, 'Grading on submission'."""


def cmd_serve(args):
    from ..service.serve import serve

    serve(args.root, args.db or default_db_url(args.root), args.state, jobs=args.jobs,
          scheduler=args.scheduler, exchange=args.exchange, course_id=args.course_id,
          ip=args.ip, port=args.port, limits=limits_of(args))


def add_serve(sub, common):
    """The ``serve`` command's options."""
    p = sub.add_parser("serve", parents=[common], formatter_class=RAW,
                       help="grade each submission as it arrives (exchange, Hub service)",
                       description=SERVE_HELP)
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count(),
                   help="submissions graded at once (default: number of cores)")
    p.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                   help="grade on the workers of this Dask scheduler instead of local processes")
    p.add_argument("--exchange", default=None, metavar="DIR",
                   help="nbgrader's exchange root (c.Exchange.root): take submissions from its "
                        "inbound folder, release feedback to it")
    p.add_argument("--course-id", default=None, metavar="ID",
                   help="the course id in the exchange (c.CourseDirectory.course_id)")
    p.add_argument("--state", default=None, metavar="DIR",
                   help="the service's queue and attempts (default ROOT/service-state)")
    p.add_argument("--ip", default=None, help="web page address (default: JupyterHub's "
                   "JUPYTERHUB_SERVICE_URL; loopback)")
    p.add_argument("--port", type=int, default=None,
                   help="web page port (default: JUPYTERHUB_SERVICE_URL's)")
    add_limits(p)
    p.set_defaults(func=cmd_serve)


def add_feedback(sub, common):
    """The ``feedback`` command's options."""
    p = sub.add_parser("feedback", parents=[common], formatter_class=RAW,
                       help="regenerate feedback HTML from the gradebook",
                       description="Write feedback/<student>/<ASSIGNMENT>/*.html from autograded/ "
                                   "and the gradebook's current scores (manual grades included). "
                                   "Hidden tests are removed. `grade` already writes feedback; run "
                                   "this after manual grading.")
    p.add_argument("assignment", help="assignment id, e.g. 01-rope")
    p.add_argument("--students", default=None, metavar="A,B", help="only these students")
    p.set_defaults(func=cmd_feedback)


def add_export(sub, common):
    """The ``export`` command's options."""
    p = sub.add_parser("export", parents=[common], formatter_class=RAW,
                       help="export the gradebook to CSV",
                       description="Export scores from the gradebook (nbgrader's CSV format: one "
                                   "row per student and assignment, manual grades and late "
                                   "penalties applied). Assignments not graded yet are left out. "
                                   "Late penalties and grades.csv are brought up to date first "
                                   "(manual grades, extensions, course.toml).")
    p.add_argument("assignment", nargs="?", help="only this assignment (default: all)")
    p.add_argument("--to", default=GRADEBOOK_EXPORT_CSV, help="output file, relative to the "
                   "course root or absolute (default gradebook_export.csv)")
    p.add_argument("--lms", choices=("canvas", "moodle"), default=None,
                   help="write the layout this LMS imports instead of the full CSV")
    p.set_defaults(func=cmd_export)


def add_roster(sub, common):
    """The ``roster`` command's options."""
    p = sub.add_parser("roster", parents=[common], formatter_class=RAW,
                       help="load roster.csv (names, emails, LMS ids) into the gradebook",
                       description="Read the roster (columns student_id, name, email, lms_id) and "
                                   "put every student in the gradebook; with --check, list roster "
                                   "students with no submission of an assignment and submissions "
                                   "not on the roster. grade reads roster.csv by itself.")
    p.add_argument("--file", default=ROSTER_CSV, help="the roster, relative to the course root "
                   "or absolute (default roster.csv)")
    p.add_argument("--check", default=None, metavar="ASSIGNMENT",
                   help="compare the roster with the submissions of ASSIGNMENT")
    p.set_defaults(func=cmd_roster)


def add_collect(sub, common):
    """The ``collect`` command's options."""
    p = sub.add_parser("collect", parents=[common], formatter_class=RAW,
                       help="unpack an LMS bulk download (Canvas, Moodle) into submitted/",
                       description="Put each notebook of a Canvas or Moodle bulk download (a zip) "
                                   "into submitted/<student>/<ASSIGNMENT>/ with a timestamp.txt, "
                                   "matching file names to roster.csv (lms_id, else the name), as "
                                   "nbgrader's zip_collect does. A student's folder is replaced, "
                                   "the earlier one kept as submitted/<student>/.<ASSIGNMENT>."
                                   "replaced-<UTC time> and named. Unmatched files are listed, as "
                                   "are Canvas _LATE marks that disagree with the files' times. An "
                                   "archive of another assignment's notebooks, one that matches no "
                                   "roster student, or a hostile one (paths out of the folder, "
                                   "links, a zip bomb) is refused whole: one line, exit status 1, "
                                   "nothing written. Zip times without a zone are read in "
                                   "course.toml's timezone.")
    p.add_argument("assignment", help="assignment id, e.g. 01-rope")
    p.add_argument("--from", dest="lms", required=True, choices=("canvas", "moodle"),
                   help="the LMS that made the archive (its file-name layout)")
    p.add_argument("archive", help="the bulk download (.zip)")
    p.set_defaults(func=cmd_collect)


def add_report(sub, common):
    """The ``report`` command's options."""
    p = sub.add_parser("report", parents=[common], formatter_class=RAW,
                       help="write the instructor's report: what the class got wrong",
                       description="Write reports/<ASSIGNMENT>.html (scores, test cells by part, "
                                   "the most common failure messages, parts failed together, "
                                   "times, limits, flags, late and missing students) and "
                                   "reports/index.html (the term), each with the CSV/JSON of its "
                                   "figures, from the gradebook and the records grade keeps. "
                                   "Offline pages: open them in any browser.")
    p.add_argument("assignment", nargs="?", help="only this assignment's page (default: all)")
    p.add_argument("--to", default=None, metavar="DIR",
                   help="output folder, relative to the course root or absolute (default reports/)")
    p.add_argument("--anonymize", action="store_true",
                   help="stable pseudonyms instead of student ids, no names, no links to "
                        "feedback pages (for sharing with TAs or in a paper)")
    p.set_defaults(func=cmd_report)


def main(argv=None):
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:  # log records name students and their files
        handler.setFormatter(PrintableFormatter("%(levelname)s %(message)s"))
    if not args.verbose:
        logging.getLogger("traitlets").setLevel(logging.ERROR)
    args.func(args)

