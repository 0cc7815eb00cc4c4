"""The kernel-free lab helper (labelled controls, a live readout, the chapter's numbers as JSON),
and the figures' text sizes: none below the book style's smallest."""

import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.font_manager import FontProperties

from transformer_ref.labs import control, heatmap_colors, lab
from transformer_ref.plotting import smallest_text_pt


def test_control_steps_through_its_values():
    c = control("Bq", "query rows per tile", [2, 3, 4, 6], 6)
    assert c == {"name": "Bq", "label": "query rows per tile", "values": [2, 3, 4, 6], "value": 6}
    assert control("m", "m", range(3))["value"] == 0          # default: the first value
    with pytest.raises(ValueError, match="^value 5 of control 'm'"):
        control("m", "m", range(3), 5)
    with pytest.raises(ValueError, match="^values of control 'm'"):
        control("m", "m", [])


def test_lab_html_has_labelled_controls_a_live_readout_and_the_data():
    data = {"S": np.array([[0.5, np.nan], [-np.inf, 1 / 3]]), "trace": {6: [1, 2]}, "text": "</script>"}
    html = str(lab("demo", data, [control("m", "query position m", range(48), 12),
                                  control("Bk", "keys per tile", [2, 3, 4], 3)],
                   title="Lab: a demo", alt='Two panels "quoted"', name="x"))
    assert html.count('<input type="range"') == 2
    for cid, label, index, maximum in (("lab-x-m", "query position m", 12, 47), ("lab-x-Bk", "keys per tile", 1, 2)):
        assert f'<label for="{cid}">{label}</label>' in html
        assert re.search(rf'id="{cid}" name="\w+" min="0" max="{maximum}" step="1" value="{index}"', html)
        assert f'<output for="{cid}" id="{cid}-value">' in html
    assert "data-values='[2, 3, 4]'" in html
    assert 'id="lab-x-readout" aria-live="polite"' in html
    assert 'role="img" aria-label="Two panels &quot;quoted&quot;"' in html
    assert 'role="group" aria-label="Lab: a demo"' in html and 'data-lab="demo"' in html
    payload = re.search(r'<script type="application/json" class="tr-lab-data">(.*?)</script>', html).group(1)
    assert json.loads(payload) == {"S": [[0.5, None], [None, 0.3333333]], "trace": {"6": [1, 2]},
                                   "text": "</script>"}      # NaN and inf as null, 7 digits, no early </script>


def test_heatmap_colors_are_symmetric_around_zero():
    colors = heatmap_colors(np.array([[-2.0, 0.0, 2.0, np.nan]]))
    assert colors[0][3] is None
    low, mid, high = (tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in colors[0][:3])
    assert low[2] > low[0] and high[0] > high[2]               # blue for negative, red for positive
    assert min(mid) > 240                                      # zero is (nearly) white


# --- text sizes: the figures' smallest text is the book style's, so the browser test can size it ---

ROOT = Path(__file__).resolve().parents[2]
# A text size set in code: fontsize=8, labelsize="small", size=9 (inside a text/legend/tick call).
SIZE_ARG = re.compile(r"\b(fontsize|labelsize|titlesize|title_fontsize|size)\s*=\s*(\"[a-z-]+\"|'[a-z-]+'|[0-9.]+)")
TEXT_CALL = re.compile(r"\.(text|annotate|legend|set_title|suptitle|tick_params|set_xticks|set_yticks|"
                       r"set_xticklabels|set_yticklabels|set_xlabel|set_ylabel|bar_label|clabel)\(|fontdict|prop=")


def code_cells(path):
    """The source of every ``{code-cell}`` of a MyST chapter, as (first line number, text) pairs."""
    cells, lines = [], path.read_text(encoding="utf-8").splitlines()
    start = None
    for number, line in enumerate(lines, 1):
        if start is None and line.startswith("```{code-cell}"):
            start = number
        elif start is not None and line.startswith("```"):
            cells.append((start, "\n".join(lines[start:number - 1])))
            start = None
    return cells


def figure_code():
    """(where, line) for every line of chapter code cells and of this plotting module."""
    for path in sorted((ROOT / "chapters").glob("*.md")):
        for start, cell in code_cells(path):
            for offset, line in enumerate(cell.splitlines(), 1):
                yield f"{path.name}:{start + offset}", line
    module = ROOT / "lib" / "transformer_ref" / "plotting.py"
    for number, line in enumerate(module.read_text(encoding="utf-8").splitlines(), 1):
        yield f"plotting.py:{number}", line


def test_code_cells_are_found():
    cells = code_cells(ROOT / "chapters" / "03-causal-mask.md")
    assert len(cells) > 10 and all("```" not in text for _, text in cells)
    assert any("glue(\"fig_cheat\"" in text for _, text in cells)


def test_smallest_text_pt_reads_the_book_style():
    expected = min(10.5, 11, 12, 11.5)                 # ticks, font, title, labels in use_book_style
    assert smallest_text_pt() == expected
    assert FontProperties(size="small").get_size_in_points() < expected   # what the scan below rejects


def test_no_figure_sets_text_smaller_than_the_book_style():
    """Every text size set in code is at least the style's smallest; no figure changes its dpi
    or the style's sizes, so the browser test can compute each figure's smallest text."""
    smallest, small, other = smallest_text_pt(), [], []
    for where, line in figure_code():
        code = line.split("#")[0]
        for name, value in SIZE_ARG.findall(code):
            if name == "size" and not TEXT_CALL.search(code):
                continue                                   # an array size, not a text size
            with plt.rc_context({"font.size": 11}):        # use_book_style's, for named sizes
                points = FontProperties(size=value.strip("\"'")).get_size_in_points()
            if points < smallest:
                small.append(f"{where}: {name}={value} ({points:.1f} pt)")
        if re.search(r"\bdpi\s*=|set_dpi\(|rcParams|rc_context|plt\.rc\(|set_size_inches", code):
            if "plotting.py" not in where:
                other.append(f"{where}: {code.strip()}")
    assert not small, f"text below the book style's {smallest} pt: {small}"
    assert not other, f"figures must keep the book style's dpi and sizes: {other}"
