"""Local servers for the cluster path: a PostgreSQL server and a Dask cluster, as real processes.

Used by the tests and ``benchmarks/start_cluster.py``; a department runs its own (see
``autograder/README.md``, *Grading on a cluster*). Everything binds to 127.0.0.1 on a free
port and stops by itself: every process is started with ``PR_SET_PDEATHSIG`` (it dies with
the process that started it) and in its own session, and the context managers kill the whole
process group on exit.

* :func:`postgres_server` runs Debian's PostgreSQL (``initdb`` + ``postgres``) in a temporary
  data directory as an unprivileged user (``postgres`` when this process is root), with
  ``trust`` authentication on loopback only; yields its ``postgresql://`` URL.
* :func:`dask_cluster` runs ``dask scheduler`` and ``dask worker --nworkers K --nthreads 1``
  (each worker under a nanny that restarts it if it dies); yields the scheduler address.
"""

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

POSTGRES_BINS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
POSTGRES_HINT = ("PostgreSQL not found: run `apt-get install postgresql` (as root) to run the "
                 "PostgreSQL gradebook tests")
DASK_HINT = "Dask not installed: run `make venv` (dask[distributed] is in requirements.lock)"


@contextmanager
def http_server(argv, *, cwd, env, log_path, ready_url, timeout=120):
    """A local HTTP server process (``argv``, its output in ``log_path``), for as long as the
    ``with`` lasts; yields the body of the first answer of ``ready_url`` (asked until it
    answers, at most ``timeout`` seconds), then terminates it (and kills it after 20 s)."""
    import urllib.request

    with open(log_path, "w") as log:
        server = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with urllib.request.urlopen(ready_url, timeout=10) as response:
                        body = response.read()
                    break
                except OSError:
                    assert server.poll() is None and time.monotonic() < deadline, \
                        Path(log_path).read_text()[-3000:]
                    time.sleep(0.5)
            yield body
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _start(argv, log, user=None, env=None):
    """Start ``argv`` in a new session that dies with us; output to the file ``log``."""
    def child():
        if user is not None:
            os.setgid(user.pw_gid)
            os.setgroups([])
            os.setuid(user.pw_uid)
        _die_with_parent()  # after setuid, which clears the parent-death signal
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                preexec_fn=child, start_new_session=True, env=env)


def _stop(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def postgres_bin():
    """Folder of Debian's PostgreSQL server programs, or None."""
    for folder in POSTGRES_BINS:
        if (folder / "postgres").is_file() and (folder / "initdb").is_file():
            return folder
    return None


def _wait_for(check, what, process, log, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited: {Path(log).read_text()[-2000:]}")
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not start within {timeout} s: {Path(log).read_text()[-2000:]}")


def _accepts(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@contextmanager
def postgres_server(database="gradebook"):
    """A throwaway PostgreSQL server on 127.0.0.1; yields ``postgresql://…/<database>``."""
    import pwd

    bin_dir = postgres_bin()
    if bin_dir is None:
        raise RuntimeError(POSTGRES_HINT)
    user = pwd.getpwnam("postgres") if os.getuid() == 0 else None
    name = user.pw_name if user else pwd.getpwuid(os.getuid()).pw_name
    tmp = Path(tempfile.mkdtemp(prefix="autograder-pg-"))
    data, log = tmp / "data", tmp / "log.txt"
    if user:
        os.chown(tmp, user.pw_uid, user.pw_gid)
    process = None
    try:
        init = _start([str(bin_dir / "initdb"), "-D", str(data), "-U", name, "-A", "trust",
                       "-E", "UTF8", "--no-sync"], log, user)
        if init.wait(timeout=120) != 0:
            raise RuntimeError(f"initdb failed: {log.read_text()[-2000:]}")
        port = free_port()
        process = _start([str(bin_dir / "postgres"), "-D", str(data), "-h", "127.0.0.1",
                          "-p", str(port), "-k", str(tmp), "-c", "fsync=off",
                          "-c", "max_connections=200"], log, user)
        _wait_for(lambda: _accepts(port), "postgres", process, log, 60)
        base = f"postgresql://{name}@127.0.0.1:{port}"
        import psycopg

        for _ in range(50):  # accepting connections a moment after the port opens
            try:
                with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{database}"')
                break
            except psycopg.OperationalError:
                time.sleep(0.1)
        yield f"{base}/{database}"
    finally:
        if process is not None:
            _stop(process)
        shutil.rmtree(tmp, ignore_errors=True)


def dask_command(*args):
    """``dask ARGS`` with this virtualenv's own ``dask`` program."""
    return [str(Path(sys.executable).with_name("dask")), *args]


@contextmanager
def dask_cluster(workers=2, memory_limit="4GiB", log_dir=None):
    """A Dask scheduler and ``workers`` single-threaded workers on 127.0.0.1.

    Yields ``(address, [worker processes])``: the scheduler's ``tcp://`` address and the
    ``dask worker`` (nanny) processes, one per worker.
    """
    import distributed  # noqa: F401  (a clear ImportError when Dask is missing)

    tmp = Path(log_dir or tempfile.mkdtemp(prefix="autograder-dask-"))
    tmp.mkdir(parents=True, exist_ok=True)
    port, processes = free_port(), []
    address = f"tcp://127.0.0.1:{port}"
    course = str(Path(__file__).resolve().parent.parent)  # workers import this checkout's grader
    env = {**os.environ, **grading_cluster_env(),
           "PYTHONPATH": os.pathsep.join(filter(None, [course, os.environ.get("PYTHONPATH")]))}
    try:
        scheduler = _start(dask_command("scheduler", "--host", "127.0.0.1", "--port", str(port),
                                        "--no-dashboard", "--no-show"), tmp / "scheduler.log",
                           env=env)
        processes.append(scheduler)
        _wait_for(lambda: _accepts(port), "dask scheduler", scheduler, tmp / "scheduler.log", 60)
        nannies = []
        for i in range(workers):
            nanny = _start(dask_command("worker", address, "--nworkers", "1", "--nthreads", "1",
                                        "--host", "127.0.0.1", "--no-dashboard",
                                        "--memory-limit", memory_limit, "--death-timeout", "60",
                                        "--name", f"grader-{i}"), tmp / f"worker-{i}.log", env=env)
            processes.append(nanny)
            nannies.append(nanny)
        from distributed import Client

        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
        yield address, nannies
    finally:
        for process in reversed(processes):
            _stop(process)
        if log_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)


def grading_cluster_env():
    """Dask settings a grading cluster runs with (``DASK_*`` environment variables).

    * ``allowed-failures 1``: a submission whose grading kills two workers is failed
      (``KilledWorker``) and recorded as an error, instead of being retried on a third;
    * ``worker-saturation 1.0``: a worker holds only the task it runs (the scheduler queues
      the rest: the grader marks its tasks for that queue, ``cluster.grading_task``), so a
      worker that dies is blamed for one submission, not for a queued one;
    * memory management off: a worker's memory is the grader's, whose kernels are capped
      by their own cgroups, so Dask must not pause or restart a worker for it;
    * the workers' statistical profiler off: it samples every thread's stack every 10 ms,
      which made each submission's grading 7 % slower than in a local worker
      (``benchmarks/bench_grading.py``).
    """
    return {
        "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1",
        "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0",
        "DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False",
        "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False",
        "DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "False",
        "DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE": "False",
        "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    }
