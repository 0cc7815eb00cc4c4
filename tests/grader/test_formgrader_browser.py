"""In real Chromium: nothing a submission contains runs or loads, in feedback pages or the formgrader.

One grading run (sandboxed, the toy course) grades an honest notebook and three hostile
ones that hold the payload family of :mod:`tests.grader.hostile_pages`: markdown, raw HTML
cells, outputs of every MIME type made by code in the sandbox, an SVG attachment, cell
tags and widget state. Each payload that works sets its own marker: ``window.pwnedI``, the
title ``1000 + I`` and a request to a recording HTTP server on 127.0.0.1. Headless
Chromium (``/usr/bin/chromium``) then opens

* each feedback page the run wrote (``file://``, as a student opens it), and the pages of
  stock ``nbgrader generate_feedback`` run with the course's ``nbgrader_config.py``;
* each submission in a live formgrader: ``jupyter server`` with nbgrader's extension,
  started from the course root (the repository's ``nbgrader_config.py`` copied there) on
  127.0.0.1 with a token.

Every page gets synthetic ``mouseover``, ``focus``, ``toggle``, ``load`` and ``error``
events on every element, in every frame. The test passes only if no marker is ever set, the
recorder gets no request, nothing is fetched from outside the page's own origin (the
formgrader's own MathJax from its CDN is the one exception, and it is blocked), the
formgrader page never calls the Jupyter contents API, and the honest notebook's PNG and
(in the feedback page, offline) its math show. A control renders the same notebooks with
nbconvert as shipped and shows the markers fire there.
"""

import io
import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import nbformat
import pytest

from autograder.core.limits import Limits
from autograder.host.driver import grade
from autograder.host.release import generate
from autograder.sandbox.launcher import unavailable_reason
from tests.grader import hostile_pages as hostile
from tests.servers import free_port, http_server

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "tests" / "fixtures" / "course" / "solutions" / "toy"
CHROMIUM = Path("/usr/bin/chromium")
FORMGRADER_MATHJAX = "https://cdnjs.cloudflare.com/ajax/libs/mathjax/"  # nbgrader's own page asset
SANDBOX_MISSING = unavailable_reason()

pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(SANDBOX_MISSING is not None, reason=str(SANDBOX_MISSING)),
              pytest.mark.skipif(not CHROMIUM.is_file(), reason="Chromium not found at /usr/bin/chromium: "
                                 "run `apt-get install chromium`")]
sync_api = pytest.importorskip("playwright.sync_api")
STUDENTS = ("honest", "markdown", "outputs", "cells")

# every inline handler a payload might have planted, fired on every element of every frame
POKE = """() => {
  for (const el of document.querySelectorAll('*'))
    for (const type of ['mouseover', 'focus', 'toggle', 'load', 'error'])
      try { el.dispatchEvent(new Event(type)); } catch (e) {}
}"""
MARKERS = """() => ({
  globals: Object.keys(window).filter(k => /^pwned\\d+$/.test(k)),
  title: document.title,
  jsLinks: [...document.querySelectorAll('a[href], area[href]')].map(a => a.getAttribute('href'))
           .filter(h => /^\\s*(javascript|vbscript|data):/i.test(h)),
})"""


