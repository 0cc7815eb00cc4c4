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
* bob logs in, submits a notebook of his own, and the service shows him only his: alice's
  attempt, by every id and path he can form, answers exactly as an id that never existed.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import nbformat
import pytest

from autograder.core.cells import is_grade, nbgrader_meta
from autograder.sandbox.launcher import unavailable_reason as sandbox_unavailable
from tests.grader.service.hub import (STUDENT_PASSWORD, Service, course_hub, exchange_config,
                                      unavailable_reason, wait_until)
from tests.grader.test_grading_e2e import FIXTURE, Class

REPO = Path(__file__).resolve().parents[3]
CHROMIUM = Path("/usr/bin/chromium")
NBGRADER = Path(sys.executable).parent / "nbgrader"
AID, COURSE_ID = "toy", "attention-2"
STUDENTS = ("alice", "bob")
SERVICE = "autograder"
FEEDBACK_TIMEOUT = 300  # s: a busy machine grades the toy notebook in well under a minute

pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable())),
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason())),
              pytest.mark.skipif(not CHROMIUM.is_file(), reason="Chromium not found at /usr/bin/chromium: "
                                 "run `apt-get install chromium`")]
sync_api = pytest.importorskip("playwright.sync_api")


def run(args, cwd, env):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The toy course on a filesystem exchange, ``toy`` generated and released by the instructor."""
    base = tmp_path_factory.mktemp("hub-course")
    root, exchange = base / "course", base / "exchange"
    shutil.copytree(FIXTURE / "solutions" / AID, root / "solutions" / AID)
    config = (REPO / "nbgrader_config.py").read_text()
    (root / "nbgrader_config.py").write_text(config + "\n" + exchange_config(exchange, COURSE_ID))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("JUPYTERHUB_USER", None)
    run([sys.executable, "-m", "autograder", "generate", AID, "--root", str(root)], REPO, env)
    run([str(NBGRADER), "release_assignment", AID], root, env)
    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    klass = Class(source, nbformat.read(root / "release" / AID / f"{AID}.ipynb", as_version=4))
    return dict(base=base, root=root, exchange=exchange, klass=klass, env=env)


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


class Student:
    """One student's browser session: logged in at the Hub, their JupyterLab open."""

    def __init__(self, browser, hub, name):
        self.hub, self.name = hub, name
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.offsite = []
        self.context.route("**/*", self._loopback_only)
        self.page = self.context.new_page()

    def _loopback_only(self, route):
        if urlsplit(route.request.url).hostname in ("127.0.0.1", None) or route.request.url.startswith("data:"):
            return route.continue_()
        self.offsite.append(route.request.url)
        return route.abort()

    def log_in(self):
        page = self.page
        page.goto(f"{self.hub.url}/hub/login")
        page.fill("#username_input", self.name)
        page.fill("#password_input", STUDENT_PASSWORD)
        page.click("#login_submit")
        page.wait_for_url(f"**/user/{self.name}/lab**", timeout=240_000)  # the Hub spawns the Lab
        page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)

    def open_assignments(self):
        page = self.page
        page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
        page.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
        page.wait_for_selector(f"#released_assignments_list .list_item:has-text('{AID}'),"
                               f" #fetched_assignments_list .list_item:has-text('{AID}')", timeout=60_000)

    def row(self, listing):
        return self.page.locator(f"#{listing}_assignments_list .list_item:has-text('{COURSE_ID}')")

    def fetch(self):
        self.row("released").locator("button", has_text="Fetch").click()
        self.row("fetched").locator("button", has_text="Submit").wait_for(timeout=60_000)
        notebook = self.hub.home(self.name) / AID / f"{AID}.ipynb"
        assert notebook.is_file(), list(self.hub.home(self.name).rglob("*"))
        return notebook

    def submit(self):
        self.row("fetched").locator("button", has_text="Submit").click()
        self.row("submitted").first.wait_for(timeout=60_000)

    def wait_for_feedback(self, timeout=FEEDBACK_TIMEOUT):
        """Refresh the Assignment List until the exchange holds feedback for the submission."""
        def released():
            self.page.click("#refresh_assignments_list")
            self.page.wait_for_timeout(1000)
            return "feedback available to fetch" in self.row("submitted").first.inner_text()
        wait_until(released, f"{self.name}'s feedback in the Assignment List", timeout, interval=2)

    def fetch_feedback(self):
        self.row("submitted").first.locator("button", has_text="Fetch Feedback").click()
        self.row("submitted").first.locator("a", has_text="view feedback").wait_for(timeout=60_000)
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
    page.locator("a", has_text="Feedback:").first.click()
    page.wait_for_load_state("load")
    assert score_of(page.content()) == (total, top)
    assert alice["student"].offsite == []
