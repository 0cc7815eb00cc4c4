"""End to end, in real Chromium through a real JupyterHub: a student hands in from JupyterLab's
Assignments tab and reads the grader's feedback there, with no instructor step in between.

One Hub for the module (``tests/grader/service/hub.py``): its proxy, the shared-password
authenticator, a JupyterLab 4 single-user server per student (nbgrader's Assignments tab), a
filesystem exchange in a temporary folder, and the course root, a copy of the toy fixture whose
``toy`` the instructor has released with ``nbgrader release_assignment``. The grading service,
``python -m autograder serve`` on that course root and exchange, runs as a Hub-managed service.
One Chromium for the module.

* alice logs in at the Hub's login page, opens Nbgrader > Assignment List in her Lab, clicks
  Fetch, solves the notebook (written on disk in her home: the Lab's editor is not under test),
  clicks Submit; the submission is graded and its feedback released to the exchange by the
  service alone; her Assignment List shows it, she clicks Fetch Feedback and gets the course's
  feedback page with her score. The service's page (``/services/autograder/``, through the Hub's
  OAuth) shows her attempt and its score.
* bob logs in and hands in a notebook (one part solved) through the service's own page (the web
  route: its upload form, CSRF token included); the attempt's page shows his score, and the
  service shows him only his own: alice's attempt, by every id and path he can form, answers
  exactly as an id that never existed, and so do the instructor's pages.
* The instructor (a Hub admin) sees the queue and last hour's throughput and pauses intake; a
  browser without a Hub login is sent to the Hub's login page, where a wrong password fails.
"""

import json
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlsplit

import nbformat
import pytest

from autograder.core.cells import is_grade, nbgrader_meta
from autograder.sandbox.launcher import unavailable_reason as sandbox_unavailable
from tests.grader.service.hub import (INSTRUCTOR, INSTRUCTOR_PASSWORD, STUDENT_PASSWORD, Service,
                                      course_hub, unavailable_reason)
from tests.grader.service.serving import AID, COURSE_ID, environ, make_course, wait_for
from tests.grader.test_exchange import run
from tests.grader.test_grading_e2e import Class

REPO = Path(__file__).resolve().parents[3]
CHROMIUM = Path("/usr/bin/chromium")
NBGRADER = Path(sys.executable).parent / "nbgrader"
STUDENTS = ("alice", "bob")
SERVICE = "autograder"
FEEDBACK_TIMEOUT = 300  # s: a busy machine grades the toy notebook in well under a minute
# ms: each wait for the page (a click's target, a navigation, a list row). JupyterLab takes
# seconds to load on an idle machine, but minutes when the suite's other workers hold the cores
UI_TIMEOUT_MS = 240_000

pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable())),
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason())),
              pytest.mark.skipif(not CHROMIUM.is_file(), reason="Chromium not found at /usr/bin/chromium: "
                                 "run `apt-get install chromium`")]
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The toy course on a filesystem exchange, ``toy`` generated and released by the instructor."""
    base = tmp_path_factory.mktemp("hub-course")
    root, exchange = make_course(base)
    run([str(NBGRADER), "release_assignment", AID], root, environ())
    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    klass = Class(source, nbformat.read(root / "release" / AID / f"{AID}.ipynb", as_version=4))
    return dict(base=base, root=root, exchange=exchange, klass=klass)


@pytest.fixture(scope="module")
def hub(course):
    """The Hub, with ``python -m autograder serve`` on the course root and exchange as its service."""
    grader = Service(SERVICE, [sys.executable, "-m", "autograder", "serve", "--root", course["root"],
                               "--exchange", course["exchange"], "--course-id", COURSE_ID,
                               "--state", course["base"] / "service-state", "--jobs", "1"], cwd=REPO)
    with course_hub(course["base"] / "hub", exchange=course["exchange"], course_id=COURSE_ID,
                    students=STUDENTS, services=(grader,)) as running:
        yield running


@pytest.fixture(scope="module")
def browser():
    from tests.book.test_site_browser import CHROMIUM_FLAGS

    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                              args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@contextmanager
def with_hub_log(hub):
    """A failure inside shows the end of the Hub's log (the Lab's and the service's output too)."""
    try:
        yield
    except Exception as error:
        raise AssertionError(f"{type(error).__name__}: {error}\n--- hub log ---\n{hub.log()[-6000:]}") from error


