"""The chapter notebook a learner downloads: the executed chapter, written for Jupyter.

A chapter is a MyST markdown notebook that Jupyter Book executes and renders; its markup
(roles, directives, glued values) means nothing to JupyterLab or the classic Notebook. The
download (:func:`download_name`, e.g. ``01-rope-chapter.ipynb``, never the name of an
exercise notebook) is made by :func:`learner_notebook` from the notebook the build executed,
its outputs included, so that it reads like the page and runs like it:

* **Markdown cells** are parsed with MyST's own parser (markdown-it-py with the book's MyST
  extensions); every role and directive is replaced by plain Markdown at the source position
  the parser reports, so nothing else of the text changes:

  ========================== =============================================================
  MyST                       in the download
  ========================== =============================================================
  ``{glue:text}`` etc.       the value the build computed, formatted as on the page
  ``{math}`` directive       ``$$ ... \\tag{1.2} $$``, numbered as on the page
  ``{eq}``, ``{numref}``     "Eq. 1.2", "Fig. 1.1"
  ``{cite}``, ``{cite:t}``   "(Su et al., 2021)", "Su et al. (2021)", with a *References*
                             cell at the end
  ``{term}``, ``{doc}``,     the text, a link to the website's page when the site's address
  ``{ref}``                  is known (``html.baseurl`` in ``_config.yml``)
  admonition                 a block quote with a bold title; a ``dropdown`` one (the quick
                             checks' answers) a folded ``<details>``
  ``{glue:figure}``          its caption, "**Fig. 1.1** ...", under the cell that draws it
  ``{glue:md}``              nothing: the cell right above shows the table
  ``{literalinclude}``       the included code as a fenced block, its caption above it
  ``(label)=``, ``%`` notes  nothing
  ========================== =============================================================

  Any other role or directive is an error (:class:`ConversionError`), so none is ever left.
* **Code cells** keep their code. The chapter's ``from myst_nb import glue`` (the build's
  package) is dropped, and a cell before the first defines stand-ins (:data:`STAND_INS`):
  ``glue(name, value)`` shows the value under the cell that computes it (a figure, a table,
  or ``name = value``), and a lab (``transformer_ref.labs``), whose sliders need the
  website's JavaScript, displays where to find it (an IPython display formatter). Stored outputs are converted by the same stand-in code
  (``application/papermill.record/image/png`` becomes ``image/png``, and so on), so the
  notebook looks as downloaded as it does after *Run All*. Cells the page hides
  (``hide-input``, ``remove-input``, ``remove-cell``) are kept, with their code folded
  (``jupyter.source_hidden``).

What the build knows (glued values, figure and equation numbers, titles, the bibliography,
the site's address) reaches the converter through a :class:`Book`; ``scripts/book_ext.py``
makes one from Sphinx's environment.
"""

import copy
import re
from dataclasses import dataclass, field

import nbformat
from docutils.parsers.rst.directives.admonitions import Admonition
from markdown_it.renderer import RendererHTML
from myst_nb.ext.glue.directives import PasteFigureDirective, PasteMarkdownDirective
from myst_nb.core.variables import format_plain_text
from myst_parser.config.main import MdParserConfig
from myst_parser.parsers.directives import parse_directive_text
from myst_parser.parsers.mdit import create_md_parser
from sphinx.directives.code import LiteralInclude
from sphinx.directives.patches import MathDirective

DOWNLOAD_SUFFIX = "-chapter.ipynb"
GLUE_IMPORT = "from myst_nb import glue"
RECORD_PREFIX = "application/papermill.record/"
LAB_MARKER = 'class="tr-lab"'           # transformer_ref.labs: the HTML of a lab
# Admonition directives shown as a block quote titled with their (capitalised) name.
NAMED_ADMONITIONS = ("note", "tip", "hint", "important", "warning", "caution", "attention",
                     "danger", "error", "seealso")
HIDDEN_CODE_TAGS = {"hide-input", "remove-input", "remove-cell"}


class ConversionError(ValueError):
    """A chapter uses MyST that has no Markdown form here; the message names it."""


