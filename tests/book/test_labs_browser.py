"""The labs of the built site in a real browser: what each shows matches the library.

Every lab (``transformer_ref.labs`` drawn by ``_static/labs.js``) is driven through its
controls to several settings; the values its readout states (text and ``data-*``
attributes) are compared with the same quantities computed here, independently, by
``transformer_ref`` and NumPy from the lab's inputs. Then, on the same page, the things a reader
relies on: labelled controls that work from the keyboard, a live readout, panels side by side
at 1280 px and stacked at 390 px with no sideways scrolling and no text under 9 pt, and
readable text in light and dark mode.
"""

import json
import math

import numpy as np
import pytest

from tests.book.test_site_browser import CHROMIUM_FLAGS, PageLog, browser, site  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

LABS = {  # lab id -> page
    "lab-rope": "chapters/01-rope",
    "lab-norm": "chapters/04-transformer-block",
    "lab-training": "chapters/04-transformer-block",
    "lab-tiles": "chapters/06-flash-attention",
    "lab-kv": "chapters/02-gqa-kv-cache",
    "lab-mask": "chapters/03-causal-mask",
    "lab-flow": "chapters/05-families",
}


def open_lab(browser, site, lab_id):  # noqa: F811
    """``(context, page, log)`` at 1280 px with the page of ``lab_id`` loaded and the lab drawn."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    log = PageLog(page, "127.0.0.1")
    page.goto(f"{site}/{LABS[lab_id]}.html", wait_until="load")
    page.wait_for_selector(f"#{lab_id}.tr-lab-ready", state="attached")
    return context, page, log


def lab_data(page, lab_id):
    return json.loads(page.locator(f"#{lab_id} script.tr-lab-data").text_content())


def set_controls(page, lab_id, **values):
    """Move each named slider to the position of the given value (in order) and return the readout."""
    for name, value in values.items():
        slider = page.locator(f"#{lab_id}-{name}")
        index = json.loads(slider.get_attribute("data-values")).index(value)
        slider.fill(str(index))  # a range input: sets the value and fires 'input'
        assert page.locator(f"#{lab_id}-{name}-value").text_content() == str(value)
    return page.locator(f"#{lab_id}-readout").evaluate("e => Object.assign({text: e.textContent}, e.dataset)")


def type_into(page, lab_id, **values):
    """Type into number boxes and pick from drop-downs (in order); return the readout."""
    for name, value in values.items():
        box = page.locator(f"#{lab_id}-{name}")
        if box.evaluate("e => e.tagName") == "SELECT":
            box.select_option(str(value))
        else:
            box.fill(str(value))  # fires 'input'
    return page.locator(f"#{lab_id}-readout").evaluate("e => Object.assign({text: e.textContent}, e.dataset)")


def shown(x, digits):
    """``x`` as labs.js writes it: fixed decimals, a real minus sign."""
    return f"{x:.{digits}f}".replace("-", "\u2212")


def test_rope_lab_shows_the_library_scores(browser, site):  # noqa: F811
    from transformer_ref import numpy as ref

    context, page, log = open_lab(browser, site, "lab-rope")
    try:
        data = lab_data(page, "lab-rope")
        q, k = np.array(data["q"]), np.array(data["k"])
        N = len(data["S"])
        assert N == 48 and page.locator("#lab-rope-m").get_attribute("max") == str(N - 1)
        for m, n in [(0, 0), (12, 18), (47, 3), (5, 47), (30, 30), (23, 40)]:
            got = set_controls(page, "lab-rope", m=m, n=n)
            qm = ref.apply_rope(q[None], np.array([m]))[0]
            kn = ref.apply_rope(k[None], np.array([n]))[0]
            score = float(qm @ kn)
            angle = (math.degrees(math.atan2(kn[1], kn[0]) - math.atan2(qm[1], qm[0])) + 540) % 360 - 180
            assert (int(got["m"]), int(got["n"]), int(got["offset"])) == (m, n, n - m)
            assert float(got["score"]) == pytest.approx(score, rel=1e-5, abs=1e-5), (m, n)
            assert float(got["angle"]) == pytest.approx(angle, abs=1e-3), (m, n)
            assert shown(float(got["score"]), 3) in got["text"] and f"m = {m}, key at n = {n}" in got["text"]
        check_what_a_reader_meets(page, "lab-rope")
        assert not log.errors, log.errors
    finally:
        context.close()


def test_tile_lab_shows_the_running_max_and_sum_of_every_tiling(browser, site):  # noqa: F811
    from transformer_ref import numpy as ref

    context, page, log = open_lab(browser, site, "lab-tiles")
    try:
        data = lab_data(page, "lab-tiles")
        S, qa, ka = (np.array(data[key]) for key in ("S", "q", "k"))
        n = len(S)
        assert np.allclose(S, qa @ ka.T / np.sqrt(qa.shape[1]), atol=1e-5)
        sizes = json.loads(page.locator("#lab-tiles-Bq").get_attribute("data-values"))
        assert sizes == [b for b in range(2, n + 1) if n % b == 0]
        for bq, bk, step in [(6, 6, 1), (6, 6, 7), (4, 8, 10), (24, 2, 12), (3, 12, 16), (2, 24, 12), (8, 3, 24)]:
            got = set_controls(page, "lab-tiles", Bq=bq, Bk=bk, step=step)
            nk = n // bk
            i, j = divmod(step - 1, nk)
            assert page.locator("#lab-tiles-step").get_attribute("max") == str((n // bq) * nk - 1)
            assert (int(got["qtile"]), int(got["ktile"])) == (i, j)
            rows = json.loads(got["rows"])
            assert [r for r, _, _ in rows] == list(range(i * bq, (i + 1) * bq))
            for r, m, l in rows:  # m, l over the keys seen so far, by definition (not by the recurrence)
                seen = S[r, : (j + 1) * bk]
                assert m == pytest.approx(seen.max(), abs=1e-5)
                assert l == pytest.approx(np.exp(seen - seen.max()).sum(), rel=1e-5)
            table = page.locator("#lab-tiles .tr-lab-table tbody tr")
            assert table.count() == bq
            assert float(table.first.get_attribute("data-l")) == pytest.approx(rows[0][2], rel=1e-9)
        # at the last step of a tiling the last query tile holds its final statistics: lse = m + log l,
        # the same as the library's flash_attention with those tiles
        for bq, bk in [(8, 3), (6, 6)]:
            last = (n // bq) * (n // bk)
            rows = json.loads(set_controls(page, "lab-tiles", Bq=bq, Bk=bk, step=last)["rows"])
            _, lse = ref.flash_attention(qa[None], ka[None], np.zeros((n, 1))[None], block_q=bq, block_k=bk,
                                         return_lse=True)
            for r, m, l in rows:
                assert m + math.log(l) == pytest.approx(lse[0, r], abs=1e-5)
        check_what_a_reader_meets(page, "lab-tiles")
        assert not log.errors, log.errors
    finally:
        context.close()


def test_depth_lab_shows_the_library_gradients(browser, site):  # noqa: F811
    import torch
    import torch.nn.functional as F
    from torch import nn

    from transformer_ref import torch as tref

    def w2_grad_norms(n_layers, norm_position, d=64, n_heads=4):  # chapter 4's experiment, redone here
        torch.manual_seed(0)
        x, target = torch.randn(8, 8, d), torch.randn(8, 8, d)
        blocks = nn.ModuleList(tref.TransformerBlock(d, n_heads, norm_position=norm_position) for _ in range(n_layers))
        with torch.no_grad():
            for p in blocks.parameters():
                if p.ndim == 2:
                    nn.init.xavier_normal_(p)
        h = x
        for block in blocks:
            h = block(h)
        if norm_position == "pre":
            h = tref.layer_norm(h, torch.ones(d), torch.zeros(d))
        F.mse_loss(h, target).backward()
        return [block.w2.grad.norm().item() for block in blocks]

    context, page, log = open_lab(browser, site, "lab-norm")
    try:
        for L, layer in [(2, 1), (16, 16)]:  # kept few: each depth is recomputed here
            got = set_controls(page, "lab-norm", L=L, layer=layer)
            assert page.locator("#lab-norm-layer").get_attribute("max") == str(L - 1)
            post, pre = w2_grad_norms(L, "post"), w2_grad_norms(L, "pre")
            assert float(got["post"]) == pytest.approx(post[layer - 1], rel=1e-4)
            assert float(got["pre"]) == pytest.approx(pre[layer - 1], rel=1e-4)
            assert float(got["lastPost"]) == pytest.approx(post[-1], rel=1e-4)
            assert float(got["lastPre"]) == pytest.approx(pre[-1], rel=1e-4)
            assert shown(float(got["post"]), 4) in got["text"]
        check_what_a_reader_meets(page, "lab-norm")
        assert not log.errors, log.errors
    finally:
        context.close()


def test_training_lab_shows_the_library_training_run(browser, site):  # noqa: F811
    import torch
    import torch.nn.functional as F

    from transformer_ref import torch as tref
    from transformer_ref.data import all_binary_sequences, majority_batch
    from transformer_ref.training import train

    X_all, y_all = all_binary_sequences(6)
    torch.set_num_threads(1)
    torch.manual_seed(0)  # chapter 4's run, redone here
    gen = torch.Generator().manual_seed(1)
    model = tref.EncoderOnlyModel(vocab_size=2, d_model=32, n_layers=2, n_heads=4, max_len=6, n_classes=2)
    history = train(model, lambda mdl, batch: F.cross_entropy(mdl(batch[0]), batch[1]),
                    lambda step: majority_batch(64, 6, generator=gen), steps=40, lr=3e-4,
                    eval_fn=lambda mdl: (mdl(X_all).argmax(-1) == y_all).float().mean().item(), eval_every=1)
    context, page, log = open_lab(browser, site, "lab-training")
    try:
        for step in (1, 10, 25, 40):
            got = set_controls(page, "lab-training", step=step)
            assert float(got["loss"]) == pytest.approx(history["loss"][step - 1], rel=1e-4)
            assert float(got["accuracy"]) == pytest.approx(history["eval"][step - 1], abs=1e-9)
            assert int(got["correct"]) == round(64 * history["eval"][step - 1])
            assert f"{got['correct']} of 64 inputs right" in got["text"]
        check_what_a_reader_meets(page, "lab-training")
        assert not log.errors, log.errors
    finally:
        context.close()


def test_kv_lab_computes_the_library_cache_of_any_configuration(browser, site):  # noqa: F811
    from transformer_ref import numpy as ref

    context, page, log = open_lab(browser, site, "lab-kv")
    try:
        presets = lab_data(page, "lab-kv")["presets"]
        assert len(presets) == 6
        for name, p in presets.items():  # every model of the chapter, as the chapter computed it
            got = type_into(page, "lab-kv", preset=name, seqLen=1, batch=1, bits=16)
            assert int(got["perToken"]) == p["perToken"] == int(got["bytes"]), name
            assert (page.locator("#lab-kv-kvHeads").is_disabled()) == (p["attention"] == "mla")
        # own numbers: the library's formulas, and below 16 bits the scales quantize_kv makes
        got = type_into(page, "lab-kv", preset="own", attention="kv", layers=7, kvHeads=3, headDim=40,
                        seqLen=1000, batch=5, bits=16)
        assert int(got["bytes"]) == ref.kv_cache_bytes(7, 3, 40, 1000, 5)
        assert f"{ref.kv_cache_bytes(7, 3, 40, 1000, 5):,} bytes" in got["text"]
        got = type_into(page, "lab-kv", bits=8, scales="token")
        _, scale = ref.quantize_kv(np.ones((5, 3, 1000, 40)), bits=8, axis=-1)
        assert int(got["dataBytes"]) == ref.kv_cache_bytes(7, 3, 40, 1000, 5, bytes_per_element=1)
        assert int(got["scaleBytes"]) == 2 * 7 * 2 * scale.size
        got = type_into(page, "lab-kv", bits=4, scales="channel")
        _, scale = ref.quantize_kv(np.ones((5, 3, 1000, 40)), bits=4, axis=-2)
        assert int(got["dataBytes"]) * 2 == ref.kv_cache_bytes(7, 3, 40, 1000, 5, bytes_per_element=1)
        assert int(got["scaleBytes"]) == 2 * 7 * 2 * scale.size
        got = type_into(page, "lab-kv", attention="mla", layers=27, kvLoraRank=512, ropeHeadDim=64, bits=16,
                        seqLen=4096, batch=2)
        assert int(got["bytes"]) == ref.mla_kv_cache_bytes(27, 512, 64, 4096, 2)
        assert page.locator("#lab-kv-headDim").is_disabled() and page.locator("#lab-kv-scales").is_disabled()
        got = type_into(page, "lab-kv", layers=99999)  # out of bounds: the box's maximum is used
        assert int(got["bytes"]) == ref.mla_kv_cache_bytes(1000, 512, 64, 4096, 2)
        type_into(page, "lab-kv", layers=27)
        check_what_a_reader_meets(page, "lab-kv")
        assert not log.errors, log.errors
    finally:
        context.close()


def test_mask_lab_draws_the_library_masks(browser, site):  # noqa: F811
    from transformer_ref import numpy as ref

    context, page, log = open_lab(browser, site, "lab-mask")
    try:
        cases = [({"kind": "causal", "T": 8, "S": 8}, ref.causal_mask(8, 8)),
                 ({"kind": "causal", "T": 3, "S": 11}, ref.causal_mask(3, 11)),
                 ({"kind": "causal", "T": 9, "S": 4}, ref.causal_mask(9, 4)),
                 ({"kind": "sliding", "T": 12, "S": 12, "window": 4}, ref.sliding_window_mask(12, 4, 12)),
                 ({"kind": "sliding", "T": 2, "S": 16, "window": 5}, ref.sliding_window_mask(2, 5, 16)),
                 ({"kind": "prefix", "T": 10, "prefix": 4}, ref.prefix_lm_mask(10, 4)),
                 ({"kind": "prefix", "T": 6, "prefix": 0}, ref.prefix_lm_mask(6, 0)),
                 ({"kind": "padding", "T": 7, "S": 7, "length": 4}, ref.causal_mask(7) & ref.padding_mask([4], 7)[0, 0]),
                 ({"kind": "padding", "T": 5, "S": 9, "length": 2}, ref.causal_mask(5, 9) & ref.padding_mask([2], 9)[0, 0])]
        for setting, expected in cases:
            kind = setting.pop("kind")
            type_into(page, "lab-mask", kind=kind)
            got = set_controls(page, "lab-mask", **setting)
            rows = np.array([[c == "1" for c in row] for row in got["bits"].split("/")])
            assert np.array_equal(rows, expected), (kind, setting)
            assert int(got["allowed"]) == expected.sum() and int(got["empty"]) == (~expected.any(1)).sum()
            assert f"{expected.sum()} of {expected.size} pairs may attend" in got["text"]
            cells = page.locator("#lab-mask .tr-lab-panel svg g rect")
            assert cells.count() == expected.size  # one drawn cell per pair
        check_what_a_reader_meets(page, "lab-mask")
        assert not log.errors, log.errors
    finally:
        context.close()


def test_flow_lab_computes_the_library_attention_weights(browser, site):  # noqa: F811
    from transformer_ref import numpy as ref

    context, page, log = open_lab(browser, site, "lab-flow")
    try:
        data = lab_data(page, "lab-flow")
        n = len(data["src"])
        for sub, src, tgt, query in [("cross", 6, 8, 3), ("cross", 2, 5, 4), ("decoder", 8, 8, 0),
                                     ("decoder", 3, 6, 5), ("encoder", 5, 8, 4), ("encoder", 8, 2, 7)]:
            type_into(page, "lab-flow", sublayer=sub)
            got = set_controls(page, "lab-flow", srcLen=src, tgtLen=tgt, query=query)
            q, k = np.array(data[{"cross": "cross", "decoder": "dec", "encoder": "enc"}[sub]]["q"]), \
                np.array(data[{"cross": "cross", "decoder": "dec", "encoder": "enc"}[sub]]["k"])
            mask = ref.causal_mask(n) if sub == "decoder" else np.broadcast_to(ref.padding_mask([src], n)[0, 0], (n, n))
            _, w = ref.scaled_dot_product_attention(q, k, k, mask=mask, return_weights=True)
            assert np.allclose(json.loads(got["weights"]), w[query], atol=1e-6), (sub, src, tgt, query)
            assert int(got["keys"]) == mask[query].sum()
            assert page.locator("#lab-flow-query").get_attribute("max") == str((src if sub == "encoder" else tgt) - 1)
        check_what_a_reader_meets(page, "lab-flow")
        assert not log.errors, log.errors
    finally:
        context.close()


# Sizes and colours a reader sees, measured in the page.
LAYOUT_JS = """lab => {
  const root = document.getElementById(lab), panels = [...root.querySelectorAll('.tr-lab-panel')];
  const box = root.querySelector('.tr-lab-panels').getBoundingClientRect();
  const texts = [...root.querySelectorAll('.tr-lab-panel svg text')].map(t => {
    const svg = t.ownerSVGElement;
    return parseFloat(getComputedStyle(t).fontSize) * svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
  });
  return {panels: panels.map(p => { const r = p.getBoundingClientRect(); return [r.left, r.top, r.width]; }),
          width: box.width, smallestText: Math.min(...texts), texts: texts.length,
          right: root.getBoundingClientRect().right, overflow: root.scrollWidth - root.clientWidth,
          viewport: document.documentElement.clientWidth};
}"""
CONTRAST_JS = """lab => {
  const rgb = s => s.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = c => { const [r, g, b] = c.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
                     return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  let node = document.getElementById(lab), bg = 'rgba(0, 0, 0, 0)';
  while (node && /rgba\\(.*, 0\\)|transparent/.test(bg)) { bg = getComputedStyle(node).backgroundColor; node = node.parentElement; }
  const ratio = fg => { const a = lum(rgb(fg)) + 0.05, b = lum(rgb(bg)) + 0.05; return Math.max(a, b) / Math.min(a, b); };
  const root = document.getElementById(lab);
  return {readout: ratio(getComputedStyle(root.querySelector('.tr-lab-readout')).color),
          label: ratio(getComputedStyle(root.querySelector('label')).color),
          axes: ratio(getComputedStyle(root.querySelector('.tr-lab-panel svg text')).fill)};
}"""


def check_what_a_reader_meets(page, lab_id):
    """Labels, keyboard, live readout; side by side at 1280 px, stacked at 390 px with no sideways
    scrolling and no text under 9 pt; readable text in light and dark mode. Ends at 1280 px, light."""
    root = page.locator(f"#{lab_id}")
    assert root.get_attribute("role") == "group" and root.get_attribute("aria-label")
    assert len(root.locator(".tr-lab-panels").get_attribute("aria-label")) > 80  # a real description
    assert root.locator(".tr-lab-panels").get_attribute("role") == "img"
    assert page.locator(f"#{lab_id}-readout").get_attribute("aria-live") == "polite"
    controls = root.locator("input[type=range], input[type=number], select")
    for index in range(controls.count()):
        control = controls.nth(index)
        label = root.locator(f"label[for='{control.get_attribute('id')}']")
        assert label.count() == 1 and label.is_visible() and label.text_content().strip()
    sliders = root.locator("input[type=range]:enabled")
    if sliders.count():  # the keyboard moves a slider one step and the readout follows
        slider = sliders.last
        slider.fill("0")
        before = page.locator(f"#{lab_id}-readout").text_content()
        slider.focus()
        page.keyboard.press("ArrowRight")
        assert slider.input_value() == "1"
    else:  # ... or steps a number box up by one
        slider = root.locator("input[type=number]:enabled").last
        start = int(slider.input_value())
        before = page.locator(f"#{lab_id}-readout").text_content()
        slider.focus()
        page.keyboard.press("ArrowUp")
        assert slider.input_value() == str(start + 1)
    assert page.locator(f"#{lab_id}-readout").text_content() != before

    wide = page.evaluate(f"({LAYOUT_JS})('{lab_id}')")
    assert len({round(top) for _, top, _ in wide["panels"]}) == 1, \
        f"{lab_id}: at 1280 px the panels should sit side by side: {wide['panels']}"
    assert wide["smallestText"] >= 12 - 1e-6 and wide["texts"] > 10
    page.set_viewport_size({"width": 390, "height": 900})
    page.wait_for_function(f"() => document.querySelector('#{lab_id} .tr-lab-panel svg').getAttribute('width') < 390")
    narrow = page.evaluate(f"({LAYOUT_JS})('{lab_id}')")
    assert narrow["right"] <= narrow["viewport"] and narrow["overflow"] <= 0, \
        f"{lab_id}: at 390 px the lab is wider than the screen: {narrow}"
    assert len({round(left) for left, _, _ in narrow["panels"]}) == 1 and \
        all(w >= 0.97 * narrow["width"] for _, _, w in narrow["panels"]), \
        f"{lab_id}: at 390 px the panels should be stacked, full width: {narrow['panels']}"
    assert narrow["smallestText"] >= 12 - 1e-6, f"{lab_id}: text under 9 pt at 390 px"
    page.set_viewport_size({"width": 1280, "height": 900})
    for theme in ("dark", "light"):  # as the theme's switch does it
        page.evaluate(f"() => {{ document.documentElement.dataset.theme = '{theme}'; }}")
        page.wait_for_timeout(400)  # let colour transitions finish
        contrast = page.evaluate(f"({CONTRAST_JS})('{lab_id}')")
        assert min(contrast.values()) >= 4.5, f"{lab_id} in {theme} mode: {contrast}"
        frame = page.evaluate(f"getComputedStyle(document.getElementById('{lab_id}').parentElement).backgroundColor")
        assert theme == "light" or frame == "rgba(0, 0, 0, 0)", f"{lab_id}: a light frame around it in dark mode"
