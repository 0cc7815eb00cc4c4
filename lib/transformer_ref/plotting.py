"""Plot helpers shared by the chapters (not part of the reference API).

One look for every figure in the book: the Okabe-Ito colour-blind-safe
palette, labelled axes, and the block diagram of chapter 4. The labs a reader
can steer are built by :mod:`transformer_ref.labs`.
"""

import sys

import matplotlib

if "ipykernel" not in sys.modules:
    # headless scripts and tests render off-screen; inside a Jupyter kernel keep the inline
    # backend, or figures would neither display nor glue into the book (myst_nb)
    matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["OKABE_ITO", "CMAP", "CMAP_DIVERGING", "use_book_style", "smallest_text_pt", "phone_layout",
           "figure_png", "PHONE_KEY"]

#: Okabe & Ito (2008), distinguishable under the common colour-vision deficiencies.
OKABE_ITO = [
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#F0E442",  # yellow
    "#000000",  # black
]
#: sequential and diverging colour maps that stay readable in greyscale and for colour-blind readers
CMAP = "viridis"
CMAP_DIVERGING = "RdBu_r"


def use_book_style():
    """Set matplotlib defaults for the book: palette, sizes, light grid, no top/right spines."""
    plt.rcParams.update(
        {
            "axes.prop_cycle": matplotlib.cycler(color=OKABE_ITO),
            "figure.figsize": (7.0, 4.0),
            "figure.dpi": 110,
            "savefig.dpi": 110,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            # Sizes for figures up to 8 in wide (880 px at 110 dpi), which the 1280 px page shows
            # in its 672 px column: legends and tick labels then render at 9 pt (12 px) or more.
            "axes.titlesize": 12,
            "axes.titleweight": "bold",
            "axes.labelsize": 11.5,
            "xtick.labelsize": 10.5,
            "ytick.labelsize": 10.5,
            "legend.fontsize": 10.5,
            "legend.frameon": False,
            "font.size": 11,
        }
    )
    _show_figures_with_their_phone_layout()


#: the rc keys that size a figure's text; a chapter sets no text size of its own below them
TEXT_SIZE_KEYS = ("font.size", "axes.titlesize", "axes.labelsize", "xtick.labelsize",
                  "ytick.labelsize", "legend.fontsize", "legend.title_fontsize", "figure.titlesize")


def smallest_text_pt():
    """The smallest text size, in points, that the book style gives any figure text (a float).

    Named sizes (``"large"``) are resolved against ``font.size``; the rc is left as it was.
    """
    from matplotlib.font_manager import FontProperties

    with plt.rc_context():
        use_book_style()
        sizes = [plt.rcParams[key] for key in TEXT_SIZE_KEYS]
        sizes = [plt.rcParams["legend.fontsize"] if s is None else s for s in sizes]
        return min(FontProperties(size=s).get_size_in_points() for s in sizes)


# --- helpers for chapters 4-6 (transformer block, families, FlashAttention) -------------------

def _box(ax, center, text, color, width, height):
    """A rounded, labelled box centred at ``center`` (data coordinates)."""
    from matplotlib.patches import FancyBboxPatch

    x, y = center
    ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                boxstyle="round,pad=0.02,rounding_size=0.12",
                                facecolor=color + "40", edgecolor=color, linewidth=1.6))
    ax.text(x, y, text, ha="center", va="center")


def _path(ax, points, *, arrow=True):
    """A polyline through ``points``; the last segment ends in an arrow head."""
    xs, ys = zip(*points)
    ax.plot(xs[:-1], ys[:-1], color="black", linewidth=1.2, solid_capstyle="butt")
    ax.annotate("", xy=points[-1], xytext=points[-2],
                arrowprops=dict(arrowstyle="-|>" if arrow else "-", color="black", linewidth=1.2,
                                shrinkA=0, shrinkB=0))


def _plus(ax, center, radius=0.2):
    from matplotlib.patches import Circle

    ax.add_patch(Circle(center, radius, facecolor="white", edgecolor="black", linewidth=1.2, zorder=3))
    ax.text(*center, "+", ha="center", va="center", fontsize=12, zorder=4)


