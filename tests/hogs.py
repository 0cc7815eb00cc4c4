"""CPU hogs for the loaded tests: processes that spin on a CPU, each weighing on the host's
scheduler as much as a grading kernel.

Not a test module. Linux shares a CPU fairly between *scheduling entities*, not processes: a
grading kernel's sandbox starts a session of its own (bubblewrap ``--new-session``), which with
``CONFIG_SCHED_AUTOGROUP`` is a group of its own, and on cgroup v2 every kernel is under the
``autograder`` cgroup. Hogs that were plain processes of the test's own session would be one
entity together, and a kernel would get a CPU's fair share against all of them at once (the
slow honest cell of ``test_load`` then ran at about half speed beside 6 hogs, not at 2/7).
So each hog is an entity of its own beside the kernels':

* cgroup v1 (``cpu`` controller): a cpu cgroup ``autograder-hog-<supervisor pid>-<i>`` inside
  the test process's own (the kernels' cpu cgroup, as they inherit it), default shares, and a
  session of its own;
* cgroup v2 with the ``cpu`` controller enabled at the root: a cgroup of that name at the
  root, a sibling of ``autograder`` (the kernels' entity there), default weight;
* elsewhere: a session of its own only (an autogroup where the root's tasks are grouped so).

With ``n`` hogs beside one kernel on ``c`` cores the kernel gets at most ``c / (n + 1)`` of a
core's worth of CPU (``n >= c``), so ``3 x cores`` hogs slow a computing cell at least 3.5-fold.

The hogs belong to a supervisor process (this file run as a script) that makes their
cgroups, starts them and, when the test's ``with`` ends, when the test process dies however
it dies (its stdin pipe closes; ``PR_SET_PDEATHSIG`` sends it SIGTERM), or on SIGTERM, kills
them and removes their cgroups; a hog dies with its supervisor (``PR_SET_PDEATHSIG``
SIGKILL). A supervisor killed with SIGKILL leaves empty cgroups, which the next supervisor
removes (their owner's pid is gone). Standard library only in the supervisor.
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

HOGS = 3 * (os.cpu_count() or 1)  # the loaded tests' hogs: a load of 3 x cores
CGROUP = "/sys/fs/cgroup"
PREFIX = "autograder-hog-"
PR_SET_PDEATHSIG = 1


class Hogs(list):
    """The hogs' pids; ``placement``: where each one runs, in words (see the module);
    ``supervisor``: the pid of the process that owns them; ``groups``: their cgroup folders."""

    placement, supervisor, groups = "", None, ()


@contextmanager
def cpu_hogs(count=HOGS, weighed=True):
    """``count`` processes that spin on a CPU for as long as the ``with`` lasts, each its own
    scheduling entity beside the grading kernels' (see the module); yields :class:`Hogs`.
    ``weighed=False``: plain processes of the caller's session instead (one entity together,
    with the caller: the load of a busy neighbour, which the scheduler shields a kernel from)."""
    supervisor = subprocess.Popen([sys.executable, __file__, str(count), str(int(weighed))],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  start_new_session=weighed,
                                  preexec_fn=lambda: _die_with_parent(signal.SIGTERM))
    try:
        line = supervisor.stdout.readline()
        if not line.startswith("{"):
            raise RuntimeError(f"the CPU hogs did not start (exit {supervisor.wait()})")
        ready = json.loads(line)
        hogs = Hogs(ready["pids"])
        hogs.placement, hogs.supervisor, hogs.groups = ready["placement"], supervisor.pid, ready["groups"]
        yield hogs
    finally:
        supervisor.stdin.close()  # the supervisor's cue to kill the hogs and remove their cgroups
        supervisor.wait()
        supervisor.stdout.close()


def plain_hogs(count=HOGS):
    """:func:`cpu_hogs` as plain processes of the caller's session."""
    return cpu_hogs(count, weighed=False)


def _die_with_parent(signum):
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signum)


def _own_cpu_cgroup_v1():
    """The cpu controller's mount point and this process's cgroup in it, or None."""
    mount = None
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 3 and fields[2] == "cgroup" and "cpu" in fields[3].split(","):
                mount = fields[1]
    if mount is None:
        return None
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "cpu" in controllers.split(","):
                return os.path.join(mount, path.lstrip("/"))
    return None


def hog_parent():
    """The folder under which each hog gets its cgroup, and the placement in words; the
    folder is None where no cpu cgroup can be made (then: a session of its own only)."""
    if os.geteuid() != 0:
        return None, "own sessions (not root: no cgroups)"
    if os.path.exists(os.path.join(CGROUP, "cgroup.controllers")):  # v2
        try:
            with open(os.path.join(CGROUP, "cgroup.subtree_control")) as f:
                enabled = "cpu" in f.read().split()
        except OSError:
            enabled = False
        if enabled:
            return CGROUP, "own cpu cgroups beside the kernels' (cgroup v2)"
        return None, "own sessions (cgroup v2 without the cpu controller at the root)"
    parent = _own_cpu_cgroup_v1()
    if parent and os.path.isdir(parent):
        return parent, "own cpu cgroups beside the kernels' (cgroup v1)"
    return None, "own sessions (no cpu cgroup controller)"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def sweep(parent):
    """Remove the empty hog cgroups under ``parent`` whose supervisor is gone."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        owner = name[len(PREFIX):].split("-")[0]
        if name.startswith(PREFIX) and owner.isdigit() and not _alive(int(owner)):
            try:
                os.rmdir(os.path.join(parent, name))
            except OSError:
                pass


def _spin(group):
    """A hog (a forked child): join cgroup folder ``group`` (if any), then spin for ever."""
    _die_with_parent(signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(0)
    if group:
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    while True:
        pass


def supervise(count, weighed=True):
    """Run ``count`` hogs (each its own entity if ``weighed``) until stdin closes or SIGTERM
    comes, then kill them and remove their cgroups."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the ``finally`` below cleans up
    if os.getppid() == 1:  # the test process died before PR_SET_PDEATHSIG was set
        return
    parent, placement = hog_parent() if weighed else (None, "the caller's session (plain)")
    groups, hogs = [], []
    try:
        if parent:
            sweep(parent)
            for i in range(count):
                groups.append(os.path.join(parent, f"{PREFIX}{os.getpid()}-{i}"))
                os.mkdir(groups[-1])
        for i in range(count):
            pid = os.fork()
            if pid == 0:
                try:
                    if weighed:
                        os.setsid()
                    _spin(groups[i] if groups else None)
                finally:
                    os._exit(1)
            hogs.append(pid)
        print(json.dumps({"pids": hogs, "placement": placement, "groups": groups}), flush=True)
        while sys.stdin.buffer.read(1):  # until EOF: the ``with`` ended or the test died
            pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # EOF and SIGTERM come together when the test dies
        for pid in hogs:
            os.kill(pid, signal.SIGKILL)
        for pid in hogs:
            os.waitpid(pid, 0)
        for group in groups:
            remove(group)


def remove(group, tries=100):
    """Remove the (emptied) cgroup folder ``group``; a reaped task may leave it a moment."""
    for _ in range(tries):
        try:
            os.rmdir(group)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


if __name__ == "__main__":
    supervise(int(sys.argv[1]), weighed=sys.argv[2:] != ["0"])
