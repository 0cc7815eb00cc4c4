"""The phone layout of the book's figures, without a browser: ``transformer_ref.plotting``
stacks a figure's panels in one narrow column and ships it in the figure's PNG;
``scripts/phone_figures.py`` takes it out again. The browser tests (``test_site_browser.py``)
check what a phone then shows."""

import base64
import io

import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image

from scripts.phone_figures import png_chunks, split_phone_layout
from transformer_ref.plotting import PHONE_KEY, PHONE_WIDTH_IN, figure_png, phone_layout, use_book_style


@pytest.fixture
def side_by_side():
    """A figure like the chapters' widest: two panels, a colour bar and a figure legend below."""
    with plt.rc_context():
        use_book_style()
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 4.6), gridspec_kw={"width_ratios": [1.35, 1]})
        for k in range(3):
            ax1.plot(np.arange(10), k * np.arange(10), label=f"a model called number {k}")
        ax1.set(xlabel="context length (tokens)", ylabel="cache (GB)", title="Cache vs context")
        image = ax2.imshow(np.arange(64).reshape(8, 8))
        fig.colorbar(image, ax=ax2)
        ax2.set(title="A heat map", xlabel="key j", ylabel="query i")
        fig.legend(*ax1.get_legend_handles_labels(), loc="lower center", ncol=3)
        fig.tight_layout(rect=(0, 0.1, 1, 1))
        yield fig
        plt.close(fig)


def test_the_phone_layout_stacks_the_panels_in_one_column(side_by_side):
    phone = phone_layout(side_by_side)
    try:
        assert tuple(phone.get_size_inches())[0] == pytest.approx(PHONE_WIDTH_IN)
        renderer = phone.canvas.get_renderer()
        panels = [ax for ax in phone.axes if getattr(ax, "_colorbar", None) is None]
        boxes = sorted((ax.get_window_extent(renderer) for ax in panels), key=lambda b: -b.y1)
        assert len(boxes) == 2 and boxes[0].y0 > boxes[1].y1          # one above the other
        whole = phone.get_tightbbox(renderer)                          # everything drawn, in inches
        assert whole.x1 - whole.x0 <= PHONE_WIDTH_IN + 0.02, "text sticks out of the column"
        legend = phone.legends[0].get_window_extent(renderer)
        assert legend.y1 <= boxes[1].y0 and phone.legends[0]._ncols == 1
    finally:
        plt.close(phone)
    assert side_by_side.get_size_inches()[0] == 8  # the figure itself is untouched


def test_the_figure_png_carries_its_phone_layout_and_the_build_takes_it_out(side_by_side):
    data = figure_png(side_by_side)
    stripped, phone = split_phone_layout(data)
    assert phone is not None and PHONE_KEY.encode() not in stripped
    assert [k for k, _ in png_chunks(stripped)] == [k for k, p in png_chunks(data)
                                                    if not p.startswith(PHONE_KEY.encode() + b"\0")]
    desktop = Image.open(io.BytesIO(stripped))
    desktop.load()  # the rewritten chunks' CRCs are checked here
    plain = io.BytesIO()
    side_by_side.savefig(plain, format="png", bbox_inches="tight")
    assert np.array_equal(np.asarray(desktop), np.asarray(Image.open(plain)))   # the page's figure is unchanged
    small = Image.open(io.BytesIO(phone))
    assert small.size[0] <= PHONE_WIDTH_IN * side_by_side.dpi + 0.2 * side_by_side.dpi + 1   # + savefig's padding
    assert small.size[1] > desktop.size[1]
    assert base64.b64decode(Image.open(io.BytesIO(data)).text[PHONE_KEY]) == phone


def test_a_png_without_a_phone_layout_is_left_alone():
    out = io.BytesIO()
    Image.new("RGB", (4, 3)).save(out, format="png")
    assert split_phone_layout(out.getvalue()) == (out.getvalue(), None)
    assert split_phone_layout(b"GIF89a") == (b"GIF89a", None)
