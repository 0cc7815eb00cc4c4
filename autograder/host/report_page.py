"""The report's pages: self-contained HTML with inline SVG figures, a table with each.

A page loads nothing: its figures are inline SVG (matplotlib, text kept as text so that it
scales, can be read by a screen reader and copied), its only image data a ``data:`` URI
inside the heatmap's SVG, its style one ``<style>`` element. A Content-Security-Policy
``<meta>`` tag allows exactly that: no script at all, no connection, no frame, no form,
styles only by the hashes of the page's own ``<style>`` elements (plus ``style``
attributes, which matplotlib's SVG uses), images only from ``data:``.

Everything a submission controls (student ids, failure messages, flags) is data: it reaches
the page only through :func:`esc` (``html.escape`` of :func:`~autograder.core.untrusted.printable`), a link only through :func:`href`
(every path segment percent-encoded), so markup in it is shown as text, never run, whatever
it holds. The pages follow the reader's light or dark setting (``prefers-color-scheme``):
the figures draw their text, axes and first series in placeholder colours that become CSS
variables (:data:`INK` ...), so one SVG serves both.

Phones: a figure is :data:`FIG_WIDTH_IN` wide and its smallest text :data:`MIN_TEXT_PT`; a
390 px phone shows it at least at 12 px. Legends sit above the plot,
never over its data. Every column of every table is on the screen, with no scroller: beside
its figure when the table fits there at its natural width, else below it at the page's full
width (a flex row that wraps: the table's box asks for its natural width); on a screen
narrower than :data:`CARDS_BELOW_REM` a table too wide for a phone (:func:`stacks_on_a_phone`)
shows each row as a card, every value under its column's name; every cell wraps long words.
Nothing scrolls the page sideways.
"""

import base64
import hashlib
import html
import io
import re
import warnings
from dataclasses import dataclass, field
from urllib.parse import quote

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from ..core.untrusted import printable  # noqa: E402
from transformer_ref.plotting import CMAP, CMAP_DIVERGING, OKABE_ITO, use_book_style  # noqa: E402

FIG_WIDTH_IN = 4.2          # 302 pt = 403 CSS px: a 358 px phone column shows it at 89 %
MIN_TEXT_PT = 10.5          # 10.5 pt = 14 px, at 89 %: 12.4 px on a 390 px phone
PHONE_COLUMN_PX = 358       # 390 px less the page's 16 px margins
# Placeholder colours the figures are drawn in, replaced by CSS variables in the SVG.
INK, GRID, ACCENT = "#010203", "#040506", "#070809"
SECOND = OKABE_ITO[1]       # orange: readable on the light and the dark background
MISSING_COLOUR = "#9e9e9e"


LABEL_CHARS = 18            # longer tick labels are cut (the table with it has them whole)


def short(label, limit=LABEL_CHARS):
    """A tick label of at most ``limit`` characters (``…`` marks a cut)."""
    label = str(label)
    return label if len(label) <= limit else label[:limit - 1] + "…"


def esc(value):
    """Any value as HTML text: markup in it is shown, never parsed (quotes included), and
    control characters and bidirectional overrides are shown as escapes (``\\u202e``), so
    that a student's text cannot reorder what the reader sees around it."""
    return html.escape(printable(value), quote=True)


def href(*segments):
    """A relative URL from path segments, each percent-encoded (``/``, ``:`` and all)."""
    return "/".join(s if s == ".." else quote(str(s), safe="") for s in segments)


