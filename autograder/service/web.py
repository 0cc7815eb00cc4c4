"""``serve``'s web page and JSON API, run as a JupyterHub service (tornado).

Every route is under the service's prefix (``JUPYTERHUB_SERVICE_PREFIX``,
``/services/<name>/``); who asks is whoever the Hub's OAuth says
(:class:`jupyterhub.services.auth.HubOAuthenticated`), never anything the request carries.

Students (any Hub user the Hub lets reach the service):

* ``GET  /``                          the assignments, an upload form, their attempts
* ``POST /upload``                    form upload (``assignment``, ``notebook``; CSRF token)
* ``GET  /attempts/<token>``          one attempt: state, queue position, score, verdicts
* ``GET  /attempts/<token>/<nb>.html`` its feedback page (the course's page and CSP)
* ``GET  /api/attempts``              JSON: their attempts; ``POST`` (``?assignment=``, the
  notebook as the body) uploads one
* ``GET  /api/attempts/<token>``      JSON: one attempt

Instructors (Hub admins, and ``[service] instructors`` of ``course.toml``):

* ``GET  /instructor``, ``GET /api/queue``: the live queue, per-assignment throughput and
  time to feedback; ``POST /instructor/pause`` (``paused=yes|no``): the intake switch.

**A student sees only their own attempts**: every lookup is by (the Hub's user, token), and
any miss, another student's token included, answers the same 404 "not found", as does an
instructor route for a student. Uploads are bounded: one notebook of at most
:data:`autograder.core.notebook_file.NOTEBOOK_BYTES` (the request body is capped before it is
read), :data:`UPLOADS_PER_MINUTE` upload requests per student, then the course's attempt
rules. Forms carry tornado's XSRF token (the Hub's, under its OAuth); pages carry a CSP
(feedback pages the course's own, :data:`autograder.core.feedback_page.CONTENT_SECURITY_POLICY`).
Nothing a student sends names a file: the assignment must be one of the course's, the
token is looked up, not opened.
"""

import argparse
import html
import json
import os
import time
from collections import defaultdict, deque
from datetime import datetime, timezone
from pathlib import Path

from tornado import web

from ..core.course_files import FEEDBACK
from ..core.policy import load_service_rules, load_settings, refusal
from ..core.feedback_page import CONTENT_SECURITY_POLICY, MATHJAX_DIR
from ..core.notebook_file import NOTEBOOK_BYTES
from . import attempts as files
from .journal import DONE, QUEUED, Journal

UPLOADS_PER_MINUTE = 6
BODY_BYTES = NOTEBOOK_BYTES + 256 * 1024  # a form's fields and boundaries besides the notebook
PAGE_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
            "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
STYLE = ("body{font:16px/1.5 system-ui,sans-serif;max-width:60rem;margin:1rem auto;padding:0 1rem}"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .5rem;text-align:left}")


