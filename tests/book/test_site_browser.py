"""The built website in a real browser: Debian's Chromium, driven headless by Playwright.

A local ``http.server`` on 127.0.0.1 serves ``_build/html``; every page of the table of
contents must load with no console error and no failed request, fetch nothing from any other
host, typeset its math (no raw TeX left), and show every image. Every lab (``transformer_ref.labs``) must
respond to each of its controls. Playwright never downloads a browser
here: it drives ``/usr/bin/chromium``.

Every page is also audited once, in one browser tab that is switched between three states
(1280 px light, 1280 px dark, 390 px light): nothing scrolls sideways on a phone outside a
scroll container and nothing is cut off at the right; every table, image, SVG and display
equation fits its column at 1280 px, and every display equation at 390 px too; every figure's
smallest text is at least 9 pt as shown at 1280 px, and on a phone at least as large as the
figure's caption, with the figure's panels stacked and the whole figure on the screen; printouts keep their lines on a phone (they scroll, never wrap); in dark
mode every figure is shown unfiltered on its white panel; table
headers meet WCAG AA contrast in light and dark mode; no output shows an object repr
(``<... at 0x...>``); axe-core (``node_modules``, pinned in ``package-lock.json``) finds no
WCAG 2.0/2.1 A or AA violation in light or dark mode; every page has a favicon and exactly
one search box; search results quote no raw TeX.

Set ``BOOK_SCREENSHOTS=<dir>`` to also save a full-page PNG of every page there (and, from the
audit, ``<page>.phone.png`` at 390 px and ``<page>.dark.png`` in dark mode), e.g.
``BOOK_SCREENSHOTS=/tmp/shots .venv/bin/python -m pytest tests/book/test_site_browser.py -k 06-flash``.
"""

import contextlib
import functools
import os
import re
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import matplotlib.pyplot as plt
import pytest
import yaml

from transformer_ref.plotting import smallest_text_pt, use_book_style

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
MATHJAX_TIMEOUT_MS = 30_000


def loopback_only(offsite, host="127.0.0.1"):
    """A Playwright route handler: a request to ``host`` goes on; any other is recorded in
    ``offsite`` and refused (nothing a test opens may leave this machine)."""
    def guard(route):
        if urlsplit(route.request.url).hostname != host:
            offsite.append(route.request.url)
            return route.abort()
        return route.continue_()
    return guard


class LoopbackChromium:
    """Chromium restricted to 127.0.0.1: every context made by :meth:`new_context` routes
    its requests through :func:`loopback_only`; ``offsite`` lists the ones it refused."""

    def __init__(self, browser):
        self.browser, self.offsite = browser, []

    def new_context(self, **options):
        context = self.browser.new_context(**options)
        context.route("**/*", loopback_only(self.offsite))
        return context


