"""The built website in ``_build/html``: complete, self-contained, offline, and free of solutions.

These tests read the site that ``make book`` built (``make test`` builds it first); they
skip with a message when there is no build. The browser checks (pages load, math typesets,
labs respond) are in ``test_site_browser.py``.
"""

import ast
import json
import re
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"

if not (HTML / "index.html").is_file():
    pytest.skip("the book is not built: run `make book` first", allow_module_level=True)

# The glossary terms the chapters link with {term}`...` (spelled exactly so).
REQUIRED_TERMS = [
    "RoPE", "NTK-aware scaling", "position interpolation", "YaRN", "KV cache",
    "multi-head attention", "grouped-query attention", "multi-query attention", "causal mask",
    "padding mask", "prefix-LM", "residual connection", "LayerNorm", "RMSNorm",
    "feed-forward network", "GELU", "SwiGLU", "pre-norm", "post-norm", "encoder-only",
    "decoder-only", "encoder-decoder", "cross-attention", "O(N²) cost", "FlashAttention",
    "online softmax", "log-sum-exp", "tiling", "sliding-window attention", "state-space model",
    "scaling law", "induction head", "receptive field", "dilated convolution",
]
# Text that only nbgrader source notebooks contain; none of it may reach the site.
SECRET_MARKERS = [b"BEGIN SOLUTION", b"BEGIN HIDDEN TESTS", b"### BEGIN"]
IMAGE_FILE = re.compile(r"(^|/)[^/\s]+\.(png|jpe?g|svg|gif|webp)$", re.IGNORECASE)


def toc_parts():
    """``{caption: [docname, ...]}`` from ``_toc.yml``, plus the root page under ``None``."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    parts = {None: [toc["root"]]}
    for part in toc["parts"]:
        parts[part["caption"]] = [entry["file"] for entry in part["chapters"]]
    return parts


TOC = toc_parts()
ALL_DOCS = [doc for docs in TOC.values() for doc in docs]
CHAPTERS = [doc for doc in TOC["Chapters"] if not doc.endswith("takeaways")]
EXERCISES = TOC["Exercises"]
# The site's pages (the theme also leaves Jinja template fragments under _static/).
HTML_PAGES = sorted(p for p in HTML.rglob("*.html") if "_static" not in p.relative_to(HTML).parts)


@lru_cache(maxsize=None)
def soup(path):
    return BeautifulSoup(Path(path).read_text(encoding="utf-8"), "html.parser")


def page(doc):
    return HTML / f"{doc}.html"


def article(doc):
    """The page's main content, without the theme's navigation."""
    tree = soup(page(doc))
    return tree.find("article") or tree.find("main") or tree


@lru_cache(maxsize=None)
def anchors(path):
    """Every id and name an ``#anchor`` can point to in an HTML file."""
    tree = soup(path)
    return {tag["id"] for tag in tree.find_all(id=True)} | {
        tag["name"] for tag in tree.find_all(attrs={"name": True})
    }


def is_local(url):
    parts = urlsplit(url)
    return not parts.scheme and not parts.netloc and not url.startswith("//")


def test_every_toc_page_was_built():
    missing = [doc for doc in ALL_DOCS if not page(doc).is_file()]
    assert not missing, f"pages in _toc.yml without built HTML: {missing}"
    assert set(TOC) == {None, "Chapters", "Exercises", "Reference"}
    assert TOC["Reference"] == ["run-yourself", "glossary", "bibliography", "api"]


def test_no_notebook_failed_to_execute():
    logs = sorted((HTML / "reports").glob("**/*.err.log"))
    assert not logs, "cells failed while building: " + ", ".join(
        str(log.relative_to(ROOT)) for log in logs
    )


@pytest.mark.parametrize("doc", CHAPTERS)
def test_chapter_has_at_least_two_figures(doc):
    images = article(doc).find_all("img")
    assert len(images) >= 2, f"{doc}: {len(images)} image(s), a chapter needs at least 2 figures"


# A chapter's opening line: "About 25 minutes to read · needs chapter 1". The minutes are the
# words of its text (code cells and their outputs left out) at READING_WPM words a minute,
# rounded up to five; READING_SLACK minutes either way let a page grow a little before the line
# must be updated.
READING_LINE = re.compile(r"^About (\d+) minutes to read · needs \S.*")
READING_WPM, READING_SLACK = 150, 5