class Course:
    """What the web process reads: the course root, the journal, the rules."""

    def __init__(self, root, state, prefix="/"):
        from ..core.assignments import source_assignments

        self.root, self.state = Path(root).resolve(), Path(state)
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.assignments = source_assignments(self.root)
        self.course = load_settings(self.root)
        self.rules = load_service_rules(self.root)
        self.journal = Journal(self.state)
        self.uploads = defaultdict(deque)

    def rate_limited(self, student, now=None):
        """Whether ``student`` made :data:`UPLOADS_PER_MINUTE` upload requests in the last minute
        (this one is counted when it is not)."""
        now, seen = now or time.monotonic(), self.uploads[student]
        while seen and now - seen[0] > 60:
            seen.popleft()
        if len(seen) >= UPLOADS_PER_MINUTE:
            return True
        seen.append(now)
        return False

    def accept(self, student, assignment, data):
        """Take an upload as a new attempt; its token, or :class:`files.Refused`."""
        files.check_student(student)
        if assignment not in self.assignments:
            raise files.Refused("no such assignment")
        earlier = [datetime.fromtimestamp(t, timezone.utc)
                   for t in self.journal.accepted_times(student, assignment)]
        if (why := refusal(self.rules.rules(assignment), earlier, datetime.now(timezone.utc),
                           self.rules.zone)):
            raise files.Refused(why)
        token = self.journal.new_token()
        files.from_upload(self.state, token, assignment, data)
        self.journal.add(token, student, assignment, "web")
        return token

    def withheld(self, assignment):
        due = self.course.due(assignment)
        return (self.rules.rules(assignment).before_due == "visible" and due is not None
                and datetime.now(timezone.utc) < due)

    def describe(self, attempt):
        """The JSON of one attempt, as its student may see it."""
        from .pages import shown_test_cells, verdicts

        out = {"id": attempt.token, "assignment": attempt.assignment, "state": attempt.state,
               "received": datetime.fromtimestamp(attempt.received, timezone.utc).isoformat(),
               "message": attempt.message, "counted": bool(attempt.counted)}
        if attempt.state == QUEUED:
            out["position"] = self.journal.position(attempt)
        if attempt.state == DONE:
            out.update(status=attempt.status, score=attempt.score, max_score=attempt.max_score)
            result = files.load_result(self.state, attempt.token)
            withheld = self.withheld(attempt.assignment)
            shown = shown_test_cells(self.root, attempt.assignment, withheld)
            out["tests"] = [{"notebook": nb, "cell": cell, "score": score, "max_score": top}
                            for nb, cell, score, top in (verdicts(result, shown) if result else [])]
            out["only_visible_tests"] = withheld
            out["pages"] = [] if withheld else sorted(files.pages(self.state, attempt.token))
        return out

    def is_instructor(self, user):
        return bool(user.get("admin")) or user.get("name") in self.rules.instructors


class Handler(web.RequestHandler):
    """The service's routes' common part: who asks, the CSP, one answer for every miss."""

    def initialize(self, course):
        self.course = course

    def set_default_headers(self):
        self.set_header("Content-Security-Policy", PAGE_CSP)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "no-referrer")
        self.set_header("Cache-Control", "no-store")

    @property
    def student(self):
        return self.current_user["name"]

    def mine(self, token):
        """The asker's attempt ``token``, or the one 404 of every miss."""
        attempt = self.course.journal.attempt_of(self.student, token)
        if attempt is None:
            raise web.HTTPError(404)
        return attempt

    def instructor_only(self):
        if not self.course.is_instructor(self.current_user):
            raise web.HTTPError(404)

    def write_error(self, status_code, **kwargs):
        words = {403: "log in through JupyterHub first", 404: "not found", 413: "too large",
                 429: "too many uploads; wait a minute"}
        reason = getattr(kwargs.get("exc_info", (None, None))[1], "log_message", None)
        text = reason if status_code in (400, 403, 409) and reason else words.get(status_code, "error")
        if self.request.path.startswith(self.course.prefix + "api/"):
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"error": text}))
        else:
            self.finish(page("Error", f"<p>{html.escape(text)}</p>"))

    def upload(self, assignment, data):
        if self.course.rate_limited(self.student):
            raise web.HTTPError(429)
        if len(data) > NOTEBOOK_BYTES:
            raise web.HTTPError(413)
        try:
            return self.course.accept(self.student, assignment, data)
        except files.Refused as why:
            raise web.HTTPError(409, str(why)) from None


def page(title, body):
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{body}</body></html>")


def attempt_rows(course, attempts):
    rows = []
    for a in reversed(attempts):
        score = f"{a.score:g} / {a.max_score:g}" if a.state == DONE and a.score is not None else ""
        rows.append(f"<tr><td><a href='{course.prefix}attempts/{a.token}'>{html.escape(a.assignment)}</a></td>"
                    f"<td>{datetime.fromtimestamp(a.received, timezone.utc):%Y-%m-%d %H:%M:%S} UTC</td>"
                    f"<td>{html.escape(a.state)}</td><td>{score}</td>"
                    f"<td>{'counts' if a.counted else ''}</td></tr>")
    return ("<table><tr><th>assignment</th><th>handed in</th><th>state</th><th>score</th><th></th></tr>"
            + "".join(rows) + "</table>") if rows else "<p>No attempts yet.</p>"


