"""Feedback pages and formgrader views render a hostile submission inert (no browser, no kernel).

The notebooks of :mod:`tests.grader.hostile_pages` (every payload family, with the outputs
their code makes baked in) are rendered with the course's nbgrader configuration through
nbgrader's ``feedback`` and ``formgrade`` templates and nbconvert's ``classic`` and ``lab``
(``feedback`` also through the worker's :class:`FeedbackExporter`);
an HTML parser then lists whatever could run or load. The same renders without the course's
sanitizing settings are the control: there, the payloads are live. The real browser, a real
grading run and a live formgrader are in ``tests/grader/test_formgrader_browser.py``.
"""

import base64
import copy
import functools
import hashlib
import re
import shutil
from collections import Counter
from pathlib import Path

import nbformat
import nbgrader
import pytest
from bs4 import BeautifulSoup
from nbconvert.exporters import HTMLExporter
from traitlets.config import Config

from autograder.core.nbgrader_config import course_config
from autograder.core.sanitize import ALLOWED_CLASSES, ID_PREFIX, clean_html, markdown2html
from autograder.host.release import generate
from autograder.core.feedback_page import (CONTENT_SECURITY_POLICY, MATHJAX_CONFIG, NO_DESCRIPTION,
                                        FeedbackExporter, rewrite_feedback_html)
from autograder.worker.pipeline import explanation_page
from autograder.core.results import Status, StudentResult
from tests.grader import hostile_pages as hostile

REPO = Path(__file__).resolve().parents[3]
TOY = REPO / "tests" / "fixtures" / "course" / "solutions" / "toy"
HIT = "http://127.0.0.1:9"
NBGRADER_TEMPLATES = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader" / "templates"
RESOURCES = {"nbgrader": {"notebook": "toy", "score": 6, "max_score": 7, "late_penalty": 0},
             "base_url": "", "assignment_id": "toy", "notebook_id": "toy", "submission_id": "x",
             "index": 0, "total": 1, "student": "s", "notebook_path": "toy.ipynb"}


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    source = nbformat.read(TOY / "toy.ipynb", as_version=4)
    shutil.copytree(TOY, root / "solutions" / "toy")
    release = nbformat.read(generate("toy", root, release_dir=root / "rel") / "toy.ipynb", as_version=4)
    outputs = hostile.hostile_outputs(source, release, HIT)
    outputs.cells[-1].outputs = hostile.baked_outputs(HIT)
    honest = hostile.honest(source, release)
    plain = copy.deepcopy(honest)
    honest.cells[-1].outputs = [nbformat.v4.new_output(
        "display_data", data={"image/png": base64.b64encode(hostile.png()).decode(), "text/plain": "<Image>"})]
    return root, {"honest": honest, "plain": plain,
                  "markdown": hostile.hostile_markdown(source, release, HIT),
                  "outputs": outputs, "cells": hostile.hostile_cells(source, release, HIT)}


@functools.lru_cache(maxsize=None)
def exporter(root, template, sanitized):
    """One exporter per template and setting (compiling the templates costs a second each).

    ``worker-feedback``: the ``feedback`` template through the worker's ``FeedbackExporter``.
    """
    c = course_config(root) if sanitized else Config()
    cls = FeedbackExporter if template == "worker-feedback" else HTMLExporter
    template = "feedback" if template == "worker-feedback" else template
    c.HTMLExporter.template_name = template
    if template in ("feedback", "formgrade"):  # as nbgrader's GenerateFeedback and formgrader set them
        c.HTMLExporter.extra_template_basedirs = [str(NBGRADER_TEMPLATES)]
        c.HTMLExporter.extra_template_paths = [str(NBGRADER_TEMPLATES.parent / "static" / "node_modules"
                                                   / "bootstrap" / "dist" / "css")]
    return cls(config=c)


def render(root, nb, template, sanitized=True):
    nb = nbformat.from_dict(copy.deepcopy(nb))
    for cell in nb.cells:  # the scores nbgrader's GetGrades puts in for the feedback template
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            meta["score"] = meta.get("points", 0)
    page, _ = exporter(root, template, sanitized).from_notebook_node(nb, resources=dict(RESOURCES))
    return page