class Recorder(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that records every request a payload makes."""

    def __init__(self):
        self.hits = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                recorder.hits.append(self.path)
                self.send_response(204)
                self.send_header("Access-Control-Allow-Origin", "*")
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/hit"


@pytest.fixture(scope="module")
def recorder():
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def course(recorder, tmp_path_factory):
    """The toy course graded once: an honest student and three hostile ones."""
    root = tmp_path_factory.mktemp("hostile-course")
    shutil.copytree(TOY, root / "solutions" / "toy")
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")  # the course's own config
    source = nbformat.read(TOY / "toy.ipynb", as_version=4)
    release = nbformat.read(generate("toy", root, release_dir=root / "release-check") / "toy.ipynb", as_version=4)
    notebooks = {"honest": hostile.honest(source, release),
                 "markdown": hostile.hostile_markdown(source, release, recorder.url),
                 "outputs": hostile.hostile_outputs(source, release, recorder.url),
                 "cells": hostile.hostile_cells(source, release, recorder.url)}
    for student, nb in notebooks.items():
        (root / "submitted" / student / "toy").mkdir(parents=True)
        nbformat.write(nb, root / "submitted" / student / "toy" / "toy.ipynb")
    results = grade("toy", root, progress=False, out=io.StringIO(), jobs=2,
                    limits=Limits(cell_timeout=20, notebook_timeout=120))
    assert {r.student: r.status for r in results} == dict.fromkeys(STUDENTS, "ok"), \
        [(r.student, r.error) for r in results]
    assert recorder.hits == [], f"a payload ran in the sandbox or the grader: {recorder.hits}"
    return root, notebooks


@pytest.fixture(scope="module")
def browser():
    from tests.book.test_site_browser import CHROMIUM_FLAGS

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                             args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def visit(browser, url, recorder, allowed_offsite=(), settle_ms=1500):
    """Open ``url``, poke every element, and return what happened: markers, requests, the page."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    home = urlsplit(url)
    offsite, same_origin = [], []

    def guard(route):
        target = urlsplit(route.request.url)
        if target.scheme == "data" or (target.scheme, target.netloc) == (home.scheme, home.netloc):
            same_origin.append(route.request.url)
            return route.continue_()
        offsite.append(route.request.url)
        if route.request.url.startswith(recorder.url):  # let the recorder see it too
            return route.continue_()
        return route.abort()

    context.route("**/*", guard)
    titles = []
    page.on("framenavigated", lambda frame: titles.append(frame.url))
    page.goto(url, wait_until="load")
    page.wait_for_timeout(settle_ms)
    found = []
    for frame in page.frames:
        try:
            frame.evaluate(POKE)
        except sync_api.Error:  # a frame the page cannot script (another origin): nothing to poke
            pass
    page.wait_for_timeout(500)
    for frame in page.frames:
        try:
            found.append(frame.evaluate(MARKERS))
        except sync_api.Error:
            pass
    outcome = dict(markers=found, offsite=[u for u in offsite if not u.startswith(tuple(allowed_offsite))],
                   same_origin=same_origin, navigated=titles, page=page, context=context)
    return outcome


def assert_inert(outcome, recorder, who):
    for found in outcome["markers"]:
        assert found["globals"] == [], (who, found)
        assert not (found["title"].isdigit() and 1000 <= int(found["title"]) < 1100), (who, found["title"])
        assert found["jsLinks"] == [], (who, found["jsLinks"])
    assert outcome["offsite"] == [], (who, outcome["offsite"])
    assert recorder.hits == [], (who, recorder.hits)


# what student content may not do to the page: take its ids, or sit fixed over it
NAMES_CHECK = """(ids) => ({
  duplicated: ids.filter(id => document.querySelectorAll('[id="' + id + '"]').length > 1),
  fixed: [...document.querySelectorAll('#notebook-container *, .text_cell_render *, .output_area *')]
         .filter(el => !el.closest('mjx-assistive-mml')  // MathJax's own clipped copy for screen readers
                       && ['fixed', 'absolute', 'sticky'].includes(getComputedStyle(el).position)
                       && el.getBoundingClientRect().width > 200).map(el => el.outerHTML.slice(0, 80)),
  math: [...document.querySelectorAll('mjx-container [id], mjx-container [href], mjx-container [style*="fixed"]')]
        .map(el => el.outerHTML.slice(0, 80)),
  mathErrors: [...document.querySelectorAll('mjx-merror')].map(el => el.textContent),
})"""
CLEAN_NAMES = {"duplicated": [], "fixed": [], "math": [], "mathErrors": []}


def feedback_pages(folder):
    return {student: folder / student / "toy" / "toy.html" for student in STUDENTS}


def test_feedback_pages_are_inert_and_honest_work_shows(course, browser, recorder):
    root, _ = course
    for student, page_path in feedback_pages(root / "feedback").items():
        outcome = visit(browser, page_path.as_uri(), recorder)
        try:
            assert_inert(outcome, recorder, student)
            page = outcome["page"]
            page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
            page.evaluate("MathJax.startup.promise")
            assert page.evaluate(NAMES_CHECK, list(hostile.PAGE_IDS)) == CLEAN_NAMES, student
            # nothing but the page itself and MathJax's script and fonts beside it
            mathjax = (root / "feedback" / "_mathjax").as_posix() + "/"
            assert all(u.startswith("data:") or urlsplit(u).path == page_path.as_posix()
                       or urlsplit(u).path.startswith(mathjax) for u in outcome["same_origin"]), \
                outcome["same_origin"]
            if student == "honest":
                # \boldsymbol, \color and \cancel: extensions MathJax loads from beside the page
                page.wait_for_function("document.querySelectorAll('mjx-container').length >= 6", timeout=30_000)
                sizes = page.evaluate("[...document.images].filter(i => i.src.startsWith('data:image/png'))"
                                      ".map(i => [i.naturalWidth, i.naturalHeight])")
                assert [24, 16] in sizes, sizes
                text = page.evaluate("document.body.innerText")
                assert "\\sigma" not in text and "\\sum" not in text, "math left as raw TeX"
        finally:
            outcome["context"].close()


# what a reader of a feedback page sees of its layout: sideways scroll, each cell's score, colours
LAYOUT = """() => {
  const box = el => el.getBoundingClientRect();
  const rgb = c => (c.match(/[\\d.]+/g) || []).slice(0, 3).map(Number);
  const lum = c => { const v = rgb(c).map(x => x / 255).map(x => x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4);
                     return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
  const contrast = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const ground = el => { for (; el; el = el.parentElement) { const c = getComputedStyle(el).backgroundColor;
                          if (!/rgba\\(.*, 0\\)$/.test(c) && c !== 'transparent') return c; } return 'rgb(255, 255, 255)'; };
  const scores = [...document.querySelectorAll('.nbgrader_cell .panel-heading .pull-right')]
                 .filter(el => el.textContent.includes('Score:'));
  return {
    width: window.innerWidth,
    scrollWidth: document.scrollingElement.scrollWidth,
    scores: scores.map(el => ({text: el.innerText.trim(), left: box(el).left, right: box(el).right,
                               shown: box(el).width > 0 && getComputedStyle(el).visibility === 'visible',
                               // inside its heading, clear of the heading's label
                               inHeading: box(el).top >= box(el.parentElement).top - 1
                                          && box(el).bottom <= box(el.parentElement).bottom + 1,
                               overlaps: [...el.parentElement.querySelectorAll('.nbgrader-label')].some(l =>
                                 box(l).left < box(el).right && box(el).left < box(l).right
                                 && box(l).top < box(el).bottom && box(el).top < box(l).bottom),
                               contrast: contrast(getComputedStyle(el).color, ground(el))})),
    toc: [...document.querySelectorAll('#toc li')].map(el => ({right: box(el).right, text: el.innerText})),
    body: lum(ground(document.body)),
    text: contrast(getComputedStyle(document.querySelector('.text_cell_render')).color,
                   ground(document.querySelector('.text_cell_render'))),
    mtext: [...document.querySelectorAll('mjx-assistive-mml mtext')].map(el => el.textContent),
  };
}"""


def test_feedback_page_reads_on_a_phone_and_a_laptop_light_and_dark(course, browser, recorder):
    """The honest page, re-rendered as ``feedback`` does after manual grading, at 1280 and 390 px
    in light and dark mode: no sideways scroll, each cell's score fully in view with readable
    contrast, dark colours when the system is dark, math text as written; and the grader's
    stamp is not among the files released to the student."""
    from autograder.core.nbgrader_config import default_db_url
    from autograder.host.driver import write_feedback_pages

    root, _ = course
    assert write_feedback_pages(root, default_db_url(root), "toy", ["honest"]) == []
    assert (root / "autograded" / "honest" / "toy" / ".autograder.json").is_file()
    assert sorted(p.name for p in (root / "feedback").rglob(".autograder.json")) == []
    page_path = root / "feedback" / "honest" / "toy" / "toy.html"
    graded = nbformat.read(root / "autograded" / "honest" / "toy" / "toy.ipynb", as_version=4)
    cells = sum(bool(c.metadata.get("nbgrader", {}).get("grade")) for c in graded.cells)
    assert cells >= 3
    for width in (1280, 390):
        for scheme in ("light", "dark"):
            phone = dict(is_mobile=True, has_touch=True, device_scale_factor=3) if width < 600 else {}
            context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme, **phone)
            try:
                page = context.new_page()
                page.goto(page_path.as_uri(), wait_until="load")
                page.wait_for_function("document.querySelectorAll('mjx-container').length >= 7", timeout=30_000)
                found = page.evaluate(LAYOUT)
                where = (width, scheme)
                assert found["width"] == width, (where, "laid out wider than the screen", found["width"])
                assert found["scrollWidth"] <= found["width"], (where, found["scrollWidth"])
                assert len(found["scores"]) == cells, where
                for score in found["scores"]:
                    assert score["shown"] and score["text"].startswith("Score:"), (where, score)
                    assert score["inHeading"] and not score["overlaps"], (where, score)
                    assert 0 <= score["left"] and score["right"] <= found["width"], (where, score)
                    assert score["contrast"] >= 4.5, (where, score)
                assert all(li["right"] <= found["width"] for li in found["toc"]), (where, found["toc"])
                assert found["text"] >= 7, (where, found["text"])
                assert (found["body"] < 0.1) if scheme == "dark" else (found["body"] > 0.8), (where, found["body"])
                assert "inv_freq" in found["mtext"], (where, found["mtext"])
            finally:
                context.close()


