"""The sandbox a kernel gets, read from the launcher's command line (no kernel is started).

:func:`autograder.sandbox.launcher.bwrap_argv` is the whole sandbox: these tests parse the
``bwrap`` command it builds for given limits and check it against what the threat model
promises, written out here independently: every namespace but the user's is new (the
user's too when not root), no network, an empty environment plus a fixed list, every
mount read-only except the private scratch ``tmpfs`` (its size the disk cap) and the
kernel's socket folder, nothing of the course root mounted, and as root the drop to
``nobody`` through ``setpriv`` with no capabilities and ``no_new_privs``.
"""

import os
import resource
import subprocess
import sys

import pytest

from autograder.sandbox import launcher
from autograder.sandbox.limits import SandboxLimits

LIMITS = SandboxLimits(memory_mb=1024, max_tasks=64, disk_mb=48, cpu_seconds=90)
SOCKETS = "/tmp/autograder-sockets-x/kernel-y"
KERNEL = ["/opt/py/bin/python", "-c", "kernel", "-f", f"{SOCKETS}/connection.json"]
MOUNTS = {"--ro-bind": 2, "--bind": 2, "--dev-bind": 2, "--bind-try": 2, "--ro-bind-try": 2,
          "--dev-bind-try": 2, "--symlink": 2, "--tmpfs": 1, "--dir": 1, "--proc": 1,
          "--dev": 1, "--mqueue": 1, "--remount-ro": 1}
WITH_VALUE = {"--setenv": 2, "--hostname": 1, "--perms": 1, "--size": 1, "--chdir": 1,
              "--cap-add": 1, "--cap-drop": 1, "--uid": 1, "--gid": 1}


def parse(argv):
    """``(flags, options, mounts, command)`` of a bwrap command line: flags without a value,
    ``[(option, values)]`` in order, mounts among them, and what follows the last ``--``."""
    flags, options, i = [], [], 1
    while argv[i] != "--":
        arity = MOUNTS.get(argv[i], WITH_VALUE.get(argv[i], 0))
        (options if arity else flags).append((argv[i], tuple(argv[i + 1:i + 1 + arity])))
        i += 1 + arity
    mounts = [(name, values) for name, values in options if name in MOUNTS]
    return [f for f, _ in flags], options, mounts, argv[i + 1:]


@pytest.fixture(params=[True, False], ids=["root", "user"])
def as_root(request):
    return request.param


def test_every_namespace_is_new_and_nothing_outlives_the_launcher(as_root):
    flags, *_ = parse(launcher.bwrap_argv(KERNEL, SOCKETS, LIMITS, as_root=as_root))
    expected = {"--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv"}
    if not as_root:  # without root, a user namespace under the grader's own uid
        expected.add("--unshare-user")
    assert set(flags) == expected  # and nothing else: no --share-net, no --unshare-all tricks


def test_the_environment_is_a_fixed_list_and_nothing_of_the_graders(monkeypatch, as_root):
    monkeypatch.setenv("GRADER_SECRET", "s3cret")
    argv = launcher.bwrap_argv(KERNEL, SOCKETS, LIMITS, as_root=as_root)
    env = dict(v for name, v in parse(argv)[1] if name == "--setenv")
    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp",
        "LANG": "C.UTF-8", "IPYTHONDIR": "/tmp/.ipython", "MPLCONFIGDIR": "/tmp/.matplotlib",
        "JUPYTER_PLATFORM_DIRS": "1", "MPLBACKEND": "Agg", "PYTHONWARNINGS": "ignore",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}
    assert not any("s3cret" in a for a in argv)


def test_only_scratch_is_writable_and_the_socket_folder_is_read_only(as_root):
    _, options, mounts, _ = parse(launcher.bwrap_argv(KERNEL, SOCKETS, LIMITS, as_root=as_root))
    writable = [(name, values) for name, values in mounts
                if name in ("--bind", "--bind-try", "--dev-bind", "--dev-bind-try", "--tmpfs")]
    assert writable == [("--tmpfs", ("/tmp",))]
    assert ("--ro-bind", (SOCKETS, SOCKETS)) in mounts
    # the scratch tmpfs is sticky, world-writable and exactly the disk cap
    at = options.index(("--tmpfs", ("/tmp",)))
    assert options[at - 2:at] == [("--perms", ("1777",)), ("--size", (str(48 * 2**20),))]
    # a fresh /proc of the new PID namespace and a minimal /dev, not the host's
    assert ("--proc", ("/proc",)) in mounts and ("--dev", ("/dev",)) in mounts
    assert ("--chdir", ("/tmp",)) in options