@contextlib.contextmanager
def loopback_chromium():
    """Debian's Chromium, headless with :data:`CHROMIUM_FLAGS`, as a :class:`LoopbackChromium`;
    closed on the way out."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                             args=CHROMIUM_FLAGS)
        try:
            yield LoopbackChromium(browser)
        finally:
            browser.close()


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

        page.route("**/*", loopback_only(self.offsite, host))  # nothing may leave this machine


def open_page(browser, url, width=1280):
    """A fresh page at ``url``, loaded, with MathJax (if the page uses it) finished."""
    context = browser.new_context(viewport={"width": width, "height": 900})
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
def test_page_renders_offline_without_errors(audit, doc):
    report = audit(doc)
    assert not report["offsite"], f"{doc} requested off-site resources: {report['offsite']}"
    assert not report["failed"], f"{doc} has failed requests: {report['failed']}"
    assert not report["errors"], f"{doc} logged console errors: {report['errors']}"
    loaded = report["loaded"]
    if loaded["math"]:
        assert loaded["typeset"] >= loaded["math"], (
            f"{doc}: {loaded['typeset']} of {loaded['math']} formulas typeset")
        assert loaded["merror"] == 0, f"{doc}: a formula has a TeX error"
    raw = RAW_TEX.findall(loaded["text"])
    assert not raw, f"{doc}: raw TeX left in the page: {raw[:5]}"
    assert not loaded["broken_images"], f"{doc}: images that did not load: {loaded['broken_images']}"


def test_a_lab_responds_to_its_controls(browser, site):
    """Every kernel-free lab (``transformer_ref.labs``) is drawn, and each of its controls that
    applies (sliders, number boxes, drop-downs) changes its readout and redraws it.

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
                assert lab.locator(".tr-lab-panel svg").count() >= 1, f"{doc}: {name} has no panels"
                readout = lab.locator(".tr-lab-readout")
                controls = lab.locator("input[type=range], input[type=number], select")
                for i in reversed(range(controls.count())):  # the last first: a slider may narrow the next's range
                    control, before = controls.nth(i), readout.text_content()
                    if control.is_disabled():  # a control that does not apply to the current setting
                        continue
                    drawn = lab.locator(".tr-lab-panels").inner_html()
                    kind = control.evaluate("e => e.type")
                    if kind == "range":
                        control.fill("0" if control.input_value() != "0" else control.get_attribute("max"))
                    elif kind == "number":
                        value = int(control.input_value())
                        control.fill(str(value + 1 if value < int(control.get_attribute("max")) else value - 1))
                    else:
                        options = control.locator("option").evaluate_all("os => os.map(o => o.value)")
                        control.select_option(next(o for o in options if o != control.input_value()))
                    assert readout.text_content() != before, f"{doc}: {name}: control {i} left the readout"
                    # (a drop-down may name a case that draws the same, e.g. any 1 x 1 mask)
                    assert kind == "select-one" or lab.locator(".tr-lab-panels").inner_html() != drawn, \
                        f"{doc}: {name}: no redraw"
                seen.append(name)
            assert not log.errors, f"{doc}: console errors while using the labs: {log.errors}"
        finally:
            context.close()
    assert seen, f"no chapter has a lab (transformer_ref.labs): {CHAPTERS}"


# ---------------------------------------------------------------------------------------
# Layout, contrast and accessibility, audited once per page (one tab, three states).

AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
DESKTOP, PHONE = 1280, 390
MIN_TEXT_PX = 12     # 9 pt: the smallest figure text a reader should have to read
OBJECT_REPR = re.compile(r"<[A-Za-z_][\w.]*(?: object)? at 0x[0-9a-fA-F]+>")

