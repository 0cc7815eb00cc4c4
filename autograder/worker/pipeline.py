"""A grading worker: one long-lived process that autogrades students one by one.

Each worker imports nbgrader once and runs its ``Autograde`` and
``GenerateFeedback`` converters in-process, which saves nbgrader's start-up for
every student but the first. Nothing of a student survives into the next one:
every notebook gets a fresh kernel in a fresh OS sandbox (killed with its whole
cgroup afterwards), the worker judges every test cell itself
(:mod:`autograder.judge.verdict`), and it writes only to its own scratch gradebook,
which no kernel can see. The parent copies the scores into the class gradebook,
one student at a time.
"""

import logging
import re
import shutil
import traceback
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from time import monotonic

import nbformat

from ..core.feedback_page import CSP_META, render_feedback, rewrite_feedback_html
from ..core.grading_run import last_bytes
from ..core.gradebook import forget_submission, keep_engines_in_nbgrader, make_scratch, read_scores
from ..core.course_files import AUTOGRADED, FEEDBACK, SECRET, SUBMITTED, TIMESTAMP
from ..core.nbgrader_config import autograde_settings, course_config
from ..core.policy import apply_late_policy, late_note
from ..core.results import LimitEvent, Status, StudentResult
from ..core.times import nbgrader_time
from ..core.submission_folder import digest_of, read_submission
from ..core.untrusted import printable
from .audit import audit, restore_deleted
from .intake import handed_in_time, take_in
from .repair import describe, repair


PREFLIGHT_STARTUP = 15.0  # seconds a preflight kernel may take to answer, per try


def autograde_config(settings, db_url, student, scratch):
    """nbgrader configuration for autograding one student in this worker."""
    c = course_config(settings.root, db_url, settings.assignment, student)
    c.merge(autograde_settings(settings.limits, sandboxed=settings.sandboxed))
    c.CourseDirectory.submitted_directory = str(scratch)
    c.BaseConverter.force = True
    if settings.socket_root:  # else the kernel manager's own short default, not TMPDIR
        c.SandboxedKernelManager.socket_root = settings.socket_root
    c.LimitedExecute.spare_kernel = True  # this worker grades notebook after notebook
    c.LimitedExecute.kernel_start_tries = settings.retries.kernel_start_tries
    c.LimitedExecute.kernel_start_pause = settings.retries.kernel_start_pause
    return c


def preflight(settings, db_url, scratch):
    """Start a sandboxed kernel here and wait for its answer: None, or why none can start.

    A grading process runs it once, before its first student (the local workers and each
    Dask worker's plugin), so a host that cannot run kernels at all (no sandbox, a broken
    virtualenv, socket paths, no memory) stops the run in seconds with one line instead of
    failing every student; the line ends with the last thing the kernel printed (it runs
    no student code, so that is the sandbox's or Python's word; the kernel's stderr goes to
    ``preflight.log`` beside ``scratch``). Bounded: ``settings.retries.kernel_start_tries``
    tries of at most :data:`PREFLIGHT_STARTUP` seconds each. The kernel that answered has
    run nothing but ``kernel_info``: it becomes the process's spare
    (:class:`autograder.judge.execute.SpareKernel`), which the first notebook takes, so no kernel
    is started for the preflight alone. Before all that it readies the process's nbgrader: one
    schema validator per schema, one SQLAlchemy engine per gradebook
    (:func:`autograder.core.gradebook.keep_engines_in_nbgrader`), and a scratch gradebook at
    ``db_url`` whose commits do not wait for the disk
    (:func:`autograder.core.gradebook.make_scratch`).
    """
    from ..judge.execute import KernelStartError, LimitedExecute, SpareKernel

    validate_metadata_once_per_schema()
    keep_engines_in_nbgrader()
    make_scratch(db_url)
    preflight_log = Path(scratch).parent / "preflight.log"
    preflight_log.unlink(missing_ok=True)
    c = autograde_config(settings, db_url, INTERNAL_ID, scratch)
    c.SandboxedKernelManager.startup_log = str(preflight_log)
    c.LimitedExecute.spare_kernel = False
    executor = LimitedExecute(config=c)
    executor.kernel_name = "python3"  # the course's notebooks' kernel (nbgrader's default too)
    executor.startup_timeout = PREFLIGHT_STARTUP
    executor.nb = nbformat.v4.new_notebook()
    try:
        executor._start()
    except KernelStartError as error:
        last = [line for line in last_bytes(preflight_log).splitlines() if line.strip()][-1:]
        executor._stop()
        preflight_log.unlink(missing_ok=True)
        return f"{error}" + (f" (the kernel said: {printable(last[0].strip()[:200])})" if last else "")
    except BaseException:
        executor._stop()
        raise
    SpareKernel.hold(executor.hand_over())
    return None


