"""The chapters a reader downloads: notebooks that read and run like their pages.

* Fast, on the built site: every chapter page offers ``<chapter>-chapter.ipynb`` (never the
  name of an exercise notebook); the file holds no MyST syntax (checked with MyST's own
  parser: no role, directive, target or glued placeholder), its display math is ``$$``
  numbered as on the page, every quick-check answer is folded in ``<details>``, every value
  the page pastes into the text is in it, its stored outputs are plain MIME types that
  JupyterLab renders, and it shows as many figures and tables as the page.
* The converter itself (``scripts/chapter_notebook.py``) on small MyST texts: links when the
  site's address is known, an error for MyST it has no Markdown form for.
* ``browser``: every download link of the site saves its file in Chromium, from the site
  served on 127.0.0.1 and from the site opened from disk (``file://``).
* ``slow`` and ``browser``: JupyterLab 4 from the learner environment (the venv made from the
  site's downloads, ``tests/book/test_learner_env.py``) on 127.0.0.1, one server and one
  headless Chromium for all chapters: each downloaded chapter, as downloaded, shows no MyST
  syntax, typeset math and folded answers; then *Run All* in the learner kernel, two
  chapters at a time, shows as many figures and tables as the chapter's page.
"""

import re
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest
import yaml
from bs4 import BeautifulSoup
from myst_parser.config.main import MdParserConfig

from scripts.chapter_notebook import (
    Book,
    ConversionError,
    MarkdownConverter,
    _walk,
    download_name,
    markdown_parser,
)
from tests.book.test_learner_env import jupyterlab, learner  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
CHROMIUM = Path("/usr/bin/chromium")
CHAPTERS = sorted(path.stem for path in (ROOT / "chapters").glob("*.md"))
# MyST's parser with the book's extensions (colon fences, dollar math, ...), as in the build
MD = markdown_parser(MdParserConfig(enable_extensions=set(yaml.safe_load(
    (ROOT / "_config.yml").read_text())["parse"]["myst_enable_extensions"])))
# What would show MyST to a reader: a role, a directive fence, a target, a colon fence.
MYST_TEXT = re.compile(r"\{[\w:+-]+\}`|```\{|^\s*:::|^\s*\([\w-]+\)=\s*$", re.M)


def built(path):
    if not path.is_file():
        pytest.skip("the book is not built: run `make book` first")
    return path


def page(stem):
    return BeautifulSoup(built(HTML / "chapters" / f"{stem}.html").read_text(encoding="utf-8"),
                         "html.parser")


def download_link(stem):
    """The path the chapter page's notebook button links to."""
    links = page(stem).select("a.btn-download-notebook-button")
    assert len(links) == 1, f"{stem}: {len(links)} notebook buttons"
    return (HTML / "chapters" / unquote(urlsplit(links[0]["href"]).path)).resolve()


def download(stem):
    return nbformat.read(download_link(stem), as_version=4)


def page_counts(stem):
    """(figures, tables) in the page's article."""
    article = page(stem).find("article")
    return len(article.select("img")), len(article.select("table"))


def notebook_counts(notebook):
    """(figures, tables) the notebook shows: PNG outputs; tables of Markdown cells and of
    Markdown or HTML outputs."""
    figures = tables = 0
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            tables += sum(token.type == "table_open" for token in MD.parse(cell.source))
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            figures += "image/png" in data
            tables += sum(token.type == "table_open"
                          for token in MD.parse(data.get("text/markdown", "")))
            tables += data.get("text/html", "").count("<table")
    return figures, tables


def myst_left(text):
    """The MyST constructs MyST's parser finds in ``text`` (empty for plain Markdown)."""
    found = []
    for token in MD.parse(text):
        if token.type in ("fence", "colon_fence") and token.info.strip().startswith("{"):
            found.append(f"directive {token.info.strip()}")
        elif token.type.startswith("myst_") or token.type == "colon_fence":
            found.append(token.type)
        for child in _walk(token.children or []):
            if child.type == "myst_role":
                found.append(f"{{{child.meta['name']}}}`{child.content}`")
    return found