def draw_block_diagram(ax, norm_position="pre", sublayers=None, *, norm_label="LayerNorm", title=None):
    """Draw one transformer block as a data-flow diagram on ``ax`` (bottom to top).

    The residual stream runs up the left; each sublayer branches off to the right and its
    output is added back (the circled +). ``norm_position="pre"`` puts the norm on the
    branch, before the sublayer (``x + F(N(x))``); ``"post"`` puts it on the stream, after
    the addition (``N(x + F(x))``). ``sublayers`` is a list of ``(label, colour)``; the
    default is self-attention then the feed-forward network.
    """
    if norm_position not in ("pre", "post"):
        raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
    if sublayers is None:
        sublayers = [("Multi-head\nself-attention", OKABE_ITO[0]), ("Feed-forward\nnetwork", OKABE_ITO[2])]
    norm_color = OKABE_ITO[1]
    y = 0.0
    ax.text(0, y - 0.35, "input  $x$  $(T \\times C)$", ha="center", va="top")
    for label, color in sublayers:
        branch = y + 0.5
        plus = y + 2.5
        _path(ax, [(0, y), (0, plus - 0.2)])  # the residual stream
        ax.plot([0, 2.0], [branch, branch], color="black", linewidth=1.2)
        if norm_position == "pre":
            _path(ax, [(2.0, branch), (2.0, branch + 0.3)])
            _box(ax, (2.0, branch + 0.52), norm_label, norm_color, 1.7, 0.44)
            _path(ax, [(2.0, branch + 0.74), (2.0, branch + 1.05)])
            _box(ax, (2.0, branch + 1.4), label, color, 2.0, 0.7)
            _path(ax, [(2.0, branch + 1.75), (2.0, plus), (0.2, plus)])
        else:
            _path(ax, [(2.0, branch), (2.0, branch + 0.65)])
            _box(ax, (2.0, branch + 1.0), label, color, 2.0, 0.7)
            _path(ax, [(2.0, branch + 1.35), (2.0, plus), (0.2, plus)])
        _plus(ax, (0, plus))
        y = plus + 0.2
        if norm_position == "post":
            _path(ax, [(0, y), (0, y + 0.25)])
            _box(ax, (0, y + 0.47), norm_label, norm_color, 1.7, 0.44)
            y += 0.69
    _path(ax, [(0, y), (0, y + 0.5)])
    ax.text(0, y + 0.6, "output  $(T \\times C)$", ha="center", va="bottom")
    ax.set_xlim(-1.3, 3.3)
    ax.set_ylim(-1.0, y + 1.2)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title)
    return ax


__all__ += ["draw_block_diagram"]


# --- the phone layout of every figure -----------------------------------------------------------

#: the PNG text chunk that carries a figure's phone layout (a base64 PNG) to the book build,
#: which serves it below 600 px (``scripts/phone_figures.py``) and strips it from the figure
PHONE_KEY = "tr-phone-layout"
#: width of the phone layout (the PNG adds 0.1 in on each side, 396 px in all at 110 dpi): its
#: smallest text (10.5 pt, 16 px) then renders at 13.8 px in the 342 px column of a 390 px
#: phone, above the captions' 13.5 px
PHONE_WIDTH_IN = 3.4
_GAP_IN = 0.25


def _inches(bbox, fig):
    """A display-space bbox in inches from the figure's lower left."""
    return bbox.transformed(fig.dpi_scale_trans.inverted())


def _one_column_legend(legend, *, below=False):
    """Lay ``legend`` out again in one column (a wide legend of a side-by-side figure); with
    ``below``, anchor it at the lower centre of its figure, under the last panel."""
    if legend is None:
        return
    if below:
        legend.set_bbox_to_anchor((0.5, 0.0), transform=legend.figure.transFigure)
        legend._set_loc(8)                                    # lower center
    if legend._ncols != 1:
        legend.set_ncols(1)
        legend._init_legend_box(legend.legend_handles, [t.get_text() for t in legend.texts],
                                markerfirst=getattr(legend, "_markerfirst", True))
        legend._legend_box.set_figure(legend.figure)
        legend._legend_box.set_offset(legend._findoffset)


def _wrap_to(text, width, renderer, fig):
    """Break ``text`` (a Text) into lines at spaces outside ``$...$`` so that it is at most ``width`` inches wide."""
    import re
    import textwrap

    content = text.get_text()
    if not content or "\n" in content or content.count("$") % 2:
        return
    glued = re.sub(r"\$[^$]*\$", lambda m: m.group(0).replace(" ", "\0"), content)   # no break inside math
    wide = _inches(text.get_window_extent(renderer), fig).width
    if wide <= width:
        return
    for chars in range(int(len(content) * width / wide), 8, -2):
        text.set_text(textwrap.fill(glued, chars).replace("\0", " "))
        if _inches(text.get_window_extent(renderer), fig).width <= width:
            return