class _SchemaValidators:
    """``jsonschema.validate`` with each schema's validator checked and built once.

    nbgrader checks every cell's metadata with ``jsonschema.validate``, which checks its
    schema and builds a validator again for each cell. This does the same check (the same
    ``best_match`` error is raised) with one validator per schema and process.
    """

    def __init__(self):
        self.validators = {}

    def validate(self, instance, schema):
        import json

        import jsonschema

        key = json.dumps(schema, sort_keys=True)
        if (validator := self.validators.get(key)) is None:
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            validator = self.validators[key] = cls(schema)
        if (error := jsonschema.exceptions.best_match(validator.iter_errors(instance))) is not None:
            raise error


def validate_metadata_once_per_schema():
    """Make nbgrader's cell-metadata check (``CheckCellMetadata``) use :class:`_SchemaValidators`."""
    from nbgrader.nbgraderformat import common

    if not isinstance(common.jsonschema, _SchemaValidators):
        common.jsonschema = _SchemaValidators()


INTERNAL_ID = "student"  # the id every submission has inside a worker: no glob characters


def stage_submission(settings, student, scratch, submission=None):
    """Take in the student's notebook, audit it and put it in ``scratch`` for nbgrader.

    The folder is read once, by :func:`autograder.core.submission_folder.read_submission`, which
    follows no link out of ``submitted/<student>/<assignment>`` (a linked student or
    assignment folder is refused) and bounds what it reads;
    :func:`autograder.worker.intake.take_in` decides which notebook to grade (any name; the
    newest of several; a copy without nbgrader metadata re-seated into the release
    notebook) or why none can be; :func:`autograder.worker.repair.repair` then mends what
    nbformat's schema or the assignment's grading metadata refuses, naming each fault. Only that notebook is staged (other files could
    shadow modules), with the collection's ``timestamp.txt`` (rewritten in nbgrader's
    format; one that is not a time or lies in the future is replaced by the time of
    grading and flagged ``bad-timestamp``) and nbgrader's ``submission_secret.txt``
    (which ``release_feedback`` needs). Deleted test cells are put back.
    Returns the :class:`StudentResult` so far.
    """
    root = Path(settings.root)
    source = root / SUBMITTED / student / settings.assignment
    dest = Path(scratch) / INTERNAL_ID / settings.assignment
    shutil.rmtree(scratch, ignore_errors=True)
    dest.mkdir(parents=True)
    if submission is None:  # on a Dask worker the client has read it (host/cluster.read_handed_in)
        submission = read_submission(source, within=root / SUBMITTED)
    result = StudentResult(student=student, digest=digest_of(submission))
    handed, problem = handed_in_time(submission, datetime.now(timezone.utc))
    if handed is not None:
        (dest / TIMESTAMP).write_text(nbgrader_time(handed))
    if problem:
        result.message, result.flags = problem, ["bad-timestamp"]
    secret = submission.entry(SECRET)
    if secret is not None and secret.data and re.fullmatch(rb"[0-9a-fA-F]{1,512}", secret.data.strip()):
        (dest / SECRET).write_bytes(secret.data.strip())
    for release_path in sorted(Path(settings.release_dir).glob("*.ipynb")):
        release = nbformat.read(release_path, as_version=4)
        intake = take_in(submission, release, timestamp=handed)
        result.message = "; ".join(m for m in (result.message, intake.message) if m)
        if intake.status != Status.OK:
            result.status = intake.status
            continue
        nb, problems = repair(intake.notebook, release)  # schema and grading-metadata faults
        result.message = "; ".join(m for m in (result.message, describe(problems)) if m)
        result.flags += [f for f in dict.fromkeys(f for f, _ in problems) if f not in result.flags]
        if intake.reseated:
            result.flags.append("reseated")
        found = audit(nb, release)
        found.record(result)
        if found.deleted:
            nb = restore_deleted(nb, release)
        nbformat.write(nb, dest / release_path.name)
    return result


