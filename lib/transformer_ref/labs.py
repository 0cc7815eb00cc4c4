"""Labs a reader can steer, in the static site, without a kernel (not part of the reference API).

A chapter computes everything a lab shows, with the reference library, when the book is
built; :func:`lab` turns those numbers into a small HTML block: real, labelled ``<input
type="range">`` controls, an empty area that the site's ``_static/labs.js`` fills with SVG
panels, a text readout that says the values of the current setting (``aria-live``, with the
same values in ``data-*`` attributes for the browser tests), and the numbers themselves as
embedded JSON. The JavaScript only looks values up and draws them; it computes nothing that
the chapter did not, except in the labs that compute (``kv``, ``mask``, ``flow``): these
evaluate the formulas of ``_static/lab-formulas.js`` on what the reader types or picks
(:func:`number` and :func:`choice` controls), and the tests hold those formulas equal to the
library's (``tests/book/test_lab_formulas.py``). ``kind`` names the view in ``labs.js`` that knows how to draw that lab:

========= ======= ==================================================================
kind      chapter data it reads
========= ======= ==================================================================
rope      1       ``S`` (N, N) scores ``s(m, n)``, ``S_rgb`` their colours (see
                  :func:`heatmap_colors`), ``q_angle`` and ``k_angle`` (N,) the angle of
                  pair 0 of the rotated q and k in degrees, ``offsets`` and
                  ``score_of_offset`` (2N-1,), ``q`` and ``k`` (D,) the unrotated vectors
norm      4       ``depths`` (n_depths,), ``post`` and ``pre``: per depth ``L`` the ``L``
                  gradient norms of the blocks' W2
training  4       ``loss``, ``accuracy`` and ``correct`` (steps,), ``p_more`` (steps, 64),
                  ``n_ones``, ``jitter`` and ``label`` (64,)
tiles     6       ``S`` (n, n) and ``S_rgb``, ``trace``: per key-tile size B_k, (n, n/B_k, 3)
                  the running max m, running sum l and rescaling factor of every row after
                  each key tile; ``q`` and ``k`` (n, d)
kv        2       ``presets``: name -> the configuration (``attention``, ``layers``,
                  ``kvHeads``, ``headDim``, ``kvLoraRank``, ``ropeHeadDim``) and
                  ``perToken``, the library's bytes per token in 16 bits
mask      3       ``limits``: the largest ``T`` and ``S`` drawn
flow      5       ``src`` (8, d) and ``tgt`` (8, d) token vectors and the projections
                  ``enc`` (Q, K of the encoder), ``dec`` (Q, K of the decoder's self-attention)
                  and ``cross`` (Q from the decoder, K from the encoder's output), each (8, d)
========= ======= ==================================================================

Controls named in the views: ``m``, ``n`` (rope); ``L``, ``layer`` (norm); ``step``
(training); ``Bq``, ``Bk``, ``step`` (tiles); ``preset``, ``attention``, ``layers``, ``kvHeads``,
``headDim``, ``kvLoraRank``, ``ropeHeadDim``, ``seqLen``, ``batch``, ``bits``, ``scales`` (kv);
``kind``, ``T``, ``S``, ``window``, ``prefix``, ``length`` (mask); ``srcLen``, ``tgtLen``,
``sublayer``, ``query`` (flow). A view may narrow a control's values (the
layers of the chosen depth, the steps of the chosen tiling).
"""

import html
import json
import math

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import to_hex

from .plotting import CMAP_DIVERGING

__all__ = ["lab", "control", "number", "choice", "heatmap_colors"]


def control(name, label, values, value=None):
    """One slider of a lab: ``name`` (the key ``labs.js`` reads), its visible ``label``,
    the ``values`` it steps through (a ``range`` or a list of numbers, in order) and the
    initial ``value`` (default: the first). The slider moves over the positions of
    ``values``, so a list such as the divisors of 24 is stepped through one entry at a time.
    """
    values = [v.item() if hasattr(v, "item") else v for v in values]
    if not values:
        raise ValueError(f"values of control {name!r} must not be empty")
    value = values[0] if value is None else value
    if value not in values:
        raise ValueError(f"value {value!r} of control {name!r} is not one of its values")
    return {"name": name, "label": label, "values": values, "value": value}


def number(name, label, value, minimum, maximum):
    """A number box of a lab (``<input type="number">``): any integer from ``minimum`` to
    ``maximum``, initially ``value``. For labs that compute from what the reader types."""
    if not minimum <= value <= maximum:
        raise ValueError(f"value {value!r} of control {name!r} is not in [{minimum}, {maximum}]")
    return {"name": name, "label": label, "type": "number", "value": int(value),
            "min": int(minimum), "max": int(maximum)}