# Elements of the article that stick out of the column or of the screen. An element inside a
# scroll container (an ancestor with overflow-x auto or scroll) is fine: it scrolls there. An
# element that an overflow-x hidden/clip ancestor cuts off is not, and neither is one that
# pushes the page itself wider than the screen.
OVERFLOW_JS = """() => {
  const article = document.querySelector('article.bd-article') || document.body;
  const box = article.getBoundingClientRect();
  const style = getComputedStyle(article);
  const column = {left: box.left + parseFloat(style.paddingLeft),
                  right: box.right - parseFloat(style.paddingRight)};
  const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
      + (el.className && typeof el.className === 'string'
         ? '.' + el.className.trim().split(/\\s+/).slice(0, 2).join('.') : '');
  const where = el => {
    const parts = [];
    for (let e = el; e && e !== article && parts.length < 4; e = e.parentElement) parts.unshift(name(e));
    const text = (el.textContent || '').trim().replace(/\\s+/g, ' ').slice(0, 60);
    return parts.join(' > ') + (text ? ` "${text}"` : '');
  };
  // The right edge an element may reach: that of every overflow-hidden ancestor up to the
  // nearest scroll container, and, with no scroll container, that of the screen.
  const rightLimit = el => {
    let limit = Infinity;
    for (let e = el.parentElement; e && e !== document.documentElement; e = e.parentElement) {
      const o = getComputedStyle(e).overflowX;
      if (o === 'auto' || o === 'scroll') return limit;
      if (o === 'hidden' || o === 'clip') limit = Math.min(limit, e.getBoundingClientRect().right);
    }
    return Math.min(limit, window.innerWidth);
  };
  const sticking = [];
  for (const el of article.querySelectorAll('*')) {
    if (el.closest('mjx-assistive-mml')) continue;      // MathJax's clipped copy for screen readers
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || !el.checkVisibility({visibilityProperty: true})) continue;
    const limit = rightLimit(el);
    if (r.right > limit + 2) sticking.push(`${where(el)}: right edge ${Math.round(r.right)} > ${Math.round(limit)}`);
  }
  // Tables, images, SVGs and display equations must fit the column itself; an equation's
  // container scrolls (custom.css), so compare the width of what it holds.
  const wide = [], wideMath = [];
  const blocks = article.querySelectorAll('table, img, svg, mjx-container[display="true"]');
  for (const el of blocks) {
    if (el.closest('mjx-container') && el.tagName !== 'MJX-CONTAINER') continue;   // MathJax's own parts
    if (el.closest('button, .headerlink, .copybtn')) continue;                     // icons
    const r = el.getBoundingClientRect();
    if (r.width === 0 || !el.checkVisibility({visibilityProperty: true})) continue;
    const width = el.tagName === 'MJX-CONTAINER' ? Math.max(el.scrollWidth, r.width) : r.width;
    const room = column.right - Math.max(r.left, column.left);
    // An equation also shares its line with its number: it must fit its own box.
    const squeezed = el.tagName === 'MJX-CONTAINER' && el.scrollWidth > el.clientWidth + 1;
    if (width > room + 1 || squeezed) {
      const text = `${where(el)}: ${Math.round(width)} px in ${Math.round(squeezed ? el.clientWidth : room)} px`;
      (el.tagName === 'MJX-CONTAINER' ? wideMath : wide).push(text);
    }
  }
  // Text outputs and code wrap at this width: none needs its own scroll bar at 1280 px.
  const scrolled = [...article.querySelectorAll('.cell_output pre')]
    .filter(el => el.scrollWidth > el.clientWidth + 1).map(where);
  return {pageWidth: document.documentElement.scrollWidth, viewport: window.innerWidth,
          sticking: sticking.slice(0, 12), wide: wide.slice(0, 12), wideMath: wideMath.slice(0, 12),
          scrolledOutputs: scrolled.slice(0, 12)};
}"""

# WCAG 2 contrast ratio of the text of every table header cell against the background it is
# drawn on (translucent backgrounds composited up to the page).
HEADER_CONTRAST_JS = """() => {
  const rgba = c => {
    const m = c.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const canvas = () => {
    const root = rgba(getComputedStyle(document.documentElement).backgroundColor);
    const body = rgba(getComputedStyle(document.body).backgroundColor);
    return (body && body[3] > 0 ? body : root && root[3] > 0 ? root : [255, 255, 255, 1]).slice(0, 3);
  };
  const background = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let out = layers.length && layers[layers.length - 1][3] >= 1 ? [0, 0, 0] : canvas();
    for (const c of layers.reverse()) out = out.map((v, i) => c[i] * c[3] + v * (1 - c[3]));
    return out;
  };
  const lum = rgb => rgb.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
                        .reduce((s, v, i) => s + [0.2126, 0.7152, 0.0722][i] * v, 0);
  const out = [];
  for (const th of document.querySelectorAll('article th')) {
    const holders = [th, ...th.querySelectorAll('*')].filter(
      e => [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim()));
    for (const el of holders) {
      const fg = rgba(getComputedStyle(el).color), bg = background(el);
      const rgb = fg.slice(0, 3).map((v, i) => v * fg[3] + bg[i] * (1 - fg[3]));
      const [a, b] = [lum(rgb), lum(bg)];
      out.push({text: el.textContent.trim().slice(0, 40),
                ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05),
                color: rgb.map(Math.round), background: bg.map(Math.round)});
    }
  }
  return out;
}"""

# Dark mode changes colours only, not the document: there, only the colour rules run again.
AXE_COLOUR_RULES = ["color-contrast", "link-in-text-block"]
AXE_RUN_JS = """async ([kind, values]) => {
  const result = await axe.run(document, {runOnly: {type: kind, values: values},
                                          resultTypes: ['violations']});
  return result.violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help, count: v.nodes.length,
    nodes: v.nodes.slice(0, 4).map(n => n.target.join(' ')),
    inLab: v.nodes.every(n => n.target.some(t => document.querySelector(t)
                                            && document.querySelector(t).closest('.animation'))),
  }));
}"""

