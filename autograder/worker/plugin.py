"""The grading side of a Dask cluster: what runs on every Dask worker process.

The client (:mod:`autograder.host.cluster`) registers one :class:`GradingPlugin` per run (its
name carries the run id, so runs of different assignments share a cluster) and sends one
:func:`grade_task` per submission. On every worker process the plugin sets up a private
scratch course: the student version and the template gradebook arrive as bytes in the
:class:`RunPayload`, so the grading hosts need the course's *code* (the checkout and ``.venv``
at the same path, or the wheel), not its files. The task runs the very pipeline a local worker
runs (:func:`autograder.worker.pipeline.grade_student`: intake, audit, sandboxed kernels, the
outside judge, the same limits, feedback) and returns a
:class:`~autograder.core.results.StudentResult` as its ``to_dict()``; workers never touch the class gradebook or the
course root. When the run ends the client unregisters the plugin (and removes it from any worker
Dask left it on: :func:`forget_plugin`), and each worker removes its scratch and kills the run's
kernels. :func:`grader_digest` runs here and in the client: both must grade with the same code.
"""

import os
import shutil
import threading
from dataclasses import replace
from pathlib import Path

from distributed import WorkerPlugin

from ..core.course_files import GRADEBOOK
from ..core.gradebook import drop_engine, sqlite_url
from ..core.grading_run import make_socket_root, plugin_name, sweep_dead_runs
from ..core.nbgrader_config import prepare_nbgrader
from ..core.scratch import make_scratch, remove_scratch
from ..sandbox.cgroups import RUN_ENV, kill_run_cgroups
from ..sandbox.launcher import unavailable_reason
from . import pipeline


class GradingPlugin(WorkerPlugin):
    """Dask worker plugin: one run's scratch course and scratch gradebook on a worker process.

    ``setup`` also does what a local worker does before its first student: nbgrader and
    the executor imported, a kernel started and waited for (:func:`pipeline.preflight`: a
    worker where no kernel can start fails its setup, and the client stops the run with one
    line); that kernel then waits as the *spare*, which the first notebook takes
    (:class:`autograder.judge.execute.SpareKernel`).
    """

    def __init__(self, payload):
        self.payload = payload
        self.name = plugin_name(payload.settings.run_id)
        self.settings = None  # made on the worker, in setup()

    def setup(self, worker=None):
        if self.payload.settings.sandboxed and (reason := unavailable_reason()):
            raise RuntimeError(f"cannot grade untrusted notebooks safely on this worker: {reason}")
        sweep_dead_runs()  # the folders of this host's workers killed outright, any run's
        workdir = make_scratch(f"autograder-{self.payload.settings.run_id}-")
        release = workdir / "release"
        release.mkdir()
        for name, data in self.payload.release.items():
            (release / name).write_bytes(data)
        (workdir / "course").mkdir()
        template = workdir / "template.db"
        template.write_bytes(self.payload.template_db)
        (workdir / "grader").mkdir()
        shutil.copy(template, workdir / "grader" / GRADEBOOK)
        self.settings = replace(self.payload.settings, root=str(workdir / "course"),
                                release_dir=str(release), template_db=str(template),
                                workdir=str(workdir),
                                socket_root=make_socket_root(self.payload.settings.run_id))
        prepare_nbgrader()
        import nbgrader.converters  # noqa: F401

        fault = None
        if _GRADING.acquire(blocking=False):  # never wait here: this is the worker's event loop
            try:
                # The newest run takes the process's one spare: a kernel waiting here is another
                # run's, or a dead one (a run whose plugin Dask left behind has had its kernels
                # killed by its teardown on another worker). Another live run on this worker
                # starts its next kernel on demand, once.
                self.enter()
                fault = pipeline.preflight(self.settings, self.db_url(), self.grader_dir() / "submitted")
            finally:
                _GRADING.release()
        if fault:  # Dask does not tear down a plugin whose setup failed
            self.teardown()
            raise RuntimeError(f"no grading kernel can start on this worker: {fault}")

    def teardown(self, worker=None):
        from ..judge.execute import SpareKernel

        if self.settings is None:
            return
        if _GRADING.acquire(blocking=False):
            try:
                if _ProcessRun.run == self.name:
                    SpareKernel.discard()
                    _ProcessRun.run = None
            finally:
                _GRADING.release()
        kill_run_cgroups(self.settings.run_id)  # the spare too, if a task holds the lock
        drop_engine(self.db_url())
        remove_scratch(self.settings.workdir)
        remove_scratch(self.settings.socket_root)

    def enter(self):
        """Make this run the one whose kernels this process starts (environment, directory)."""
        from ..judge.execute import SpareKernel

        if _ProcessRun.run != self.name:  # a spare kernel of another run has its limits: not ours
            SpareKernel.discard()
            _ProcessRun.run = self.name
        os.environ.update(self.settings.limits.environment())
        os.environ[RUN_ENV] = self.settings.run_id
        os.chdir(self.settings.root)

    def grader_dir(self):
        return Path(self.settings.workdir) / "grader"

    def db_url(self):
        return sqlite_url(self.grader_dir() / GRADEBOOK)

    def grade(self, student, submission, more=True):
        """Grade one submission (a :class:`autograder.core.submission_folder.SubmissionFolder`, read by the
        client) in this worker's scratch course; ``more``: whether the run has students after it."""
        with _GRADING:
            self.enter()
            return pipeline.grade_student(self.settings, student, self.grader_dir(), self.db_url(),
                                          submission=submission, more=more).to_dict()


_GRADING = threading.Lock()  # one submission at a time per worker process, whatever the run


class _ProcessRun:
    """The run whose environment (and spare kernel) this worker process has now."""

    run = None  # the plugin whose environment (and spare kernel) this worker process has


def grade_task(plugin_name, student, submission, more=True):
    """The Dask task: grade ``student``'s ``submission`` with this worker's plugin of the run;
    its :class:`~autograder.core.results.StudentResult` as ``to_dict()``. ``more``: whether the
    run's queue held students after it when it was submitted (if not, the worker launches no
    spare kernel after it)."""
    from distributed import get_worker

    return get_worker().plugins[plugin_name].grade(student, submission, more)
