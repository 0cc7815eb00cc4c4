"""The service's web page and JSON API: uploads, isolation, CSRF, limits, the instructor's view.

The real tornado application of :mod:`autograder.service.web` on 127.0.0.1, with one thing
replaced, in this file only: who asks. In production JupyterHub's OAuth says it
(``HubOAuthenticated``; ``test_hub_e2e.py`` drives that through a real Hub); here
:class:`HeaderUser` reads the test's ``X-Test-User`` header. A real ``serve`` (no web page,
the same ``--state``) grades the uploads in the real sandbox.

The course's toy assignment is due in a week with ``before_due = "visible"``: a student sees
the score and the visible tests' verdicts, never the hidden ones', and no page before then.
"""

import asyncio
import re
import threading
from datetime import datetime, timedelta, timezone

import nbformat
import pytest
import requests

from autograder.sandbox.launcher import unavailable_reason
from autograder.service.web import BODY_BYTES, Course, make_app
from autograder.core.notebook_file import NOTEBOOK_BYTES
from tests.grader.service.serving import AID, make_course, serving, wait_for
from tests.grader.test_grading_e2e import Class
from tests.servers import free_port

PREFIX = "/services/grader/"
SANDBOX_MISSING = unavailable_reason()
pytestmark = pytest.mark.slow


class HeaderUser:
    """TEST ONLY: the user is the request's ``X-Test-User`` header (production: the Hub's OAuth)."""

    def get_current_user(self):
        name = self.request.headers.get("X-Test-User")
        return {"name": name, "admin": False} if name else None


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("web")
    due = (datetime.now(timezone.utc) + timedelta(days=7)).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    root, exchange = make_course(base, f'[service]\ninstructors = ["prof"]\nbefore_due = "visible"\n'
                                       f'[assignments.{AID}]\ndue = "{due}"\n')
    state, port, ready = base / "state", free_port(), threading.Event()
    loop = asyncio.new_event_loop()

    def run():
        from tornado.httpserver import HTTPServer

        asyncio.set_event_loop(loop)
        course = Course(root, state, PREFIX)  # its SQLite connection lives in this thread
        HTTPServer(make_app(course, HeaderUser), max_body_size=BODY_BYTES).listen(port, "127.0.0.1")
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(60)
    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    klass = Class(source, nbformat.read(root / "release" / AID / f"{AID}.ipynb", as_version=4))
    yield dict(base=base, root=root, exchange=exchange, state=state, klass=klass,
               url=f"http://127.0.0.1:{port}{PREFIX}")
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


class Student:
    """A browser-like client: the XSRF cookie from a page, then the token on each POST."""

    def __init__(self, site, name):
        self.site, self.name = site, name
        self.http = requests.Session()
        self.http.headers["X-Test-User"] = name
        self.get("")  # sets the _xsrf cookie
        self.xsrf = self.http.cookies.get("_xsrf")

    def get(self, path, **kw):
        return self.http.get(self.site["url"] + path, allow_redirects=False, timeout=30, **kw)

    def post(self, path, xsrf=True, **kw):
        headers = {"X-XSRFToken": self.xsrf} if xsrf else {}
        return self.http.post(self.site["url"] + path, headers=headers, allow_redirects=False,
                              timeout=60, **kw)

    def upload(self, notebook, assignment=AID):
        return self.post(f"api/attempts?assignment={assignment}", data=nbformat.writes(notebook).encode())


def test_pages_carry_a_csp_and_forms_their_xsrf_token(site):
    ann = Student(site, "ann")
    home = ann.get("")
    assert home.status_code == 200
    assert "default-src 'none'" in home.headers["Content-Security-Policy"]
    assert "form-action 'self'" in home.headers["Content-Security-Policy"]
    assert re.search(r'name="_xsrf" value="[^"]+"', home.text)
    assert "<script" not in home.text
    nobody = requests.get(site["url"] + "api/attempts", allow_redirects=False, timeout=30)
    assert nobody.status_code == 403 and "attempts" not in nobody.text  # no login: the API refuses


