r"""A feedback page a student can read: one way to render it, one way to finish it.

Every feedback page the grader writes, by a grading worker after autograding or by the host's
``feedback`` command after manual grading, is rendered by :func:`render_feedback` (nbgrader's
``GenerateFeedback`` through one :class:`FeedbackExporter` per process) and finished by
:func:`rewrite_feedback_html`. nbgrader's feedback template lists every test as "Test cell",
shows an ungraded written answer as 0 points, loads MathJax 2 from a CDN and lets long messages
run off the page. :func:`rewrite_feedback_html` rewrites the rendered page:

* each test in the table of contents is named by its grade id and its title (the
  first comment line of the cell, e.g. "Hidden tests: several sizes and bases");
* a written answer that still needs a manual grade says "to be graded by hand";
* the late penalty line says how late, under which policy and what it took
  (:func:`autograder.core.policy.late_note`);
* error messages and outputs wrap; the page reads on a phone (:data:`PAGE_CSS`: at 390 px each
  cell's score stays in view and nothing scrolls sideways) and follows a dark system theme;
* MathJax 3 comes from ``feedback/_mathjax`` (copied there by :func:`install_mathjax`
  from the pinned ``sphinx-mathjax-offline`` package, with every TeX extension it autoloads:
  ``\boldsymbol``, ``\color``, ``\cancel``...), so math renders offline, with ``textmacros``
  so that text in math reads as written (``\text{inv\_freq}`` shows ``inv_freq``); it runs with its
  ``safe`` extension allowing no URL, class, id or style from TeX (``\href``, ``\class``,
  ``\cssId``, ``\style``, ``\mmlToken[...]``): math cannot name or cover the page;
* the page carries a strict Content-Security-Policy (:data:`CONTENT_SECURITY_POLICY`): only
  the MathJax configuration (by its hash) and files next to the page run, images come only
  from the page itself (``data:``), nothing else is fetched, no form is sent and no
  ``<base>`` counts. The page's HTML is already sanitized when it is rendered
  (:mod:`autograder.core.sanitize`, through the course configuration); the policy makes
  whatever a sanitizer might miss unable to run or to load anything.

Rewriting a finished page again changes nothing.
"""
import base64
import hashlib
import html
import re
import shutil
from pathlib import Path

from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

from .cells import grade_id, is_grade, is_solution

MATHJAX_DIR = "_mathjax"  # under feedback/: pages are feedback/<student>/<assignment>/*.html
MATHJAX_FILES = ("tex-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions", "ui/safe.js")
# the page's own layout (after nbgrader's template styles, so it wins): messages and code wrap;
# on a narrow screen (a phone, 390 px) the prompts go, each cell's heading wraps so its score
# stays in view, and nothing is wider than the screen; a reader whose system is dark
# (prefers-color-scheme) gets dark panels, with code areas inverted so their colours keep contrast
PAGE_CSS = """<meta name="viewport" content="width=device-width, initial-scale=1">
<style id="autograder-page">
:root { color-scheme: light dark; }
.output_area pre, .output_subarea pre, .nbgrader_cell pre { white-space: pre-wrap; word-break: break-word; }
img, svg, video, table { max-width: 100%; }
.output_subarea, .inner_cell, .text_cell_render { min-width: 0; max-width: 100%; }
mjx-container[display="true"] { overflow-x: auto; overflow-y: hidden; max-width: 100%; }
div.nbgrader_cell .panel-heading { height: auto; min-height: 37px; display: flex; flex-wrap: wrap;
  justify-content: space-between; align-items: baseline; column-gap: 1em; }
div.nbgrader_cell .panel-heading::before, div.nbgrader_cell .panel-heading::after { content: none; }
div.nbgrader_cell .panel-heading .pull-right { float: none !important; margin-left: auto; }
@media (max-width: 600px) {
  body { padding-top: 0.5em; }
  .container, #notebook-container { width: auto; padding-left: 4px; padding-right: 4px; }
  .panel-body { padding: 0.4em 0.2em; }
  div.prompt, div.input_prompt, div.output_prompt { display: none; }
  div.cell, div.input, div.output_area { display: block; }
  .input_area pre, .highlight pre { white-space: pre-wrap; word-break: break-word; }
  #toc ol { padding-left: 1.5em; }
}
@media (prefers-color-scheme: dark) {
  body, .panel, .panel-body, .panel-footer, div#notebook, #notebook-container, .container {
    background-color: #16181c; color: #e4e6eb; }
  .panel-default > .panel-heading { background-color: #23262d; color: #e4e6eb; border-color: #3a3f48; }
  .panel-primary > .panel-heading { background-color: #1d3d63; color: #f2f4f8; border-color: #2e5b8f; }
  .panel, .panel-primary, .panel-default { border-color: #3a3f48; }
  a, div.nbgrader_cell .panel-heading a { color: #8ab4f8; }
  .score, li.late-penalty { color: inherit; }
  li.late-penalty { color: #ff8a80; }
  code, kbd { background-color: #2a2d33; color: #f0c5d6; }
  .rendered_html table, .rendered_html th, .rendered_html td, .rendered_html tr { color: #e4e6eb;
    background-color: transparent; border-color: #3a3f48; }
  .rendered_html tbody tr:nth-child(odd) { background-color: #1e2126; }
  .input_area, .output_area pre, .output_subarea pre { filter: invert(1) hue-rotate(180deg); }
  div.output_stderr { background-color: #efd6d6; }
}
</style>"""
# \href is redefined to show its text only: a link made by math is not a link; the safe
# extension drops every URL, class, id and style attribute that TeX makes (\mmlToken included)
MATHJAX_CONFIG = (
    "window.MathJax = {loader: {load: ['ui/safe', '[tex]/textmacros']}, "
    "tex: {packages: {'[+]': ['textmacros']}, inlineMath: [['$', '$'], ['\\\\(', '\\\\)']], "
    "processEscapes: true, macros: {href: ['#2', 2]}}, "
    "options: {ignoreHtmlClass: 'tex2jax_ignore', safeOptions: {allow: "
    "{URLs: 'none', classes: 'none', cssIDs: 'none', styles: 'none'}}}};")
