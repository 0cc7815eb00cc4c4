"""The formulas the computing labs evaluate in the reader's browser (``_static/lab-formulas.js``),
run in Node and held equal to ``transformer_ref``: the KV-cache bytes of every model of
chapter 2 and of random configurations (``kv_cache_bytes``, ``mla_kv_cache_bytes``, and the
scales ``quantize_kv`` makes for a cache quantized per token or per channel), every mask kind
of chapter 3's lab cell by cell (``causal_mask``, ``sliding_window_mask``, ``prefix_lm_mask``,
``padding_mask``) and chapter 5's attention weights (``scaled_dot_product_attention``).
The browser tests (``test_labs_browser.py``) then check that the pages show what these
formulas give. No browser and no built book needed, only Node.
"""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from transformer_ref import numpy as ref

ROOT = Path(__file__).resolve().parents[2]
FORMULAS = ROOT / "_static" / "lab-formulas.js"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="Node not found: apt-get install nodejs")

# name: (layers L, KV heads H_kv, head size D) or ("mla", L, d_c, d_R): chapter 2's models
CHAPTER_2 = {
    "Llama-2-7B": (32, 32, 128), "Llama-2-70B": (80, 8, 128), "Mistral-7B": (32, 8, 128),
    "GPT-3 175B": (96, 96, 128), "Llama 3.1 405B": (126, 8, 128), "DeepSeek-V3": ("mla", 61, 512, 64),
}


def run_js(calls):
    """Evaluate ``[[function, argument...], ...]`` of lab-formulas.js in one Node process."""
    script = (f"const F = require({json.dumps(str(FORMULAS))});"
              "const calls = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "process.stdout.write(JSON.stringify(calls.map(([f, ...args]) => F[f](...args))));")
    done = subprocess.run([NODE, "-e", script], input=json.dumps(calls), capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout)


def library_bytes(c):
    """The cache of configuration ``c`` from the library: its formulas for the numbers, and, below
    16 bits, the codes and scales that ``quantize_kv`` makes for one such cache (sizes only)."""
    mla = c["attention"] == "mla"
    per_element = 2 if c["bits"] == 16 else 1
    if mla:
        full = ref.mla_kv_cache_bytes(c["layers"], c["kvLoraRank"], c["ropeHeadDim"], c["seqLen"], c["batch"], per_element)
    else:
        full = ref.kv_cache_bytes(c["layers"], c["kvHeads"], c["headDim"], c["seqLen"], c["batch"], per_element)
    if c["bits"] == 16:
        return full, 0
    data = full // 2 if c["bits"] == 4 else full
    # one layer's cache as the library quantizes it: (B, H_kv, S, D) keys and values, or (B, S, d_c + d_R)
    shape = (c["batch"], c["seqLen"], c["kvLoraRank"] + c["ropeHeadDim"]) if mla else \
        (c["batch"], c["kvHeads"], c["seqLen"], c["headDim"])
    axis = -2 if c["scales"] == "channel" else -1
    _, scale = ref.quantize_kv(np.ones(shape), bits=c["bits"], axis=axis)
    scales = c["layers"] * scale.size * (1 if mla else 2)
    return data, scales


def configs():
    rng = np.random.default_rng(0)
    out = []
    for bits, scales in [(16, "token"), (8, "token"), (8, "channel"), (4, "token"), (4, "channel")]:
        for spec in CHAPTER_2.values():
            c = {"bits": bits, "scales": scales, "seqLen": 1 if bits == 16 else 32, "batch": 1}
            if spec[0] == "mla":
                c.update(attention="mla", layers=spec[1], kvLoraRank=spec[2], ropeHeadDim=spec[3])
            else:
                c.update(attention="kv", layers=spec[0], kvHeads=spec[1], headDim=spec[2])
            out.append(c)
        for _ in range(6):
            mla = bool(rng.integers(2))
            c = {"bits": bits, "scales": scales, "layers": int(rng.integers(1, 9)), "seqLen": int(rng.integers(1, 40)),
                 "batch": int(rng.integers(1, 4)), "attention": "mla" if mla else "kv"}
            if mla:
                c.update(kvLoraRank=int(rng.integers(1, 64)), ropeHeadDim=int(rng.integers(0, 16)))
            else:
                c.update(kvHeads=int(rng.integers(1, 9)), headDim=2 * int(rng.integers(1, 33)))
            out.append(c)
    return out


def test_kv_cache_bytes_equal_the_library():
    cases = configs()
    got = run_js([["kvCache", c] for c in cases])
    for c, r in zip(cases, got):
        data, scales = library_bytes(c)
        assert r["dataBytes"] == data and r["scales"] == scales, (c, r, data, scales)
        assert r["bytes"] == data + 2 * scales, c
    # the chapter's numbers, per token in 16 bits
    per_token = {name: r["bytes"] for name, r in zip(CHAPTER_2, got)}
    assert per_token["Llama-2-70B"] == 327_680 and per_token["DeepSeek-V3"] == 70_272
    assert per_token["Llama 3.1 405B"] == 516_096


def mask_cases():
    for T in range(1, 9):
        for S in range(1, 9):
            yield {"kind": "causal", "T": T, "S": S}, ref.causal_mask(T, S)
            for window in (1, 2, 5):
                yield {"kind": "sliding", "T": T, "S": S, "window": window}, ref.sliding_window_mask(T, window, S)
            for length in range(S + 1):
                yield ({"kind": "padding", "T": T, "S": S, "length": length},
                       ref.causal_mask(T, S) & ref.padding_mask([length], S)[0, 0])
        for prefix in range(T + 1):
            yield {"kind": "prefix", "T": T, "S": 3, "prefix": prefix}, ref.prefix_lm_mask(T, prefix)


def test_masks_equal_the_library():
    cases = list(mask_cases())
    got = run_js([["mask", c] for c, _ in cases])
    assert len(got) == len(cases) > 500
    for (c, expected), rows in zip(cases, got):
        assert np.array_equal(np.array(rows, dtype=bool).reshape(expected.shape), expected), c


def test_attention_weights_equal_the_library():
    rng = np.random.default_rng(1)
    calls, expected = [], []
    for _ in range(40):
        S, d = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        q, K = rng.standard_normal(d), rng.standard_normal((S, d))
        allowed = rng.random(S) < 0.7
        _, w = ref.scaled_dot_product_attention(q[None], K, K, mask=allowed[None], return_weights=True)
        calls.append(["attend", q.tolist(), K.tolist(), allowed.tolist(), 1 / np.sqrt(d)])
        expected.append(w[0])
    for got, w in zip(run_js(calls), expected):
        assert np.allclose(got, w, rtol=1e-12, atol=1e-15)