def test_a_form_upload_without_the_xsrf_token_is_refused(site):
    ann = Student(site, "ann-forms")
    data = nbformat.writes(site["klass"].notebook()).encode()
    files = {"notebook": ("x.ipynb", data)}
    assert ann.post("upload", xsrf=False, data={"assignment": AID}, files=files).status_code == 403
    assert ann.post("api/attempts?assignment=toy", xsrf=False, data=data).status_code == 403
    ok = ann.post("upload", data={"assignment": AID, "_xsrf": ann.xsrf}, files=files)
    assert ok.status_code == 303 and re.fullmatch(rf"{PREFIX}attempts/[\w-]+", ok.headers["Location"])


def test_uploads_are_bounded_in_size_and_rate(site):
    eve = Student(site, "eve-rate")
    too_big = eve.post(f"api/attempts?assignment={AID}", data=b" " * (NOTEBOOK_BYTES + 1))
    assert too_big.status_code == 413
    not_notebook = eve.post(f"api/attempts?assignment={AID}", data=b"<html>")
    assert not_notebook.status_code == 409 and "not JSON" in not_notebook.json()["error"]
    unknown = eve.upload(site["klass"].notebook(), assignment="../../etc")
    assert unknown.status_code == 409
    answers = [eve.upload(site["klass"].notebook()).status_code for _ in range(4)]
    assert answers[:3] == [201, 201, 201] and answers[3] == 429  # 6 requests a minute, all counted


def not_found_answers(student, token):
    return [student.get(f"attempts/{token}"), student.get(f"attempts/{token}/{AID}.html"),
            student.get(f"api/attempts/{token}")]


def test_a_student_sees_only_their_own_attempts(site):
    alice, bob = Student(site, "alice"), Student(site, "bob")
    created = alice.upload(site["klass"].notebook())
    assert created.status_code == 201
    token = created.json()["id"]
    assert alice.get(f"api/attempts/{token}").status_code == 200
    nothing = not_found_answers(bob, "A" * 22)
    for theirs, none in zip(not_found_answers(bob, token), nothing):
        assert theirs.status_code == none.status_code == 404
        assert theirs.content == none.content  # the same "not found", nothing about whose
    assert token not in bob.get("api/attempts").text and token not in bob.get("").text
    for path in (f"attempts/%2e%2e%2f{token}", f"attempts/{token}%2F{AID}.html",
                 f"attempts/{token}%2F..%2F..%2Fjournal.db", "instructor", "api/queue"):
        answer = bob.get(path)
        assert answer.status_code == 404 and token not in answer.text
    assert bob.post("instructor/pause", data={"paused": "yes", "_xsrf": bob.xsrf}).status_code == 404


@pytest.mark.skipif(SANDBOX_MISSING is not None, reason=str(SANDBOX_MISSING))
def test_an_upload_is_graded_and_before_the_due_date_shows_only_visible_tests(site):
    klass = site["klass"]
    carol = Student(site, "carol")
    token = carol.upload(klass.notebook()).json()["id"]
    log = site["base"] / "serve.log"
    with serving(site["root"], site["exchange"], site["state"], log, "--jobs", "1") as process:
        done = wait_for(lambda: (a := carol.get(f"api/attempts/{token}").json())["state"] == "done" and a,
                        "carol's attempt graded", process, log)
    assert done["status"] == "ok" and done["score"] == klass.total
    assert done["only_visible_tests"] and done["pages"] == []
    assert {t["cell"] for t in done["tests"]} == {"test_add_visible", "test_softmax_visible"}
    assert carol.get(f"attempts/{token}/{AID}.html").status_code == 404  # the page: after the due date
    page = carol.get(f"attempts/{token}")
    assert "test_add_visible" in page.text and "test_add_hidden" not in page.text
    assert f"Score: {klass.total:g} / {done['max_score']:g}" in page.text


def test_the_instructor_sees_the_queue_and_pauses_grading(site):
    prof = Student(site, "prof")
    Student(site, "dave").upload(site["klass"].notebook())
    view = prof.get("api/queue").json()
    assert any(q["student"] == "dave" for q in view["queue"])
    assert prof.post("instructor/pause", data={"paused": "yes", "_xsrf": prof.xsrf}).status_code == 303
    assert prof.get("api/queue").json()["paused"] is True
    assert "Resume intake" in prof.get("instructor").text
    prof.post("instructor/pause", data={"paused": "no", "_xsrf": prof.xsrf})
    assert prof.get("api/queue").json()["paused"] is False