def download_name(docname):
    """``chapters/01-rope`` -> ``01-rope-chapter.ipynb`` (an exercise's is ``01-rope.ipynb``)."""
    return docname.rsplit("/", 1)[-1] + DOWNLOAD_SUFFIX


@dataclass
class Book:
    """What the build knows that a chapter's text refers to.

    ``glue``: key -> MIME bundle (``{"text/plain": ...}``) the chapter glued; ``figures``
    and ``equations``: label -> number as shown ("1.1"); ``labels``: label -> (docname,
    anchor, title) of ``{ref}``/``{numref}`` targets; ``titles``: docname -> title;
    ``terms``: term -> anchor on the glossary page; ``citations``: key -> (label,
    Markdown entry); ``base_url``: the website's address ("" when unknown: no links);
    ``docname`` and ``title``: this chapter's; ``figure_format``/``equation_format``:
    the page's "Fig. %s" and "Eq. {number}"; ``include``: (path, options) -> included text.
    """

    docname: str
    title: str
    glue: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    equations: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    titles: dict = field(default_factory=dict)
    terms: dict = field(default_factory=dict)
    citations: dict = field(default_factory=dict)
    base_url: str = ""
    figure_format: str = "Fig. %s"
    equation_format: str = "Eq. {number}"
    include: object = None

    def page_url(self, docname, anchor=""):
        """The website's URL of ``docname`` (and ``#anchor``), or "" without ``base_url``."""
        if not self.base_url:
            return ""
        return f"{self.base_url.rstrip('/')}/{docname}.html" + (f"#{anchor}" if anchor else "")


# -- the stand-ins of the notebook's second code cell --------------------------------------
STAND_INS = '''\
# This notebook is a chapter of the book "Attention, Part 2". On the website, glue() pastes
# computed values into the text and a lab draws sliders and panels. Here, glue() shows each
# value under the cell that computes it (the text quotes the value the website was built
# with), and a lab says where to find it: it needs the website's JavaScript.
import re as _re
from html import unescape as _unescape

from IPython import get_ipython as _get_ipython
from IPython.display import Markdown as _Markdown, display as _display

_CITATIONS = {citations}
_PAGE_TITLE = {page_title}
_PAGE_URL = {page_url}


def _cited(markdown):
    """Markdown with each citation written out, as in the text: (Su et al., 2021)."""
    def written(match):
        return "(" + "; ".join(_CITATIONS[key.strip()] for key in match.group(1).split(",")) + ")"
    return _re.sub(r"\\{{cite(?::p)?\\}}`([^`]*)`", written, markdown)


def _shown(name, data):
    """What glue() shows of a value whose display data is ``data`` (MIME type -> content):
    a figure or a table as it is, anything else as ``name = value``."""
    if "text/markdown" in data:
        return {{**data, "text/markdown": _cited(data["text/markdown"])}}
    if "image/png" in data or "text/html" in data:
        return dict(data)
    return {{"text/plain": f"{{name}} = {{data['text/plain']}}"}}


def glue(name, variable, display=True):
    """Show ``variable`` under this cell (the book's glue() keeps it for the text)."""
    data, metadata = _get_ipython().display_formatter.format(variable)
    _display(_shown(name, data), metadata=metadata, raw=True)


def _lab_markdown(html):
    """A lab of the website (``transformer_ref.labs``; ``html``: its HTML): where to find it."""
    title = _re.search(r'aria-label="([^"]*)"', html)
    title = _unescape(title.group(1)) if title else "Lab"
    anchor = _re.search(r'id="([^"]*)"', html)
    where = (f"[its place on the chapter's page]({{_PAGE_URL}}#{{anchor.group(1) if anchor else ''}})"
             if _PAGE_URL else f"the page “{{_PAGE_TITLE}}” of the book's website")
    return (f"> **{{title}}.** This lab is interactive on the book's website, where its "
            f"sliders redraw the panels; it needs the website's JavaScript, so Jupyter cannot "
            f"show it. Open it on {{where}}.")


# a lab shows where to find it, instead of its HTML, whose sliders would do nothing here
_formatters = _get_ipython().display_formatter.formatters if _get_ipython() else {{}}
if _formatters:
    _formatters["text/markdown"].for_type_by_name(
        "transformer_ref.labs", "Lab", lambda lab: _lab_markdown(str(lab)))
    _formatters["text/html"].for_type_by_name("transformer_ref.labs", "Lab", lambda lab: None)
'''