def source_counts(stem):
    """(dropdown admonitions, {math} directives) of the chapter's MyST source."""
    dropdowns = maths = 0
    for token in MD.parse((ROOT / "chapters" / f"{stem}.md").read_text(encoding="utf-8")):
        info = token.info.strip() if token.type in ("fence", "colon_fence") else ""
        maths += info.startswith("{math}")
        dropdowns += info.startswith("{admonition}") and re.search(
            r"^:class:.*\bdropdown\b", token.content, re.M) is not None
    return dropdowns, maths


# -- the files on the built site ------------------------------------------------------------
def test_chapter_downloads_are_named_apart_from_the_exercises():
    exercise_names = set()
    for exercise in sorted(built(HTML / "exercises" / "01-rope.html").parent.glob("*.html")):
        soup = BeautifulSoup(exercise.read_text(encoding="utf-8"), "html.parser")
        exercise_names |= {Path(unquote(urlsplit(a["href"]).path)).name
                           for a in soup.select("a.download")}
    assert {"01-rope.ipynb", "06-flash-attention.ipynb"} <= exercise_names
    names = [download_link(stem).name for stem in CHAPTERS]
    assert names == [download_name(f"chapters/{stem}") for stem in CHAPTERS]
    assert names == [f"{stem}-chapter.ipynb" for stem in CHAPTERS]
    assert not set(names) & exercise_names
    # no notebook under a chapter's old name is left in the site
    assert sorted(path.name for path in (HTML / "_sources" / "chapters").glob("*.ipynb")) == names


@pytest.mark.parametrize("stem", CHAPTERS)
def test_download_reads_like_the_page(stem):
    notebook = download(stem)
    nbformat.validate(notebook)
    markdown = [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]
    outputs = [output for cell in notebook.cells if cell.cell_type == "code"
               for output in cell.outputs]
    shown_markdown = [output["data"]["text/markdown"] for output in outputs
                      if "text/markdown" in output.get("data", {})]
    for text in markdown + shown_markdown:
        assert not myst_left(text), myst_left(text)
        assert not MYST_TEXT.search(text), MYST_TEXT.search(text).group(0)
        assert "{glue" not in text
    # outputs JupyterLab renders: no papermill records, no lab whose sliders need the site
    for output in outputs:
        assert not any(mime.startswith("application/papermill") for mime in output.get("data", {}))
        assert 'class="tr-lab"' not in output.get("data", {}).get("text/html", "")
    # answers folded, display math as $$ numbered as on the page
    text = "\n\n".join(markdown)
    dropdowns, maths = source_counts(stem)
    assert text.count("<details>") == text.count("</details>") == dropdowns
    assert len(re.findall(r"^\s*\$\$\s*$", text, re.M)) == 2 * maths
    soup = page(stem)
    page_numbers = [re.search(r"\((.*?)\)", span.get_text()).group(1)
                    for span in soup.select("div.math span.eqno")]
    assert re.findall(r"\\tag\{([\d.]+)\}", text) == page_numbers
    # every value the page pastes into its text is there, as the page shows it
    for pasted in soup.find("article").select("span.pasted-text"):
        assert pasted.get_text() in text, pasted.get_text()
    # figures and tables: as many as the page shows
    assert notebook_counts(notebook) == page_counts(stem)
    # the code runs without the book's build: no MyST-NB import left, stand-ins defined
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert "myst_nb" not in code and "def glue(" in code
    assert "jupytext" not in notebook.metadata


def test_citations_read_as_on_the_page_with_references_at_the_end():
    notebook = download("01-rope")
    assert "This is the\nRoPE of (Su et al., 2021)." in notebook.cells[0].source
    references = notebook.cells[-1].source
    assert references.startswith("## References")
    assert "**Su et al., 2021.**" in references and "arxiv.org/abs/2104.09864" in references
    cited = re.findall(r"\*\*([^*]+)\.\*\*", references)
    text = "\n".join(cell.source for cell in notebook.cells[:-1] if cell.cell_type == "markdown")
    assert all(label in text for label in cited)
    # the page cites the same entries with the same labels
    on_page = {a.get_text() for a in page("01-rope").select("span.bibtex-citation a")}
    assert set(cited) == on_page