# -- figures --------------------------------------------------------------------------------
REPORT_RC = {
    "figure.figsize": (FIG_WIDTH_IN, 3.0), "figure.facecolor": "none", "axes.facecolor": "none",
    "savefig.facecolor": "none", "savefig.transparent": True, "svg.fonttype": "none",
    "font.size": MIN_TEXT_PT + 0.5, "axes.titlesize": MIN_TEXT_PT + 1, "axes.labelsize": MIN_TEXT_PT,
    "xtick.labelsize": MIN_TEXT_PT, "ytick.labelsize": MIN_TEXT_PT, "legend.fontsize": MIN_TEXT_PT,
    "legend.title_fontsize": MIN_TEXT_PT, "figure.titlesize": MIN_TEXT_PT + 1,
    "text.color": INK, "axes.labelcolor": INK, "axes.edgecolor": INK, "xtick.color": INK,
    "ytick.color": INK, "grid.color": GRID, "grid.alpha": 1.0, "axes.titleweight": "bold",
    "font.family": "DejaVu Sans", "axes.titlelocation": "left",
    "text.parse_math": False,  # a student id with $...$ is text, not TeX for mathtext
}


def new_figure(height=3.0, width=FIG_WIDTH_IN):
    return Figure(figsize=(width, height))


def svg(fig, name):
    """``fig`` as an inline ``<svg>`` with theme colours as CSS variables, ids unique to ``name``."""
    with matplotlib.rc_context():
        use_book_style()
        matplotlib.rcParams.update(REPORT_RC)
        matplotlib.rcParams["svg.hashsalt"] = name
        buffer = io.StringIO()
        top = 1.0
        if fig.legends:  # a legend above the plots (legend_above): the plots fit below it
            fig.draw_without_rendering()
            top -= max(legend.get_window_extent().height for legend in fig.legends) / fig.bbox.height
        with warnings.catch_warnings():  # "not compatible with tight_layout": it still fits
            warnings.simplefilter("ignore", UserWarning)
            # inside its width, whatever the labels: phones rely on it
            fig.tight_layout(pad=0.4, rect=(0, 0, 1, top))
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    for colour, variable in ((INK, "--ink"), (GRID, "--grid"), (ACCENT, "--accent")):
        text = text.replace(colour, f"var({variable})")
    # the title matplotlib gives an SVG is not the figure's name; the <figure> labels it
    return text.replace("<svg ", f'<svg role="img" aria-labelledby="{esc(name)}-caption" ', 1)


def plotted(draw, name, height=3.0, width=FIG_WIDTH_IN):
    """Call ``draw(fig)`` on a new figure under the report's style and return its SVG."""
    with matplotlib.rc_context():
        use_book_style()
        matplotlib.rcParams.update(REPORT_RC)
        fig = new_figure(height, width)
        draw(fig)
        return svg(fig, name)


def legend_above(ax, labels=None, ncols=1):
    """The axes' legend (``labels`` in place of its artists' own) as a frameless block of
    ``ncols`` columns at the top left of the figure, where it covers no data whatever the
    values; :func:`svg` fits the plots below it."""
    handles, found = ax.get_legend_handles_labels()
    ax.figure.legend(handles, found if labels is None else labels, loc="upper left",
                     bbox_to_anchor=(0, 1), ncols=ncols, borderaxespad=0.2, frameon=False,
                     fontsize=MIN_TEXT_PT, handlelength=1.2, columnspacing=1.2)


def bars(values, labels, xlabel, name, limit=None, colour=ACCENT):
    """A horizontal bar chart, one bar per label, top to bottom."""
    def draw(fig):
        ax = fig.add_subplot()
        ax.barh(range(len(values)), values, color=colour)
        ax.set_yticks(range(len(values)), [short(x) for x in labels])
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        if limit is not None:
            ax.set_xlim(0, limit)
        ax.grid(axis="y", visible=False)
    return plotted(draw, name, height=max(2.2, 0.8 + 0.28 * len(values)))


def histograms(series, edges, xlabel, name):
    """Counts of each ``(label, colour, values)`` in ``series`` over ``edges``, side by side."""
    def draw(fig):
        ax = fig.add_subplot()
        width = (edges[1] - edges[0]) / (len(series) + 1) if len(edges) > 1 else 1.0
        for k, (label, colour, counts) in enumerate(series):
            ax.bar([e + width * (k + 0.5) for e in edges[:-1]], counts, width=width,
                   color=colour, label=label, align="edge")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("students")
        legend_above(ax, ncols=len(series))
        ax.yaxis.get_major_locator().set_params(integer=True)
    return plotted(draw, name)


