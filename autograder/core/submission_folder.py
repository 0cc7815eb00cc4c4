"""A student's submission folder, looked at and never followed: the hostile-filesystem reader.

:func:`read_submission` reads one ``submitted/<student>/<assignment>/`` folder into a
:class:`SubmissionFolder` (every entry's name and kind, the bytes of the files the grader reads,
or why each was not read). Everything handed in is hostile, so the folder is only ever
*looked at*:

* the student's folder and the assignment folder are opened one component at a time with
  ``O_NOFOLLOW`` (a symbolic link there, to ``solutions/`` or to a classmate, makes the whole
  submission unreadable);
* entries are listed with ``lstat``; a file is opened with ``O_NOFOLLOW | O_NONBLOCK``,
  checked with ``fstat`` to be a regular file and read from that descriptor. Symbolic links,
  folders named ``*.ipynb``, FIFOs, sockets and devices are never opened (a FIFO would block
  forever) and are reported by name;
* a **hard link** (a regular file with more than one name, which may be a file of
  ``solutions/`` or of a classmate) is refused, never read;
* every cost is bounded before it is paid: a file larger than
  :data:`autograder.core.notebook_file.NOTEBOOK_BYTES` (by ``st_size``, then while reading)
  is not read, nor are notebooks beyond :data:`SUBMISSION_BYTES` per folder, nor a folder of
  more than :data:`FOLDER_ENTRIES` entries;
* only candidate notebooks (visible ``*.ipynb`` entries, :func:`is_candidate`) and the
  collection's files (``timestamp.txt``, ``submission_secret.txt``) are read;
* file names that are not UTF-8 are kept as Python's surrogate escapes; every message names
  them escaped (:func:`autograder.core.untrusted.printable`).

:func:`submission_digest` is the digest of what was handed in, read the same way: the grader
grades a submission again only when it changes. Nothing here modifies the folder.
"""

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from .course_files import SECRET, TIMESTAMP
from .notebook_file import NOTEBOOK_BYTES
from .untrusted import printable

COLLECTION_FILES = (TIMESTAMP, SECRET)
COLLECTION_BYTES = 4096  # a timestamp or a secret is a short line
# names of the folder's own files, written by collection and Jupyter, not by the student
NOT_HANDED_IN = {".ipynb_checkpoints", *COLLECTION_FILES}
SUBMISSION_BYTES = 64 * 2**20    # all the notebooks of one folder together
FOLDER_ENTRIES = 1000            # entries of one folder that are looked at


class Kind(StrEnum):
    """What an entry of a submission folder is, by ``lstat`` (never by following it)."""

    FILE = "file"
    FOLDER = "folder"
    LINK = "link"
    SPECIAL = "special"  # a FIFO, a socket or a device


@dataclass(frozen=True)
class Entry:
    """One entry of a submission folder: what it is and, for a file the grader reads,
    its bytes (``data``) or why they were not read (``problem``, completing "NAME is ...").
    ``name`` is as listed (bytes that are not UTF-8 as surrogate escapes)."""

    name: str
    kind: Kind
    mtime: float
    data: bytes | None = None
    problem: str | None = None


@dataclass(frozen=True)
class SubmissionFolder:
    """What one submission folder holds, read once, without following anything out of it.

    ``problem`` (completing "the submission ...") says why the folder itself was not read:
    then ``entries`` is empty.
    """

    entries: tuple[Entry, ...] = ()
    problem: str | None = None

    def entry(self, name):
        """The entry called ``name``, or None."""
        return next((e for e in self.entries if e.name == name), None)