def stand_ins(book, cited_in_code):
    """The source of the stand-in cell for ``book``'s chapter; ``cited_in_code``: the
    citation keys that glued Markdown may write out."""
    citations = {key: book.citations[key][0] for key in sorted(cited_in_code)}
    return STAND_INS.format(citations=repr(citations), page_title=repr(book.title),
                            page_url=repr(book.page_url(book.docname)))


def stand_in_namespace(source):
    """The names the stand-in cell defines (run here, to convert stored outputs the same way)."""
    namespace = {}
    exec(compile(source, "<stand-ins>", "exec"), namespace)  # noqa: S102 - our own code
    return namespace


# -- Markdown -------------------------------------------------------------------------------
def markdown_parser(config=None):
    """MyST's markdown-it parser (``config``: the book's ``MdParserConfig``), whose role tokens
    also carry their position in the inline source (``meta["start"]``, ``meta["end"]``)."""
    md = create_md_parser(config or MdParserConfig(), RendererHTML)
    original = next(rule.fn for rule in md.inline.ruler.__rules__ if rule.name == "myst_role")

    def role_with_position(state, silent):
        start = state.pos
        if not original(state, silent):
            return False
        if not silent:
            state.tokens[-1].meta.update(start=start, end=state.pos)
        return True

    md.inline.ruler.at("myst_role", role_with_position)
    return md


@dataclass
class _Edit:
    start: int      # offsets into the text
    end: int
    text: str


def _line_starts(text):
    starts, position = [], 0
    for line in text.split("\n"):
        starts.append(position)
        position += len(line) + 1
    return starts


