"""Plot helpers shared by the chapters (not part of the reference API).

One look for every figure in the book: the Okabe-Ito colour-blind-safe
palette, labelled axes, and a helper that turns a matplotlib animation into a
self-contained HTML widget (slider and play buttons) that works in the static
site without a kernel.
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import animation  # noqa: E402

__all__ = ["OKABE_ITO", "CMAP", "CMAP_DIVERGING", "use_book_style", "animation_html"]

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
            "axes.titlesize": 12,
            "axes.titleweight": "bold",
            "axes.labelsize": 11,
            "legend.frameon": False,
            "font.size": 10,
            "animation.embed_limit": 8.0,  # MB of frames embedded in one page
        }
    )


def animation_html(fig, update, frames, *, interval=400, default_mode="once"):
    """Return self-contained HTML (a ``<div>`` with inline JavaScript) for a kernel-free lab.

    ``update(i)`` redraws ``fig`` for frame ``i`` (``0 <= i < frames``). The frames are
    rendered now, with whatever the chapter computed, and embedded as images; the
    reader scrubs them with the slider and buttons matplotlib's ``to_jshtml`` provides.
    Display the result with ``IPython.display.HTML``. The figure is closed afterwards.
    """
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    anim = animation.FuncAnimation(fig, update, frames=frames, interval=interval, blit=False)
    html = anim.to_jshtml(default_mode=default_mode)
    plt.close(fig)
    return html