def read_submission(folder: Path, within: Path | None = None) -> SubmissionFolder:
    """The :class:`SubmissionFolder` in ``folder``, read without following any link.

    ``within`` is an ancestor of ``folder`` taken as it is (the course's ``submitted/``);
    every folder below it, down to ``folder``, is opened with ``O_NOFOLLOW``, so a link
    there is refused, not followed. By default only ``folder`` itself is checked.
    """
    folder = Path(folder)
    within = Path(within) if within is not None else folder.parent
    steps = folder.relative_to(within).parts
    try:
        fd = os.open(within, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return SubmissionFolder()
    try:
        for depth, step in enumerate(steps):
            try:
                inner = os.open(step, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK
                                | os.O_CLOEXEC, dir_fd=fd)
            except OSError as error:
                return folder_problem(error, fd, step, Path(*steps[:depth + 1]))
            os.close(fd)
            fd = inner
        return looked_at(fd, Path(*steps))
    finally:
        os.close(fd)


def folder_problem(error, fd, name, path):
    """The :class:`SubmissionFolder` of the folder ``name`` in the open folder ``fd`` (``path``
    under ``submitted/``) that could not be opened (``error``)."""
    if error.errno == errno.ENOENT:
        return SubmissionFolder()
    try:
        linked = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        linked = False
    if linked or error.errno == errno.ELOOP:
        return SubmissionFolder(problem=f"folder {printable(str(path))} is a symbolic link, which the "
                                  "grader does not follow")
    if error.errno == errno.ENOTDIR:
        return SubmissionFolder(problem=f"folder {printable(str(path))} is not a folder")
    return SubmissionFolder(problem=f"folder {printable(str(path))} cannot be opened ({error.strerror})")


def looked_at(fd, path):
    """The :class:`SubmissionFolder` of the open folder ``fd`` (``path`` under ``submitted/``):
    the :class:`Entry` of each name, sorted by name.

    Candidate notebooks and the collection files are read (:func:`read_regular`);
    notebooks beyond :data:`SUBMISSION_BYTES` in all are not. A folder of more than
    :data:`FOLDER_ENTRIES` entries is not read at all.
    """
    with os.scandir(fd) as listing:
        names = sorted(entry.name for _, entry in zip(range(FOLDER_ENTRIES + 1), listing))
    if len(names) > FOLDER_ENTRIES:
        return SubmissionFolder(problem=f"folder {printable(str(path))} holds more than {FOLDER_ENTRIES} "
                                  "entries, more than the grader looks at")
    entries, budget = [], SUBMISSION_BYTES
    for name in names:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue  # removed while we looked
        kind = kind_of(info.st_mode)
        problem = data = None
        if is_candidate(name) or name in COLLECTION_FILES:
            cap = NOTEBOOK_BYTES if is_candidate(name) else COLLECTION_BYTES
            if kind != Kind.FILE:
                problem = NOT_A_FILE[kind]
            elif is_candidate(name) and budget < info.st_size <= cap:
                problem = (f"not read: the folder's notebooks exceed "
                           f"{SUBMISSION_BYTES // 2**20} MiB together")
            else:
                data, problem = read_regular(name, fd, cap)
                budget -= len(data or b"")
        entries.append(Entry(name, kind, info.st_mtime, data, problem))
    return SubmissionFolder(tuple(entries))


NOT_A_FILE = {Kind.LINK: "a symbolic link, which the grader does not follow",
              Kind.FOLDER: "a folder, not a notebook file",
              Kind.SPECIAL: "not a regular file (a FIFO, socket or device), never opened"}


def kind_of(mode):
    """The :class:`Kind` of an ``lstat`` mode."""
    if stat.S_ISLNK(mode):
        return Kind.LINK
    if stat.S_ISDIR(mode):
        return Kind.FOLDER
    return Kind.FILE if stat.S_ISREG(mode) else Kind.SPECIAL


def read_regular(name, fd, cap):
    """``(bytes, None)`` of the regular file ``name`` in the open folder ``fd``, else
    ``(None, problem)``: not a regular file, a hard link, or more than ``cap`` bytes.

    The file is opened without following a link and without blocking, checked with
    ``fstat`` and read from that descriptor, at most ``cap + 1`` bytes.
    """
    try:
        handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                         | os.O_CLOEXEC, dir_fd=fd)
    except OSError as error:
        return None, (NOT_A_FILE[Kind.LINK] if error.errno == errno.ELOOP
                      else "a file the grader cannot open")
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            return None, NOT_A_FILE[kind_of(info.st_mode)]
        if info.st_nlink > 1:
            return None, (f"a hard link (one file with {info.st_nlink} names, maybe outside the "
                          "folder), which the grader does not read; hand in a copy")
        if info.st_size > cap:
            return None, too_large(cap)
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(handle, min(1 << 20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return (None, too_large(cap)) if size > cap else (b"".join(chunks), None)
    except OSError:
        return None, "a file the grader cannot read"
    finally:
        os.close(handle)


def too_large(cap):
    """The problem of a file over ``cap`` bytes."""
    return f"larger than the {cap // 2**20 or cap} {'MiB' if cap >= 2**20 else 'bytes'} the grader reads"


def handed_in_names(submission):
    """Sorted names of what the student put in the folder (folders end in ``/``)."""
    return [entry.name + ("/" if entry.kind == Kind.FOLDER else "")
            for entry in submission.entries if entry.name not in NOT_HANDED_IN]


def is_candidate(name):
    """Whether an entry called ``name`` may be a notebook to consider: a visible ``*.ipynb``."""
    return name.lower().endswith(".ipynb") and not name.startswith(".")


def submission_digest(folder):
    """SHA-256 of what a student handed in to ``submitted/<student>/<assignment>`` (``folder``).

    Read as grading reads it (:func:`read_submission`: no link followed, neither the
    student's nor the assignment's folder may be a link).
    """
    folder = Path(folder)
    return digest_of(read_submission(folder, within=folder.parent.parent))


def digest_of(submission):
    """SHA-256 of a :class:`SubmissionFolder`: every entry's name and
    kind, and the bytes of its notebooks and collection files (or why they were not read)."""
    digest = hashlib.sha256((submission.problem or "").encode())
    for entry in submission.entries:
        content = entry.data if entry.data is not None else (entry.problem or "").encode()
        digest.update(os.fsencode(entry.name) + b"\0" + entry.kind.encode() + b"\0"
                      + content + b"\0")
    return digest.hexdigest()
