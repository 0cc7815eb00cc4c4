"""HTML rendered from a submission, made inert: what feedback pages and the formgrader show.

A student writes a notebook's markdown and raw cells and, through their code, every output,
its MIME types and its metadata. The feedback pages and the formgrader's submission views
render all of it with nbconvert, in the instructor's browser (the formgrader in the origin of
their Jupyter server, whose API reads and writes the course). nbconvert's own
``HTMLExporter.sanitize_html`` is not enough there: nbgrader's ``feedback`` and ``formgrade``
templates render markdown cells without it, nbconvert's ``clean_html`` (bleach) escapes
headings, tables and images into text, and image metadata lands in an unquoted ``width=``
attribute (``width=1 onload=...``). So every piece of a submission reaches a page through
one of three doors, each an allowlist:

* :class:`InertOutputs`, an nbconvert preprocessor: an output keeps only the MIME types that
  render as data (text, HTML and markdown to be cleaned, LaTeX as text, PNG, JPEG and SVG as
  ``data:`` images): ``application/javascript``, widget views and anything unknown are
  dropped; output metadata keeps only numeric ``width``/``height``; attachments keep only
  images; the notebook's widget state is dropped.
* :func:`clean_html`: nh3 (the Ammonia sanitizer) with an allowlist of tags and attributes
  for rendered markdown, tables, code and images: no script, style, iframe, object, form,
  meta, base or link element, no event-handler or ``style`` attribute (CSS ``url()``), links
  only to ``http``/``https``/``mailto`` or within the page, images only from ``data:image/``.
* :func:`markdown2html`: nbconvert's own markdown renderer (math kept for MathJax,
  attachments as ``data:`` images; an attachment that is missing or is not an image renders as
  its alt text), then :func:`clean_html`.

The sanitizer is always the last step: nothing transforms a submission's HTML after it. The
templates' own chain ``markdown2html | strip_files_prefix`` would turn the relative link
``files/javascript:...`` into ``javascript:...`` after cleaning, so :func:`strip_files_prefix`
replaces nbconvert's filter of that name and cleans what it returns (and relative links other
than ``#fragment`` are dropped by the cleaner in the first place).

Student content cannot name the page's elements or wear its styles (the formgrader finds its
score inputs with ``$("#" + grade_id)``, its status bar is ``#statusmessage``, Bootstrap's
``modal-backdrop`` covers the page): every ``id`` is prefixed ``user-content-`` (as GitHub does,
headings included), in-page links ``#x`` follow as ``#user-content-x``, no ``name`` or ``for``
attribute is kept, and ``class`` keeps only :data:`ALLOWED_CLASSES` (the renderer's own inert
ones: heading anchors and Pygments' token classes inside ``div.highlight``).

:func:`exporter_settings` is the ``HTMLExporter`` configuration that installs them; the
course configuration (``autograder.core.nbgrader_config.course_config``) carries it to the
feedback pages, stock ``nbgrader generate_feedback`` and the formgrader. The pages the
grader writes add a Content-Security-Policy (``autograder.core.feedback_page``), so that what a
sanitizer might miss still cannot run or load anything.
"""

import re

import nh3
from jinja2 import pass_context
from nbconvert.preprocessors import Preprocessor
from traitlets.config import Config

# What a rendered output may be: each is escaped, cleaned or shown as a data: image.
RENDERED_MIME_TYPES = frozenset({"text/plain", "text/html", "text/markdown", "text/latex",
                                 "image/png", "image/jpeg", "image/svg+xml"})
IMAGE_MIME_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/svg+xml"})
_SIZE = re.compile(r"\d{1,5}(\.\d{1,3})?")

TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del",
    "details", "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3", "h4", "h5",
    "h6", "hr", "i", "img", "ins", "kbd", "li", "mark", "ol", "p", "pre", "q", "s", "samp",
    "small", "span", "strike", "strong", "sub", "summary", "sup", "table", "tbody", "td",
    "tfoot", "th", "thead", "tr", "u", "ul", "var",
})
ATTRIBUTES = {
    "*": {"id", "title", "lang", "dir"},
    "a": {"href"},
    "img": {"src", "alt", "width", "height"},
    "td": {"colspan", "rowspan", "align"},
    "th": {"colspan", "rowspan", "align", "scope"},
    "ol": {"start"},
}
URL_SCHEMES = frozenset({"http", "https", "mailto", "data"})  # data: only on img (below)
ID_PREFIX = "user-content-"


def _pygments_classes():
    from pygments.token import STANDARD_TYPES

    return frozenset(name for name in STANDARD_TYPES.values() if name)


# The only classes student content may carry: what nbconvert's markdown renderer itself writes
# (heading anchors, highlighted code), none of which the formgrader's scripts or Bootstrap act on.
ALLOWED_CLASSES = {"a": frozenset({"anchor-link"}), "div": frozenset({"highlight"}),
                   "span": _pygments_classes()}