def test_stock_nbgrader_generate_feedback_is_sanitized_too(course, browser, recorder):
    """``nbgrader generate_feedback`` with the course's nbgrader_config.py: no CSP, still inert."""
    root, _ = course
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([str(Path(sys.executable).with_name("nbgrader")), "generate_feedback", "toy",
                           "--force", "--CourseDirectory.feedback_directory=stock_feedback"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    pages = feedback_pages(root / "stock_feedback")
    template_own = set(hostile.active_content(pages["honest"].read_text(), allowed=(FORMGRADER_MATHJAX,)))
    for student, page_path in pages.items():
        html = page_path.read_text()
        assert "Content-Security-Policy" not in html  # stock pages are not ours: the sanitizer alone
        assert set(hostile.active_content(html, allowed=(FORMGRADER_MATHJAX,))) <= template_own, student
        if student != "honest":
            outcome = visit(browser, page_path.as_uri(), recorder, allowed_offsite=(FORMGRADER_MATHJAX,))
            try:
                assert_inert(outcome, recorder, f"stock {student}")
            finally:
                outcome["context"].close()


@pytest.fixture(scope="module")
def formgrader(course, tmp_path_factory):
    """``jupyter server`` with nbgrader's formgrader, started from the course root on 127.0.0.1."""
    root, _ = course
    folder = tmp_path_factory.mktemp("formgrader")
    port = free_port()
    token = "formgrader-test-token"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(PYTHONPATH=str(REPO), JUPYTER_CONFIG_DIR=str(folder / "config"),
               JUPYTER_DATA_DIR=str(folder / "data"), JUPYTER_RUNTIME_DIR=str(folder / "runtime"))
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "jupyter_server", "--no-browser", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}", *(["--allow-root"] if os.geteuid() == 0 else [])]
    with http_server(argv, cwd=root, env=env, log_path=folder / "server.log",
                     ready_url=f"{base}/formgrader/api/submitted_notebooks/toy/toy?token={token}") as body:
        yield base, token, {s["student"]: s["id"] for s in json.loads(body)}


def test_formgrader_submission_views_are_inert(formgrader, browser, recorder):
    base, token, submissions = formgrader
    assert sorted(submissions) == sorted(STUDENTS)
    for student in STUDENTS:
        url = f"{base}/formgrader/submissions/{submissions[student]}/?token={token}"
        outcome = visit(browser, url, recorder, allowed_offsite=(FORMGRADER_MATHJAX,))
        try:
            assert_inert(outcome, recorder, f"formgrader {student}")
            assert not [u for u in outcome["same_origin"] if "/api/contents" in u], outcome["same_origin"]
            page = outcome["page"]
            assert page.locator("div#notebook-container .cell").count() >= 10  # the notebook is there
            if student == "honest":
                sizes = page.evaluate("[...document.images].filter(i => i.src.startsWith('data:image/png'))"
                                      ".map(i => [i.naturalWidth, i.naturalHeight])")
                assert [24, 16] in sizes, sizes
                assert "\\sigma(x)_i" in page.evaluate("document.body.innerText")  # math is there, as text
        finally:
            outcome["context"].close()


def grades(base, token, submission_id):
    import urllib.request

    with urllib.request.urlopen(f"{base}/formgrader/api/grades?submission_id={submission_id}&token={token}") as r:
        return {g["name"]: (g["manual_score"], g["extra_credit"]) for g in json.loads(r.read())}


def test_formgrader_clicks_run_nothing_and_change_only_their_own_grade(formgrader, browser, recorder):
    """The instructor's clicks: every link of each submission, then "Full credit" on each written
    answer. The page carries a policy without ``'unsafe-inline'``; no click runs a payload or
    leaves the server; no element of the notebook has an id of the page's own (the score inputs,
    ``#statusmessage``) or sits fixed over it; and "Full credit" changes that answer's grade only."""
    base, token, submissions = formgrader
    for student in ("honest", "markdown", "cells"):
        url = f"{base}/formgrader/submissions/{submissions[student]}/?token={token}"
        context = browser.new_context(viewport={"width": 1280, "height": 900},  # the instructor's session
                                      extra_http_headers={"Authorization": f"token {token}"})
        offsite = []

        def guard(route):
            target = urlsplit(route.request.url)
            if target.scheme == "data" or route.request.url.startswith(base):
                return route.continue_()
            if route.request.url.startswith(recorder.url):  # a payload's request: the recorder sees it
                return route.continue_()
            if not (route.request.is_navigation_request() and target.scheme == "https"):
                offsite.append(route.request.url)  # following a student's https link is what links do
            return route.abort()

        context.route("**/*", guard)
        page = context.new_page()
        console, requests = [], []
        page.on("console", lambda message: console.append(message.text))
        page.on("request", lambda request: requests.append(f"{request.method} {request.url}"))
        try:
            policy = page.goto(url, wait_until="load").headers.get("content-security-policy", "")
            script_src = policy.split("script-src")[1].split(";")[0]
            assert "'unsafe-inline'" not in script_src and "'self'" in script_src, policy
            page.wait_for_function("document.querySelectorAll('.full-credit').length > 0")
            links = page.locator("#notebook-container a[href]").count()
            for i in range(links):
                link = page.locator("#notebook-container a[href]").nth(i)
                if link.is_visible():
                    link.click(timeout=5000, no_wait_after=True)
                    page.wait_for_timeout(200)
                    page.wait_for_load_state("load")
                try:  # a javascript: link would run here, in this page, without navigating
                    markers = page.evaluate(MARKERS)
                except sync_api.Error:  # the click navigated (an https link, aborted): a new page
                    markers = None
                if markers:
                    assert markers["globals"] == [] and not markers["title"].isdigit(), (student, i, markers)
                if page.url != url:
                    page.goto(url, wait_until="load")
            page.wait_for_function("document.querySelectorAll('.full-credit').length > 0")
            found = page.evaluate(NAMES_CHECK, list(hostile.PAGE_IDS))
            assert found == CLEAN_NAMES, (student, found)
            if student == "honest":  # nbgrader's own handlers still run under the policy
                page.locator("span.glyphicon.name-hidden").click()
                assert page.locator("a.name-shown").first.is_visible(), console
            before = grades(base, token, submissions[student])
            answers = page.locator(".nbgrader_cell:has(.text_cell_render) .full-credit")
            assert answers.count() == 1  # the toy's written answer, "why"
            try:
                with page.expect_response(lambda r: "/formgrader/api/grade/" in r.url and r.request.method == "PUT",
                                          timeout=15_000):
                    answers.first.click()
            except sync_api.TimeoutError:
                raise AssertionError(f"no grade saved: {console} {requests[-10:]} {policy}") from None
            after = grades(base, token, submissions[student])
            changed = {name for name in after if after[name] != before[name]}
            assert changed == {"why"} and after["why"][0] == 1, (student, before, after)
            assert offsite == [] and recorder.hits == [], (student, offsite, recorder.hits)
        finally:
            context.close()


def test_control_nbconvert_as_shipped_runs_the_payloads(course, browser, recorder, tmp_path):
    """Without the course's settings the same notebooks are live: the markers can be seen."""
    from nbconvert.exporters import HTMLExporter

    root, notebooks = course
    graded = nbformat.read(root / "autograded" / "outputs" / "toy" / "toy.ipynb", as_version=4)
    seen = {}
    for who, nb in (("markdown", notebooks["markdown"]), ("outputs", graded)):
        page_path = tmp_path / f"{who}.html"
        page_path.write_text(HTMLExporter(template_name="classic").from_notebook_node(nb)[0])
        outcome = visit(browser, page_path.as_uri(), recorder)
        seen[who] = [g for found in outcome["markers"] for g in found["globals"]]
        outcome["context"].close()
    assert seen["markdown"] and seen["outputs"], seen
    assert recorder.hits, "the recorder saw no payload request"
    recorder.hits.clear()


def test_the_policy_alone_stops_every_script_and_load(course, browser, recorder, tmp_path):
    """Defence in depth: the hostile notebooks rendered WITHOUT the sanitizer, with only the
    feedback pages' Content-Security-Policy added. No script or handler runs and nothing is
    fetched; the one thing a policy does not govern is navigation, which the sanitizer removes
    (``<meta http-equiv=refresh>``): that request, and only that one, reaches the recorder."""
    from nbconvert.exporters import HTMLExporter

    from autograder.core.feedback_page import with_csp

    root, notebooks = course
    recorder.hits.clear()
    for who in ("markdown", "outputs", "cells"):
        nb = nbformat.read(root / "autograded" / who / "toy" / "toy.ipynb", as_version=4) \
            if who == "outputs" else notebooks[who]
        page_path = tmp_path / f"{who}.html"
        page_path.write_text(with_csp(HTMLExporter(template_name="classic").from_notebook_node(nb)[0]))
        outcome = visit(browser, page_path.as_uri(), recorder)
        try:
            for found in outcome["markers"]:
                assert found["globals"] == [], (who, found)
            allowed = [f"{recorder.url}/refresh"] if who == "markdown" else []
            assert [u for u in outcome["offsite"] if u not in allowed] == [], (who, outcome["offsite"])
        finally:
            outcome["context"].close()
    assert set(recorder.hits) <= {"/hit/refresh"}, recorder.hits
    recorder.hits.clear()