def phi_matrix(names, pairs, name):
    """Parts by parts, each cell the phi coefficient of the two parts' failures."""
    import numpy as np

    index = {n: i for i, n in enumerate(names)}
    grid = np.full((len(names), len(names)), np.nan)
    for p in pairs:
        i, j = index[p.first], index[p.second]
        grid[i, j] = grid[j, i] = p.phi

    def draw(fig):
        ax = fig.add_subplot()
        cmap = matplotlib.colormaps[CMAP_DIVERGING].with_extremes(bad=MISSING_COLOUR)
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-1, vmax=1)
        ax.set_xticks(range(len(names)), [n.replace("Part ", "P") for n in names])
        ax.set_yticks(range(len(names)), [n.replace("Part ", "P") for n in names])
        ax.grid(False)
        for p in pairs:
            if p.significant:
                i, j = index[p.first], index[p.second]
                for a, b in ((i, j), (j, i)):
                    ax.text(b, a, "*", ha="center", va="center", color="black", fontsize=14)
        fig.colorbar(image, ax=ax, label="phi (* = more than chance)", shrink=0.9, use_gridspec=True)
    return plotted(draw, name, height=3.4)


def heatmap(rows, assignments, name, labels=None):
    """Students (rows) by assignments: percent of the maximum; grey = missing, dot = late."""
    import numpy as np

    data = np.array([[c.percent if c.percent is not None else np.nan for c in row] for row in rows]
                    ).reshape(len(rows), len(assignments))
    cmap = matplotlib.colormaps[CMAP].with_extremes(bad=MISSING_COLOUR)
    late = [(j, i) for i, row in enumerate(rows) for j, c in enumerate(row) if c.late]

    def draw(fig):
        ax = fig.add_subplot()
        image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0, vmax=100, aspect="auto",
                          interpolation="nearest")
        ax.set_xticks(range(len(assignments)), [a.split("-")[0] for a in assignments])
        ax.set_xlabel("assignment")
        if labels is not None:
            ax.set_yticks(range(len(labels)), [short(x) for x in labels])
        else:
            ax.set_ylabel(f"{len(rows)} students, best mean first")
            ax.set_yticks([])
        ax.grid(False)
        if late and len(rows) <= 200:
            xs, ys = zip(*late)
            ax.scatter(xs, ys, s=14, c="white", edgecolors="black", linewidths=0.8)
        fig.colorbar(image, ax=ax, shrink=0.9, use_gridspec=True).ax.set_title("%")
    height = 4.0 if labels is None else max(3.0, 1.4 + 0.22 * len(labels))
    return plotted(draw, name, height=height)


def assignment_means(assignments, means, medians, completion, name):
    """Each assignment's mean and median (percent) and its completion rate."""
    def draw(fig):
        ax = fig.add_subplot()
        x = range(len(assignments))
        ax.bar([i - 0.2 for i in x], [m or 0 for m in means], width=0.4, color=ACCENT, label="mean")
        ax.bar([i + 0.2 for i in x], [m or 0 for m in medians], width=0.4, color=SECOND,
               label="median")
        ax.plot(list(x), completion, color=INK, marker="o", label="handed in")
        ax.set_xticks(list(x), [a.split("-")[0] for a in assignments])
        ax.set_ylim(0, 105)
        ax.set_ylabel("% of the maximum / class")
        ax.set_xlabel("assignment")
        legend_above(ax, ncols=3)
    return plotted(draw, name, height=3.4)


