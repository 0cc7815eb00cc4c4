"""An attempt's files: taken in from the exchange or an upload, kept under ``--state``.

Each accepted attempt is a folder ``<state>/attempts/<token>/`` written by the service
alone: ``submission/`` (what the student handed in, as grading reads it), then, once it is
graded, ``result.pickle`` (the worker's :class:`~autograder.core.results.StudentResult`,
files included: what the gradebook and the course's files are set back to when this
attempt counts again) and ``feedback/`` (its pages as the course rendered them).

**Nothing a student sends is a path.** The student id is the Hub's user name (or the
exchange folder's first part) and must be a plain id (:func:`check_student`); the
assignment must be one of the course's; the folder is named by a random token; an upload is
written as ``<assignment>.ipynb``; an exchange folder is read with
:func:`autograder.core.submission_folder.read_submission` (no link followed, every file capped) and
only its plain regular files are written back, under their own plain names.
"""

import os
import pickle
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path

from ..core.course_files import SECRET, SUBMITTED, TIMESTAMP
from ..core.times import nbgrader_time
from ..core.notebook_file import NOTEBOOK_BYTES, read_notebook
from ..core.submission_folder import Kind, read_submission

STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()+-]{0,127}")
ATTEMPTS = "attempts"
SUBMISSION = "submission"
RESULT = "result.pickle"
PAGES = "feedback"


class Refused(ValueError):
    """An attempt that is not taken: one line for the student."""


def check_student(student):
    """``student`` if it is a plain id (letters, digits, ``._@-``; 64 at most), else Refused."""
    if not isinstance(student, str) or not STUDENT_ID.fullmatch(student):
        raise Refused("this user name cannot be a student id of the course")
    return student


def folder(state, token):
    return Path(state) / ATTEMPTS / token


def handed_in_text(moment):
    """A time as nbgrader's ``timestamp.txt`` holds it."""
    return nbgrader_time(moment)


def write_synced(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def sync_folder(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def from_upload(state, token, assignment, data, now=None):
    """Write an uploaded notebook as attempt ``token``; Refused (nothing written) if the
    bytes are too many or not a notebook."""
    if len(data) > NOTEBOOK_BYTES:
        raise Refused(f"the notebook is larger than {NOTEBOOK_BYTES // 2**20} MiB")
    notebook, problem = read_notebook(data)
    if notebook is None:
        raise Refused(f"the file is {problem}")
    where = folder(state, token) / SUBMISSION
    write_synced(where / f"{assignment}.ipynb", data)
    write_synced(where / TIMESTAMP, handed_in_text(now or datetime.now(timezone.utc)).encode())
    sync_folder(where)
    return where


def from_exchange(state, token, inbound):
    """Copy the exchange's folder ``inbound`` as attempt ``token`` (its plain files only)."""
    submission = read_submission(Path(inbound), within=Path(inbound).parent)
    where = folder(state, token) / SUBMISSION
    where.mkdir(parents=True, exist_ok=True)
    for entry in submission.entries:
        if entry.kind == Kind.FILE and entry.data is not None and FILE_NAME.fullmatch(entry.name):
            write_synced(where / entry.name, entry.data)
    sync_folder(where)
    return where


def install(root, state, token, student, assignment):
    """Make ``submitted/<student>/<assignment>/`` the attempt's submission, as ``grade`` reads
    it. A folder there that is no attempt of the service (collected by hand, from an LMS) is
    kept beside it, as ``collect`` keeps what it replaces."""
    target = Path(root) / SUBMITTED / student / assignment
    marker = target.with_name(f".{assignment}.service")  # beside, never in, what intake reads
    if target.is_symlink():
        target.unlink()
    elif target.exists() and not marker.exists():
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        target.rename(target.with_name(f".{assignment}.replaced-{stamp}"))
    staging = target.with_name(f".{assignment}.installing")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(folder(state, token) / SUBMISSION, staging)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    marker.write_text(token)
    return target


def keep_result(state, token, result):
    write_synced(folder(state, token) / RESULT, pickle.dumps(result.to_dict()))


def load_result(state, token):
    from ..core.results import StudentResult

    path = folder(state, token) / RESULT
    if not path.is_file():
        return None
    with open(path, "rb") as f:  # written by this service only
        return StudentResult.from_dict(pickle.load(f))


def keep_pages(state, token, pages):
    """Keep ``{notebook id: html bytes}`` as the attempt's pages."""
    for name, data in pages.items():
        write_synced(folder(state, token) / PAGES / f"{name}.html", data)


def pages(state, token):
    """``{notebook id: html bytes}`` of the attempt (empty before it is graded)."""
    where = folder(state, token) / PAGES
    return {p.stem: p.read_bytes() for p in sorted(where.glob("*.html"))} if where.is_dir() else {}


def secret(state, token):
    """The attempt's ``submission_secret.txt`` (the exchange's), or None."""
    path = folder(state, token) / SUBMISSION / SECRET
    return path.read_text().strip() if path.is_file() else None