class Student:
    """One student's browser session: logged in at the Hub, their JupyterLab open."""

    def __init__(self, browser, hub, name):
        self.hub, self.name = hub, name
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.context.set_default_timeout(UI_TIMEOUT_MS)
        self.offsite = []
        self.context.route("**/*", self._loopback_only)
        self.page = self.context.new_page()

    def _loopback_only(self, route):
        if urlsplit(route.request.url).hostname in ("127.0.0.1", None) or route.request.url.startswith("data:"):
            return route.continue_()
        self.offsite.append(route.request.url)
        return route.abort()

    def log_in(self, then=None, password=STUDENT_PASSWORD):
        """Log in at the Hub's login page; then JupyterLab (the Hub spawns it) or the page ``then``."""
        page = self.page
        page.goto(f"{self.hub.url}/hub/login" + (f"?next={quote(then)}" if then else ""))
        page.fill("#username_input", self.name)
        page.fill("#password_input", password)
        page.click("#login_submit")
        if then:
            page.wait_for_url(f"{self.hub.url}{then}**")
            return
        page.wait_for_url(f"**/user/{self.name}/lab**")  # the Hub spawns the Lab
        page.wait_for_selector("#jp-main-dock-panel")

    def open_assignments(self):
        page = self.page
        page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
        page.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
        page.wait_for_selector(f"#released_assignments_list .list_item:has-text('{AID}'),"
                               f" #fetched_assignments_list .list_item:has-text('{AID}')")

    def row(self, listing):
        return self.page.locator(f"#{listing}_assignments_list .list_item:has-text('{COURSE_ID}')")

    def fetch(self):
        self.row("released").locator("button", has_text="Fetch").click()
        self.row("fetched").locator("button", has_text="Submit").wait_for()
        notebook = self.hub.home(self.name) / AID / f"{AID}.ipynb"
        assert notebook.is_file(), list(self.hub.home(self.name).rglob("*"))
        return notebook

    def submit(self):
        self.row("fetched").locator("button", has_text="Submit").click()
        self.row("submitted").first.wait_for()

    def wait_for_feedback(self, timeout=FEEDBACK_TIMEOUT):
        """Refresh the Assignment List until the exchange holds feedback for the submission."""
        def released():
            self.page.click("#refresh_assignments_list")
            self.page.wait_for_timeout(1000)
            return "feedback available to fetch" in self.row("submitted").first.inner_text()
        wait_for(released, f"{self.name}'s feedback in the Assignment List", timeout=timeout)

    def fetch_feedback(self):
        self.row("submitted").first.locator("button", has_text="Fetch Feedback").click()
        self.row("submitted").first.locator("a", has_text="view feedback").wait_for()
        return sorted((self.hub.home(self.name) / AID / "feedback").glob(f"*/{AID}.html"))

    def close(self):
        self.context.close()


def max_score(release):
    """Every graded cell's points: the tests' and the written answers' (graded by hand)."""
    return sum(float(nbgrader_meta(c)["points"]) for c in release.cells if is_grade(c))


def score_of(page_html):
    """The total score a course feedback page states (``Score: X / Y`` in its heading)."""
    found = re.search(r"Score:\s*([\d.]+)\s*/\s*([\d.]+)", page_html)
    assert found, page_html[:2000]
    return float(found.group(1)), float(found.group(2))


@pytest.fixture(scope="module")
def alice(course, hub, browser):
    """alice's whole round trip: log in, fetch, solve, submit, wait for the feedback, fetch it."""
    student = Student(browser, hub, "alice")
    try:
        with with_hub_log(hub):
            student.log_in()
            student.open_assignments()
            notebook = student.fetch()
            nbformat.write(course["klass"].notebook(), notebook)
            student.submit()
            student.wait_for_feedback()
            pages = student.fetch_feedback()
        yield dict(student=student, pages=pages)
    finally:
        student.close()


def test_submitted_from_the_lab_and_feedback_fetched_in_the_lab(course, alice):
    pages = alice["pages"]
    assert len(pages) == 1, pages
    html = pages[0].read_text()
    assert score_of(html) == (course["klass"].total, max_score(course["klass"].release))
    assert "Content-Security-Policy" in html  # the course's own feedback page, not nbgrader's
    assert "BEGIN HIDDEN TESTS" not in html and "BEGIN SOLUTION" not in html
    assert alice["student"].offsite == []


def test_the_service_page_shows_the_attempt_and_its_score(course, hub, alice):
    """alice opens the service through the Hub (its OAuth lets her through, no confirmation) and
    sees the attempt she handed in from the Lab, its score and its feedback page."""
    page = alice["student"].page
    page.goto(hub.service_url(SERVICE))
    page.wait_for_url(f"{hub.service_url(SERVICE)}**")
    assert "Grading for alice" in page.locator("h1").inner_text()
    rows = page.locator("table tr:has(td)")
    assert rows.count() == 1, page.content()
    total, top = course["klass"].total, max_score(course["klass"].release)
    assert f"{total:g} / {top:g}" in rows.first.inner_text()
    rows.first.locator("a").first.click()
    page.wait_for_selector("text=Score:")
    assert f"Score: {total:g} / {top:g}" in page.locator("body").inner_text()
    link = page.locator("a", has_text="Feedback:").first.get_attribute("href")
    served = alice["student"].context.request.get(f"{hub.url}{link}")
    assert served.headers["content-security-policy"]  # the course's policy on the page
    assert served.body() == alice["pages"][0].read_bytes()  # the page the Lab fetched, byte for byte
    page.goto(f"{hub.url}{link}")
    assert score_of(page.content()) == (total, top)
    assert alice["student"].offsite == []