# -- the converter ----------------------------------------------------------------------------
def small_book(base_url=""):
    return Book(
        docname="chapters/09-test", title="A test chapter", base_url=base_url,
        glue={"n": {"text/plain": "1234.5678"}, "fig": {"image/png": "x", "text/plain": "<Figure>"}},
        figures={"fig-a": "9.1"}, equations={"eq-a": "9.2"},
        labels={"sec-a": ("chapters/09-test", "sec-a", "A section")},
        titles={"exercises/09-test": "Exercise 9"}, terms={"rope": "term-RoPE"},
        citations={"su2021": ("Su et al., 2021", "Su. *RoFormer*."),
                   "xiong2020": ("Xiong et al., 2020", "Xiong. *Pre-norm*.")})


SMALL = """\
(sec-a)=
## Values

We got {glue:text}`n:,.1f` from {cite}`su2021,xiong2020`; {cite:t}`xiong2020` said so, see
{numref}`fig-a`, {eq}`eq-a`, {ref}`sec-a`, {term}`RoPE` and {doc}`../exercises/09-test`.
Code stays code: `{term}`x``.

```{math}
:label: eq-a
a = b

c
```

```{glue:figure} fig
:name: fig-a

The caption, {glue:text}`n:.0f`.
```

1. A question?

   :::{admonition} Answer
   :class: dropdown
   Yes, {term}`RoPE`.
   :::

:::{admonition} Careful
Plain.
:::
"""


def test_converter_writes_plain_markdown():
    converter = MarkdownConverter(small_book(), MD)
    out = converter.convert(SMALL)
    assert not myst_left(out.replace("`{term}`x``", "")), myst_left(out)
    assert "We got 1,234.6 from (Su et al., 2021; Xiong et al., 2020); Xiong et al. (2020) said" in out
    assert "see\nFig. 9.1, Eq. 9.2, A section, RoPE and Exercise 9." in out
    assert "Code stays code: `{term}`x``." in out
    assert "$$\na = b\nc\n\\tag{9.2}\n$$" in out
    assert "**Fig. 9.1** The caption, 1235." in out
    assert ("   <details>\n   <summary>Answer</summary>\n\n   Yes, RoPE.\n\n   </details>"
            in out)
    assert "> **Careful**\n>\n> Plain." in out
    assert "(sec-a)=" not in out and out.startswith("## Values")
    assert converter.cited == ["su2021", "xiong2020"]


def test_converter_links_to_the_site_when_its_address_is_known():
    out = MarkdownConverter(small_book("https://example.org/book/"), MD).convert(SMALL)
    assert "[RoPE](https://example.org/book/glossary.html#term-RoPE)" in out
    assert "[Exercise 9](https://example.org/book/exercises/09-test.html)" in out
    assert "[A section](https://example.org/book/chapters/09-test.html#sec-a)" in out


@pytest.mark.parametrize("text, named", [
    ("A {kbd}`Ctrl`.", "{kbd}"), ("```{figure} a.png\n```", "{figure}"),
    ("{glue:text}`missing`", "missing"), ("{cite}`nobody`", "nobody"),
    ("{eq}`nowhere`", "nowhere")])
def test_converter_refuses_myst_it_cannot_write_out(text, named):
    with pytest.raises(ConversionError, match=re.escape(named)):
        MarkdownConverter(small_book(), MD).convert(text)


# -- saving the downloads, served and from disk --------------------------------------------
def download_links():
    """(page, CSS selector of the link, the file it must save) for the site's downloads."""
    cases = [("chapters/01-rope.html", "a.btn-download-notebook-button",
              HTML / "_sources" / "chapters" / "01-rope-chapter.ipynb"),
             ("chapters/01-rope.html", "a.btn-download-source-button",
              HTML / "_sources" / "chapters" / "01-rope.md")]
    for name, selector in (("exercises/01-rope.html", "a.download"),
                           ("run-yourself.html", "a.download")):
        soup = BeautifulSoup(built(HTML / name).read_text(encoding="utf-8"), "html.parser")
        for index, link in enumerate(soup.select(selector)):
            target = (HTML / name).parent / unquote(urlsplit(link["href"]).path)
            cases.append((name, f"{selector} >> nth={index}", target.resolve()))
    return cases