SEARCH_BOXES_JS = """() => [...document.querySelectorAll(
    'input[type="search"], input[name="q"], button.search-button, button.search-button-field')]
  .filter(el => el.checkVisibility({visibilityProperty: true, opacityProperty: true}))
  .map(el => el.outerHTML.slice(0, 80))"""

# Every image a cell made (myst-nb writes them to _images/; a glued figure's <img> sits in its
# <figure>, not in a cell output): the width the page shows it at, the width of the PNG, the
# font size of its caption (CSS px; of the page's first caption for an image without one),
# and how it is drawn (the theme's dark mode puts a CSS filter on images).
FIGURE_SCALE_JS = """() => {
  const size = el => el ? parseFloat(getComputedStyle(el.querySelector('p') || el).fontSize) : null;
  const pageCaption = size(document.querySelector('article figcaption'));
  return [...document.querySelectorAll('article img[src*="_images/"]')].map(img => {
    const figure = img.closest('figure');
    const style = getComputedStyle(img);
    const box = img.getBoundingClientRect();
    return {where: (figure && figure.id) || img.getAttribute('src'),
            shown: box.width, natural: img.naturalWidth, left: box.left, right: box.right,
            viewport: document.documentElement.clientWidth, source: img.currentSrc.split('/').pop(),
            scrolls: !!figure && ['auto', 'scroll'].includes(getComputedStyle(figure).overflowX)
                     && figure.scrollWidth > figure.clientWidth + 1,
            caption: (figure && size(figure.querySelector('figcaption'))) || pageCaption,
            filter: style.filter, background: style.backgroundColor};
  });
}"""

# Printouts (stream and plain-text outputs) whose lines the browser wrapped: more line boxes
# on screen than lines in the text. Aligned columns of numbers must scroll, not wrap.
WRAPPED_PRINTOUTS_JS = """() => {
  const out = [];
  for (const pre of document.querySelectorAll(
      'article .cell_output .output.stream pre, article .cell_output .output.text_plain pre')) {
    if (!pre.checkVisibility({visibilityProperty: true})) continue;
    const lines = pre.textContent.split('\\n').filter(line => line.length > 0).length;
    const tops = [];
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const range = document.createRange();
      range.selectNodeContents(node);
      for (const r of range.getClientRects()) if (r.width > 0) tops.push(r.top);
    }
    tops.sort((a, b) => a - b);
    const shown = tops.filter((top, i) => i === 0 || top - tops[i - 1] > 3).length;   // line boxes
    if (shown > lines) out.push({text: pre.textContent.trim().slice(0, 60), lines, shown});
  }
  return out;
}"""

FAVICON_JS = """async () => {
  const link = document.querySelector('link[rel~="icon"]');
  if (!link) return null;
  const response = await fetch(link.href);
  return {href: link.getAttribute('href'), ok: response.ok,
          type: response.headers.get('content-type')};
}"""


def set_theme(page, mode):
    """Switch the theme's colour mode in place (what its light/dark button does), then wait
    for the colour transitions it starts (0.15 s on the theme's buttons) to end, so contrast
    is measured on the final colours."""
    page.evaluate("""(mode) => {
      document.documentElement.dataset.theme = mode;
      document.documentElement.dataset.mode = mode;
    }""", mode)
    page.evaluate("""() => Promise.race([
      new Promise(r => setTimeout(r, 2000)),
      Promise.all(document.getAnimations().filter(a => a.transitionProperty).map(a => a.finished.catch(() => null))),
    ]).then(() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r))))""")