def findings(page):
    """What could run or load, less what every page of the template has (its own scripts)."""
    return hostile.active_content(page, allowed=("https://cdnjs.cloudflare.com/ajax/libs/mathjax/",
                                                 "/formgrader/static/", "https://cdnjs.cloudflare.com/ajax/libs/require.js/",
                                                 "https://cdnjs.cloudflare.com/ajax/libs/jquery/"))


TEMPLATES = ["feedback", "worker-feedback", "formgrade", "classic", "lab"]


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("who", ["markdown", "outputs", "cells"])
def test_hostile_notebook_renders_inert(notebooks, template, who):
    root, nbs = notebooks
    baseline = set(findings(render(root, nbs["honest"], template)))
    page = render(root, nbs[who], template)
    assert set(findings(page)) <= baseline, sorted(set(findings(page)) - baseline)
    assert not re.search(r"<script[^>]*>[^<]*pwned", page), "a payload script survived"


def _names(page):
    soup = BeautifulSoup(page, features="html.parser")
    return (Counter(el["id"] for el in soup.select("[id]")),
            Counter((el.name, a) for el in soup.select("[name], [for]") for a in ("name", "for") if el.has_attr(a)),
            {c for el in soup.select("[class]") for c in el["class"]})


@pytest.mark.parametrize("template", TEMPLATES)
def test_student_content_names_no_element_and_wears_no_style(notebooks, template):
    """The written answer's headings, ids, labels and classes (:data:`hostile.NAMES`) add only
    ``user-content-`` ids and inert classes to the page: nothing a script or style of the page acts on."""
    root, nbs = notebooks
    ids, named, classes = _names(render(root, nbs["honest"], template))
    hostile_ids, hostile_named, hostile_classes = _names(render(root, nbs["markdown"], template))
    added = hostile_ids - ids
    assert added and all(i.startswith((ID_PREFIX, "cell-id=")) for i in added), sorted(added)  # the template prefixes cell ids
    assert {f"{ID_PREFIX}{i}" for i in ("test_add_hidden", "test_softmax_visible", "statusmessage")} <= set(added)
    assert all(hostile_ids[i] == ids[i] for i in hostile.PAGE_IDS), {i: hostile_ids[i] for i in hostile.PAGE_IDS}
    assert hostile_named == named
    inert = set().union(*ALLOWED_CLASSES.values())
    assert hostile_classes - classes <= inert, sorted(hostile_classes - classes - inert)
    page, own = render(root, nbs["markdown"], template), render(root, nbs["honest"], template)
    assert page.count('href="#test_add_hidden"') == own.count('href="#test_add_hidden"')  # the template's own
    assert f'href="#{ID_PREFIX}test_add_hidden"' in page


@pytest.mark.parametrize("link", ["files/javascript:alert(1)", "/files/JaVaScRiPt:alert(1)",
                                  "files/java&#9;script:alert(1)", "files/data:text/html;base64,PHNjcmlwdD4=",
                                  "files/files/javascript:alert(1)", "/files/%6Aavascript:alert(1)"])
def test_the_sanitizer_runs_after_strip_files_prefix(notebooks, link):
    """nbgrader's templates write ``markdown2html | strip_files_prefix``: the cleaning comes last."""
    root, _ = notebooks
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"[a]({link}) <a href=\"{link}\">b</a>")])
    empty = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("[a](#x) b")])
    for template in TEMPLATES:
        page, own = render(root, nb, template), render(root, empty, template)
        assert set(findings(page)) <= set(findings(own)), (template, link)
        assert page.lower().count("script:") == own.lower().count("script:"), (template, link)


@pytest.mark.parametrize("who", ["plain", "honest", "markdown", "outputs", "cells"])
def test_the_worker_exporter_makes_nbconverts_page(notebooks, who):
    """``FeedbackExporter`` skips ``HTMLExporter``'s BeautifulSoup pass only where it changes nothing.

    A page with an image gets the pass (the same bytes as ``HTMLExporter``'s); a page without
    one is ``HTMLExporter``'s page before its re-serialization.
    """
    root, nbs = notebooks
    ours, stock = render(root, nbs[who], "worker-feedback"), render(root, nbs[who], "feedback")
    if who == "plain":
        assert "<img" not in ours and ours != stock
        assert str(BeautifulSoup(ours, features="html.parser")) == stock
    else:
        assert "<img" in ours and ours == stock
    if who == "honest":
        assert f'alt="{NO_DESCRIPTION}"' in ours  # the plot the student's code drew