def _attribute_filter(tag, attribute, value):
    if attribute == "src":  # only images carried in the page itself: nothing is fetched
        return value if tag == "img" and value.startswith("data:image/") else None
    if attribute == "href" and value.lower().startswith("data:"):
        return None
    if attribute in ("width", "height"):
        return value if _SIZE.fullmatch(value) else None
    return value


def _relative_url(url):
    """A relative URL: only an in-page link survives, pointed at the prefixed ids."""
    if not url.startswith("#"):
        return None  # files/..., ../api/...: nothing on the grader's pages to link to
    target = url[1:]
    return url if target.startswith(ID_PREFIX) else f"#{ID_PREFIX}{target}"


_CLEANER = nh3.Cleaner(tags=set(TAGS), attributes={k: set(v) for k, v in ATTRIBUTES.items()},
                       allowed_classes={k: set(v) for k, v in ALLOWED_CLASSES.items()},
                       url_schemes=set(URL_SCHEMES), url_relative=_relative_url,
                       id_prefix=ID_PREFIX, attribute_filter=_attribute_filter,
                       strip_comments=True, link_rel="noopener noreferrer nofollow")


def clean_html(html):
    """``html`` (text or bytes) with everything that could run, load or name the page removed (nh3).

    Idempotent: cleaning clean HTML changes nothing (ids already prefixed stay as they are).
    """
    text = html.decode() if isinstance(html, bytes) else str(html)
    return _CLEANER.clean(text)


def strip_files_prefix(text):
    """nbconvert's ``strip_files_prefix`` followed by :func:`clean_html`: the sanitizer stays last.

    nbgrader's and nbconvert's templates write ``cell.source | markdown2html | strip_files_prefix``;
    nbconvert's filter edits ``href``/``src`` after our cleaning (``files/javascript:x`` becomes
    ``javascript:x``), so this filter replaces it in every template the course renders with.
    """
    from nbconvert.filters.strings import strip_files_prefix as nbconvert_strip

    return clean_html(nbconvert_strip(text))


@pass_context
def markdown2html(context, source):
    """Markdown to clean HTML: nbconvert's renderer (math, attachments), then :func:`clean_html`.

    A Jinja filter that replaces nbconvert's ``markdown2html`` in every template, nbgrader's
    ``feedback`` and ``formgrade`` included (they do not pass markdown through ``clean_html``).
    """
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    class Renderer(IPythonRenderer):
        def _embed_image_or_attachment(self, src):
            # nbconvert raises on a missing attachment and takes any MIME type: here an
            # attachment that is missing or holds no image is no image (its alt text shows)
            if src.startswith("attachment:"):
                bundle = self.attachments.get(src[len("attachment:"):])
                if not isinstance(bundle, dict) or not IMAGE_MIME_TYPES & set(bundle):
                    return ""
            return super()._embed_image_or_attachment(src)

    cell = context.get("cell", {})
    renderer = Renderer(escape=False, attachments=cell.get("attachments", {}),
                        embed_images=False, path="", anchor_link_text="¶")
    return clean_html(MarkdownWithMath(renderer=renderer).render(source))


def _image_metadata(meta):
    return {key: meta[key] for key in ("width", "height")
            if isinstance(meta.get(key), (int, float)) and not isinstance(meta.get(key), bool)}


class InertOutputs(Preprocessor):
    """Outputs, attachments and widget state reduced to what renders as data (see above)."""

    def preprocess(self, nb, resources):
        nb.metadata.pop("widgets", None)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        if "attachments" in cell:
            cell.attachments = {name: {mime: data for mime, data in bundle.items()
                                       if mime in IMAGE_MIME_TYPES and isinstance(data, str)}
                                for name, bundle in cell.attachments.items()
                                if isinstance(bundle, dict)}
        for output in cell.get("outputs", []):
            if output.get("output_type") not in ("display_data", "execute_result"):
                continue
            output.data = {mime: data for mime, data in output.get("data", {}).items()
                           if mime in RENDERED_MIME_TYPES}
            output.metadata = {mime: _image_metadata(meta)
                               for mime, meta in output.get("metadata", {}).items()
                               if mime in output.data and isinstance(meta, dict)}
        return cell, resources


def exporter_settings():
    """The ``HTMLExporter`` settings that make a submission inert in any nbconvert template."""
    c = Config()
    c.HTMLExporter.sanitize_html = True  # templates drop javascript and widget outputs
    c.HTMLExporter.skip_svg_encoding = False  # SVG as a data: image, where scripts never run
    c.HTMLExporter.preprocessors = ["autograder.core.sanitize.InertOutputs"]
    c.HTMLExporter.filters = {"clean_html": "autograder.core.sanitize.clean_html",
                              "markdown2html": "autograder.core.sanitize.markdown2html",
                              "strip_files_prefix": "autograder.core.sanitize.strip_files_prefix"}
    return c
