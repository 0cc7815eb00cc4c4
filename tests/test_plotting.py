"""The kernel-free lab helper embeds one image per frame and a working widget."""

import matplotlib.pyplot as plt
import pytest

from transformer_ref.plotting import OKABE_ITO, frames_html


def test_frames_html_embeds_every_frame_once():
    fig, ax = plt.subplots(figsize=(2, 2))
    (line,) = ax.plot([0, 1], [0, 0], color=OKABE_ITO[0])
    calls = []

    def update(i):
        calls.append(i)
        line.set_ydata([0, i])

    html = frames_html(fig, update, 5, interval=200)
    assert calls == [0, 1, 2, 3, 4]  # each frame drawn exactly once, in order
    assert html.count("data:image/png;base64") == 5
    assert "<input" in html and "slider" in html.lower()
    assert not plt.fignum_exists(fig.number)  # the figure is closed afterwards


def test_frames_html_rejects_empty_labs():
    fig = plt.figure()
    with pytest.raises(ValueError, match="^frames"):
        frames_html(fig, lambda i: None, 0)
    plt.close(fig)