class Home(Handler):
    @web.authenticated
    def get(self):
        c = self.course
        options = "".join(f"<option>{html.escape(a)}</option>" for a in c.assignments)
        form = (f"<form method='post' action='{c.prefix}upload' enctype='multipart/form-data'>"
                f"{self.xsrf_form_html()}<label>Assignment <select name='assignment'>{options}</select></label> "
                f"<label>Notebook <input type='file' name='notebook' accept='.ipynb'></label> "
                f"<button type='submit'>Hand in</button></form>")
        extra = (f"<p><a href='{c.prefix}instructor'>Instructor's view</a></p>"
                 if c.is_instructor(self.current_user) else "")
        self.finish(page(f"Grading for {self.student}", form + "<h2>Your attempts</h2>"
                         + attempt_rows(c, c.journal.attempts_of(self.student)) + extra))


class Upload(Handler):
    @web.authenticated
    def post(self):
        uploaded = self.request.files.get("notebook") or [None]
        if uploaded[0] is None:
            raise web.HTTPError(400, "choose a notebook to hand in")
        token = self.upload(self.get_body_argument("assignment", ""), uploaded[0]["body"])
        self.redirect(f"{self.course.prefix}attempts/{token}", status=303)


class AttemptPage(Handler):
    @web.authenticated
    def get(self, token):
        a = self.course.describe(self.mine(token))
        lines = [f"<p>State: {html.escape(a['state'])}</p>"]
        if "position" in a:
            lines.append(f"<p>Attempts to grade before this one: {a['position']}</p>")
        if a["state"] == DONE:
            lines.append(f"<p>Score: {a['score']:g} / {a['max_score']:g} ({html.escape(a['status'])})</p>")
            if a["only_visible_tests"]:
                lines.append("<p>Until the due date: the score and the tests you can see.</p>")
            lines.append("<table><tr><th>test cell</th><th>score</th></tr>" + "".join(
                f"<tr><td>{html.escape(t['cell'])}</td><td>{t['score']:g} / {t['max_score']:g}</td></tr>"
                for t in a["tests"]) + "</table>")
            lines += [f"<p><a href='{self.course.prefix}attempts/{token}/{html.escape(nb)}.html'>"
                      f"Feedback: {html.escape(nb)}</a></p>" for nb in a["pages"]]
        if a["message"]:
            lines.append(f"<p>{html.escape(a['message'])}</p>")
        if a["state"] != DONE:
            lines.append("<p>This page does not refresh itself: reload it.</p>")
        self.finish(page(f"{a['assignment']}: attempt of {a['received'][:19]}", "".join(lines)
                         + f"<p><a href='{self.course.prefix}'>All attempts</a></p>"))


class FeedbackPage(Handler):
    @web.authenticated
    def get(self, token, notebook):
        attempt = self.mine(token)
        pages = {} if self.course.withheld(attempt.assignment) else files.pages(self.course.state, token)
        if notebook not in pages:
            raise web.HTTPError(404)
        self.set_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(pages[notebook])


class MathJax(web.StaticFileHandler):
    def set_default_headers(self):
        self.set_header("X-Content-Type-Options", "nosniff")


class Api(Handler):
    """A JSON route: a request without a Hub login is refused (403), never sent to log in
    (:class:`NoLogin` goes before the authentication mixin)."""


class NoLogin:
    def get_login_url(self):
        raise web.HTTPError(403)


class ApiAttempts(Api):
    @web.authenticated
    def get(self):
        self.finish({"attempts": [self.course.describe(a)
                                  for a in self.course.journal.attempts_of(self.student)]})

    @web.authenticated
    def post(self):
        token = self.upload(self.get_query_argument("assignment", ""), self.request.body)
        self.set_status(201)
        self.finish(self.course.describe(self.mine(token)))


class ApiAttempt(Api):
    @web.authenticated
    def get(self, token):
        self.finish(self.course.describe(self.mine(token)))


def queue_view(course):
    from .journal import throughput

    j = course.journal
    return {"paused": j.switch("paused") == "yes",
            "queue": [{"student": a.student, "assignment": a.assignment, "state": a.state,
                       "waiting_s": round(time.time() - a.received, 1),
                       "position": j.position(a)} for a in j.queue()],
            "throughput": {name: {"graded_last_hour": n, "p50_s": round(p50, 2), "max_s": round(top, 2)}
                           for name, (n, p50, top) in throughput(j).items()}}