@pytest.fixture(scope="module")
def bob(course, hub, browser, tmp_path_factory):
    """bob, logged in straight to the service (no Lab), hands in one part solved by its upload form."""
    klass = course["klass"]
    student = Student(browser, hub, "bob")
    prefix = urlsplit(hub.service_url(SERVICE)).path
    try:
        with with_hub_log(hub):
            student.log_in(then=prefix)
            page = student.page
            notebook = tmp_path_factory.mktemp("bob") / f"{AID}.ipynb"
            nbformat.write(klass.notebook(solved=[klass.parts[0][0]]), notebook)
            page.select_option("select[name=assignment]", AID)
            page.set_input_files("input[name=notebook]", str(notebook))
            page.click("button[type=submit]")
            page.wait_for_url(f"**{prefix}attempts/**")
            attempt = page.url

            def graded():
                page.goto(attempt)  # the page does not refresh itself
                page.wait_for_timeout(1000)
                return "Score:" in page.locator("body").inner_text()
            wait_for(graded, "bob's web attempt graded", timeout=FEEDBACK_TIMEOUT)
        yield dict(student=student, attempt=attempt, expected=sum(p for _, p in klass.parts[0][1]))
    finally:
        student.close()


def test_the_web_route_grades_an_upload_from_the_service_page(course, bob):
    body = bob["student"].page.locator("body").inner_text()
    assert f"Score: {bob['expected']:g} / {max_score(course['klass'].release):g}" in body, body
    assert 0 < bob["expected"] < course["klass"].total  # one part of several: a score that can fail
    assert bob["student"].offsite == []


def test_a_student_sees_only_their_own_attempts(hub, alice, bob):
    """Every form of alice's attempt that bob can ask for answers as an attempt that never existed
    (same status, same page), and his list holds his attempt only."""
    base = hub.service_url(SERVICE)
    mine = json.loads(alice["student"].context.request.get(f"{base}api/attempts").text())["attempts"]
    assert len(mine) == 1 and mine[0]["state"] == "done", mine
    hers, never = mine[0]["id"], "A" * len(mine[0]["id"])
    page = bob["student"].page

    def ask(path):
        response = page.goto(base + path)
        return response.status, page.content()

    forms = ["attempts/{}", "attempts/{}/", "attempts/{}/toy.html", "attempts/{}/feedback.html",
             "api/attempts/{}", "api/attempts/{}/", "attempts/{}?student=alice", "api/attempts/{}?user=alice"]
    for form in forms:
        theirs, none = ask(form.format(hers)), ask(form.format(never))
        assert theirs[0] == 404 and theirs == none, (form, theirs, none)
    for path in ("instructor", "api/queue"):
        assert ask(path)[0] == 404, path
    listed = json.loads(bob["student"].context.request.get(f"{base}api/attempts").text())["attempts"]
    assert [a["id"] for a in listed] != [] and hers not in [a["id"] for a in listed], listed
    page.goto(base)
    assert hers not in page.content() and "Grading for bob" in page.content()


def test_the_instructor_sees_the_queue_and_throughput_and_pauses_intake(course, hub, browser, alice, bob):
    """The Hub's admin (the instructor) opens the service's instructor page through the Hub's OAuth:
    both attempts graded in the last hour, none queued; the Pause switch (a form with its CSRF
    token) closes intake and Resume opens it again. Students got 404 there (the test above)."""
    instructor = Student(browser, hub, INSTRUCTOR)
    base = hub.service_url(SERVICE)
    try:
        instructor.log_in(then=urlsplit(base).path + "instructor", password=INSTRUCTOR_PASSWORD)
        page = instructor.page
        assert "Intake open." in page.locator("body").inner_text()
        queue = json.loads(instructor.context.request.get(f"{base}api/queue").text())
        assert queue["queue"] == [] and queue["paused"] is False, queue
        assert queue["throughput"][AID]["graded_last_hour"] == 2, queue
        page.click("button:has-text('Pause intake')")
        page.wait_for_selector("text=Intake paused.")
        assert json.loads(instructor.context.request.get(f"{base}api/queue").text())["paused"] is True
        page.click("button:has-text('Resume intake')")
        page.wait_for_selector("text=Intake open.")
        assert instructor.offsite == []
    finally:
        instructor.close()


def test_the_hub_decides_who_the_student_is(hub, browser, alice):
    """Without a Hub login the service's pages send the browser to the Hub's login page, and a
    wrong password there logs no one in: the identity the tests above use is the Hub's."""
    stranger = Student(browser, hub, "alice")
    try:
        page = stranger.page
        page.goto(hub.service_url(SERVICE))
        assert urlsplit(page.url).path == "/hub/login", page.url
        assert "Grading for" not in page.content()
        page.fill("#username_input", "alice")
        page.fill("#password_input", STUDENT_PASSWORD + "-wrong")
        page.click("#login_submit")
        page.wait_for_load_state("load")
        assert urlsplit(page.url).path == "/hub/login", page.url
        assert page.locator(".login_error, #login_error, .alert-danger").count() >= 1, page.content()
    finally:
        stranger.close()