@pytest.mark.browser
def test_every_download_link_saves_its_file_served_and_from_disk():
    if not CHROMIUM.is_file():
        pytest.skip("Chromium not found at /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from tests.book.test_site_browser import CHROMIUM_FLAGS

    cases = download_links()
    assert len(cases) >= 6   # notebook and source of a chapter, the exercise, three set-up files
    handler = functools.partial(type("Quiet", (SimpleHTTPRequestHandler,),
                                     {"log_message": lambda *a: None}), directory=str(HTML))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    bases = [f"http://127.0.0.1:{server.server_address[1]}/", HTML.as_uri() + "/"]
    saved = []
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                                 args=CHROMIUM_FLAGS)
            try:
                context = browser.new_context(accept_downloads=True)
                for base in bases:
                    for name, selector, target in cases:
                        tab = context.new_page()
                        tab.goto(base + name, wait_until="load")
                        link = tab.locator(selector)
                        if not link.is_visible():   # the theme's buttons: in the download menu
                            tab.locator(".dropdown-download-buttons > button").click()
                        with tab.expect_download(timeout=20_000) as info:
                            link.click()
                        got = Path(info.value.path()).read_bytes()
                        assert info.value.suggested_filename == target.name, (base, name)
                        assert got == target.read_bytes(), (base, name, target.name)
                        assert tab.url == base + name     # nothing opened in its place
                        saved.append((base[:4], target.name))
                        tab.close()
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert len(saved) == 2 * len(cases)


# -- the chapters in JupyterLab, as downloaded and after Run All -----------------------------
TYPESET_JS = """() => {
  const root = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const md = [...root.querySelectorAll('.jp-MarkdownCell .jp-RenderedMarkdown, .jp-OutputArea-output')];
  const text = md.map(el => {
    const copy = el.cloneNode(true);
    copy.querySelectorAll('code, pre, mjx-container, .MathJax, script, style').forEach(x => x.remove());
    return copy.textContent;
  }).join('\\n');
  const details = [...root.querySelectorAll('.jp-RenderedMarkdown details')];
  return {
    text,
    math: root.querySelectorAll('.jp-RenderedMarkdown mjx-container').length,
    displayMath: root.querySelectorAll('.jp-RenderedMarkdown mjx-container[display="true"]').length,
    mathErrors: root.querySelectorAll('mjx-merror').length,
    details: details.length,
    open: details.filter(d => d.open).length,
    answersShown: details.filter(d => [...d.children].some(
        c => c.tagName !== 'SUMMARY' && c.checkVisibility())).length,
    figures: root.querySelectorAll('.jp-OutputArea-output img').length,
    tables: root.querySelectorAll('.jp-RenderedMarkdown table, .jp-OutputArea-output table').length,
  };
}"""


def wait_typeset(tab, timeout=120):
    """Wait until every Markdown cell is rendered and MathJax has typeset the page."""
    start = time.monotonic()
    last = None
    while time.monotonic() < start + timeout:
        state = tab.evaluate(TYPESET_JS)
        if state == last and (state["math"] > 0 or time.monotonic() > start + 20):
            return state
        last = state
        tab.wait_for_timeout(1000)
    return last


def run_all_finished(tab, path, timeout=480):
    """The notebook as JupyterLab saves it once Run All has run every code cell or stopped at
    an error (saved every few seconds; the copy it opened had no execution counts)."""
    deadline = time.monotonic() + timeout
    while True:
        tab.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^File$")).click()
        tab.locator(".lm-Menu-itemLabel", has_text=re.compile("^Save Notebook$")).click()
        tab.wait_for_timeout(3000)   # Playwright's wait: the page's requests go on meanwhile
        try:
            notebook = nbformat.read(path, as_version=4)
        except nbformat.reader.NotJSONError:   # read mid-save: Jupyter writes the file in place
            assert time.monotonic() < deadline, f"{path.name}: no whole save in {timeout} s"
            continue
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        if all(cell.execution_count for cell in code) or any(
                output.output_type == "error" for cell in code for output in cell.outputs):
            return notebook
        assert time.monotonic() < deadline, f"{path.name}: Run All unfinished after {timeout} s"