def audit_page(browser, site, doc):
    """Everything the render, layout and accessibility tests check on one page, in one tab:
    first the page as loaded at the desktop width (``loaded``), then its colour modes, then
    the phone width; what the page requested and logged is kept until the end."""
    context, page, log = open_page(browser, f"{site}/{doc}.html", width=DESKTOP)
    try:
        report = {"loaded": {
                      "math": page.locator(".math").count(),
                      "typeset": page.locator("mjx-container").count(),
                      "merror": page.locator("mjx-merror").count(),
                      "text": page.evaluate(ARTICLE_TEXT_JS),
                      "broken_images": page.evaluate(
                          "() => Array.from(document.images)"
                          ".filter(img => !img.complete || img.naturalWidth === 0)"
                          ".map(img => img.currentSrc || img.id)")},
                  "desktop": page.evaluate(OVERFLOW_JS),
                  "figures": page.evaluate(FIGURE_SCALE_JS),
                  "text": page.evaluate(
                      "() => (document.querySelector('article') || document.body).innerText"),
                  "search_boxes": page.evaluate(SEARCH_BOXES_JS),
                  "favicon": page.evaluate(FAVICON_JS)}
        if os.environ.get("BOOK_SCREENSHOTS"):
            target = Path(os.environ["BOOK_SCREENSHOTS"]) / f"{doc.replace('/', '_')}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(target), full_page=True)
        if AXE.is_file():
            page.add_script_tag(path=str(AXE))
        for mode in ("light", "dark"):
            set_theme(page, mode)
            report[f"contrast_{mode}"] = page.evaluate(HEADER_CONTRAST_JS)
            report[f"figures_{mode}"] = page.evaluate(FIGURE_SCALE_JS)
            if AXE.is_file():
                rules = ["tag", AXE_TAGS] if mode == "light" else ["rule", AXE_COLOUR_RULES]
                report[f"axe_{mode}"] = page.evaluate(AXE_RUN_JS, rules)
        set_theme(page, "light")
        page.set_viewport_size({"width": PHONE, "height": 844})
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        # the figures' phone layouts (<picture> sources) load now: wait for every one of them
        page.wait_for_function("() => [...document.querySelectorAll('article picture img')]"
                               ".every(i => i.complete && i.naturalWidth > 0 && i.currentSrc.endsWith('-phone.png'))",
                               timeout=30_000)
        report["phone"] = page.evaluate(OVERFLOW_JS)
        report["phone_figures"] = page.evaluate(FIGURE_SCALE_JS)
        report["phone_wrapped"] = page.evaluate(WRAPPED_PRINTOUTS_JS)
        if os.environ.get("BOOK_SCREENSHOTS"):
            target = Path(os.environ["BOOK_SCREENSHOTS"]) / f"{doc.replace('/', '_')}.phone.png"
            page.screenshot(path=str(target), full_page=True)
            page.set_viewport_size({"width": DESKTOP, "height": 900})
            set_theme(page, "dark")
            page.screenshot(path=str(target.with_suffix("").with_suffix(".dark.png")),
                            full_page=True)
        report.update(errors=list(log.errors), failed=list(log.failed), offsite=list(log.offsite))
        return report
    finally:
        context.close()


@pytest.fixture(scope="module")
def audit(browser, site):
    """``audit(doc)``: the page's report from ``audit_page``, computed once per module."""
    reports = {}

    def get(doc):
        if doc not in reports:
            reports[doc] = audit_page(browser, site, doc)
        return reports[doc]

    return get


@pytest.mark.parametrize("doc", DOCS)
def test_nothing_scrolls_sideways_on_a_phone(audit, doc):
    phone = audit(doc)["phone"]
    assert phone["pageWidth"] <= phone["viewport"], (
        f"{doc}: at {PHONE} px the page is {phone['pageWidth']} px wide: {phone['sticking']}")
    assert not phone["sticking"], f"{doc}: at {PHONE} px, cut off or outside the screen: {phone['sticking']}"
    assert not phone["wideMath"], (
        f"{doc}: display equations wider than the column at {PHONE} px: {phone['wideMath']}")


@pytest.mark.parametrize("doc", DOCS)
def test_tables_figures_and_equations_fit_the_column(audit, doc):
    desktop = audit(doc)["desktop"]
    too_wide = desktop["wide"] + desktop["wideMath"]
    assert not too_wide, f"{doc}: wider than the text column at {DESKTOP} px: {too_wide}"
    assert not desktop["sticking"], f"{doc}: cut off at {DESKTOP} px: {desktop['sticking']}"
    assert not desktop["scrolledOutputs"], (
        f"{doc}: text outputs too wide for the column at {DESKTOP} px: {desktop['scrolledOutputs']}")