def test_every_bind_is_read_only_at_its_own_path_and_none_is_the_course(as_root):
    _, _, mounts, _ = parse(launcher.bwrap_argv(KERNEL, SOCKETS, LIMITS, as_root=as_root))
    course = os.path.dirname(os.path.dirname(os.path.abspath(launcher.__file__)))
    course = os.path.dirname(course)  # the repository root: autograder/, lib/, solutions/
    allowed = ("/usr", "/etc/", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
               SOCKETS, *launcher.python_roots())
    for name, (source, target) in ((n, v) for n, v in mounts if n == "--ro-bind"):
        assert source == target
        assert source.startswith(allowed), source
        assert source not in ("/", course) and not course.startswith(source.rstrip("/") + "/")
        for hidden in ("autograder", "lib", "solutions", "submitted", "gradebook.db"):
            assert not source.startswith(os.path.join(course, hidden)), source
    assert ("--ro-bind", ("/usr", "/usr")) in mounts
    # the folders above the course are made empty (--dir), never bound
    assert all(name in ("--dir", "--ro-bind", "--symlink", "--bind", "--tmpfs", "--proc", "--dev")
               for name, _ in mounts)


def test_as_root_the_kernel_becomes_nobody_without_capabilities():
    _, options, _, command = parse(launcher.bwrap_argv(KERNEL, SOCKETS, LIMITS, as_root=True))
    # bwrap keeps only what setpriv needs to change user; setpriv drops them with the uid
    assert [v for n, v in options if n.startswith("--cap")] == [("CAP_SETUID",), ("CAP_SETGID",)]
    assert os.path.basename(command[0]) == "setpriv"
    assert command[1:6] == ["--reuid=65534", "--regid=65534", "--clear-groups",
                            "--no-new-privs", "--"]
    assert command[6:] == KERNEL


def test_as_another_user_no_capability_is_added_and_the_kernel_runs_directly():
    _, options, _, command = parse(launcher.bwrap_argv(KERNEL, SOCKETS, LIMITS, as_root=False))
    assert not [n for n, _ in options if n.startswith("--cap")]
    assert command == KERNEL


def test_the_disk_cap_follows_the_limits():
    small = SandboxLimits(memory_mb=0, max_tasks=0, disk_mb=1, cpu_seconds=0)
    _, options, _, _ = parse(launcher.bwrap_argv(KERNEL, SOCKETS, small, as_root=True))
    assert ("--size", (str(2**20),)) in options


def test_rlimits_are_the_caps_and_zero_means_none():
    assert launcher.rlimits(LIMITS) == [
        (resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, 48 * 1024 * 1024),
        (resource.RLIMIT_DATA, resource.RLIM_INFINITY),
        (resource.RLIMIT_AS, 1024 * 1024 * 1024), (resource.RLIMIT_CPU, 90)]
    none = SandboxLimits(memory_mb=0, max_tasks=0, disk_mb=2, cpu_seconds=0)
    assert launcher.rlimits(none) == [(resource.RLIMIT_CORE, 0),
                                      (resource.RLIMIT_FSIZE, 2 * 1024 * 1024),
                                      (resource.RLIMIT_DATA, resource.RLIM_INFINITY),
                                      (resource.RLIMIT_AS, resource.RLIM_INFINITY)]


@pytest.mark.parametrize("value, message", [
    (None, "no limits in the environment"),
    ("{not json", "AUTOGRADER_LIMITS is not JSON"),
    ('{"memory_mb": 1}', "AUTOGRADER_LIMITS must hold exactly"),
])
def test_the_launcher_refuses_missing_or_bad_limits_in_one_line(value, message):
    env = {k: v for k, v in os.environ.items() if k != "AUTOGRADER_LIMITS"}
    if value is not None:
        env["AUTOGRADER_LIMITS"] = value
    done = subprocess.run([sys.executable, "-I", "-c", launcher.BOOT, "-f", "/nonexistent/c.json"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_passed_sockets_reach_the_kernel_and_the_boot_code_reads_that_name(as_root):
    """The worker's listening descriptors are named to the kernel in one variable, whose name
    the boot code (standard library only, run as ``-c`` source) keeps equal."""
    from autograder.kernel import boot

    assert boot.SOCKETS_ENV == launcher.SOCKETS_ENV
    passed = '{"/tmp/x/k-1": 5}'
    env = dict(v for name, v in parse(launcher.bwrap_argv(KERNEL, SOCKETS, LIMITS, as_root=as_root,
                                                          sockets=passed))[1] if name == "--setenv")
    assert env[launcher.SOCKETS_ENV] == passed
    plain = dict(v for name, v in parse(launcher.bwrap_argv(KERNEL, SOCKETS, LIMITS,
                                                            as_root=as_root))[1] if name == "--setenv")
    assert launcher.SOCKETS_ENV not in plain


def test_a_launcher_whose_worker_has_ended_starts_nothing_and_makes_no_cgroup():
    """A worker killed while its kernel's launcher starts up (a run stopped mid-class) must not
    leave a kernel or a cgroup behind: the launcher checks that the process that launched it
    is still its parent, after asking to die with it, and before it makes anything."""
    from autograder.sandbox.cgroups import RUN_ENV, kernel_cgroups

    ended = subprocess.Popen(["true"])  # the worker that launched it, ended since
    ended.wait()
    run = f"launchertest{os.getpid()}"
    env = {**os.environ, **LIMITS.environment(), RUN_ENV: run, launcher.PARENT_ENV: str(ended.pid)}
    done = subprocess.run([sys.executable, "-I", "-c", launcher.BOOT, "-f", "/nonexistent/c.json"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "the process that launched this kernel has ended" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not [name for name in kernel_cgroups() if name.startswith(f"k{run}-")]