def explanation_page(student, assignment, result):
    """The feedback page of a submission that could not be graded: what was wrong."""
    from html import escape

    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{CSP_META}"
            f"<title>{escape(assignment)}: not graded</title></head><body>"
            f"<h1>{escape(assignment)}: your submission could not be graded</h1>"
            f"<p>{escape(result.message or result.error or result.status)}</p>"
            f"<p>Score: 0. Hand in the assignment's notebook (a <code>.ipynb</code> file saved "
            f"by Jupyter) and ask your instructor to grade it again.</p></body></html>").encode()


def unrendered_page(student, assignment, notebook, cause):
    """The feedback page of a notebook that was graded but whose page could not be rendered."""
    from html import escape

    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{CSP_META}"
            f"<title>{escape(assignment)}: graded</title></head><body>"
            f"<h1>{escape(assignment)}: {escape(notebook)} was graded</h1>"
            f"<p>Your scores are recorded, but this page could not show your notebook: "
            f"{escape(cause)}.</p><p>Ask your instructor for your scores.</p></body></html>").encode()


class NotGraded(Exception):
    """nbgrader could not grade a notebook; the message is the cause it logged."""


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextmanager
def nbgrader_errors():
    """What nbgrader's converters log as errors meanwhile (a list of messages).

    A converter catches a notebook's exception, logs it with its traceback and raises
    ``NbGraderException("Please see the above traceback")``: the cause is only in the log.
    """
    handler, logger = _Records(), logging.getLogger("traitlets")  # nbgrader's converters' logger
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


def cause_of(error, logged):
    """One line: the exception that really stopped nbgrader (its last logged traceback line)."""
    for text in reversed(logged):
        lines = [line for line in str(text).splitlines() if line.strip()]
        if lines and "Traceback" in str(text):
            return printable(lines[-1].strip())[:300]
    return printable(f"{type(error).__name__}: {error}")[:300]


def collect_files(scratch_root, student, assignment, needs_manual, late=None):
    """The autograded notebooks and feedback pages as ``{path under the course root: bytes}``.

    Feedback pages are rewritten (:func:`autograder.core.feedback_page.rewrite_feedback_html`, with ``late``, the
    words on the late penalty, if any) on the way.
    The staged ``timestamp.txt`` and ``submission_secret.txt`` come along, which nbgrader
    copies into both folders too: ``nbgrader release_feedback`` reads them beside each page.
    """
    files = {}
    for kind in (AUTOGRADED, FEEDBACK):
        folder = Path(scratch_root) / kind / INTERNAL_ID / assignment
        for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
            if not path.is_file():
                continue
            data = path.read_bytes()
            if kind == FEEDBACK and path.suffix == ".html":
                graded = Path(scratch_root) / AUTOGRADED / INTERNAL_ID / assignment / f"{path.stem}.ipynb"
                nb = nbformat.read(graded, as_version=4)
                data = rewrite_feedback_html(data.decode(), nb, needs_manual, late).encode()
            files[f"{kind}/{student}/{assignment}/{path.relative_to(folder)}"] = data
    return files