class MarkdownConverter:
    """MyST Markdown -> plain Markdown for one chapter (see the module docstring)."""

    def __init__(self, book, md):
        self.book = book
        self.md = md
        self.cited = []          # citation keys in order of first citation

    # roles
    def role(self, name, content):
        book = self.book
        text, target = _explicit_title(content)
        if name in ("glue", "glue:text", "glue:", "glue:any", "glue:md"):
            key, _, spec = content.rpartition(":") if ":" in content else (content, "", "")
            data = self._glued(key)
            if name == "glue:md":
                return data.get("text/markdown", data.get("text/plain", ""))
            return format_plain_text(data["text/plain"], spec or "s")
        if name == "term":
            anchor = book.terms.get(target) or book.terms.get(target.lower())
            url = book.page_url("glossary", anchor) if anchor else ""
            return f"[{text}]({url})" if url else text
        if name in ("cite", "cite:p", "cite:t", "cite:ps", "cite:ts"):
            keys = [key.strip() for key in content.split(",") if key.strip()]
            labels = []
            for key in keys:
                if key not in book.citations:
                    raise ConversionError(f"{{cite}}: no entry {key!r} in the bibliography")
                if key not in self.cited:
                    self.cited.append(key)
                labels.append(book.citations[key][0])
            if name.startswith("cite:t"):
                return "; ".join(f"{who} ({year})" for who, year in
                                 (label.rsplit(", ", 1) for label in labels))
            return "(" + "; ".join(labels) + ")"
        if name == "eq":
            number = book.equations.get(target)
            if number is None:
                raise ConversionError(f"{{eq}}: no numbered equation {target!r}")
            return book.equation_format.format(number=number)
        if name == "numref":
            number = book.figures.get(target)
            if number is None:
                raise ConversionError(f"{{numref}}: no numbered figure {target!r}")
            pattern = text if text != target else book.figure_format
            return pattern.replace("{number}", number).replace("%s", number)
        if name == "ref":
            if target not in book.labels:
                raise ConversionError(f"{{ref}}: no label {target!r}")
            docname, anchor, title = book.labels[target]
            shown = text if text != target else title
            url = book.page_url(docname, anchor)
            return f"[{shown}]({url})" if url else shown
        if name == "doc":
            docname = _resolve_doc(book.docname, target)
            shown = text if text != target else book.titles.get(docname, target)
            url = book.page_url(docname)
            return f"[{shown}]({url})" if url else shown
        if name == "math":
            return f"${content}$"
        raise ConversionError(f"role {{{name}}} has no Markdown form in the download "
                              "(scripts/chapter_notebook.py)")

    def _glued(self, key):
        if key not in self.book.glue:
            raise ConversionError(f"no value glued as {key!r}")
        return self.book.glue[key]

    # directives
    def directive(self, name, argument, content):
        if name == "math":
            parsed = parse_directive_text(MathDirective, argument, content)
            label = parsed.options.get("label")
            body = [line for line in (argument, *parsed.body) if line.strip()]
            if label:
                number = self.book.equations.get(label)
                if number is None:
                    raise ConversionError(f"{{math}}: no number for the equation {label!r}")
                body.append(f"\\tag{{{number}}}")
            return "$$\n" + "\n".join(body) + "\n$$"
        if name == "admonition" or name in NAMED_ADMONITIONS:
            spec = Admonition if name == "admonition" else _NamedAdmonition
            parsed = parse_directive_text(spec, argument, content)
            title = parsed.arguments[0] if name == "admonition" else name.capitalize()
            body = self.convert("\n".join(parsed.body)).strip()
            classes = parsed.options.get("class") or []
            if "dropdown" in (classes.split() if isinstance(classes, str) else classes):
                return f"<details>\n<summary>{title}</summary>\n\n{body}\n\n</details>"
            quoted = "\n".join(f"> {line}" if line else ">" for line in body.split("\n"))
            return f"> **{self.convert(title).strip()}**\n>\n{quoted}"
        if name == "glue:figure":
            parsed = parse_directive_text(PasteFigureDirective, argument, content)
            self._glued(parsed.arguments[0])
            caption = self.convert("\n".join(parsed.body)).strip()
            label = parsed.options.get("name")
            number = self.book.figures.get(label) if label else None
            if number:
                caption = f"**{self.book.figure_format % number}** {caption}"
            return caption
        if name == "glue:md":
            parsed = parse_directive_text(PasteMarkdownDirective, argument, content)
            self._glued(parsed.arguments[0])
            return ""
        if name == "literalinclude":
            parsed = parse_directive_text(LiteralInclude, argument, content)
            if self.book.include is None:
                raise ConversionError("{literalinclude}: no way to read included files here")
            code = self.book.include(parsed.arguments[0], parsed.options).rstrip("\n")
            fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", code)), default=0))
            language = parsed.options.get("language", "")
            caption = parsed.options.get("caption")
            head = f"*{self.convert(caption).strip()}*\n\n" if caption else ""
            return f"{head}{fence}{language}\n{code}\n{fence}"
        raise ConversionError(f"directive {{{name}}} has no Markdown form in the download "
                              "(scripts/chapter_notebook.py)")

    # the text
    def convert(self, text):
        """``text`` (MyST Markdown) with every role and directive replaced (see the module)."""
        lines = text.split("\n")
        starts = _line_starts(text)
        edits = []
        for token in self.md.parse(text):
            if token.type in ("fence", "colon_fence") and token.info.strip().startswith("{"):
                match = re.fullmatch(r"\{([^}]+)\}\s*(.*)", token.info.strip())
                replacement = self.directive(match.group(1), match.group(2), token.content)
                edits.append(self._block_edit(token, lines, starts, replacement))
            elif token.type in ("myst_target", "myst_line_comment", "myst_block_break"):
                edits.append(self._block_edit(token, lines, starts, None))
            elif token.type in ("math_block", "math_block_label", "amsmath"):
                body = token.content.strip("\n")
                edits.append(self._block_edit(token, lines, starts, f"$$\n{body}\n$$"))
            elif token.type == "inline" and token.children:
                edits.extend(self._role_edits(token, lines, starts))
            elif token.type.startswith(("myst_", "colon_fence", "front_matter", "dl_",
                                        "field_list", "footnote")):
                raise ConversionError(f"{token.type} has no Markdown form in the download "
                                      "(scripts/chapter_notebook.py)")
        for edit in sorted(edits, key=lambda e: e.start, reverse=True):
            text = text[:edit.start] + edit.text + text[edit.end:]
        return text

    def _block_edit(self, token, lines, starts, replacement):
        """Replace the lines of a block token, indented as its first line was."""
        first, last = token.map
        indent = re.match(r"[ \t>]*", lines[first]).group(0)
        if not lines[first][len(indent):].startswith(("`", "~", ":", "(", "%", "+", "$", "\\")):
            raise ConversionError(f"cannot place the block that starts on line {first + 1} of "
                                  f"a Markdown cell (start it on a line of its own): "
                                  f"{lines[first]!r}")
        end = starts[last - 1] + len(lines[last - 1]) if last > first else starts[first]
        if replacement is None:   # the line goes, with its line break
            return _Edit(starts[first], min(end + 1, starts[-1] + len(lines[-1])), "")
        body = "\n".join(f"{indent}{line}" if line else indent.rstrip() or ""
                         for line in replacement.split("\n"))
        return _Edit(starts[first], end, body)

    def _role_edits(self, token, lines, starts):
        """An edit per role of an inline token, at the role's place in ``lines``."""
        placed = _place_inline(token, lines, starts)
        edits = []
        for child in _walk(token.children):
            if child.type != "myst_role":
                continue
            start, end = placed(child.meta["start"]), placed(child.meta["end"])
            edits.append(_Edit(start, end, self.role(child.meta["name"], child.content)))
        return edits


