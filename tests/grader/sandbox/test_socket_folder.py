"""The kernel's socket folder is the grader's, read-only to the kernel: no path race, no bytes.

Every byte a kernel writes is in its private scratch (a tmpfs of ``--disk-mb``, charged to
its memory cgroup): a kernel that writes everywhere it reaches, its socket folder first,
leaves the host's ``/tmp`` as it was and cannot stop a classmate's kernel from starting
(run in a private mount namespace whose ``/tmp`` is a 24 MiB tmpfs, so the host's own
``/tmp`` is never filled).

The worker binds, chmods and unlinks the judge's socket by path in the kernel's socket
folder, as root, once per judged cell. A folder the kernel could write would let it swap
``judge`` for a symbolic link (``renameat2`` with ``RENAME_EXCHANGE`` in a loop) between
the worker's ``bind`` and ``chmod``, and make root's ``chmod 0666`` land on any file of the
host. Here the folder belongs to the grader and is mounted read-only: the kernel can make
no link, swap no name and write no byte there.

* The *control* shows the racer is a real threat on this machine and measures its power:
  the same racer, as ``nobody`` outside any sandbox, against the worker's old sequence
  (unlink, bind, chmod 0666, one session every millisecond) in a folder ``nobody`` can
  write, until :data:`CONTROL_HITS` sessions chmodded a root-owned 0600 victim (or
  :data:`CONTROL_SECONDS` passed): ``p`` is the share of sessions hit. It must hit at
  least once. On the 2-core development machine, busy, ``p`` was about 0.005 (the window
  between ``bind`` and ``chmod`` is a few microseconds).
* The *attack* runs that racer beside a real sandboxed kernel (as the
  student's code would: a process it starts), for :data:`SESSIONS` judged sessions of the real
  :class:`~autograder.judge.transport.KernelTransport`, against every name in the folder.
  Two checks, either of which a folder the kernel could write fails:
  the racer's own counts (about a hundred thousand tries of which not one link was made
  and not one name swapped, every ``symlink`` refused with ``EROFS``): a writable folder
  fails this with certainty; and no victim changed mode: a writable folder with the old
  sequence would pass it with probability ``(1 - p) ** SESSIONS`` (0.005 and 1,000
  sessions: 0.7 %), printed by the test with the ``p`` it measured.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from jupyter_client.utils import run_sync

from autograder.judge.transport import SOCKET_NAME, KernelTransport
from autograder.kernel.probe import Op
from autograder.sandbox.launcher import NOBODY, unavailable_reason
from tests.sandboxed_kernel import sandboxed_kernel

pytestmark = pytest.mark.slow

SESSIONS = 1000       # judged sessions raced
CONTROL_HITS = 10     # the control stops after this many sessions hit ...
CONTROL_SECONDS = 20  # ... or after this long
VICTIMS = 4           # root-owned 0600 files the racer's links point to

# The racer: links to the victims, then renameat2(RENAME_EXCHANGE) of each name in the folder
# with a link, in a loop, until SIGTERM; its counts go to ``report`` (JSON).
RACER = r'''
import ctypes, json, os, signal, stat, sys
folder, report, victims = sys.argv[1], sys.argv[2], sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
counts = {"tries": 0, "exchanged": 0, "links": 0, "link_errors": []}
def stop(*_):
    with open(report, "w") as f:
        json.dump(counts, f)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
with open(os.path.join(os.path.dirname(report), "racer.ready"), "w"):
    pass
try:
    known = set(os.listdir(folder))
except OSError:  # 0711: the kernel cannot list its folder; it knows these names
    known = set()
names = [os.path.join(folder, n).encode() for n in sorted(known | {"judge", "connection.json"})]
link, i = os.path.join(folder, "swap").encode(), 0
while True:
    i += 1
    victim = victims[i % len(victims)].encode()
    if libc.symlink(victim, link) == 0:  # a fresh link each time the last one was used up
        counts["links"] += 1
    elif ctypes.get_errno() == 17:  # EEXIST: keep it if it is still a link
        try:
            if not stat.S_ISLNK(os.lstat(link).st_mode):
                os.unlink(link)
        except OSError:
            pass
    elif len(counts["link_errors"]) < 3:
        counts["link_errors"].append(os.strerror(ctypes.get_errno()))
    for name in names:
        counts["tries"] += 1
        if libc.renameat2(AT_FDCWD, name, AT_FDCWD, link, RENAME_EXCHANGE) == 0:
            counts["exchanged"] += 1
'''


def need_root_sandbox():
    if reason := unavailable_reason():
        pytest.skip(f"{reason}: the sandbox is needed")
    if os.geteuid() != 0:
        pytest.skip("the race is the root worker's: run as root")


@pytest.fixture
def victims(tmp_path):
    paths = []
    for i in range(VICTIMS):
        path = tmp_path / f"victim{i}"
        path.write_text("root's secret\n")
        os.chmod(path, 0o600)
        paths.append(path)
    return paths


def hit(victims):
    """How many victims became world-writable (each is reset to 0600)."""
    count = 0
    for path in victims:
        if os.stat(path).st_mode & 0o777 != 0o600:
            count += 1
            os.chmod(path, 0o600)
    return count


def as_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def control_hit_rate(victims):
    """The share of the worker's old sessions (unlink, bind, chmod 0666 by path, as root) in a
    folder ``nobody`` writes that the racer turns into a chmod of a victim."""
    base = Path(tempfile.mkdtemp(prefix="race-control-", dir="/tmp"))
    try:
        os.chmod(base, 0o711)
        folder = base / "sockets"
        folder.mkdir()
        os.chown(folder, NOBODY, NOBODY)
        scratch = base / "racer"
        scratch.mkdir()
        os.chown(scratch, NOBODY, NOBODY)
        racer = subprocess.Popen([shutil.which("python3", path="/usr/bin:/bin") or sys.executable, "-c", RACER, str(folder), str(scratch / "r.json"),
                                  *map(str, victims)], preexec_fn=as_nobody)
        try:
            wait_for(scratch / "racer.ready", racer)
            path, sessions, hits = str(folder / SOCKET_NAME), 0, 0
            end = time.monotonic() + CONTROL_SECONDS
            while hits < CONTROL_HITS and time.monotonic() < end:
                time.sleep(0.001)  # sessions are apart: the racer runs in between
                sessions += 1
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
                    try:
                        listener.bind(path)
                        os.chmod(path, 0o666)
                    except OSError:
                        pass  # the racer's link was in place at bind: a missed session
                hits += hit(victims) > 0
        finally:
            racer.terminate()
            racer.wait(30)
        return hits, sessions
    finally:
        shutil.rmtree(base, ignore_errors=True)


def wait_for(path, process, timeout=60):
    end = time.monotonic() + timeout
    while not Path(path).exists():
        assert process is None or process.poll() is None, "the racer did not start"
        assert time.monotonic() < end, "the racer did not start in time"
        time.sleep(0.01)


START_RACER = '''
import json, os, subprocess, sys, time
from ipykernel.connect import get_connection_file
_folder = os.path.dirname(get_connection_file())
_racer = subprocess.Popen([sys.executable, "-c", {racer!r}, _folder, "/tmp/race.json", *{victims!r}])
while not os.path.exists("/tmp/racer.ready"):
    assert _racer.poll() is None, "the racer stopped"
    time.sleep(0.01)
print(json.dumps({{"folder": _folder, "pid": _racer.pid}}))
'''
STOP_RACER = '''
_racer.terminate()
_racer.wait()
print(open("/tmp/race.json").read())
'''


def drain(kc):
    """Read every iopub message the kernel sent so far."""
    from queue import Empty

    while True:
        try:
            run_sync(kc.iopub_channel.get_msg)(timeout=0)
        except Empty:
            return


def printed(kc, code):
    """What ``code`` printed in the kernel (its last line), as JSON."""
    lines = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            lines.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            lines.append(json.dumps({"error": msg["content"]["evalue"]}))

    reply = run_sync(kc.execute_interactive)(code, timeout=120, output_hook=hook)
    assert reply["content"]["status"] == "ok", lines
    text = "".join(lines).strip()
    assert text, f"nothing printed by {code[:60]!r}"
    try:
        return json.loads(text.splitlines()[-1])
    except ValueError:
        raise AssertionError(text) from None


def test_a_racing_kernel_cannot_turn_the_workers_chmod_on_a_host_file(victims):
    need_root_sandbox()
    control_hits, control_sessions = control_hit_rate(victims)
    assert control_hits >= 1, f"the racer never won in {control_sessions} sessions of the control"
    p = control_hits / control_sessions
    with sandboxed_kernel() as (km, kc):
        started = printed(kc, START_RACER.format(victims=[str(v) for v in victims], racer=RACER))
        assert started["folder"] == os.path.dirname(km.connection_file)
        transport = KernelTransport(kc, km, 30)
        hits = 0
        for _ in range(SESSIONS):
            reply = transport.request({"op": Op.LOOKUP, "name": "started_by_racer"}, 30)
            assert reply == {"found": False, "callable": False}
            transport.end_session()
            drain(kc)  # each session's status messages: read, or the queues drop newer ones
            hits += hit(victims)
        counts = printed(kc, STOP_RACER)
    # the racer ran all along, and the folder refused every link and every swap
    assert counts["tries"] > 10 * SESSIONS, counts
    assert counts["links"] == 0 and counts["exchanged"] == 0, counts
    assert set(counts["link_errors"]) == {"Read-only file system"}, counts
    assert hits == 0
    assert transport.round_trips >= SESSIONS
    print(f"\ncontrol: {control_hits} of {control_sessions} sessions hit (p={p:.4f}); attack: "
          f"{SESSIONS} sessions, {counts['tries']} racer tries, 0 links, 0 swaps, 0 hits; "
          f"a writable folder would pass the chmod check with probability "
          f"{(1 - p) ** SESSIONS:.2g}")


def test_the_socket_folder_and_its_files_are_the_graders():
    """What the kernel sees of its folder: the grader's, read-only; the connection file is
    readable by the kernel's user and no one else; the sockets were bound by the worker."""
    need_root_sandbox()
    with sandboxed_kernel() as (km, kc):
        folder = Path(km.connection_file).parent
        info = os.lstat(folder)
        assert (info.st_uid, info.st_mode & 0o777) == (0, 0o711)
        cf = os.lstat(km.connection_file)
        assert (cf.st_uid, cf.st_mode & 0o777) == (NOBODY, 0o600)
        for entry in folder.iterdir():
            if entry.name != "connection.json":
                assert entry.is_socket() and entry.lstat().st_uid == 0, entry
        seen = printed(kc, '''
import os, json
from ipykernel.connect import get_connection_file
d = os.path.dirname(get_connection_file())
tries = {}
for name, act in (("create", lambda: open(d + "/x", "w")), ("mkdir", lambda: os.mkdir(d + "/y")),
                  ("rename", lambda: os.rename(d + "/connection.json", d + "/z")),
                  ("chmod", lambda: os.chmod(d + "/connection.json", 0o666))):
    try:
        act()
        tries[name] = "done"
    except OSError as e:
        tries[name] = e.strerror
print(json.dumps({"uid": os.getuid(), "tries": tries, "writable": os.access(d, os.W_OK)}))
''')
    assert seen["uid"] == NOBODY and not seen["writable"]
    assert set(seen["tries"].values()) == {"Read-only file system"}, seen
    assert not folder.exists()