def figure_text_px(shown, natural):
    """CSS px of a figure's smallest text (the book style's, ``smallest_text_pt``) when its PNG,
    ``natural`` px wide at the style's dpi, is shown ``shown`` CSS px wide."""
    with plt.rc_context():
        use_book_style()
        dpi = plt.rcParams["savefig.dpi"]
        assert dpi == plt.rcParams["figure.dpi"], "inline figures use figure.dpi, saved ones savefig.dpi"
    return smallest_text_pt() / 72 * dpi * shown / natural


def test_figure_text_px_scales_with_the_shown_width():
    assert figure_text_px(100, 100) == pytest.approx(10.5 / 72 * 110)   # 16.0 px at full size
    assert figure_text_px(672, 8 * 110) == pytest.approx(12.25, abs=0.01)   # 8 in, 672 px column
    assert figure_text_px(672, 8.5 * 110) < MIN_TEXT_PX                       # 8.5 in is too wide


@pytest.mark.parametrize("doc", CHAPTERS)
def test_figure_text_is_at_least_9_pt_as_shown(audit, doc):
    """At 1280 px every figure's smallest text renders at 12 CSS px (9 pt) or more.

    ``test_plotting.py`` checks that no figure sets its text below the book style's sizes
    or changes its dpi, so the style's smallest size, scaled as the page shows the PNG, is
    the smallest text on the page."""
    figures = audit(doc)["figures"]
    made = (HTML / f"{doc}.html").read_text(encoding="utf-8").count('src="../_images/')
    assert len(figures) == made, f"{doc}: {len(figures)} of the {made} cell-made images measured"
    small = [f"{f['where']}: {figure_text_px(f['shown'], f['natural']):.1f} px "
             f"({f['natural']} px PNG shown {f['shown']:.0f} px)"
             for f in figures if figure_text_px(f["shown"], f["natural"]) < MIN_TEXT_PX]
    assert not small, f"{doc}: figure text below {MIN_TEXT_PX} px (9 pt) at {DESKTOP} px: {small}"


@pytest.mark.parametrize("doc", CHAPTERS)
def test_figure_text_is_as_large_as_the_caption_on_a_phone(audit, doc):
    """At 390 px every figure's smallest text is at least as large as its caption's text
    (there the page shows each figure's phone layout, its panels stacked in one column drawn
    about 400 px wide: ``scripts/phone_figures.py``), rather than shrinking an 8-inch
    figure's text to about 6 px."""
    figures = audit(doc)["phone_figures"]
    assert len(figures) == len(audit(doc)["figures"]), f"{doc}: not every figure measured at {PHONE} px"
    small = [f"{f['where']}: {figure_text_px(f['shown'], f['natural']):.1f} px < caption "
             f"{f['caption']:.1f} px ({f['natural']} px PNG shown {f['shown']:.0f} px)"
             for f in figures if figure_text_px(f["shown"], f["natural"]) < f["caption"] - 0.05]
    assert not small, f"{doc}: figure text smaller than the caption at {PHONE} px: {small}"


@pytest.mark.parametrize("doc", CHAPTERS)
def test_figures_stack_their_panels_on_a_phone(audit, doc):
    """At 390 px every figure shows its phone layout (panels stacked, ``-phone.png``), whole
    on the screen: no wider than the column, its right edge inside the viewport, nothing to
    scroll sideways; at 1280 px the page shows the side-by-side layout."""
    phone, desktop = audit(doc)["phone_figures"], audit(doc)["figures"]
    assert [f["where"] for f in phone] == [f["where"] for f in desktop]
    wrong = [f"{f['where']}: {f['source']} shown {f['shown']:.0f} px ({f['natural']} px PNG), right edge "
             f"{f['right']:.0f} of {f['viewport']} px{', scrolls sideways' if f['scrolls'] else ''}"
             for f in phone if not f["source"].endswith("-phone.png") or f["right"] > f["viewport"] + 0.5
             or f["left"] < -0.5 or f["scrolls"] or f["shown"] > f["natural"] + 0.5]
    assert not wrong, f"{doc}: figures not stacked into the screen at {PHONE} px: {wrong}"
    side_by_side = [f["where"] for f in desktop if f["source"].endswith("-phone.png")]
    assert not side_by_side, f"{doc}: the phone layout shown at {DESKTOP} px: {side_by_side}"