def reading_words(doc):
    """Words a reader reads on the chapter's page: its article text without code cells."""
    tree = BeautifulSoup(str(article(doc)), "html.parser")
    for cell in tree.select("div.cell, div.highlight, script, style, .headerlink"):
        cell.decompose()
    return len(tree.get_text(" ").split())


@pytest.mark.parametrize("doc", TOC["Chapters"])
def test_chapter_opens_with_its_reading_time_and_what_it_needs(doc):
    heading = article(doc).find("h1")
    first = heading.find_next("p")
    text = " ".join(first.get_text(" ").split())
    match = READING_LINE.match(text)
    assert match, f"{doc}: the paragraph under the title should read 'About N minutes to read · needs ...', not {text!r}"
    stated, words = int(match.group(1)), reading_words(doc)
    computed = 5 * -(-words // (5 * READING_WPM))
    assert abs(stated - computed) <= READING_SLACK, (
        f"{doc}: says {stated} minutes, but {words} words at {READING_WPM} a minute take about {computed}")


@pytest.mark.parametrize("doc", CHAPTERS)
def test_figures_are_first_cited_in_their_order(doc):
    """Fig. N.k is cited for the first time before Fig. N.(k+1) is: a reader never meets a later
    figure's number first."""
    first_cited = []
    for link in article(doc).select("a.reference"):
        match = re.fullmatch(r"Fig\. (\d+)\.(\d+)", " ".join(link.get_text().split()))
        if match and int(match.group(2)) not in first_cited:
            first_cited.append(int(match.group(2)))
    assert first_cited == sorted(first_cited), f"{doc}: figures first cited in the order {first_cited}"


def test_rope_chapter_maps_the_scalings_before_their_details():
    """Chapter 1 gives one table of the six context-extension methods, each with what it changes,
    when to use it and a cited model that uses it, before the first method's own paragraph."""
    page_text = " ".join(article("chapters/01-rope").get_text(" ").split())
    tables = [table for table in article("chapters/01-rope").find_all("table")
              if "when to use it" in table.get_text(" ")]
    assert len(tables) == 1, "chapter 1 should have one map table of the scalings"
    rows = tables[0].select("tbody tr")
    methods = [row.find("td").get_text(" ", strip=True) for row in rows]
    for name in ["position interpolation", "NTK-aware", "dynamic NTK", "YaRN", "Llama 3", "LongRoPE"]:
        assert any(name in method for method in methods), f"the map lacks {name}: {methods}"
    for row in rows:
        assert row.select('a[href*="bibliography.html#"]'), f"a row without a citation: {row.get_text(' ', strip=True)}"
    table_at = page_text.index(" ".join(tables[0].get_text(" ").split()[:3]))
    assert table_at < page_text.index("Position interpolation"), "the map should come before the methods' details"


# Numeric answers of the exercises (Ex1 Part 4, Ex2 Parts 6 and 8, Ex4 Part 6, Ex6 Part 4), which
# the chapters teach the method for on other numbers and must not print.
def _part6_answers():
    """Ex2 Part 6's two byte counts, from its check's model (its one owner), as a page would print
    them (its third answer, a batch of a dozen sequences, is too common a number to look for)."""
    from autograder.checks.gqa import MODEL
    from transformer_ref.numpy import kv_cache_bytes

    m = MODEL
    mha = kv_cache_bytes(m["n_layers"], m["n_heads"], m["head_dim"], m["seq_len"])
    gqa = kv_cache_bytes(m["n_layers"], m["n_kv_heads"], m["head_dim"], m["seq_len"])
    return [f"{mha:,}", str(mha), f"{gqa:,}", str(gqa)]


EXERCISE_ANSWERS = ["54,410", "54410", "2,302,672,896", "7,087,872", "7087872",
                    "20,000,000,000", "2e+10", "2.000e+10", *_part6_answers()]


@pytest.mark.parametrize("doc", TOC["Chapters"])
def test_chapters_do_not_print_the_exercises_numeric_answers(doc):
    text = article(doc).get_text(" ")
    printed = [answer for answer in EXERCISE_ANSWERS if answer in text]
    assert not printed, f"{doc} prints exercise answers: {printed}"


@pytest.mark.parametrize("path", HTML_PAGES, ids=lambda p: str(p.relative_to(HTML)))
def test_every_image_has_real_alt_text(path):
    """Alt text must describe the image: not empty, and not the file name MyST-NB puts there."""
    bad = []
    for img in soup(path).find_all("img"):
        alt = (img.get("alt") or "").strip()
        if not alt or IMAGE_FILE.search(alt) or alt.startswith("../_images"):
            bad.append(img.get("id") or img.get("src", "")[:80])
    assert not bad, (
        f"{len(bad)} <img> without a description in {path.relative_to(HTML)}: {bad[:5]}. "
        "Give figures alt text with the cell option `mystnb: image: alt: ...`."
    )


@pytest.mark.parametrize("path", HTML_PAGES, ids=lambda p: str(p.relative_to(HTML)))
def test_internal_links_and_anchors_resolve(path):
    broken = []
    for tag, attr in [("a", "href"), ("link", "href"), ("img", "src"), ("script", "src"),
                      ("source", "src"), ("iframe", "src")]:
        for element in soup(path).find_all(tag, attrs={attr: True}):
            url = element[attr]
            if not is_local(url) or url.startswith(("data:", "javascript:")):
                continue
            parts = urlsplit(url)
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if not target.exists():
                broken.append(url)
            elif parts.fragment and target.suffix == ".html":
                if unquote(parts.fragment) not in anchors(target):
                    broken.append(url)
    assert not broken, f"broken links in {path.relative_to(HTML)}: {sorted(set(broken))[:10]}"


def external_resources(tree):
    """URLs of scripts, stylesheets, fonts, images and frames that a browser would fetch."""
    found = []
    for tag, attr in [("script", "src"), ("img", "src"), ("source", "src"), ("iframe", "src"),
                      ("video", "src"), ("audio", "src"), ("embed", "src"), ("object", "data")]:
        found += [el[attr] for el in tree.find_all(tag, attrs={attr: True})]
    found += [el["href"] for el in tree.find_all("link", attrs={"href": True})
              if set(el.get("rel", [])) & {"stylesheet", "preload", "icon", "preconnect",
                                           "modulepreload", "prefetch", "dns-prefetch"}]
    for style in tree.find_all("style"):
        found += re.findall(r"url\(\s*['\"]?([^'\")]+)", style.get_text())
    return [url for url in found if not is_local(url) and not url.startswith("data:")]


@pytest.mark.parametrize("path", HTML_PAGES, ids=lambda p: str(p.relative_to(HTML)))
def test_page_loads_nothing_from_the_network(path):
    external = external_resources(soup(path))
    assert not external, f"{path.relative_to(HTML)} fetches from the network: {external}"


def test_stylesheets_load_nothing_from_the_network():
    pattern = re.compile(r"(url\(\s*['\"]?|@import\s+['\"])(https?:)?//", re.IGNORECASE)
    offenders = [str(css.relative_to(HTML)) for css in HTML.rglob("*.css")
                 if pattern.search(css.read_text(encoding="utf-8", errors="replace"))]
    assert not offenders, f"stylesheets with remote url()/@import (fonts?): {offenders}"


def test_mathjax_is_served_from_the_site():
    """MathJax 3 (not a CDN, not version 4) with its fonts, referenced by every page with math."""
    mathjax = HTML / "_static" / "mathjax" / "tex-chtml.js"
    assert mathjax.is_file(), "vendored MathJax missing: is sphinx-mathjax-offline installed?"
    assert re.search(r'VERSION="3\.', mathjax.read_text(encoding="utf-8", errors="replace"))
    assert list((HTML / "_static" / "mathjax" / "output" / "chtml" / "fonts").rglob("*.woff"))
    pages_with_math = [p for p in HTML_PAGES if soup(p).select(".math")]
    assert page("intro") in pages_with_math
    for path in pages_with_math:
        sources = [urlsplit(s["src"]).path for s in soup(path).find_all("script", src=True)]
        assert any(src.endswith("_static/mathjax/tex-chtml.js") for src in sources), path


def test_no_solution_or_hidden_test_text_anywhere_in_the_site():
    leaks = []
    for path in HTML.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            leaks += [f"{path.relative_to(HTML)}: {m.decode()}" for m in SECRET_MARKERS if m in data]
    assert not leaks, f"solution or hidden-test text in the built site: {leaks[:10]}"


def test_glossary_defines_every_term_the_chapters_use():
    terms = set()
    for dt in article("glossary").select("dl.glossary dt"):
        for permalink in dt.select("a.headerlink"):
            permalink.extract()
        terms.add(dt.get_text(" ", strip=True))
    missing = [term for term in REQUIRED_TERMS if term not in terms]
    assert not missing, f"glossary lacks: {missing}"
    definitions = article("glossary").select("dl.glossary dd")
    assert all(len(dd.get_text(strip=True)) > 40 for dd in definitions)


def test_no_page_speaks_of_a_syllabus_or_lesson_the_reader_never_saw():
    """The course's own planning documents are not part of the site: no page may refer to them."""
    words = re.compile(r"\b(syllabus|syllabi|lessons?)\b", re.IGNORECASE)
    found = {doc: sorted(set(words.findall(article(doc).get_text(" ")))) for doc in ALL_DOCS}
    found = {doc: hits for doc, hits in found.items() if hits}
    assert not found, f"pages that mention a syllabus or lesson: {found}"


def test_bibliography_lists_every_entry_of_references_bib():
    keys = re.findall(r"^@\w+\{([^,\s]+),", (ROOT / "references.bib").read_text(), re.MULTILINE)
    assert len(keys) >= 42 and len(keys) == len(set(keys)), "duplicate or missing bib keys"
    entries = article("bibliography").select(".citation, dl.citation > dt, div.citation")
    assert len(entries) >= len(keys), f"{len(entries)} entries shown for {len(keys)} bib keys"
    text = article("bibliography").get_text(" ").lower()
    for title in ["Attention is all you need", "RoFormer", "Fast transformer decoding"]:
        assert title.lower() in text


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_api_page_documents_every_public_name_of_both_backends(backend):
    """api.md (autodoc): each backend's ``__all__`` with its docstring; counts once, under counts."""
    import importlib

    module = importlib.import_module(f"transformer_ref.{backend}")
    counts = importlib.import_module("transformer_ref.counts")
    entries = {dt["id"]: dt for dt in article("api").select("dl.py > dt[id]")}
    for name in ["apply_rope", "flash_attention", "grouped_query_attention", "KVCache"]:
        assert f"transformer_ref.{backend}.{name}" in entries, f"{backend}.{name} not on the API page"
    own = [name for name in module.__all__ if name not in counts.__all__]
    missing = [name for name in own if f"transformer_ref.{backend}.{name}" not in entries]
    assert not missing, f"public names of transformer_ref.{backend} missing from api.html: {missing}"
    missing = [name for name in counts.__all__ if f"transformer_ref.counts.{name}" not in entries]
    assert not missing, f"transformer_ref.counts names missing from api.html: {missing}"
    repeated = [name for name in counts.__all__ if f"transformer_ref.{backend}.{name}" in entries]
    assert not repeated, f"counts re-exports listed again under {backend}: {repeated}"
    for name in own:
        docstring = entries[f"transformer_ref.{backend}.{name}"].find_next_sibling("dd")
        assert docstring is not None and len(docstring.get_text(strip=True)) > 20, name


def test_api_page_documents_the_triton_backend():
    """The Triton backend is on the API page too, though the book's venv has no triton (autodoc
    mocks it): every name of its ``__all__`` (its ``flash`` module's), read from the source."""
    flash = ROOT / "lib" / "transformer_ref" / "triton" / "flash.py"
    names = next(ast.literal_eval(node.value) for node in ast.parse(flash.read_text()).body
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__")
    entries = {dt["id"]: dt for dt in article("api").select("dl.py > dt[id]")}
    assert "flash_attention" in names
    for name in names:
        entry = entries.get(f"transformer_ref.triton.{name}")
        assert entry is not None, f"triton.{name} not on the API page"
        assert "causal" in entry.get_text() or name != "flash_attention", "signature not rendered"
        docstring = entry.find_next_sibling("dd")
        assert docstring is not None and len(docstring.get_text(strip=True)) > 20, name


@pytest.mark.parametrize("doc", CHAPTERS)
def test_chapter_offers_its_executed_notebook_for_download(doc):
    """``chapters/01-rope`` offers ``01-rope-chapter.ipynb`` (tests/book/test_chapter_downloads.py
    checks what it holds)."""
    download = f"{doc}-chapter.ipynb"
    notebook = HTML / "_sources" / download
    assert notebook.is_file(), f"no executed notebook for {doc}"
    cells = json.loads(notebook.read_text())["cells"]
    assert any(c["cell_type"] == "code" and c.get("outputs") for c in cells)
    links = [a["href"] for a in soup(page(doc)).find_all("a", href=True)]
    assert any(href.endswith(f"_sources/{download}") for href in links)


@pytest.mark.parametrize("doc", EXERCISES)
def test_exercise_page_downloads_its_student_notebook(doc):
    """The download button serves the generated student notebook, which is valid JSON."""
    assignment = Path(doc).name
    links = [a["href"] for a in article(doc).find_all("a", href=True)
             if a["href"].endswith(f"{assignment}.ipynb") and is_local(a["href"])]
    assert links, f"{doc} has no download link to {assignment}.ipynb"
    for href in links:
        notebook = (page(doc).parent / unquote(urlsplit(href).path)).resolve()
        assert notebook.is_file() and notebook.is_relative_to(HTML), href
        assert json.loads(notebook.read_text())["nbformat"] == 4


def test_equations_and_figures_are_numbered():
    intro = article("intro")
    assert intro.select("span.eqno"), "numbered equations are not rendered with numbers"
    captions = [span.get_text() for doc in CHAPTERS for span in article(doc).select(
        "figure span.caption-number")]
    assert all(re.match(r"Fig\. \d+(\.\d+)* ", caption) for caption in captions), captions


def bibliography_entries():
    """``{id: (label, entry element)}`` of the bibliography page's entries."""
    entries = {}
    for entry in article("bibliography").select("div.citation"):
        label = entry.select_one("span.label")
        text = label.get_text("", strip=True).strip("[]") if label else ""
        entries[entry["id"]] = (text, entry)
    return entries


def test_bibliography_entries_are_a_list_with_author_year_labels_and_links():
    """Each entry: a list item (not the deprecated doc-biblioentry role), an author-year label,
    a link to its source (DOI, arXiv or a URL), and no TeX left in its text."""
    entries = bibliography_entries()
    assert len(entries) >= 42
    lists = article("bibliography").select('[role="list"]')
    assert lists and all(child.get("role") == "listitem"
                         for box in lists for child in box.find_all(recursive=False)), \
        "a role=list box whose children are not all listitems"
    assert not article("bibliography").select('[role="doc-biblioentry"]')
    for key, (label, entry) in entries.items():
        assert re.fullmatch(r"\S.*, (\d{4}[a-z]?|n\.d\.)", label), f"{key}: label {label!r} is not author, year"
        assert not re.match(r"\d+$", label), label
        links = [a["href"] for a in entry.find_all("a", href=True) if not is_local(a["href"])]
        assert links, f"{label}: no DOI, arXiv or web link"
        assert all(href.startswith("https://") for href in links), links
        text = entry.get_text(" ")
        assert "$" not in text and "\\" not in text, f"{label}: TeX in the entry: {text[:120]}"


def test_citations_in_the_text_match_the_bibliography_labels():
    """A parenthetical {cite} shows "Author, year"; the entry it links to carries that label."""
    entries = bibliography_entries()
    checked = 0
    for doc in CHAPTERS:
        for link in article(doc).select('a[href*="bibliography.html#"]'):
            text = " ".join(link.get_text().split())
            if not re.fullmatch(r".+, \d{4}[a-z]?", text):
                continue                      # {cite:t} reads "Author [year]": not a label
            target = unquote(urlsplit(link["href"]).fragment)
            assert target in entries, f"{doc}: citation {text!r} links to no entry ({target})"
            assert entries[target][0] == text, (
                f"{doc}: citation {text!r}, bibliography label {entries[target][0]!r}")
            checked += 1
    assert checked >= 40, f"only {checked} parenthetical citations found"


@pytest.mark.parametrize("doc", CHAPTERS)
def test_tables_are_markdown_tables(doc):
    """Every table goes through the Markdown path (docutils ``table.table``), none is raw HTML
    printed by a cell, which the theme neither styles nor fits into the column."""
    raw = [table for table in article(doc).select(".cell_output table")]
    assert not raw, f"{doc}: {len(raw)} raw HTML table(s) in cell outputs; glue a Markdown table"
    for table in article(doc).find_all("table"):
        assert "table" in table.get("class", []), f"{doc}: a table without the theme's class"


# What the Triton chapter (06b) explains, each with the code that shows it. Every highlighted
# line of the kernel listings must show one of these, and each must be highlighted somewhere:
# a change of the kernel that moves its lines under the listings' :emphasize-lines: fails here.
TRITON_TAUGHT = {
    "compile-time constants": "tl.constexpr",
    "the instance's query tile": "tl.program_id(0)",
    "the instance's batch x head row": "tl.program_id(1)",
    "GQA as an index": "bh // GROUP",
    "the tile's row and column numbers": "tl.arange(0, BLOCK_",
    "pointer arithmetic of the query load": "q = tl.load(Q + bh * T * D + offs_m[:, None] * D + offs_d[None, :]",
    "the masks of ragged rows and padded columns": "mask=(offs_m[:, None] < T) & (offs_d",
    "a key tile's position": "cols = start_n + offs_n",
    "the key load and its mask": "k = tl.load(K + kv * S * D",
    "the masked key columns": "mask=(cols[:, None] < S)",
    "the visible scores": "visible = (cols[None, :] < S)",
    "scores set to -inf": "tl.where(visible, s, float(\"-inf\"))",
    "masked stores": "tl.store(",
}
KERNEL_LISTING = "The forward kernel, part"


def kernel_listings():
    """``{caption: [(line number or None, highlighted line text), ...]}`` of the Triton chapter's kernel listings."""
    listings = {}
    for block in article("chapters/06b-flash-triton").select("div.literal-block-wrapper"):
        caption = block.select_one(".caption-text")
        if caption is None or KERNEL_LISTING not in caption.get_text():
            continue
        lines = []
        for span in block.select("span.hll"):
            number = span.select_one(".linenos")
            text = span.get_text()
            if number is not None:
                text = text.replace(number.get_text(), "", 1)
            lines.append((int(number.get_text()) if number is not None else None, text.strip()))
        listings[caption.get_text()] = lines
    return listings


def test_triton_listings_highlight_the_lines_the_prose_explains():
    listings = kernel_listings()
    assert len(listings) == 3, f"the Triton chapter should show the forward kernel in three parts: {list(listings)}"
    highlighted = [text for lines in listings.values() for _, text in lines]
    stray = [text for text in highlighted if not any(code in text for code in TRITON_TAUGHT.values())]
    assert not stray, f"highlighted kernel lines that the prose does not explain: {stray}"
    missing = [topic for topic, code in TRITON_TAUGHT.items() if not any(code in text for text in highlighted)]
    assert not missing, f"the prose explains these, but no kernel line showing them is highlighted: {missing}"


def test_triton_prose_cites_highlighted_line_numbers():
    """The bullets under part 1 name its lines ("(lines 19-21)"); each named line is highlighted."""
    numbered = [lines for lines in kernel_listings().values() if lines and lines[0][0] is not None]
    assert len(numbered) == 1, "part 1 of the kernel listing should show line numbers"
    shown = {number for number, _ in numbered[0]}
    text = article("chapters/06b-flash-triton").get_text(" ")
    cited = set()
    for first, last in re.findall(r"\(lines? (\d+)(?:-(\d+))?\)", text):
        cited.update(range(int(first), int(last or first) + 1))
    assert cited, "the Triton section cites no line numbers"
    assert cited <= shown, f"lines cited by the prose but not highlighted: {sorted(cited - shown)}"