class _NamedAdmonition(Admonition):
    required_arguments = 0
    optional_arguments = 0


def _walk(tokens):
    for token in tokens:
        yield token
        if token.children:
            yield from _walk(token.children)


def _place_inline(token, lines, starts):
    """A function: offset into ``token.content`` -> offset into the whole text.

    An inline token's content is its lines of the source, each without the prefix of its
    container (indentation, list marker, ``>``) and, at the ends, without surrounding
    white space; a table cell is part of one line.
    """
    first, last = token.map
    content_lines = token.content.split("\n")
    origins = []
    for k, content_line in enumerate(content_lines):
        number = min(first + k, last - 1)
        source = lines[number]
        if len(content_lines) == 1 and last - first == 1:
            column = source.find(content_line)
        else:
            stripped = source.rstrip()
            column = len(stripped) - len(content_line.rstrip())
        if column < 0 or source[column:column + len(content_line)].rstrip() != content_line.rstrip():
            raise ConversionError(f"cannot place line {number + 1} of a Markdown cell: {source!r}")
        origins.append(starts[number] + column)
    offsets = _line_starts(token.content)

    def placed(offset):
        k = max(i for i, start in enumerate(offsets) if start <= offset)
        return origins[k] + offset - offsets[k]

    return placed


def _explicit_title(content):
    """``"text <target>"`` -> (text, target); ``"target"`` -> (target, target)."""
    match = re.fullmatch(r"\s*(.*?)\s*<([^<>]+)>\s*", content, re.S)
    if match and match.group(1):
        return match.group(1), match.group(2).strip()
    return content.strip(), content.strip()


def _resolve_doc(current, target):
    """A ``{doc}`` target relative to the current document -> docname."""
    if target.startswith("/"):
        return target.lstrip("/")
    parts = current.split("/")[:-1]
    for part in target.split("/"):
        if part == "..":
            parts = parts[:-1]
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts)


# -- the notebook ---------------------------------------------------------------------------
def _lab_html(output):
    """The HTML of a lab (``transformer_ref.labs``) that ``output`` shows, or None."""
    text = "".join(output.get("data", {}).get("text/html", ""))
    return text if LAB_MARKER in text else None


def _source(cell):
    return "".join(cell.source) if isinstance(cell.source, list) else cell.source


