"""A grading worker: one long-lived process that autogrades students one by one.

Each worker imports nbgrader once and runs its ``Autograde`` and
``GenerateFeedback`` converters in-process, which saves nbgrader's start-up for
every student but the first. Nothing of a student survives into the next one:
every notebook gets a fresh kernel in a fresh OS sandbox (killed with its whole
cgroup afterwards), the worker judges every test cell itself
(:mod:`autograder.judge`), and it writes only to its own scratch gradebook,
which no kernel can see. The parent copies the scores into the class gradebook,
one student at a time.
"""

import logging
import os
import shutil
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic

import nbformat

from .audit import audit, restore_deleted
from .limits import Limits
from .nbgrader_config import SUBMITTED, autograde_settings, course_config, prepare_nbgrader


@dataclass
class Settings:
    """Everything a worker needs, picklable."""

    root: str
    assignment: str
    template_db: str       # SQLite gradebook that knows the assignment
    release_dir: str       # student version, generated for this run
    workdir: str           # scratch space of the whole run (no kernel can see it)
    limits: Limits = field(default_factory=Limits)
    sandboxed: bool = True  # False only for trusted notebooks (the instructor's own)


def autograde_config(settings, db_url, student, scratch):
    """nbgrader configuration for autograding one student in this worker."""
    c = course_config(settings.root, db_url, settings.assignment, student)
    c.merge(autograde_settings(settings.limits, sandboxed=settings.sandboxed))
    c.CourseDirectory.submitted_directory = str(scratch)
    c.BaseConverter.force = True
    c.SandboxedKernelManager.socket_root = str(Path(scratch).parent)
    return c


def stage_submission(settings, student, scratch):
    """Copy the student's notebooks into ``scratch``, audited and repaired.

    Only notebooks (and ``timestamp.txt``) are copied: other files could shadow
    modules. Deleted test cells are put back; unreadable notebooks are left out
    (nbgrader then scores them 0). Returns the audit record.
    """
    source = Path(settings.root) / SUBMITTED / student / settings.assignment
    dest = Path(scratch) / student / settings.assignment
    shutil.rmtree(scratch, ignore_errors=True)
    dest.mkdir(parents=True)
    if (source / "timestamp.txt").is_file():
        shutil.copy(source / "timestamp.txt", dest)
    record = dict(tampered=[], deleted=[], flags=[], unreadable=[], missing=[], resemblances=[],
                  functions={})
    for release_path in sorted(Path(settings.release_dir).glob("*.ipynb")):
        path = source / release_path.name
        if not path.is_file():
            record["missing"].append(release_path.name)
            continue
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:
            record["unreadable"].append(release_path.name)
            continue
        release = nbformat.read(release_path, as_version=4)
        found = audit(nb, release)
        for key in ("tampered", "deleted", "flags", "resemblances"):
            record[key] += [x for x in found[key] if x not in record[key]]
        record["functions"].update(found["functions"])
        if found["deleted"]:
            nb = restore_deleted(nb, release)
        nbformat.write(nb, dest / release_path.name)
    return record


def read_scores(db_url, assignment, student):
    """Scores of one submission in a gradebook, as plain data."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(db_url) as gb:
        try:
            sub = gb.find_submission(assignment, student)
        except MissingEntry:
            return None, []
        notebooks = [
            dict(name=nb.name, late_penalty=nb.late_submission_penalty,
                 grades=[dict(name=g.name, auto_score=g.auto_score, max_score=g.max_score)
                         for g in nb.grades],
                 comments=[dict(name=c.name, auto_comment=c.auto_comment) for c in nb.comments])
            for nb in sub.notebooks
        ]
        return sub.timestamp, notebooks


class _Shared:
    feedback_exporter = None


def generate_feedback(config):
    """nbgrader's GenerateFeedback, reusing one HTML exporter per process.

    A new exporter compiles its Jinja templates again (about a second of CPU);
    the exporter holds no per-student state, so the worker keeps the first one.
    """
    from nbconvert.writers import FilesWriter
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory

    converter = GenerateFeedback(coursedir=CourseDirectory(config=config), config=config)
    converter.init_notebooks()
    converter.writer = FilesWriter(parent=converter, config=converter.config)
    if _Shared.feedback_exporter is None:
        exporter = converter.exporter_class(parent=converter, config=converter.config)
        for preprocessor in converter.preprocessors:
            exporter.register_preprocessor(preprocessor)
        _Shared.feedback_exporter = exporter
    converter.exporter = _Shared.feedback_exporter
    converter.convert_notebooks()  # paths are absolute: no chdir needed


def grade_student(settings, student, workdir, db_url):
    """Autograde one student and write their feedback; return a result dict."""
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory

    from . import execute

    start = monotonic()
    scratch = Path(workdir) / "submitted"
    result = dict(student=student, status="ok", error=None, events=[])
    try:
        result.update(stage_submission(settings, student, scratch))
        execute.EVENTS.clear()
        c = autograde_config(settings, db_url, student, scratch)
        Autograde(coursedir=CourseDirectory(config=c), config=c).start()
        result["events"] = list(execute.EVENTS)
        c = course_config(settings.root, db_url, settings.assignment, student)
        c.BaseConverter.force = True
        generate_feedback(c)
    except Exception as error:
        result.update(status="error", error=f"{type(error).__name__}: {error}"[:500])
        logging.getLogger("autograder").error("%s: %s", student, traceback.format_exc())
        result["events"] = result["events"] or list(execute.EVENTS)
    result["timestamp"], result["notebooks"] = read_scores(db_url, settings.assignment, student)
    result["seconds"] = monotonic() - start
    return result


def main(conn, settings, index):
    """Worker loop: receive student ids on ``conn``, send back result dicts; None stops."""
    workdir = Path(settings.workdir) / f"worker{index}"
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "gradebook.db"
    shutil.copy(settings.template_db, db)
    os.environ.update(settings.limits.environment())
    log = open(workdir / "log.txt", "a")  # nothing from a worker or its kernels reaches the console
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, force=True)
    os.chdir(settings.root)
    prepare_nbgrader()
    while (student := conn.recv()) is not None:
        conn.send(grade_student(settings, student, workdir, f"sqlite:///{db}"))