def grade_student(settings, student, workdir, db_url, submission=None, more=True):
    """Autograde one student and render their feedback, all in ``workdir``; a StudentResult.

    Nothing is written under the course root: the driver records the scores and
    writes the returned files, so the gradebook and the files on disk always agree.
    ``more``: whether students still wait in the run's queue (the driver says, see
    :func:`autograder.host.schedule.run_schedule`); without them, this student's last
    notebook launches no spare kernel (:class:`autograder.judge.execute.SpareKernel`).
    """
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory

    from ..judge.execute import GradingHostFault, SpareKernel, events, flags

    start = monotonic()
    SpareKernel.wanted = more or len(list(Path(settings.release_dir).glob("*.ipynb"))) > 1
    scratch = Path(workdir) / "submitted"
    out = Path(workdir) / "out"
    shutil.rmtree(out, ignore_errors=True)
    result = StudentResult(student=student)
    try:
        result = stage_submission(settings, student, scratch, submission)
        if result.status == Status.OK:
            c = autograde_config(settings, db_url, INTERNAL_ID, scratch)
            c.CourseDirectory.autograded_directory = str(out / AUTOGRADED)
            # the scratch gradebook grades everyone as INTERNAL_ID: nothing of the previous
            # student may remain (nbgrader would keep its submission time, for one thing)
            forget_submission(db_url, settings.assignment, INTERNAL_ID)
            stamp = scratch / INTERNAL_ID / settings.assignment / TIMESTAMP
            if not stamp.exists():  # without a timestamp.txt, the time of grading counts
                stamp.write_text(nbgrader_time(datetime.now(timezone.utc)))
            with nbgrader_errors() as logged:
                try:
                    Autograde(coursedir=CourseDirectory(config=c), config=c).start()
                except GradingHostFault:
                    raise
                except Exception as error:  # the cause, not "Please see the above traceback"
                    raise NotGraded(cause_of(error, logged)) from error
            for graded in sorted((out / AUTOGRADED).rglob("*.ipynb")):
                executed = nbformat.read(graded, as_version=4)
                result.events += [LimitEvent.from_dict(e) for e in events(executed)]
                result.flags += [f for f in flags(executed) if f not in result.flags]  # judged calls
            late = apply_late_policy(db_url, settings.assignment, settings.course)
            result.page_penalty = late[INTERNAL_ID].penalty if INTERNAL_ID in late else 0.0
            c = course_config(settings.root, db_url, settings.assignment, INTERNAL_ID)
            c.CourseDirectory.autograded_directory = str(out / AUTOGRADED)
            c.CourseDirectory.feedback_directory = str(out / FEEDBACK)
            c.BaseConverter.force = True
            unrendered = None
            with nbgrader_errors() as logged:
                try:
                    render_feedback(c)
                except OSError:
                    raise
                except Exception as error:  # a page that cannot be rendered never costs the scores
                    unrendered = cause_of(error, logged)
                    result.flags.append("feedback-failed")
                    result.message = "; ".join(m for m in (
                        result.message, f"the feedback page could not be rendered ({unrendered}); "
                                        "the scores stand") if m)
                    result.log = "\n".join([traceback.format_exc(), *logged])[-4000:]
                    logging.getLogger("autograder").error("%s: feedback not rendered: %s", student, result.log)
            result.timestamp, result.notebooks = read_scores(db_url, settings.assignment, INTERNAL_ID)
            note = (late_note(settings.course.policy(settings.assignment), late[INTERNAL_ID].late_by,
                              result.page_penalty) if result.page_penalty > 0 else None)
            result.files = collect_files(out, student, settings.assignment, result.manual_cells(), note)
            if unrendered is not None:
                for graded in sorted((out / AUTOGRADED / INTERNAL_ID / settings.assignment).glob("*.ipynb")):
                    page = f"{FEEDBACK}/{student}/{settings.assignment}/{graded.stem}.html"
                    if page not in result.files:
                        result.files[page] = unrendered_page(student, settings.assignment, graded.stem, unrendered)
        else:  # the page says why; the staged times let release_feedback hand it back too
            staged = scratch / INTERNAL_ID / settings.assignment
            folder = f"{FEEDBACK}/{student}/{settings.assignment}"
            result.files = {f"{folder}/{settings.assignment}.html":
                            explanation_page(student, settings.assignment, result)}
            result.files.update({f"{folder}/{name}": (staged / name).read_bytes()
                                 for name in (TIMESTAMP, SECRET) if (staged / name).is_file()})
    except GradingHostFault as error:  # the host's fault: no grade, the earlier one stays
        result = StudentResult(student=student, status=Status.ERROR, host_fault=True,
                               error=f"a fault of the grading host: {error}"[:500],
                               log=traceback.format_exc()[-4000:])
        logging.getLogger("autograder").error("%s: %s", student, result.log)
    except Exception as error:
        result.status, result.error = Status.ERROR, f"{type(error).__name__}: {error}"[:500]
        result.log = traceback.format_exc()[-4000:]  # chained: the cause, then the converter's words
        logging.getLogger("autograder").error("%s: %s", student, result.log)
    result.seconds = monotonic() - start
    return result
