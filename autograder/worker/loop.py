"""The local grading worker: a process forked by the driver that grades student after student.

:func:`main` is the whole process: it arms itself to die with the driver, leaves signals to
the driver, sends everything it and its kernels print to its own log file, and then answers
one ``(student id, more)`` after another on its pipe with that student's
:class:`~autograder.core.results.StudentResult`, as its ``to_dict()`` (:func:`autograder.worker.pipeline.grade_student`,
in its own scratch gradebook; ``more``: whether students still wait in the driver's queue), until it
receives None. Its first word is a
:class:`~autograder.core.results.WorkerStart` (its ``to_dict()`` too): whether its first kernel could start
(:func:`autograder.worker.pipeline.preflight`); a worker whose kernel cannot start ends there. The driver's end of the pipe is
:class:`autograder.host.pool.Worker`.
"""

import ctypes
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

from ..core.course_files import GRADEBOOK
from ..core.gradebook import sqlite_url
from ..core.limits import cap_worker_memory
from ..core.nbgrader_config import prepare_nbgrader
from ..sandbox.cgroups import RUN_ENV
from ..core.results import WorkerStart
from .pipeline import grade_student, preflight


def main(conn, settings, index):
    """A worker's entry: it dies with the driver, and leaves signals to the driver."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphaned workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the driver decides
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if os.getppid() == 1:  # the driver died before the line above ran
        os._exit(1)
    serve(conn, settings, index)


def serve(conn, settings, index):
    """Worker loop: say whether kernels start, then receive ``(student id, more)`` on ``conn``
    and send back results; None stops."""
    workdir = Path(settings.workdir) / f"worker{index}"
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / GRADEBOOK
    shutil.copy(settings.template_db, db)
    db_url = sqlite_url(db)
    os.environ.update(settings.limits.environment())
    os.environ[RUN_ENV] = settings.run_id
    cap_worker_memory()
    log = open(workdir / "log.txt", "a")  # nothing from a worker or its kernels reaches the console
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, force=True)
    os.chdir(settings.root)
    prepare_nbgrader()
    from ..judge.execute import SpareKernel

    try:
        fault = preflight(settings, db_url, workdir / "submitted")
        conn.send(WorkerStart(fault or "").to_dict())
        if fault:
            return
        while (work := conn.recv()) is not None:
            student, more = work
            conn.send(grade_student(settings, student, workdir, db_url, more=more).to_dict())
    finally:
        SpareKernel.discard()
