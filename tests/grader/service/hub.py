"""A real JupyterHub on 127.0.0.1 for the graded-on-submission tests: a course's whole web path.

:func:`course_hub` starts, for as long as its ``with`` lasts,

* JupyterHub (``requirements.lock``) with its own temporary folder, SQLite database and cookie
  secret, bound to free loopback ports; its proxy is ``configurable-http-proxy`` from
  ``node_modules`` (``package-lock.json``, installed by ``make test``'s ``npm ci``);
* the Hub's ``shared-password`` authenticator: the students (``allowed_users``) log in with
  :data:`STUDENT_PASSWORD`, the instructor (an ``admin_users`` member) with
  :data:`INSTRUCTOR_PASSWORD`. A wrong password is refused, so a test's login is the Hub's;
* ``SimpleLocalProcessSpawner``: each user's single-user server is JupyterLab (with nbgrader's
  Assignments tab, its lab extension and server extensions from this virtualenv) in its own
  home folder under the Hub's folder, holding an ``nbgrader_config.py`` that names the course's
  filesystem exchange;
* optionally the grading service as a Hub-managed service (``services``): the Hub starts its
  command with the Hub's service variables (``JUPYTERHUB_SERVICE_URL``, ``…_PREFIX``, ``…_API_TOKEN``,
  OAuth client) and proxies ``/services/<name>/`` to it; the ``user`` role gets
  ``access:services!service=<name>``, so a student's browser is let through the Hub's OAuth (whose
  identity answer, ``read:users:name``, includes whether the user is a Hub admin).

Every process the Hub starts (proxy, single-user servers, service) runs under
:data:`DIE_WITH_PARENT`: it gets ``SIGKILL`` when the Hub's process dies, and the Hub gets it
when this process dies (``tests.servers``), so nothing outlives a test run even on ``kill -9``.
At the end the Hub is asked to stop (``SIGTERM``: it stops the servers and the service), then its
process group is killed, and every process it had started must be gone within 30 s (else they
are killed and the fixture fails: a leak is a failure, not a silent leftover).

**The OS user.** A Hub's single-user servers normally run each as its own OS user, or, as in
Zero to JupyterHub, every server in its own container as the OS user ``jovyan``, and then
nbgrader takes the student's name from ``JUPYTERHUB_USER`` (``nbgrader.utils.get_username``).
Here every server is a process of this (root) user, so the server starts with nbgrader's
OS-user lookup answering ``jovyan`` (:data:`AS_HUB_USER_SERVER`), as in a container, and (as
root) with ``--allow-root``; the name nbgrader writes into the exchange is then the Hub's user name, as in
production. The exchange is a folder of this machine, written by every server, as a shared
volume is on a Hub.
"""

import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers import _accepts, _start, _wait_for, free_port

REPO = Path(__file__).resolve().parents[3]
PROXY = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
NODE = shutil.which("node")
HUB_HINT = ("JupyterHub's proxy not found: run `make test` (npm ci installs configurable-http-proxy "
            "from package-lock.json; apt-get install nodejs npm)")
STUDENT_PASSWORD = "student-password-for-tests"
INSTRUCTOR_PASSWORD = "instructor-password-for-the-hub-tests-only"  # >= 32 characters: the Hub's rule
INSTRUCTOR = "instructor"

# argv prefix: the program after it gets SIGKILL when its parent dies (PR_SET_PDEATHSIG
# survives execve), then becomes that program
DIE_WITH_PARENT = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
                   "os.execv(sys.argv[1], sys.argv[1:])")
# the single-user server as a Hub runs it in a container (OS user jovyan, the student's name
# from JUPYTERHUB_USER), and dying with the Hub
AS_HUB_USER_SERVER = ("import ctypes, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
                      "import nbgrader.utils as u; u.get_osusername = lambda: 'jovyan'; "
                      "from jupyterhub.singleuser import main; sys.argv[0] = 'jupyterhub-singleuser'; "
                      "sys.exit(main())")


def unavailable_reason():
    """Why a Hub cannot start here (one line with the install hint), or None."""
    if NODE is None or not PROXY.is_file():
        return HUB_HINT
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        return "JupyterHub not installed: run `make venv` (jupyterhub is in requirements.lock)"
    return None


def die_with_parent(argv):
    return [sys.executable, "-c", DIE_WITH_PARENT, *map(str, argv)]


def exchange_config(exchange, course_id):
    """The nbgrader settings that put a course on the filesystem exchange ``exchange``."""
    return f"c.Exchange.root = {str(exchange)!r}\nc.CourseDirectory.course_id = {course_id!r}\n"


@dataclass
class Service:
    """A Hub-managed service: ``command`` runs under the Hub, reached at ``/services/<name>/``."""
    name: str
    command: list
    cwd: Path
    environment: dict = field(default_factory=dict)
    port: int = field(default_factory=free_port)


@dataclass
class Hub:
    url: str                 # the proxy's public address: http://127.0.0.1:PORT
    folder: Path             # the Hub's own files: config, database, log, homes
    exchange: Path
    course_id: str
    students: tuple
    services: tuple

    def home(self, user):
        """The user's home folder (their single-user server's root)."""
        return self.folder / "home" / user

    def log(self):
        return (self.folder / "hub.log").read_text(errors="replace")

    def service_url(self, name):
        return f"{self.url}/services/{name}/"


