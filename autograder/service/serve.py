"""``python -m autograder serve`` itself: the grading loop in this process, the web page in a
child process that dies with it (:func:`serve`); the two share only the journal.

The web page authenticates with JupyterHub's OAuth, so it runs only under JupyterHub
(:func:`web_address`).
"""


import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

HUB_URL = "JUPYTERHUB_SERVICE_URL"
HUB_PREFIX = "JUPYTERHUB_SERVICE_PREFIX"


def die_with_parent():
    """The web process ends with ``serve`` however ``serve`` ends (``PR_SET_PDEATHSIG``)."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def web_address(ip, port, environ=os.environ):
    """``(ip, port, prefix)`` of the web page, or None when there is none to serve.

    Under JupyterHub, where :data:`HUB_URL` says (``--ip``/``--port`` override it) and under
    :data:`HUB_PREFIX`; without the Hub, a web page cannot know who asks: ``--port`` alone is
    refused with one line."""
    if HUB_URL not in environ:
        if port is not None:
            raise SystemExit("serve --port: the web page authenticates with JupyterHub's OAuth; "
                             "run serve as a JupyterHub service (see autograder/README.md)")
        return None
    url = urlparse(environ[HUB_URL])
    return (ip or url.hostname or "127.0.0.1", port or url.port or 80,
            environ.get(HUB_PREFIX, "/"))


def start_web(root, state, address):
    ip, port, prefix = address
    argv = [sys.executable, "-m", "autograder.service.web", "--root", str(root), "--state",
            str(state), "--ip", ip, "--port", str(port), "--prefix", prefix]
    return subprocess.Popen(argv, preexec_fn=die_with_parent)


def serve(root, db_url, state, jobs=None, scheduler=None, exchange=None, course_id=None,
          ip=None, port=None, limits=None, sandboxed=True):
    """Run the service until SIGINT, SIGTERM or SIGHUP (see the package)."""
    from ..core.gradebook import check_url, fault_line, gradebook_faults, GradebookError
    from ..core.policy import load_service_rules
    from ..host.driver import connect_cluster
    from ..core.limits import Retries
    from .engine import Service
    from .exchange import Exchange

    root = Path(root).resolve()
    state = Path(state).resolve() if state else root / "service-state"
    if (exchange is None) != (course_id is None):
        raise SystemExit("serve: give --exchange and --course-id together (nbgrader's "
                         "c.Exchange.root and c.CourseDirectory.course_id)")
    try:
        check_url(db_url)
        load_service_rules(root)
        Retries.from_environment()  # a malformed AUTOGRADER_RETRIES is one line, as for grade
    except (GradebookError, ValueError) as error:
        raise SystemExit(str(error)) from None
    address = web_address(ip, port)
    client = connect_cluster(scheduler, sandboxed) if scheduler else None
    ex = Exchange(exchange, course_id) if exchange else None
    web = None
    try:
        service = Service(root, db_url, state, jobs, client, ex, limits, sandboxed)
        if address:
            web = start_web(root, state, address)
        print(f"serve: grading {root} ({service.jobs} slot(s)); state in {state}"
              + (f"; exchange {ex.course}" if ex else "")
              + (f"; web on http://{address[0]}:{address[1]}{address[2]}" if address else ""),
              file=sys.stderr, flush=True)
        service.run()
    except gradebook_faults() as error:
        raise SystemExit(f"serve stopped: {fault_line(error)}") from None
    finally:
        if web is not None:
            web.terminate()
            try:
                web.wait(timeout=10)
            except subprocess.TimeoutExpired:
                web.kill()
        if client is not None:
            client.close()