def references_cell(book, keys):
    """The *References* Markdown cell: the entries of ``keys``, in the bibliography's order."""
    order = list(book.citations)
    entries = [f"* **{book.citations[key][0]}.** {book.citations[key][1]}"
               for key in sorted(keys, key=order.index)]
    return nbformat.v4.new_markdown_cell("## References\n\n" + "\n".join(entries))


def learner_notebook(notebook, book, md=None):
    """The download of the executed chapter ``notebook`` (see the module docstring)."""
    md = md or markdown_parser()
    notebook = copy.deepcopy(notebook)
    converter = MarkdownConverter(book, md)
    glued_markdown = " ".join(bundle.get("text/markdown", "") for bundle in book.glue.values())
    cited_in_code = set()
    for match in re.finditer(r"\{cite(?::p)?\}`([^`]*)`", glued_markdown):
        cited_in_code.update(key.strip() for key in match.group(1).split(","))
    for role in re.findall(r"\{([\w:-]+)\}`", glued_markdown):
        if role not in ("cite", "cite:p"):
            raise ConversionError(f"glued Markdown uses the role {{{role}}}; the download's "
                                  "glue() can only write out {cite}")
    code = stand_ins(book, cited_in_code)
    namespace = stand_in_namespace(code)

    cells, stand_ins_placed = [], False
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = converter.convert(_source(cell)).strip("\n")
            cell.pop("attachments", None)
            if cell.source.strip():
                cells.append(cell)
            continue
        if cell.cell_type != "code":
            cells.append(cell)
            continue
        lines = _source(cell).split("\n")
        cell.source = "\n".join(line for line in lines if line.strip() != GLUE_IMPORT)
        if "myst_nb" in cell.source:
            raise ConversionError(f"a code cell uses myst_nb other than by `{GLUE_IMPORT}` "
                                  "on a line of its own: the download could not run it")
        if HIDDEN_CODE_TAGS & set(cell.metadata.get("tags", [])):
            cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
        outputs = []
        for output in cell.get("outputs", []):
            record = output.get("metadata", {}).get("scrapbook")
            if output.get("output_type") == "display_data" and record:
                data = {mime.removeprefix(RECORD_PREFIX): value
                        for mime, value in output["data"].items()}
                outputs.append(nbformat.v4.new_output(
                    "display_data", data=namespace["_shown"](record["name"], data)))
            elif (output.get("output_type") in ("display_data", "execute_result")
                  and _lab_html(output)):
                note = namespace["_lab_markdown"](_lab_html(output))
                outputs.append(nbformat.v4.new_output(
                    output["output_type"], data={"text/markdown": note, "text/plain": note},
                    **({"execution_count": output.get("execution_count")}
                       if output["output_type"] == "execute_result" else {})))
            else:
                outputs.append(output)
        cell.outputs = outputs
        if not stand_ins_placed:   # before the first code cell, which may call glue()
            helper = nbformat.v4.new_code_cell(code)
            helper.metadata["jupyter"] = {"source_hidden": True}
            helper.metadata["tags"] = ["hide-input"]
            cells.append(helper)
            stand_ins_placed = True
        cells.append(cell)
    cited = list(converter.cited) + sorted(cited_in_code - set(converter.cited))
    if cited:
        cells.append(references_cell(book, cited))
    notebook.cells = cells
    metadata = notebook.metadata
    metadata.pop("jupytext", None)
    metadata.pop("source_map", None)
    metadata.pop("mystnb", None)
    nbformat.validate(notebook)
    return notebook


def glued_values(notebook):
    """key -> MIME bundle (without the record prefix) of every value ``notebook`` glued."""
    values = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            record = output.get("metadata", {}).get("scrapbook")
            if record:
                values[record["name"]] = {
                    mime.removeprefix(RECORD_PREFIX): "".join(value) if isinstance(value, list)
                    else value for mime, value in output.get("data", {}).items()}
    return values


__all__ = ["Book", "ConversionError", "DOWNLOAD_SUFFIX", "MarkdownConverter", "STAND_INS",
           "download_name", "glued_values", "learner_notebook", "markdown_parser",
           "references_cell", "stand_ins"]