# Run in a private mount namespace whose /tmp is a small tmpfs of its own (the host's /tmp is
# never filled): kernel A writes everywhere it can reach, as much as it can, its socket folder
# first; then the host's /tmp must have lost nothing to it, and kernel B must start and answer.
FILL_TMP = r'''
import json, os, sys
from jupyter_client.utils import run_sync
from autograder.core.limits import Limits
from tests.sandboxed_kernel import started, stop

os.environ.update(Limits(disk_mb=48).environment())

FILL = """
import os, json
from ipykernel.connect import get_connection_file
written = {}
for folder in (os.path.dirname(get_connection_file()), "/tmp", "/", "/dev"):
    total, i = 0, 0
    while True:
        try:
            with open(f"{folder}/fill{i}", "wb") as f:
                for _ in range(64):
                    f.write(b"x" * 2**20)
                    total += 2**20
        except OSError as error:
            written[folder] = [total, error.strerror]
            break
        i += 1
print(json.dumps(written))
"""

def run(kc, code):
    out = []
    reply = run_sync(kc.execute_interactive)(code, timeout=300, output_hook=lambda m: out.append(
        m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
    return reply["content"]["status"], "".join(out)

free = lambda: os.statvfs("/tmp").f_bavail * os.statvfs("/tmp").f_frsize
before = free()
a_km, a_kc = run_sync(started)()
status, written = run(a_kc, FILL)
during = free()
b_km, b_kc = run_sync(started)()
b_status, two = run(b_kc, "print(1 + 1)")
for km, kc in ((a_km, a_kc), (b_km, b_kc)):
    run_sync(stop)(km, kc)
print(json.dumps({"written": json.loads(written), "before": before, "during": during,
                  "b": [b_status, two.strip()]}))
'''