class Instructor(Handler):
    @web.authenticated
    def get(self):
        self.instructor_only()
        v, c = queue_view(self.course), self.course
        switch = (f"<form method='post' action='{c.prefix}instructor/pause'>{self.xsrf_form_html()}"
                  f"<input type='hidden' name='paused' value='{'no' if v['paused'] else 'yes'}'>"
                  f"<button type='submit'>{'Resume' if v['paused'] else 'Pause'} intake</button></form>")
        queue = "".join(f"<tr><td>{html.escape(q['student'])}</td><td>{html.escape(q['assignment'])}</td>"
                        f"<td>{q['state']}</td><td>{q['waiting_s']:g} s</td></tr>" for q in v["queue"])
        rates = "".join(f"<tr><td>{html.escape(name)}</td><td>{t['graded_last_hour']}</td>"
                        f"<td>{t['p50_s']:g} s</td><td>{t['max_s']:g} s</td></tr>"
                        for name, t in v["throughput"].items())
        self.finish(page("Grading service", f"<p>Intake {'paused' if v['paused'] else 'open'}.</p>{switch}"
                         "<h2>Queue</h2><table><tr><th>student</th><th>assignment</th><th>state</th>"
                         f"<th>waiting</th></tr>{queue}</table><h2>Last hour</h2><table><tr>"
                         "<th>assignment</th><th>graded</th><th>median time to feedback</th><th>longest</th>"
                         f"</tr>{rates}</table>"))


class Pause(Handler):
    @web.authenticated
    def post(self):
        self.instructor_only()
        value = self.get_body_argument("paused", "")
        if value not in ("yes", "no"):
            raise web.HTTPError(400, "paused: yes or no")
        self.course.journal.switch("paused", value)
        self.redirect(f"{self.course.prefix}instructor", status=303)


class ApiQueue(Api):
    @web.authenticated
    def get(self):
        self.instructor_only()
        self.finish(queue_view(self.course))


class NotFound(Handler):
    @web.authenticated
    def get(self, *args):
        raise web.HTTPError(404)

    post = get


def make_app(course, auth, callback=None, cookie_secret=None):
    """The tornado application of ``course`` (a :class:`Course`), every handler authenticated
    by the mixin ``auth`` (production: :class:`HubOAuthenticated`; ``callback``: its OAuth
    callback handler)."""
    p = course.prefix
    routes = [("", Home), ("upload", Upload), (r"attempts/([A-Za-z0-9_-]+)", AttemptPage),
              (r"attempts/([A-Za-z0-9_-]+)/([^/]+)\.html", FeedbackPage),
              ("api/attempts", ApiAttempts), (r"api/attempts/([A-Za-z0-9_-]+)", ApiAttempt),
              ("instructor", Instructor), ("instructor/pause", Pause), ("api/queue", ApiQueue)]
    handlers = [(p + path, type(cls.__name__, (NoLogin, auth, cls) if issubclass(cls, Api) else (auth, cls),
                                {}), {"course": course})
                for path, cls in routes]
    handlers.insert(0, (p + MATHJAX_DIR + "/(.*)", MathJax,
                        {"path": str(course.root / FEEDBACK / MATHJAX_DIR)}))
    if callback is not None:
        handlers.insert(0, (p + "oauth_callback", callback))
    handlers.append((r"(.*)", type("NotFound", (auth, NotFound), {}), {"course": course}))
    return web.Application(handlers, xsrf_cookies=True, cookie_secret=cookie_secret or os.urandom(32),
                           login_url=p + "oauth_start")


def main(argv=None):
    """The web process of ``serve`` under JupyterHub: bind where the Hub says, serve under its
    prefix, authenticate with its OAuth."""
    import asyncio

    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from tornado.httpserver import HTTPServer

    a = argparse.ArgumentParser()
    a.add_argument("--root", required=True)
    a.add_argument("--state", required=True)
    a.add_argument("--ip", required=True)
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--prefix", required=True)
    args = a.parse_args(argv)
    course = Course(args.root, args.state, args.prefix)
    app = make_app(course, HubOAuthenticated, HubOAuthCallbackHandler)
    server = HTTPServer(app, max_body_size=BODY_BYTES, xheaders=True)
    server.listen(args.port, args.ip)
    asyncio.get_event_loop().run_forever()


if __name__ == "__main__":
    main()
