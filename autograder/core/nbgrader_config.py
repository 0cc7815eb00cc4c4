"""nbgrader settings for this course, built in code so that every command agrees.

The course root is the repository root; its folders and files are named by
:mod:`autograder.core.course_files`; :func:`course_config` hands them to nbgrader, so nbgrader's
commands and the grader's agree.
"""

import functools
import os
from pathlib import Path

from traitlets.config import Config

from .course_files import AUTOGRADED, FEEDBACK, GRADEBOOK, RELEASE, SOURCE, STAMP, SUBMITTED
from .gradebook import sqlite_url
from .sanitize import exporter_settings



def default_db_url(root):
    """The SQLite gradebook :data:`~autograder.core.course_files.GRADEBOOK` in ``root``."""
    return sqlite_url(Path(root).resolve() / GRADEBOOK)


def course_config(root, db_url=None, assignment=None, student=None):
    """A traitlets ``Config`` for nbgrader's converters, rooted at ``root``."""
    from nbgrader.coursedir import CourseDirectory

    c = Config()
    c.CourseDirectory.root = str(Path(root).resolve())
    c.CourseDirectory.source_directory = SOURCE
    c.CourseDirectory.release_directory = RELEASE
    c.CourseDirectory.submitted_directory = SUBMITTED
    c.CourseDirectory.autograded_directory = AUTOGRADED
    c.CourseDirectory.feedback_directory = FEEDBACK
    c.CourseDirectory.db_url = db_url or default_db_url(root)
    if assignment:
        c.CourseDirectory.assignment_id = assignment
    if student:
        c.CourseDirectory.student_id = student
    c.CourseDirectory.ignore = [*CourseDirectory.ignore.default(), STAMP]
    # feedback shows the student's code and test results, never the hidden tests
    c.GenerateFeedback.preprocessors = [
        "nbgrader.preprocessors.GetGrades",
        "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
        "nbgrader.preprocessors.ClearHiddenTests",
    ]
    # what a submission contains renders inert in feedback pages and the formgrader's views
    c.merge(exporter_settings())
    return c


def autograde_settings(limits=None, *, sandboxed=True):
    """How to autograde: sandboxed kernels, the outside judge, the limits.

    The driver's workers and stock ``nbgrader autograde`` (through the course's
    ``nbgrader_config.py``, the formgrader included) use exactly this, so a
    student gets the same score whichever way the instructor grades.
    """
    from .limits import Limits

    limits = limits or Limits()
    c = Config()
    c.Autograde.autograde_preprocessors = [
        "autograder.judge.execute.LimitedExecute",
        "nbgrader.preprocessors.IgnorePattern",
        "nbconvert.preprocessors.ClearMetadataPreprocessor",
        "nbgrader.preprocessors.LimitOutput",
        "nbgrader.preprocessors.SaveAutoGrades",  # late penalties: core.policy.apply_late_policy
        "nbgrader.preprocessors.CheckCellMetadata",
    ]
    c.Execute.timeout = int(limits.cell_timeout)
    c.Execute.interrupt_on_timeout = True
    c.Execute.raise_on_iopub_timeout = False
    c.Execute.iopub_timeout = 2  # outputs still in flight after a reply (waited for on a hang too)
    c.Execute.startup_timeout = 60
    c.Execute.extra_arguments = [
        "--InteractiveShell.xmode=Minimal",  # no traceback lines in messages
        "--HistoryManager.hist_file=:memory:",
        "--IPKernelApp.ignore_cwd=True",
    ]
    c.Execute.kernel_manager_class = "autograder.judge.kernel_manager.SandboxedKernelManager"
    c.LimitedExecute.notebook_timeout = float(limits.notebook_timeout)
    c.LimitedExecute.output_limit = int(limits.output_limit)
    c.SandboxedKernelManager.sandboxed = bool(sandboxed)
    # keep the executor's record of the limits it enforced in the autograded notebook
    c.ClearMetadataPreprocessor.preserve_nb_metadata_mask = {("language_info", "name"), ("autograder",)}
    return c


@functools.lru_cache(maxsize=None)
def alembic_head():
    """The gradebook schema revision, read in-process from nbgrader's migrations."""
    import nbgrader
    from alembic.config import Config as AlembicConfig
    from alembic.script import ScriptDirectory

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", os.path.join(os.path.dirname(nbgrader.__file__), "alembic"))
    return ScriptDirectory.from_config(cfg).get_current_head()


def alembic_upgrade(db_url, revision="head"):
    """``nbgrader db upgrade``'s migration, run in-process instead of by the ``alembic`` command."""
    from alembic import command
    from alembic.config import Config as AlembicConfig
    from nbgrader.dbutil import _temp_alembic_ini

    with _temp_alembic_ini(db_url) as alembic_ini:
        command.upgrade(AlembicConfig(alembic_ini), revision)


def prepare_nbgrader():
    """Make nbgrader work without the ``alembic`` command on PATH.

    Creating a gradebook, nbgrader 0.9.6 runs ``alembic heads`` in a subprocess, and
    ``nbgrader db upgrade`` runs ``alembic upgrade`` (seconds of start-up each, and
    both fail when the virtualenv's ``bin/`` is not on PATH: a half-made
    ``gradebook.db`` is left behind). The same revision is read, and the same
    migration run, here in-process.
    """
    import nbgrader.api
    import nbgrader.dbutil

    nbgrader.api.get_alembic_version = alembic_head
    nbgrader.dbutil.upgrade = alembic_upgrade