def choice(name, label, options, value=None):
    """A drop-down of a lab (``<select>``): ``options`` is a list of ``(value, text)`` pairs,
    ``value`` the initial one (default: the first)."""
    values = [v for v, _ in options]
    value = values[0] if value is None else value
    if value not in values:
        raise ValueError(f"value {value!r} of control {name!r} is not one of its options")
    return {"name": name, "label": label, "type": "choice", "options": list(options), "value": value}


def heatmap_colors(matrix, cmap=CMAP_DIVERGING, vmax=None):
    """``(R, C)`` hex colours (``"#rrggbb"``) of ``matrix`` (R, C) under a matplotlib colour map
    (default the book's diverging one), symmetric around 0 (``-vmax .. vmax``, default the
    largest magnitude); NaN stays ``None``."""

    matrix = np.asarray(matrix, dtype=float)
    vmax = float(np.nanmax(np.abs(matrix))) if vmax is None else vmax
    rgba = colormaps[cmap]((matrix + vmax) / (2 * vmax))
    return [[None if math.isnan(x) else to_hex(c) for x, c in zip(xs, cs)] for xs, cs in zip(matrix, rgba)]


def _plain(value, digits):
    """``value`` as JSON-ready Python: arrays to nested lists, floats to ``digits`` significant
    digits, NaN and infinities to None."""
    if isinstance(value, dict):
        return {str(k): _plain(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v, digits) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return float(f"{value:.{digits}g}") if math.isfinite(value) else None
    return value


class Lab:
    """The HTML of one lab; a notebook displays it (``_repr_html_``), ``str()`` gives the HTML."""

    def __init__(self, html_text):
        self.html = html_text

    def _repr_html_(self):
        return self.html

    def __str__(self):
        return self.html


def lab(kind, data, controls, *, title, alt, name=None, digits=7):
    """Build a kernel-free lab: ``kind`` (a view of ``_static/labs.js``, see the module
    docstring), its ``data`` (a dict of numbers and arrays computed by the chapter, embedded as
    JSON with ``digits`` significant digits), its ``controls`` (a list of :func:`control`), its
    ``title`` (the accessible name of the whole lab) and ``alt``, the text that describes what
    the panels show. ``name`` makes the element ids unique
    on the page (default: ``kind``): the lab is ``#lab-<name>``, a control ``#lab-<name>-<control>``
    and the readout ``#lab-<name>-readout``. Returns a :class:`Lab`; the last expression of a
    cell displays it.
    """
    name = name or kind
    uid = f"lab-{name}"
    rows = []
    for c in controls:
        cid = f"{uid}-{c['name']}"
        if c.get("type") == "number":
            rows.append(
                f'<div class="tr-lab-control"><label for="{cid}">{html.escape(c["label"])}</label>'
                f'<input type="number" id="{cid}" name="{c["name"]}" min="{c["min"]}" max="{c["max"]}" '
                f'step="1" value="{c["value"]}" inputmode="numeric"></div>')
            continue
        if c.get("type") == "choice":
            options = "".join(f'<option value="{html.escape(str(v))}"{" selected" if v == c["value"] else ""}>'
                              f"{html.escape(text)}</option>" for v, text in c["options"])
            rows.append(f'<div class="tr-lab-control"><label for="{cid}">{html.escape(c["label"])}</label>'
                        f'<select id="{cid}" name="{c["name"]}">{options}</select></div>')
            continue
        index = c["values"].index(c["value"])
        rows.append(
            f'<div class="tr-lab-control"><label for="{cid}">{html.escape(c["label"])}</label>'
            f'<input type="range" id="{cid}" name="{c["name"]}" min="0" max="{len(c["values"]) - 1}" '
            f'step="1" value="{index}" aria-valuetext="{c["value"]}" '
            f"data-values='{json.dumps(c['values'])}'>"
            f'<output for="{cid}" id="{cid}-value">{c["value"]}</output></div>')
    payload = json.dumps(_plain(data, digits), separators=(",", ":"), allow_nan=False)
    payload = payload.replace("</", "<\\/")  # a "</script>" inside the data would end the script
    return Lab(
        f'<div class="tr-lab" id="{uid}" data-lab="{kind}" role="group" aria-label="{html.escape(title)}">'
        f'<div class="tr-lab-controls">{"".join(rows)}</div>'
        f'<div class="tr-lab-panels" role="img" aria-label="{html.escape(alt)}">'
        '<p class="tr-lab-nojs">The book\'s website draws this lab (its labs.js); the numbers it shows are computed in this cell.</p></div>'
        f'<div class="tr-lab-readout" id="{uid}-readout" aria-live="polite"></div>'
        f'<script type="application/json" class="tr-lab-data">{payload}</script>'
        "</div>")
