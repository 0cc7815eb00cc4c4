"""Scratch folders: a process killed outright leaves its folders to the next run's sweep.

Each case makes its folders in real processes (killed with SIGKILL, so no ``finally`` runs)
under its own ``tmp_path``, and sweeps only there: nothing of the runs beside it is touched.
"""

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from autograder.core.scratch import OWNER, make_scratch, remove_scratch, sweep_scratch

REPO = Path(__file__).resolve().parents[3]

# Makes one scratch folder in argv[1], prints it and a pid, then sleeps. argv[2]: "fork" also
# forks a child that sleeps (a local grading worker), "exec" runs a program that inherits every
# descriptor it may (close_fds=False: what a careless launcher of a kernel would do).
HOLDER = """\
import os, subprocess, sys, time
from autograder.core.scratch import make_scratch
folder = make_scratch(dir=sys.argv[1])
other = 0
if sys.argv[2] == "fork":
    other = os.fork()
    if other == 0:
        time.sleep(600)
        os._exit(0)
elif sys.argv[2] == "exec":
    other = subprocess.Popen(["sleep", "600"], close_fds=False).pid
print(folder, other, flush=True)
time.sleep(600)
"""


@contextmanager
def holder(base, mode="alone"):
    """A process holding a scratch folder in ``base``: yields ``(process, folder, other pid)``;
    every process it made is killed when the block ends."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(base), mode], text=True,
                               stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    other = 0
    try:
        folder, other = process.stdout.readline().split()
        other = int(other)
        yield process, Path(folder), other
    finally:
        for pid in (process.pid, other):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        process.wait()


def kill(pid):
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and not zombie(pid):
        time.sleep(0.05)


def zombie(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_only_the_folder_of_a_process_killed_outright_is_swept(tmp_path):
    own = make_scratch(dir=tmp_path)
    try:
        with holder(tmp_path) as (dead, dead_folder, _), holder(tmp_path) as (_, live_folder, _):
            (dead_folder / "submitted").mkdir()  # what a worker copies there
            (dead_folder / "submitted" / "alice.ipynb").write_text("{}")
            kill(dead.pid)
            dead.wait()
            assert dead_folder.is_dir()  # no finally ran: the folder is left
            assert sweep_scratch([tmp_path], min_age=0) == [dead_folder]
            assert not dead_folder.exists() and live_folder.is_dir() and own.is_dir()
    finally:
        remove_scratch(own)
    assert not own.exists()


def test_a_forked_worker_keeps_the_folder_held_and_a_program_run_from_it_does_not(tmp_path):
    with holder(tmp_path, "fork") as (parent, folder, child):
        kill(parent.pid)
        assert sweep_scratch([tmp_path], min_age=0) == []  # the worker it forked still runs
        kill(child)
        assert sweep_scratch([tmp_path], min_age=0) == [folder]
    with holder(tmp_path, "exec") as (parent, folder, program):
        kill(parent.pid)
        assert Path(f"/proc/{program}").exists() and not zombie(program)
        assert sweep_scratch([tmp_path], min_age=0) == [folder]  # close-on-exec: never its lock


def test_the_sweep_leaves_what_is_not_a_dead_runs_scratch(tmp_path):
    def dead_folder(base):
        with holder(base) as (process, folder, _):
            kill(process.pid)
        return folder

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    kept = {
        "no lock file": tmp_path / "autograder-nolock",
        "a link to a dead run's folder": tmp_path / "autograder-link",
        "a file": tmp_path / "autograder-file",
        "not named autograder-*": tmp_path / "other-name",
    }
    kept["no lock file"].mkdir()
    target = dead_folder(elsewhere)
    kept["a link to a dead run's folder"].symlink_to(target)
    kept["a file"].write_text("")
    kept["not named autograder-*"].mkdir()
    (kept["not named autograder-*"] / OWNER).write_text("")
    young = dead_folder(tmp_path)
    kept["changed a moment ago"] = young
    if os.getuid() == 0:
        others = dead_folder(tmp_path)
        os.chown(others, 65534, 65534)
        kept["another user's"] = others
    assert sweep_scratch([tmp_path]) == []  # min_age: a minute
    old = time.time() - 120
    for path in kept.values():
        os.utime(path, (old, old), follow_symlinks=False)
    os.utime(young, (time.time(), time.time()))
    assert sweep_scratch([tmp_path]) == []
    assert all(path.exists() or path.is_symlink() for path in kept.values())
    assert target.is_dir() and (target / OWNER).is_file()
    os.utime(young, (old, old))
    assert sweep_scratch([tmp_path]) == [young]


def test_a_scratch_folder_is_private_and_named_for_the_sweep(tmp_path):
    folder = make_scratch("autograder-run1-", dir=tmp_path)
    assert folder.name.startswith("autograder-run1-") and folder.stat().st_mode & 0o777 == 0o700
    assert (folder / OWNER).stat().st_mode & 0o777 == 0o600
    remove_scratch(folder)
    remove_scratch(folder)  # gone already: nothing to do
    with pytest.raises(ValueError, match="starts with 'autograder-'"):
        make_scratch("tmp-", dir=tmp_path)
