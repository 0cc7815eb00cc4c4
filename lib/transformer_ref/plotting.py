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

__all__ = ["OKABE_ITO", "CMAP", "CMAP_DIVERGING", "use_book_style", "smallest_text_pt"]

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