@pytest.mark.parametrize("doc", DOCS)
def test_printouts_do_not_wrap_on_a_phone(audit, doc):
    wrapped = audit(doc)["phone_wrapped"]
    assert not wrapped, f"{doc}: printouts wrapped at {PHONE} px (they should scroll): {wrapped}"


@pytest.mark.parametrize("doc", CHAPTERS)
def test_figures_are_unfiltered_on_white_in_dark_mode(audit, doc):
    """The theme's dark mode dims images (``filter: brightness(.8) contrast(1.2)``); figures
    keep their colours on the white panel that ``custom.css`` gives them."""
    made = (HTML / f"{doc}.html").read_text(encoding="utf-8").count('src="../_images/')
    for mode in ("light", "dark"):
        figures = audit(doc)[f"figures_{mode}"]
        assert len(figures) == made, f"{doc}: {len(figures)} of the {made} cell-made images measured in {mode} mode"
        wrong = [f"{f['where']}: filter {f['filter']}, background {f['background']}" for f in figures
                 if f["filter"] != "none" or (mode == "dark" and f["background"] != "rgb(255, 255, 255)")]
        assert not wrong, f"{doc}: figures drawn with a filter or off the white panel in {mode} mode: {wrong}"


@pytest.mark.parametrize("doc", DOCS)
def test_table_headers_meet_contrast_aa(audit, doc):
    for mode in ("light", "dark"):
        poor = [c for c in audit(doc)[f"contrast_{mode}"] if c["ratio"] < 4.5]
        assert not poor, f"{doc}: table headers below 4.5:1 in {mode} mode: {poor[:4]}"


@pytest.mark.parametrize("doc", DOCS)
def test_no_object_reprs_in_outputs(audit, doc):
    reprs = OBJECT_REPR.findall(audit(doc)["text"])
    assert not reprs, f"{doc}: the page shows object reprs (a cell's stray last value?): {reprs}"


@pytest.mark.parametrize("doc", DOCS)
def test_no_accessibility_violations(audit, doc):
    if not AXE.is_file():
        pytest.skip("axe-core is not installed: run `npm ci --ignore-scripts` (make test does)")
    for mode in ("light", "dark"):
        found = audit(doc)[f"axe_{mode}"]
        assert not found, f"{doc}: axe-core finds WCAG 2 A/AA violations in {mode} mode: {found}"


@pytest.mark.parametrize("doc", DOCS)
def test_one_search_box_and_a_favicon(audit, doc):
    report = audit(doc)
    assert len(report["search_boxes"]) == 1, f"{doc}: search boxes shown: {report['search_boxes']}"
    favicon = report["favicon"]
    assert favicon and favicon["ok"], f"{doc}: no favicon that loads: {favicon}"
    assert not report["errors"], f"{doc}: console errors while audited: {report['errors']}"


def test_search_results_quote_no_raw_tex(browser, site):
    """The search page's snippets come from the pages' HTML, where formulas are still TeX."""
    context, page, log = open_page(browser, f"{site}/search.html?q=rotation+frequency")
    try:
        page.wait_for_selector("#search-results ul.search li p.context", timeout=20_000)
        page.wait_for_function("() => !document.querySelector('#search-progress')"
                               " || !document.querySelector('#search-progress').textContent"
                               ".includes('Preparing')", timeout=20_000)
        snippets = page.locator("#search-results ul.search li p.context").all_inner_texts()
        assert snippets, "the search found nothing for 'rotation frequency'"
        raw = [s for s in snippets if RAW_TEX.search(s) or re.search(r"\\[A-Za-z]{2,}", s)]
        assert not raw, f"search snippets with raw TeX: {raw[:3]}"
        assert not log.errors, f"console errors on the search page: {log.errors}"
    finally:
        context.close()