MATHJAX_3 = (f"<script>{MATHJAX_CONFIG}</script>\n"
             f"<script defer src=\"../../{MATHJAX_DIR}/tex-chtml.js\"></script>")
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; "
    f"script-src 'self' 'sha256-{base64.b64encode(hashlib.sha256(MATHJAX_CONFIG.encode()).digest()).decode()}'; "
    "style-src 'unsafe-inline'; img-src 'self' data:; font-src 'self'; "
    "base-uri 'none'; form-action 'none'")
CSP_META = f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">'
MATHJAX_2 = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)


LATE_LINE = re.compile(r'(<li class="late-penalty">Late submission penalty \(Score: -[^)<]*\))\s*</li>')
NO_DESCRIPTION = "No description has been provided for this image"  # HTMLExporter's words


class FeedbackExporter(HTMLExporter):
    """nbconvert's ``HTMLExporter`` for feedback pages, less a parse that changes nothing there.

    ``HTMLExporter.from_notebook_node`` (nbconvert 7.17) renders its template and then parses
    and re-serializes the whole page with BeautifulSoup's ``html.parser``, only to give each
    ``<img>`` without ``alt`` a description and to make the ``lab`` template's cells focusable
    (``tabindex``). nbgrader's ``feedback`` template is ``classic`` (no ``jp-Notebook``), so on
    a page without an image that pass only re-serializes it. This exporter renders the same
    template with the same filters and runs :func:`describe_images`, the same edits, only on a
    page that has an ``<img`` or a ``jp-Notebook``: the same page, either way. Everything a
    submission puts on the page is already escaped or cleaned (:mod:`autograder.core.sanitize`)
    before either.
    """

    def from_notebook_node(self, nb, resources=None, **kw):
        """``(html, resources)``, as ``HTMLExporter.from_notebook_node`` returns them."""
        langinfo = nb.metadata.get("language_info", {})
        lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
        resources = self._init_resources(resources)
        self.register_filter("highlight_code", self.filters.get(
            "highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self)))
        self.register_filter("filter_data_type", WidgetsDataTypeFilter(
            notebook_metadata=self._nb_metadata, parent=self, resources=resources))
        page, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        if "<img" in page or "jp-Notebook" in page:
            page = describe_images(page)
        return page, resources


def describe_images(page):
    """``HTMLExporter``'s own edits of a rendered page: ``alt`` on every image, focusable lab cells."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page, features="html.parser")
    for elem in soup.select("img:not([alt])"):
        elem.attrs["alt"] = NO_DESCRIPTION
    for elem in soup.select(".jp-Notebook div.jp-Cell-inputWrapper, .jp-Notebook div.jp-OutputArea-output"):
        elem.attrs["tabindex"] = "0"
    return str(soup)


class _ProcessExporter:
    """The process's one :class:`FeedbackExporter` (None until the first page is rendered)."""

    exporter = None


def render_feedback(config):
    """nbgrader's ``GenerateFeedback`` for ``config`` (absolute paths) through this process's
    :class:`FeedbackExporter`: the pages, as nbgrader writes them, before
    :func:`rewrite_feedback_html`.

    A new exporter compiles its Jinja templates again; the exporter holds no per-student
    state, so the process keeps the first one.
    """
    from nbconvert.writers import FilesWriter
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory

    converter = GenerateFeedback(coursedir=CourseDirectory(config=config), config=config)
    converter.init_notebooks()
    converter.writer = FilesWriter(parent=converter, config=converter.config)
    if _ProcessExporter.exporter is None:
        exporter = FeedbackExporter(parent=converter, config=converter.config)
        for preprocessor in converter.preprocessors:
            exporter.register_preprocessor(preprocessor)
        _ProcessExporter.exporter = exporter
    converter.exporter = _ProcessExporter.exporter
    converter.convert_notebooks()  # paths are absolute: no chdir needed


def title(cell):
    """A test cell's title: its first comment line, or what its grade id says."""
    for line in cell.source.splitlines():
        text = line.strip()
        if text.startswith("#") and not text.startswith("###"):
            return text.lstrip("# ").rstrip(".")
    return "visible tests" if grade_id(cell).endswith("visible") else "tests"


def rewrite_feedback_html(page, nb, needs_manual=(), late=None):
    """The rendered feedback ``page`` (HTML text) of notebook ``nb``, rewritten as above.

    ``needs_manual``: grade ids of written answers that have no manual grade yet; ``late``:
    the words on its late penalty (:func:`autograder.core.policy.late_note`), or ``None``.
    """
    for cell in nb.cells:
        gid = grade_id(cell)
        if not is_grade(cell) or not gid:
            continue
        anchor = f'<a href="#{gid}">'
        if not is_solution(cell):
            label = f"<code>{html.escape(gid)}</code> {html.escape(title(cell))}"
            page = page.replace(f"{anchor}Test cell</a>", f"{anchor}{label}</a>")
        elif gid in needs_manual:
            page = re.sub(re.escape(anchor) + r"(Written response|Coding free-response)</a> \(Score: [^)]*\)",
                          lambda m: f"{anchor}{m.group(1)}</a> (to be graded by hand)", page)
    if late:  # nbgrader's line ends right after its score: a rewritten page is not matched again
        page = LATE_LINE.sub(lambda m: f"{m.group(1)}: {html.escape(late)}</li>", page, count=1)
    page = MATHJAX_2.sub(lambda _: MATHJAX_3, page, count=1)
    if PAGE_CSS not in _head(page):  # ``feedback --students`` rewrites the other pages again
        page = page.replace("</head>", PAGE_CSS + "\n</head>", 1)
    return with_csp(page)


def _head(page):
    return page[:page.find("</head>")]


def with_csp(page):
    """``page`` with :data:`CSP_META` first in its head, before anything it governs (once)."""
    if CSP_META in _head(page):
        return page
    return re.sub(r"<head[^>]*>", lambda m: m.group() + "\n" + CSP_META, page, count=1)


def install_mathjax(feedback_root):
    """Copy MathJax 3 (script, fonts, TeX extensions, ``safe``) into ``feedback_root/_mathjax`` once."""
    from importlib.metadata import PackageNotFoundError, distribution

    target = Path(feedback_root) / MATHJAX_DIR
    if (target / MATHJAX_FILES[-1]).exists():  # the last file copied: a complete copy
        return
    try:  # the package installs its files under a folder that is not an importable name
        base = Path(distribution("sphinx-mathjax-offline").locate_file(
            "sphinx-mathjax-offline/static/mathjax"))
    except PackageNotFoundError:
        return
    if not base.is_dir():
        return
    for name in MATHJAX_FILES:
        source, dest = base / name, target / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, dest, dirs_exist_ok=True)
        else:
            shutil.copy(source, dest)