def phone_layout(fig, width=PHONE_WIDTH_IN):
    """A copy of ``fig`` with its panels stacked in one column ``width`` inches wide (a new Figure).

    The panels (axes at least a tenth of the figure in both directions; the rest, such as
    colour bars, move with the panel beside them) are taken in reading order, top to bottom
    and left to right, and each becomes as wide as the column allows once its own tick labels,
    axis labels and legend are drawn; a panel with a fixed aspect (a heat map, a diagram) keeps
    it, the others keep their height. Legends go to one column; figure legends below the last
    panel; titles, x labels and legend entries wider than the column wrap at spaces (unless
    they hold mathtext). Text keeps its size in points, so on a phone it is as large as on the
    desktop page.
    """
    import io
    import pickle

    phone = pickle.load(io.BytesIO(pickle.dumps(fig)))
    phone.set_layout_engine(None)
    renderer = phone.canvas.get_renderer()
    for legend in phone.legends + [ax.get_legend() for ax in phone.axes if ax.get_legend()]:
        for text in legend.texts:                             # an entry wider than the column wraps
            _wrap_to(text, width - 0.8, renderer, phone)
    for legend in phone.legends:
        _one_column_legend(legend, below=True)
    for ax in phone.axes:
        _one_column_legend(ax.get_legend())
    for ax in phone.axes:                                     # titles and axis labels wider than the column wrap
        for text in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label):
            _wrap_to(text, width - 0.2, renderer, phone)
    phone.draw_without_rendering()   # lays the re-flowed legends out and applies the panels' aspects
    W, H = phone.get_size_inches()
    bars = {ax: getattr(ax, "_colorbar", None) for ax in phone.axes}
    panels = [ax for ax in phone.axes if ax.get_visible() and bars[ax] is None
              and ax.get_position().width > 0.1 and ax.get_position().height > 0.1]
    panels.sort(key=lambda ax: (-round(ax.get_position().y1, 2), ax.get_position().x0))
    beside = {ax: [cax for cax, bar in bars.items() if bar is not None and bar.mappable.axes is ax] for ax in panels}
    slots = []
    for ax in panels:
        box = ax.get_position()
        tight = _inches(ax.get_tightbbox(renderer), phone)
        x0, x1, y0, y1 = box.x0 * W, box.x1 * W, box.y0 * H, box.y1 * H
        left, right = x0 - tight.x0, tight.x1 - x1                       # room for labels and legends
        bottom, top = y0 - tight.y0, tight.y1 - y1
        for cax in beside[ax]:                                           # and for its colour bar
            right += _inches(cax.get_tightbbox(renderer), phone).width + 0.15
        slots.append([ax, left, right, bottom, top, box])
    legends_in = sum(_inches(leg.get_window_extent(renderer), phone).height + _GAP_IN for leg in phone.legends)

    def place(slack):
        """Stack the panels, each ``slack[i]`` inches narrower than the column allows."""
        heights = []
        for (ax, left, right, bottom, top, box), less in zip(slots, slack):
            aw = max(1.2, width - left - right - less)
            heights.append(box.height * H * aw / (box.width * W) if ax.get_aspect() != "auto" else box.height * H)
        total = sum(s[4] + h + s[3] + _GAP_IN for s, h in zip(slots, heights)) + legends_in
        phone.set_size_inches(width, total)
        y = total
        for (ax, left, right, bottom, top, box), less, ah in zip(slots, slack, heights):
            aw = max(1.2, width - left - right - less)
            y -= top + ah
            ax.set_position([left / width, y / total, aw / width, ah / total])
            for cax in beside[ax]:
                cw = cax.get_position().width * W
                cax.set_position([(left + aw + 0.15) / width, y / total, cw / width, ah / total])
            y -= bottom + _GAP_IN

    slack = [0.0] * len(slots)
    for _ in range(3):                                        # shrink a panel whose drawn text sticks out
        place(slack)
        over = []
        for ax in panels:
            t = _inches(ax.get_tightbbox(renderer), phone)
            for cax in beside[ax]:
                t = type(t).union([t, _inches(cax.get_tightbbox(renderer), phone)])
            over.append(max(0.0, t.x1 - width) + max(0.0, -t.x0))
        if max(over, default=0) < 0.02:
            break
        slack = [s + o for s, o in zip(slack, over)]
    if phone._suptitle is not None:
        phone._suptitle.set_position((0.5, 1.0))
    return phone


def figure_png(fig):
    """``fig`` as the notebook shows it (PNG bytes at ``figure.dpi``, cropped to what it draws), with
    its :func:`phone_layout` as a base64 PNG in the text chunk :data:`PHONE_KEY`; None for a
    figure without axes (IPython shows nothing for it either)."""
    import base64
    import io

    def png(figure, metadata=None, bbox="tight"):
        out = io.BytesIO()
        figure.savefig(out, format="png", dpi=fig.dpi, bbox_inches=bbox, facecolor=fig.get_facecolor(),
                       edgecolor=fig.get_edgecolor(), metadata=metadata)
        return out.getvalue()

    if not fig.axes and not fig.lines:                        # an empty figure shows nothing, as in IPython
        return None
    try:
        phone = phone_layout(fig)
    except Exception as error:                                 # a figure the layout cannot copy
        raise RuntimeError(f"no phone layout for this figure: {error}") from error
    # what "tight" would crop to, measured once rather than by a second drawing
    box = _inches(phone.get_tightbbox(phone.canvas.get_renderer()).transformed(phone.dpi_scale_trans), phone)
    phone_png = png(phone, bbox=box.padded(plt.rcParams["savefig.pad_inches"]))
    plt.close(phone)
    return png(fig, {PHONE_KEY: base64.b64encode(phone_png).decode("ascii")})


def _show_figures_with_their_phone_layout():
    """In a Jupyter kernel, make figures display (and glue) as :func:`figure_png`."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return
    from matplotlib.figure import Figure

    if "matplotlib_inline" in plt.get_backend():
        # the inline backend sets its own PNG formatter (once) when it is first imported: import it
        # now, or the chapter's first figure would load it and replace this one
        import matplotlib_inline.backend_inline  # noqa: F401
    shell.display_formatter.formatters["image/png"].for_type(Figure, figure_png)
