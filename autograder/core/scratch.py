"""Scratch folders of grading runs: each held by the process that made it, swept once it died.

A run's scratch (the student version, the template gradebook, the workers' copies of
submissions, the kernels' socket folders) lives in temporary folders named ``autograder-*``
(:func:`autograder.core.grading_run.make_socket_root` says how they are named). The process
that makes one removes it when the run ends, however the run ends, as long as that process
gets to run its ``finally``. A process killed outright (``SIGKILL``, the kernel's OOM killer,
a Dask worker its nanny restarts) cannot: its folders would stay, copies of students' work
among them, until the machine restarts.

So each folder holds a lock file, :data:`OWNER`, which the process that made it holds locked
(``flock``) for as long as it lives; processes forked from it hold it with it (a local worker),
and a program it runs does not (the descriptor is close-on-exec). The kernel drops a lock when
the last process holding it is gone, however it went, so a folder whose lock anyone can take
belongs to no live process: :func:`sweep_scratch`, called as a run starts, removes those. The
lock is what proves a folder dead; a name or an age never does. The name and the age only
narrow what is looked at: a folder without the lock file (not made here) is never touched, nor
one of another user, nor a link, nor one changed in the last minute (made a moment ago, it may
not hold its lock yet).
"""

import fcntl
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

OWNER = ".owner.lock"   # the lock file in each scratch folder
PREFIX = "autograder-"  # every scratch folder's name starts with it
_HELD = {}              # folder -> descriptor of its locked OWNER file, in the process that made it


def make_scratch(prefix=PREFIX, dir=None, mode=0o700):
    """A fresh folder ``<dir>/<prefix>*`` (``mkdtemp``: atomic, random name, this user's),
    with permissions ``mode``, held by this process until :func:`remove_scratch` or its end."""
    if not prefix.startswith(PREFIX):
        raise ValueError(f"a scratch folder's name starts with {PREFIX!r}, not {prefix!r}")
    path = tempfile.mkdtemp(prefix=prefix, dir=dir)
    os.chmod(path, mode)
    fd = os.open(os.path.join(path, OWNER), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _HELD[path] = fd
    return Path(path)


def remove_scratch(path):
    """Remove the scratch folder ``path`` and everything in it (nothing if it is gone)."""
    fd = _HELD.pop(str(path), None)
    if fd is not None:
        os.close(fd)
    shutil.rmtree(path, ignore_errors=True)


def sweep_scratch(bases, min_age=60.0):
    """Remove the scratch folders in the folders ``bases`` that no live process holds.

    Only this user's folders named ``autograder-*`` with an :data:`OWNER` file, and not
    changed in the last ``min_age`` seconds (a folder made a moment ago may not hold its lock
    yet). Returns the folders removed.
    """
    removed = []
    for base in dict.fromkeys(map(str, bases)):
        try:
            names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
        except OSError:
            continue
        for name in names:
            folder = os.path.join(base, name)
            if _unheld(folder, min_age):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(Path(folder))
    return removed


def _unheld(folder, min_age):
    """Whether ``folder`` is this user's scratch folder, old enough, whose lock is free."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or time.time() - info.st_mtime < min_age):
        return False
    try:
        fd = os.open(os.path.join(folder, OWNER), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # not made by make_scratch: never ours to remove
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # a live process holds it (this one included: flock is per open file)
    finally:
        os.close(fd)
    return True
