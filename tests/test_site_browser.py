"""The built website in a real browser: Debian's Chromium, driven headless by Playwright.

A local ``http.server`` on 127.0.0.1 serves ``_build/html``; every page of the table of
contents must load with no console error and no failed request, fetch nothing from any other
host, typeset its math (no raw TeX left), and show every image. One lab (a matplotlib
``to_jshtml`` animation) must respond to its controls. Playwright never downloads a browser
here: it drives ``/usr/bin/chromium``.

Set ``BOOK_SCREENSHOTS=<dir>`` to also save a full-page PNG of every page there.
"""

import functools
import os
import re
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
MATHJAX_TIMEOUT_MS = 30_000

if not CHROMIUM.is_file():
    pytest.skip(
        "Chromium not found at /usr/bin/chromium: run `apt-get install chromium "
        "fonts-noto-color-emoji` (as root) to run the browser tests",
        allow_module_level=True,
    )
if not (HTML / "index.html").is_file():
    pytest.skip("the book is not built: run `make book` first", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


def toc_docs():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"]] + [entry["file"] for part in toc["parts"] for entry in part["chapters"]]


DOCS = toc_docs()
CHAPTERS = [doc for doc in DOCS if doc.startswith("chapters/")]


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # keep pytest's output clean
        pass


@pytest.fixture(scope="module")
def site():
    """Base URL of ``_build/html`` served on 127.0.0.1 (a free port) for this module."""
    handler = functools.partial(QuietHandler, directory=str(HTML))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
        )
        yield browser
        browser.close()


class PageLog:
    """What one page did: console errors, uncaught exceptions, failed and off-site requests."""

    def __init__(self, page, host):
        self.errors, self.failed, self.offsite = [], [], []
        page.on("console", lambda msg: msg.type == "error" and self.errors.append(msg.text))
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        page.on("requestfailed", lambda req: self.failed.append(f"{req.url} ({req.failure})"))
        page.on("response", lambda res: res.status >= 400 and self.failed.append(
            f"{res.url} (HTTP {res.status})"))

        def guard(route):  # nothing may leave this machine: record and block it
            if urlsplit(route.request.url).hostname != host:
                self.offsite.append(route.request.url)
                return route.abort()
            return route.continue_()

        page.route("**/*", guard)


def open_page(browser, url):
    """A fresh page at ``url``, loaded, with MathJax (if the page uses it) finished."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    log = PageLog(page, "127.0.0.1")
    page.goto(url, wait_until="load")
    page.wait_for_function(
        "() => !document.querySelector('.math') || (window.MathJax && MathJax.startup"
        " && MathJax.startup.promise)", timeout=MATHJAX_TIMEOUT_MS)
    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
    return context, page, log


# Visible text of the article, leaving out code and what MathJax already typeset.
ARTICLE_TEXT_JS = """() => {
  const root = (document.querySelector('article') || document.body).cloneNode(true);
  root.querySelectorAll('pre, code, script, style, mjx-container, .MathJax, textarea')
      .forEach(el => el.remove());
  return root.textContent;
}"""
RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\$[^$\n]*\\[A-Za-z]+[^$\n]*\$")


@pytest.mark.parametrize("doc", DOCS)
def test_page_renders_offline_without_errors(browser, site, doc):
    context, page, log = open_page(browser, f"{site}/{doc}.html")
    try:
        assert not log.offsite, f"{doc} requested off-site resources: {log.offsite}"
        assert not log.failed, f"{doc} has failed requests: {log.failed}"
        assert not log.errors, f"{doc} logged console errors: {log.errors}"

        math_nodes = page.locator(".math").count()
        if math_nodes:
            typeset = page.locator("mjx-container").count()
            assert typeset >= math_nodes, f"{doc}: {typeset} of {math_nodes} formulas typeset"
            assert page.locator("mjx-merror").count() == 0, f"{doc}: a formula has a TeX error"
        raw = RAW_TEX.findall(page.evaluate(ARTICLE_TEXT_JS))
        assert not raw, f"{doc}: raw TeX left in the page: {raw[:5]}"

        broken = page.evaluate(
            "() => Array.from(document.images)"
            ".filter(img => !img.complete || img.naturalWidth === 0)"
            ".map(img => img.currentSrc || img.id)")
        assert not broken, f"{doc}: images that did not load: {broken}"

        if os.environ.get("BOOK_SCREENSHOTS"):
            target = Path(os.environ["BOOK_SCREENSHOTS"]) / f"{doc.replace('/', '_')}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(target), full_page=True)
    finally:
        context.close()


def test_a_lab_responds_to_its_controls(browser, site):
    """Every kernel-free lab (``transformer_ref.labs``) is drawn, and each of its sliders redraws it.

    ``test_labs_browser.py`` checks what each lab shows against the library.
    """
    seen = []
    for doc in CHAPTERS:
        if 'class="tr-lab"' not in (HTML / f"{doc}.html").read_text(encoding="utf-8"):
            continue
        context, page, log = open_page(browser, f"{site}/{doc}.html")
        try:
            labs = page.locator("div.tr-lab")
            for index in range(labs.count()):
                lab = labs.nth(index)
                lab.scroll_into_view_if_needed()
                name = lab.get_attribute("id")
                assert "tr-lab-ready" in lab.get_attribute("class"), f"{doc}: {name} was not drawn"
                assert lab.locator(".tr-lab-panel svg").count() >= 2, f"{doc}: {name} has no panels"
                readout = lab.locator(".tr-lab-readout")
                sliders = lab.locator("input[type=range]")
                for i in reversed(range(sliders.count())):  # the last first: a slider may narrow the next's range
                    slider, before = sliders.nth(i), readout.text_content()
                    drawn = lab.locator(".tr-lab-panels").inner_html()
                    target = "0" if slider.input_value() != "0" else slider.get_attribute("max")
                    slider.fill(target)  # a range input: sets the value and fires 'input'
                    assert readout.text_content() != before, f"{doc}: {name}: slider {i} left the readout"
                    assert lab.locator(".tr-lab-panels").inner_html() != drawn, f"{doc}: {name}: no redraw"
                seen.append(name)
            assert not log.errors, f"{doc}: console errors while using the labs: {log.errors}"
        finally:
            context.close()
    assert seen, f"no chapter has a lab (transformer_ref.labs): {CHAPTERS}"