def _config(folder, *, ports, exchange, course_id, students, services):
    """The Hub's ``jupyterhub_config.py``: every setting in one place, values as Python literals."""
    singleuser = [sys.executable, "-c", AS_HUB_USER_SERVER]
    # a student's server sees the virtualenv, never the course checkout (it holds the answers)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    service_specs = [dict(name=s.name, url=f"http://127.0.0.1:{s.port}", command=die_with_parent(s.command),
                          cwd=str(s.cwd), oauth_no_confirm=True,
                          environment={**env, "PYTHONPATH": str(REPO), **s.environment})
                     for s in services]
    user_scopes = ["self", *(f"access:services!service={s.name}" for s in services)]
    roles = [{"name": "user", "scopes": user_scopes}]  # the services get no scope of their own
    settings = {
        "JupyterHub.bind_url": f"http://127.0.0.1:{ports['public']}",
        "JupyterHub.hub_bind_url": f"http://127.0.0.1:{ports['hub']}",
        "JupyterHub.db_url": f"sqlite:///{folder / 'jupyterhub.sqlite'}",
        "JupyterHub.cookie_secret_file": str(folder / "cookie_secret"),
        "JupyterHub.pid_file": str(folder / "jupyterhub.pid"),
        "JupyterHub.authenticator_class": "shared-password",
        "JupyterHub.spawner_class": "simple",
        "JupyterHub.services": service_specs,
        "JupyterHub.load_roles": roles,
        "JupyterHub.cleanup_servers": True,
        "JupyterHub.check_running_servers": False,
        "SharedPasswordAuthenticator.user_password": STUDENT_PASSWORD,
        "SharedPasswordAuthenticator.admin_password": INSTRUCTOR_PASSWORD,
        "Authenticator.allowed_users": sorted(students),
        "Authenticator.admin_users": [INSTRUCTOR],
        "ConfigurableHTTPProxy.command": die_with_parent([NODE, PROXY]),
        "ConfigurableHTTPProxy.api_url": f"http://127.0.0.1:{ports['proxy_api']}",
        "ConfigurableHTTPProxy.pid_file": str(folder / "proxy.pid"),
        "SimpleLocalProcessSpawner.home_dir_template": str(folder / "home" / "{username}"),
        "Spawner.cmd": singleuser,
        "Spawner.args": [*(["--allow-root"] if os.geteuid() == 0 else []), "--ServerApp.ip=127.0.0.1",
                         "--LabApp.news_url=None",
                         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        "Spawner.default_url": "/lab",
        "Spawner.environment": env,
        "Spawner.start_timeout": 180,
        "Spawner.http_timeout": 180,
    }
    lines = ["c = get_config()  # noqa: F821"]
    for key, value in settings.items():
        lines.append(f"c.{key} = {value!r}")
    return "\n".join(lines) + "\n"


def _answers(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def course_hub(folder, *, exchange, course_id, students, services=(), timeout=180):
    """A running Hub for the course on ``exchange`` (see the module's docstring); yields a :class:`Hub`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for user in (*students, INSTRUCTOR):
        home = folder / "home" / user
        (home / ".jupyter").mkdir(parents=True, exist_ok=True)
        settings = "c = get_config()  # noqa: F821\n" + exchange_config(exchange, course_id)
        (home / ".jupyter" / "nbgrader_config.py").write_text(settings)
    ports = {name: free_port() for name in ("public", "hub", "proxy_api")}
    (folder / "jupyterhub_config.py").write_text(
        _config(folder, ports=ports, exchange=exchange, course_id=course_id, students=students,
                services=services))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "CONFIGPROXY"))}
    log = folder / "hub.log"
    argv = [sys.executable, "-m", "jupyterhub", "-f", str(folder / "jupyterhub_config.py")]
    hub = _start(argv, log, env={**env, "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}"})
    url = f"http://127.0.0.1:{ports['public']}"
    try:
        _wait_for(lambda: _answers(f"{url}/hub/health"), "jupyterhub", hub, log, timeout)
        for service in services:  # the Hub starts a service without waiting for it
            _wait_for(lambda: _accepts(service.port), f"service {service.name}", hub, log, timeout)
        yield Hub(url=url, folder=folder, exchange=Path(exchange), course_id=course_id,
                  students=tuple(students), services=tuple(services))
    finally:
        everything = _descendants(hub.pid)
        hub.send_signal(signal.SIGTERM)  # the Hub stops its servers, services and proxy
        try:
            hub.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(hub.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        hub.wait()
        _none_left(everything, log)


def _descendants(pid):
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _none_left(processes, log, timeout=30):
    """Every process the Hub started has ended once the Hub has: else kill them, and fail."""
    import psutil

    def running(p):  # a zombie has ended (it waits for whoever reaps it)
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    _, alive = psutil.wait_procs(processes, timeout=timeout)
    alive = [p for p in alive if running(p)]
    if alive:
        names = []
        for p in alive:
            try:
                names.append(" ".join(p.cmdline()[:4]))
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if names:
            raise AssertionError(f"outlived the Hub: {names}; {Path(log).read_text()[-2000:]}")