@pytest.mark.parametrize("template", ["feedback", "formgrade"])
def test_without_the_course_settings_the_payloads_are_live(notebooks, template):
    """The control: nbgrader's templates as shipped render the same notebooks with live payloads."""
    root, nbs = notebooks
    baseline = set(findings(render(root, nbs["honest"], template, sanitized=False)))
    live = set()
    for who in ("markdown", "outputs", "cells"):
        live |= set(findings(render(root, nbs[who], template, sanitized=False))) - baseline
    assert {"<img onerror>", "<iframe>", "<base>", "<object>", "<embed>"} <= live, live


def test_honest_content_survives(notebooks):
    root, nbs = notebooks
    page = render(root, nbs["honest"], "feedback")
    assert 'src="data:image/png;base64,' in page
    assert "\\sigma(x)_i" in page and "$$e^{x_i - m} \\le 1.$$" in page
    md = ("# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n`x < y` and $a<b$ and [docs](https://example.org)\n\n"
          "![dot](data:image/png;base64,iVBORw0KGgo=)")
    html = markdown2html({"cell": {}}, md)
    for kept in ("<h1", "<table>", "<th>", "<code>x &lt; y</code>", "$a&lt;b$",
                 'href="https://example.org"', 'src="data:image/png;base64,iVBORw0KGgo="'):
        assert kept in html, (kept, html)


@pytest.mark.parametrize("name, payload", hostile.MARKDOWN)
def test_each_markdown_payload_alone(name, payload):
    text = payload.format(js=hostile.marker_js(name, HIT), hit=HIT)
    assert hostile.active_content(markdown2html({"cell": {}}, text)) == []
    assert hostile.active_content(clean_html(text)) == []


def test_feedback_pages_carry_a_strict_policy():
    page = rewrite_feedback_html("<html><head><meta charset='utf-8'>\n<!-- Load mathjax -->x<!-- End of mathjax "
                  "configuration --></head><body><p>hi</p></body></html>", nbformat.v4.new_notebook())
    head = page[:page.index("</head>")]
    assert head.index("Content-Security-Policy") < head.index("<script")
    assert rewrite_feedback_html(page, nbformat.v4.new_notebook()) == page  # rewriting again changes nothing
    digest = base64.b64encode(hashlib.sha256(MATHJAX_CONFIG.encode()).digest()).decode()
    assert f"<script>{MATHJAX_CONFIG}</script>" in page and f"'sha256-{digest}'" in CONTENT_SECURITY_POLICY
    for directive in ("default-src 'none'", "base-uri 'none'", "form-action 'none'", "img-src 'self' data:"):
        assert directive in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY.split("script-src")[1].split(";")[0]
    result = StudentResult(student="s", status=Status.UNREADABLE, message='<img src=x onerror="alert(1)">')
    page = explanation_page("s", "toy", result).decode()
    assert "Content-Security-Policy" in page and hostile.active_content(page) == []


def test_the_formgrader_policy_allows_only_the_templates_own_scripts(notebooks):
    """The submission view's policy hashes the inline scripts that stand before the notebook
    (nbgrader's template) and nothing after it: a script that got into the notebook would not run."""
    import base64 as b64

    from autograder.core.formgrader_policy import NOTEBOOK_START, submission_view_policy

    root, nbs = notebooks
    page = render(root, nbs["honest"], "formgrade")
    policy = submission_view_policy(page)
    script_src = policy.split("script-src")[1].split(";")[0]
    assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src
    template = page[:page.index(NOTEBOOK_START)]
    own = re.findall(r"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", template, re.S)
    assert own and all(f"'sha256-{b64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" in script_src
                       for s in own)
    planted = page.replace(NOTEBOOK_START, NOTEBOOK_START + "><script>window.pwned=1</script", 1)
    digest = b64.b64encode(hashlib.sha256(b"window.pwned=1").digest()).decode()
    assert digest not in submission_view_policy(planted) and digest not in policy
    assert "frame-src" not in policy and "default-src 'none'" in policy and "form-action 'none'" in policy