@pytest.mark.slow
@pytest.mark.browser
def test_downloaded_chapters_read_and_run_in_jupyterlab(jupyterlab):  # noqa: F811
    if not CHROMIUM.is_file():
        pytest.skip("Chromium not found at /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    from tests.book.test_site_browser import loopback_chromium

    base, token, work = jupyterlab
    expected = {}
    for stem in CHAPTERS:
        # as downloaded, but with no execution counts: a count then says a cell ran here
        notebook = download(stem)
        for cell in notebook.cells:
            if cell.cell_type == "code":
                cell.execution_count = None
                for output in cell.outputs:
                    if output.output_type == "execute_result":
                        output.execution_count = None
        nbformat.write(notebook, work / download_name(f"chapters/{stem}"))
        expected[stem] = (page_counts(stem), source_counts(stem))
    order = sorted(CHAPTERS, key=lambda s: -(work / download_name(f"chapters/{s}")).stat().st_size)
    report = {}
    with loopback_chromium() as chromium:
        with chromium.new_context(viewport={"width": 1280, "height": 900}) as context:
            for pair in (order[i:i + 2] for i in range(0, len(order), 2)):
                tabs = {}
                for stem in pair:   # open both, check them as downloaded, start Run All
                    tab = context.new_page()
                    # a workspace of its own: the two tabs must not restore each other's notebook
                    tab.goto(f"{base}/lab/workspaces/{stem}/tree/"
                             f"{download_name(f'chapters/{stem}')}?reset&token={token}")
                    tab.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
                    sync_api.expect(tab.locator(".jp-StatusBar-Widget", has_text="| Idle")
                                    ).to_be_visible(timeout=120_000)
                    news = tab.get_by_role("button", name="No", exact=True)
                    if news.count():
                        news.click()
                    before = wait_typeset(tab)
                    (figures, tables), (dropdowns, maths) = expected[stem]
                    found = MYST_TEXT.search(before["text"])
                    assert not found, (stem, found.group(0))
                    assert "{glue" not in before["text"] and "$$" not in before["text"], stem
                    assert before["displayMath"] >= maths and before["mathErrors"] == 0, (stem, before)
                    assert (before["details"], before["open"], before["answersShown"]) == (
                        dropdowns, 0, 0), (stem, before)
                    assert (before["figures"], before["tables"]) == (figures, tables), (stem, before)
                    if dropdowns:   # a click on "Answer" shows it
                        answer = tab.locator(".jp-NotebookPanel:not(.lm-mod-hidden) "
                                             ".jp-RenderedMarkdown details").first
                        sync_api.expect(answer.locator("p").first).to_be_hidden()
                        answer.locator("summary").click()
                        sync_api.expect(answer.locator("p").first).to_be_visible()
                    tab.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
                    tab.locator(".lm-Menu-itemLabel",
                                has_text=re.compile("^Run All Cells$")).click()
                    tabs[stem] = tab
                for stem, tab in tabs.items():
                    start = time.monotonic()
                    ran = run_all_finished(tab, work / download_name(f"chapters/{stem}"))
                    errors = [output.get("ename") for cell in ran.cells
                              for output in cell.get("outputs", []) if output.output_type == "error"]
                    assert not errors, (stem, errors)
                    after = wait_typeset(tab)
                    (figures, tables), _ = expected[stem]
                    report[stem] = (after["figures"], after["tables"], figures, tables,
                                    round(time.monotonic() - start))
                    # in the page JupyterLab shows and in the notebook it saved
                    assert (after["figures"], after["tables"]) == (figures, tables), (stem, after)
                    assert notebook_counts(ran) == (figures, tables), stem
                    assert not MYST_TEXT.search(after["text"]) and after["mathErrors"] == 0, stem
                    tab.close()
    print("\nafter Run All (figures, tables, page figures, page tables, s):", report)
    assert sorted(report) == sorted(CHAPTERS)
    assert not chromium.offsite, chromium.offsite
