"""The kernel-free lab helper: labelled controls, a live readout, the chapter's numbers as JSON."""

import json
import re

import numpy as np
import pytest

from transformer_ref.labs import control, heatmap_colors, lab


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