def trajectories(lines, assignments, name):
    """Percent per assignment of each ``(label, values)``: the falling students."""
    def draw(fig):
        ax = fig.add_subplot()
        for k, (label, values) in enumerate(lines):
            ax.plot(range(len(values)), values, marker="o", label=label,
                    color=OKABE_ITO[k % (len(OKABE_ITO) - 1)] if k else ACCENT)
        if lines:
            legend_above(ax, [short(label) for label, _ in lines], ncols=2)
        ax.set_xticks(range(len(assignments)), [a.split("-")[0] for a in assignments])
        ax.set_ylim(-5, 105)
        ax.set_ylabel("% of the maximum")
        ax.set_xlabel("assignment")
    return plotted(draw, name, height=3.0 + 0.25 * ((min(len(lines), 8) + 1) // 2))


# -- tables and the page ------------------------------------------------------------------------
@dataclass
class Table:
    """A table of the page; ``rows`` hold HTML already escaped (use :func:`esc`)."""

    caption: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class Section:
    """A heading, an optional paragraph (escaped HTML), an optional figure and its tables."""

    title: str
    anchor: str
    text: str = ""
    figure: str = ""          # an <svg> from the plotting helpers, or ""
    tables: list[Table] = field(default_factory=list)
    data: list[str] = field(default_factory=list)   # file names of its data, beside the page


PHONE_TABLE_PX = PHONE_COLUMN_PX     # a table narrower than this stays a table on a phone
CARDS_BELOW_REM = 40                 # screens narrower than this show wide tables as cards
CHAR_PX = 8.5                        # a character of table text (0.9 rem), a little generous
CELL_PADDING_PX = 17                 # 0.5 rem either side and the rule


def text_of(cell_html):
    """The text a cell's HTML shows (tags dropped, entities read)."""
    return html.unescape(re.sub(r"<[^>]*>", "", str(cell_html)))


def stacks_on_a_phone(table):
    """Whether ``table`` at its natural width (each column as wide as its longest header or
    value, on one line) is wider than a phone's column (:data:`PHONE_TABLE_PX`), so that a
    narrow screen shows its rows as cards."""
    columns = [[h] for h in table.header]
    for row in table.rows:
        for i, cell in enumerate(row[:len(columns)]):
            columns[i].append(cell)
    natural = sum(CHAR_PX * max(len(text_of(c)) for c in column) + CELL_PADDING_PX
                  for column in columns)
    return natural > PHONE_TABLE_PX


def table_html(table, anchor):
    """The table, its caption and note; a card per row on a narrow screen when it is wide
    (:func:`stacks_on_a_phone`): each cell carries its column's name (``data-label``)."""
    labels = [html.escape(text_of(h), quote=True) for h in table.header]
    head = "".join(f'<th scope="col">{h}</th>' for h in table.header)
    body = "\n".join("<tr>" + "".join(
        (f'<th scope="row">{c}</th>' if i == 0 else f'<td data-label="{labels[i]}">{c}</td>')
        for i, c in enumerate(row)) + "</tr>" for row in table.rows)
    if not table.rows:
        body = f'<tr><td colspan="{len(table.header)}">none</td></tr>'
    note = f'<p class="note">{table.note}</p>' if table.note else ""
    cards = ' class="cards"' if table.rows and stacks_on_a_phone(table) else ""
    return (f'<table{cards}><caption id="{anchor}">{table.caption}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}")


CSS = """
:root { color-scheme: light dark; --bg: #ffffff; --ink: #1b1b1b; --muted: #4a4a4a;
  --grid: #d0d0d0; --accent: #0072b2; --link: #0a58a6; --rule: #c8c8c8; --head: #eef2f6; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #141414; --ink: #ececec; --muted: #c2c2c2; --grid: #4a4a4a; --accent: #56b4e9;
    --link: #8cc8ff; --rule: #4a4a4a; --head: #24292f; } }
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 16px/1.5 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; }
main { max-width: 72rem; margin: 0 auto; padding: 1rem; }
a { color: var(--link); text-decoration: underline; }
h1 { font-size: 1.6rem; line-height: 1.25; margin: 0.5rem 0 0.75rem; overflow-wrap: anywhere; }
h2 { font-size: 1.25rem; margin: 2rem 0 0.5rem; border-top: 1px solid var(--rule); padding-top: 1rem; }
p, li { max-width: 48rem; overflow-wrap: anywhere; }
.note, .data { color: var(--muted); font-size: 0.9rem; }
nav ul { padding-left: 1.2rem; }
.pair { display: flex; flex-wrap: wrap; gap: 1rem 2rem; align-items: flex-start; }
figure { margin: 0; flex: 1 1 20rem; max-width: 34rem; min-width: 0; }
figure svg { width: 100%; height: auto; display: block; }
figcaption { font-size: 0.9rem; color: var(--muted); }
.tables { flex: 1 1 auto; min-width: 0; max-width: 100%; }
table { border-collapse: collapse; font-size: 0.9rem; margin: 0.5rem 0; max-width: 100%; }
caption { text-align: left; font-weight: 600; padding: 0.25rem 0; }
th, td { border-bottom: 1px solid var(--rule); padding: 0.25rem 0.5rem; text-align: left;
  vertical-align: top; max-width: 28rem; overflow-wrap: anywhere; }
thead th { background: var(--head); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 0.9em; }
""" + f"@media (max-width: {CARDS_BELOW_REM}rem) {{" + """
  table.cards, .cards caption, .cards tbody, .cards tr, .cards th, .cards td { display: block; }
  .cards thead { position: absolute; width: 1px; height: 1px; overflow: hidden;
    clip-path: inset(50%); white-space: nowrap; }
  .cards tr { border: 1px solid var(--rule); border-radius: 0.25rem; margin: 0 0 0.5rem;
    padding: 0.25rem 0.5rem; }
  .cards th[scope="row"], .cards td { border: 0; padding: 0.1rem 0; max-width: none; }
  .cards td::before { content: attr(data-label) ": "; font-weight: 600; }
}
"""


def page(title, intro, sections, nav):
    """The whole HTML document: CSP, style, headings, figures with their tables."""
    body = [f"<h1>{esc(title)}</h1>", intro, nav]
    for s in sections:
        body.append(f'<section aria-labelledby="{s.anchor}"><h2 id="{s.anchor}">{esc(s.title)}</h2>')
        if s.text:
            body.append(f"<p>{s.text}</p>")
        tables = "".join(table_html(t, f"{s.anchor}-t{i}") for i, t in enumerate(s.tables))
        if s.figure:
            body.append(f'<div class="pair"><figure>{s.figure}<figcaption id="{s.anchor}-fig-caption">'
                        f"{esc(s.title)} (the table with it holds the same numbers)</figcaption>"
                        f'</figure><div class="tables">{tables}</div></div>')
        else:
            body.append(tables)
        if s.data:
            links = ", ".join(f'<a href="{href(d)}">{esc(d)}</a>' for d in s.data)
            body.append(f'<p class="data">Data: {links}</p>')
        body.append("</section>")
    styles = [CSS]
    content = "\n".join(body)
    styles += _svg_styles(content)
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
                      for s in dict.fromkeys(styles))
    csp = (f"default-src 'none'; img-src data:; style-src {hashes}; "
           "style-src-attr 'unsafe-inline'; base-uri 'none'; form-action 'none'")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            '<meta name="referrer" content="no-referrer">\n'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n"
            f"<body><main>\n{content}\n</main></body></html>\n")


def _svg_styles(content):
    """The text of every ``<style>`` element matplotlib put in the figures (CSP hashes them)."""
    out, start = [], 0
    while (i := content.find("<style", start)) != -1:
        j = content.index(">", i) + 1
        k = content.index("</style>", j)
        out.append(content[j:k])
        start = k
    return out


def figure_id(section_anchor):
    """The id a section's figure caption gets (its SVG is labelled by it)."""
    return f"{section_anchor}-fig"