def test_a_kernel_that_fills_every_folder_it_reaches_cannot_stop_its_classmates():
    need_root_sandbox()
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is needed for a private mount namespace")
    # A course folder under /tmp (a clone in /tmp/x, say) is bound back from the shell's working
    # directory, which the new /tmp hides but does not take away: it is another file system, so
    # what it holds never counts against the 24 MiB.
    script = ("mount --make-rprivate / && mount -t tmpfs -o size=24m,mode=1777 tmpfs /tmp && "
              'case "$PWD" in /tmp/*) mkdir -p "$PWD" && '
              'mount --no-canonicalize --bind /proc/self/cwd "$PWD";; esac && '
              f"exec {sys.executable} -c \"$0\"")
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script, FILL_TMP],
                          capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    folder = [f for f in seen["written"] if f.startswith("/tmp/kernel-")][0]
    # nothing in the socket folder; the scratch took the disk cap (48 MiB) and no more
    assert seen["written"][folder] == [0, "Read-only file system"], seen
    assert 40 * 2**20 <= seen["written"]["/tmp"][0] <= 48 * 2**20, seen
    assert seen["written"]["/tmp"][1] == "No space left on device", seen
    assert seen["written"]["/"][0] == seen["written"]["/dev"][0] == 0, seen
    # the host's /tmp (24 MiB here) lost nothing but the sockets' inodes, and B started
    assert seen["before"] - seen["during"] < 2**20, seen
    assert seen["b"] == ["ok", "2"], seen
