"""The grader-only checks behind the hidden tests.

Each check passes the course's solution and fails typical wrong implementations with a
clear message (NaN outputs, modified inputs and array subclasses included); the memory
checks also require a correct result; visible test cells pass the solution quietly.
"""

import functools
import importlib
import inspect
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import transformer_ref

from notebooks import ASSIGNMENTS, hidden_checks, meta, read, solved_namespace, source_path


from autograder.checks import block, causal, families, flash, gqa, rope, serving  # noqa: E402
from autograder.checks._common import diagnosis_key  # noqa: E402
from autograder.judge.verdict import LocalFunction  # noqa: E402

CHECK_MODULES = (block, causal, families, flash, gqa, rope, serving)
from autograder.core.assignments import REGISTRY  # noqa: E402



def under_the_judge(check):
    """``check`` as the judge hands it the student's function where it measures memory: as a
    :class:`~autograder.judge.verdict.LocalFunction` (memory has one meter, the sandbox's; a
    local function is not measured, so here the check judges the result; the memory bounds are
    tested on the grader's meter in ``tests/grader/judge/test_memory_judge.py``). Other checks
    as they are."""
    if "measure(" not in inspect.getsource(check):
        return check

    @functools.wraps(check)
    def judged(fn):
        return check(LocalFunction(fn, getattr(fn, "__name__", "fn"), []) if callable(fn) else fn)

    return judged


def passing():
    """``(assignment, check, argument)`` of every hidden test, read from the source notebooks
    through the registry: a check a notebook calls is tested here without a list kept by hand."""
    rows = []
    for assignment in REGISTRY:
        if assignment.needs:  # 07-flash-triton has its own test module
            continue
        module = importlib.import_module(f"autograder.checks.{assignment.checks}")
        rows += [(assignment.id, under_the_judge(getattr(module, check)), name)
                 for check, name in hidden_checks(assignment.id)]
    return rows


PASSING = passing()


@pytest.fixture(scope="module")
def solutions():
    return {aid: solved_namespace(aid) for aid in ASSIGNMENTS}


# Frozen expected values. A check compares the student's outputs with transformer_ref's, computed
# live; a library change in mid-term would silently re-grade the class. So every result a check
# takes from transformer_ref (on its seeded inputs) is fingerprinted and kept in FROZEN, and a
# test fails when one moves. To change them on purpose, re-freeze and say why in the commit:
#   FREEZE_CHECKS=1 .venv/bin/python -m pytest tests/grader/assignments/test_checks.py -k passes
FROZEN = Path(__file__).with_name("frozen_checks.json")
REFREEZE = ("if the change is on purpose (and the class may be re-graded), re-freeze with "
            "FREEZE_CHECKS=1 .venv/bin/python -m pytest tests/grader/assignments/test_checks.py -k passes")


def fingerprint(value):
    """A small, JSON-able summary of a result that moves when any entry moves.

    Arrays and tensors: shape, dtype, counts of NaN and of each infinity, the sum of absolute
    values and a sum weighted by fixed random weights (a random projection: changing any entry
    changes it); numbers: themselves; sequences: element by element.
    """
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if isinstance(value, (tuple, list)):
        return [fingerprint(v) for v in value]
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return value.item() if isinstance(value, (np.number, np.bool_)) else value
    if not isinstance(value, np.ndarray):
        return type(value).__name__
    x = value.astype(np.float64).ravel()
    finite = np.where(np.isfinite(x), x, 0.0)
    weights = np.random.default_rng(x.size).standard_normal(x.size)
    return {"shape": list(value.shape), "dtype": str(value.dtype), "nan": int(np.isnan(x).sum()),
            "inf": [int((x == np.inf).sum()), int((x == -np.inf).sum())],
            "abs": float(np.abs(finite).sum()), "weighted": float(finite @ weights)}


def moved(old, new):
    """Why fingerprint ``new`` differs from the frozen ``old``, or None if it does not."""
    if isinstance(old, dict) and isinstance(new, dict):
        exact = {k: old[k] for k in ("shape", "dtype", "nan", "inf")}
        if exact != {k: new[k] for k in exact}:
            return f"{exact} became {({k: new[k] for k in exact})}"
        rtol = 1e-5 if old["dtype"] in ("float32", "float16", "bfloat16") else 1e-9
        scale = max(old["abs"], 1e-300)
        for key in ("abs", "weighted"):
            if abs(new[key] - old[key]) > rtol * scale:
                what = "sum of |x|" if key == "abs" else "weighted sum"
                return f"its entries changed ({what} {old[key]:.12g} -> {new[key]:.12g})"
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return next((m for m in map(moved, old, new) if m), None)
    if isinstance(old, float) and isinstance(new, (int, float)):
        return None if abs(new - old) <= 1e-9 * max(abs(old), 1e-300) else f"{old!r} became {new!r}"
    return None if old == new else f"{old!r} became {new!r}"


class Recorder:
    """A transformer_ref backend that logs a fingerprint of every result its functions return."""

    def __init__(self, backend, prefix, log):
        self._backend, self._prefix, self._log = backend, prefix, log

    def __getattr__(self, name):
        value = getattr(self._backend, name)
        if not callable(value) or isinstance(value, type):
            return value

        def recorded(*args, **kwargs):
            out = value(*args, **kwargs)
            self._log.append([f"{self._prefix}.{name}", fingerprint(out)])
            return out

        return recorded


@pytest.mark.parametrize("aid, check, name", PASSING, ids=[p[1].__name__ for p in PASSING])
def test_check_passes_the_solution_with_its_frozen_expected_values(solutions, aid, check, name,
                                                                  capfd, monkeypatch):
    log = []
    module = importlib.import_module(check.__module__)
    monkeypatch.setattr(module, "ref", Recorder(module.ref, "ref", log))
    monkeypatch.setattr(transformer_ref, "torch", Recorder(transformer_ref.torch, "tref", log))
    check(solutions[aid][name])
    assert capfd.readouterr().err == "", "a passing check must print nothing on stderr"
    key = f"{aid}::{check.__name__}"
    frozen = json.loads(FROZEN.read_text()) if FROZEN.is_file() else {}
    if os.environ.get("FREEZE_CHECKS"):
        frozen[key] = log
        FROZEN.write_text(json.dumps(frozen, indent=1, sort_keys=True) + "\n")
        return
    assert key in frozen, f"{key} has no frozen expected values yet: {REFREEZE}"
    calls = [call for call, _ in frozen[key]]
    assert [call for call, _ in log] == calls, (
        f"{key} moved: it now asks transformer_ref for {[c for c, _ in log]} instead of {calls}; "
        f"{REFREEZE}")
    for i, ((call, old), (_, new)) in enumerate(zip(frozen[key], log)):
        why = moved(old, new)
        assert why is None, (f"{key} moved: its expected value #{i} ({call}) changed: {why}. A "
                             f"library change would re-grade the class; {REFREEZE}")


# (assignment, check, function, [(old, new) edits of the solution code], words the message must contain)
MUTANTS = [
    ("rope-pair-layout", "01-rope", rope.check_apply_rope, "apply_rope",
     [("a, b = x[..., 0::2], x[..., 1::2]", "a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]")],
     "pair layout"),
    ("rope-wrong-sign", "01-rope", rope.check_apply_rope, "apply_rope",
     [("out[..., 0::2] = a * cos - b * sin", "out[..., 0::2] = a * cos + b * sin")], "values are wrong"),
    ("rope-freq-off-by-one", "01-rope", rope.check_rope_inv_freq, "rope_inv_freq",
     [("i = np.arange(head_dim // 2)", "i = np.arange(1, head_dim // 2 + 1)")], "values are wrong"),
    ("rope-freq-missing-two", "01-rope", rope.check_rope_inv_freq, "rope_inv_freq",
     [("return base ** (-2.0 * i / head_dim)", "return base ** (-1.0 * i / head_dim)")], "values are wrong"),
    ("rope-no-value-error", "01-rope", rope.check_rope_inv_freq, "rope_inv_freq",
     [("raise ValueError(f\"head_dim must be even for RoPE, got {head_dim}\")", "pass")], "ValueError"),
    ("ntk-linear-scale", "01-rope", rope.check_ntk_inv_freq, "ntk_inv_freq",
     [("base * scale ** (head_dim / (head_dim - 2))", "base * scale")], "values are wrong"),
    ("ntk-as-interpolation", "01-rope", rope.check_ntk_inv_freq, "ntk_inv_freq",
     [("return rope_inv_freq(head_dim, base * scale ** (head_dim / (head_dim - 2)))",
       "return rope_inv_freq(head_dim, base) / scale")], "values are wrong"),
    ("llama3-blend-reversed", "01-rope", rope.check_llama3_inv_freq, "llama3_inv_freq",
     [("blended = (1 - g) * theta / scale + g * theta", "blended = g * theta / scale + (1 - g) * theta")],
     "values are wrong"),
    ("llama3-no-value-error", "01-rope", rope.check_llama3_inv_freq, "llama3_inv_freq",
     [("if high_freq_factor <= low_freq_factor:", "if False:")], "ValueError"),
    ("repeat-tiled", "02-gqa-kv-cache", gqa.check_repeat_kv, "repeat_kv",
     [("return np.repeat(x, n_rep, axis=-3)", "return np.concatenate([x] * n_rep, axis=-3)")], "interleave"),
    ("gqa-no-scale", "02-gqa-kv-cache", gqa.check_grouped_query_attention, "grouped_query_attention",
     [(" / np.sqrt(q.shape[-1])  # (..., H_q, T, S)", "")], "values are wrong"),
    ("kv-bytes-no-two", "02-gqa-kv-cache", gqa.check_kv_cache_bytes, "kv_cache_bytes",
     [("return 2 * n_layers", "return n_layers")], "not correct"),
    ("torch-detached", "02-gqa-kv-cache", gqa.check_grouped_query_attention_torch, "grouped_query_attention_torch",
     [("return torch.softmax(scores, dim=-1) @ v", "return (torch.softmax(scores, dim=-1) @ v).detach()")],
     "differentiate"),
    ("decode-no-append", "02-gqa-kv-cache", gqa.check_decode_step, "decode_step",
     [("return grouped_query_attention(q_new, k_cache, v_cache), k_cache, v_cache",
       "return grouped_query_attention(q_new, k_cache, v_cache), k_new, v_new")], "caches must have shape"),
    ("decode-prepend", "02-gqa-kv-cache", gqa.check_decode_step, "decode_step",
     [("v_cache = np.concatenate([v_cache, v_new], axis=-2)", "v_cache = np.concatenate([v_new, v_cache], axis=-2)")],
     "values are wrong"),
    ("mla-scale-nope-only", "02-gqa-kv-cache", gqa.check_mla_absorbed_attention, "mla_absorbed_attention",
     [("scale = 1.0 / np.sqrt(q_nope.shape[-1] + q_rope.shape[-1])", "scale = 1.0 / np.sqrt(q_nope.shape[-1])")],
     "values are wrong"),
    ("mla-no-rope-term", "02-gqa-kv-cache", gqa.check_mla_absorbed_attention, "mla_absorbed_attention",
     [("(q_latent @ c_t + q_rope @ k_rope_t) * scale", "(q_latent @ c_t) * scale")], "values are wrong"),
    ("mask-top-left", "03-causal-mask", causal.check_causal_mask, "causal_mask",
     [("return j <= i + (S - T)", "return j <= i")], "top-left"),
    ("mask-off-by-one", "03-causal-mask", causal.check_causal_mask, "causal_mask",
     [("return j <= i + (S - T)", "return j < i + (S - T)")], "entries are wrong"),
    ("softmax-nan-rows", "03-causal-mask", causal.check_masked_softmax, "masked_softmax",
     [("row_max = np.where(np.isfinite(row_max), row_max, 0.0)", ""),
      ("return e / np.where(total > 0, total, 1.0)", "return e / total")], "NaN"),
    ("softmax-finite-fill", "03-causal-mask", causal.check_masked_softmax, "masked_softmax",
     [("masked = np.where(mask, scores, -np.inf)", "masked = np.where(mask, scores, -1e9)"),
      ("e = np.where(mask, np.exp(masked - row_max), 0.0)", "e = np.exp(masked - row_max)")], "values are wrong"),
    ("softmax-unstable", "03-causal-mask", causal.check_masked_softmax, "masked_softmax",
     [("np.exp(masked - row_max)", "np.exp(masked)")], "NaN"),
    ("attention-no-scale", "03-causal-mask", causal.check_causal_attention, "causal_attention",
     [("scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])", "scores = q @ np.swapaxes(k, -1, -2)")],
     "values are wrong"),
    ("cache-sees-everything", "03-causal-mask", causal.check_cached_causal_attention, "cached_causal_attention",
     [("k[..., :end, :], v[..., :end, :]", "k, v")], "values are wrong"),
    ("layernorm-unbiased", "04-transformer-block", block.check_layer_norm, "layer_norm",
     [("var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)",
       "var = x.var(axis=-1, ddof=1, keepdims=True)")], "values are wrong"),
    ("ffn-relu", "04-transformer-block", block.check_feed_forward, "feed_forward",
     [("return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))", "return np.maximum(x, 0.0)")], "values are wrong"),
    ("ffn-gelu-tanh", "04-transformer-block", block.check_feed_forward, "feed_forward",
     [("return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))",
       "return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))")], "values are wrong"),
    ("mha-no-scale", "04-transformer-block", block.check_multi_head_attention, "multi_head_attention",
     [("scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(head_dim)\n", "scores = q @ np.swapaxes(k, -1, -2)\n")],
     "values are wrong"),
    ("mha-scale-by-width", "04-transformer-block", block.check_multi_head_attention, "multi_head_attention",
     [("/ np.sqrt(head_dim)\n", "/ np.sqrt(C)\n")], "values are wrong"),
    ("block-post-as-pre", "04-transformer-block", block.check_post_norm_block, "transformer_block",
     [('if norm_position == "post":', 'if norm_position == "never":')], "ValueError"),
    ("block-pre-missing-residual", "04-transformer-block", block.check_pre_norm_block, "transformer_block",
     [("return x + ffn(ln(x, \"ln2\"))", "return ffn(ln(x, \"ln2\"))")], "values are wrong"),
    ("params-no-norm-bias", "04-transformer-block", block.check_block_param_count, "block_param_count",
     [("norms = 2 * (2 * d_model if bias else d_model)", "norms = 2 * d_model")], "not correct"),
    ("encoder-mask-causal", "05-families", families.check_encoder_mask, "encoder_mask",
     [("return np.repeat(real_keys[:, None, :], T, axis=1)",
       "return np.repeat(real_keys[:, None, :], T, axis=1) & np.tri(T, dtype=bool)")], "entries are wrong"),
    ("encoder-mask-padding-queries", "05-families", families.check_encoder_mask, "encoder_mask",
     [("return np.repeat(real_keys[:, None, :], T, axis=1)", "return np.repeat(real_keys[:, :, None], T, axis=2)")],
     "entries are wrong"),
    ("cross-keys-from-x", "05-families", families.check_cross_attention, "cross_attention",
     [('k = split_heads(memory @ params["wk"] + params["bk"])', 'k = split_heads(x @ params["wk"] + params["bk"])'),
      ('v = split_heads(memory @ params["wv"] + params["bv"])', 'v = split_heads(x @ params["wv"] + params["bv"])')],
     "values are wrong"),
    ("decoder-mask-no-padding", "05-families", families.check_decoder_mask, "decoder_mask",
     [("return encoder_mask(lengths, T) & causal", "return np.broadcast_to(causal, (len(lengths), T, T))")],
     "entries are wrong"),
    ("cross-causal", "05-families", families.check_cross_attention, "cross_attention",
     [("if memory_mask is not None:", "if True:"),
      ("scores = np.where(memory_mask, scores, -np.inf)",
       "scores = np.where(np.tril(np.ones(scores.shape[-2:], dtype=bool)), scores, -np.inf)")],
     "values are wrong"),
    ("online-nan-on-masked-chunk", "06-flash-attention", flash.check_online_softmax, "online_softmax",
     [("safe = np.where(np.isfinite(m_new), m_new, 0.0)  # a row that is still all -inf", "safe = m_new")],
     "NaN"),
    ("online-no-rescale", "06-flash-attention", flash.check_online_softmax, "online_softmax",
     [("l * np.exp(m - safe) + chunk_sum", "l + chunk_sum")], "values are wrong"),
    ("flash-no-acc-rescale", "06-flash-attention", flash.check_flash_attention, "flash_attention",
     [("acc = rescale[..., None] * acc + p @ v[..., j0:j1, :]", "acc = acc + p @ v[..., j0:j1, :]")],
     "values are wrong"),
    ("flash-no-final-division", "06-flash-attention", flash.check_flash_attention, "flash_attention",
     [("out[..., i0:i1, :] = acc / np.where(l > 0, l, 1.0)[..., None]", "out[..., i0:i1, :] = acc")],
     "values are wrong"),
    ("flash-top-left-tiles", "06-flash-attention", flash.check_flash_attention, "flash_attention",
     [("<= np.arange(i0, i1)[:, None] + S - T", "<= np.arange(i0, i1)[:, None]"),
      ("newest_key = i1 - 1 + S - T", "newest_key = i1 - 1")], "values are wrong"),
    ("flash-drops-ragged-tile", "06-flash-attention", flash.check_flash_attention, "flash_attention",
     [("for j0 in range(0, S, block_k):", "for j0 in range(0, S - block_k + 1, block_k):")],
     "values are wrong"),
    ("window-off-by-one", "06-flash-attention", flash.check_sliding_window_attention, "sliding_window_attention",
     [("(offset > -window)", "(offset >= -window)")], "values are wrong"),
    ("window-one-short", "06-flash-attention", flash.check_sliding_window_attention, "sliding_window_attention",
     [("(offset > -window)", "(offset > 1 - window)")], "values are wrong"),
    ("window-no-scale", "06-flash-attention", flash.check_sliding_window_attention, "sliding_window_attention",
     [("np.swapaxes(k[..., j0:i1, :], -1, -2) * scale", "np.swapaxes(k[..., j0:i1, :], -1, -2)")],
     "values are wrong"),
    ("flash-no-scale", "06-flash-attention", flash.check_flash_attention, "flash_attention",
     [("q_tile = q[..., i0:i1, :] * scale", "q_tile = q[..., i0:i1, :]")], "values are wrong"),
    ("lse-no-max", "08-serving", serving.check_attention_with_lse, "attention_with_lse",
     [("m = np.where(np.isfinite(m), m, 0.0)\n    p = np.exp(scores - m)", "m = 0.0 * m\n    p = np.exp(scores)")],
     "NaN"),
    ("merge-by-block-size", "08-serving", serving.check_merge_attention, "merge_attention",
     [("w = np.exp(lses - m)", "w = np.ones_like(lses)")], "values are wrong"),
    ("merge-nan-unseen-rows", "08-serving", serving.check_merge_attention, "merge_attention",
     [("m = np.where(np.isfinite(m), m, 0.0)                         # rows that no piece saw", "")], "NaN"),
    ("decoding-remainder-last", "08-serving", serving.check_flash_decoding, "flash_decoding",
     [("sizes = [S // n_splits + (i < S % n_splits) for i in range(n_splits)]",
       "sizes = [S // n_splits] * (n_splits - 1) + [S - (n_splits - 1) * (S // n_splits)]")], "longer pieces first"),
    ("gather-ignores-the-table", "08-serving", serving.check_gather_kv, "gather_kv",
     [("blocks = np.asarray(block_table, dtype=int)[positions // block_size]", "blocks = positions // block_size")],
     "values are wrong"),
    ("append-takes-from-the-back", "08-serving", serving.check_append_kv, "append_kv",
     [("block_table = list(block_table) + list(free_list[:needed])\n    free_list = list(free_list[needed:])",
       "block_table = list(block_table) + list(free_list[::-1][:needed])\n"
       "    free_list = list(free_list[::-1][needed:])[::-1]")], "front of the free list"),
    ("append-ignores-room-in-the-last-block", "08-serving", serving.check_append_kv, "append_kv",
     [("needed = max(0, -(-(length + T_new) // block_size) - len(block_table))", "needed = -(-T_new // block_size)")],
     "block table should become"),
    ("append-no-value-error", "08-serving", serving.check_append_kv, "append_kv",
     [("if needed > len(free_list):", "if False:")], "ValueError"),
]


def _naive_flash(q, k, v, causal=False, block_q=64, block_k=64):
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        scores = np.where(np.arange(S)[None, :] <= np.arange(T)[:, None] + S - T, scores, -np.inf)
    w = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


def known_mistakes():
    """``{key: (function, Mistake)}`` of every checks module's table of known mistakes."""
    found = {}
    for module in CHECK_MODULES:
        for function, mistakes in module.MISTAKES.items():
            for mistake in mistakes:
                if mistake.cause:  # an earlier function's mistake, seen through this one
                    assert mistake.key in found, mistake
                    continue
                assert mistake.key not in found, f"two known mistakes named {mistake.key}"
                found[mistake.key] = (function, mistake)
    return found


KNOWN = known_mistakes()


@pytest.mark.parametrize("label, aid, check, name, edits, words", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_check_fails_a_typical_mistake(label, aid, check, name, edits, words):
    """Every mutant fails with its words, and its verdict names it (the checks' MISTAKES tables,
    keyed by the mutant's label) with its fix."""
    wrong = solved_namespace(aid, edits)[name]
    with pytest.raises(AssertionError, match=words) as failed:
        check(wrong)
    function, mistake = KNOWN[label]
    assert function == name
    message = str(failed.value)
    assert diagnosis_key(message) == label and mistake.fix in message, message


@pytest.mark.parametrize("aid", sorted({m[1] for m in MUTANTS}))
def test_every_failure_of_a_mutant_names_its_mistake(aid):
    """Each mutant's notebook against every hidden check of its assignment: every check that fails
    (its own function's, and those of the parts that call it) names the mutant's mistake, so the
    report counts it once; a later part that fails through an earlier one says to fix that first."""
    checks = [(check, name) for a, check, name in PASSING if a == aid]
    cascades, unnamed = 0, []
    for label, _, _, function, edits, _ in (m for m in MUTANTS if m[1] == aid):
        namespace = solved_namespace(aid, edits)
        for check, name in checks:
            try:
                check(namespace[name])
            except AssertionError as failed:
                message = str(failed)
                if diagnosis_key(message) != label:
                    unnamed.append(f"{label} through {check.__name__}: {message}")
                cascades += f"Fix {function} first" in message
    assert not unnamed, "\n".join(unnamed)
    assert cascades or aid in {"06-flash-attention"}, "no part of this assignment calls another: say so here"


def test_a_cascade_names_the_earlier_functions_mistake(solutions):
    """ntk_inv_freq calls rope_inv_freq: with rope_inv_freq's mistake planted, ntk_inv_freq's
    verdict names that mistake (the same key: the report counts it once) and says to fix it first."""
    edits = next(m[4] for m in MUTANTS if m[0] == "rope-freq-off-by-one")
    with pytest.raises(AssertionError) as failed:
        rope.check_ntk_inv_freq(solved_namespace("01-rope", edits)["ntk_inv_freq"])
    message = str(failed.value)
    assert diagnosis_key(message) == "rope-freq-off-by-one" and "Fix rope_inv_freq first" in message


def test_every_known_mistake_is_planted():
    """The checks' tables of known mistakes and the planted mutants are one list: every entry
    of a table has its mutant here and every mutant is a known mistake (so each is tested, and
    the class of the parity test names every one)."""
    assert set(KNOWN) == {m[0] for m in MUTANTS}, set(KNOWN) ^ {m[0] for m in MUTANTS}


WRONG_ANSWERS = [(module.__name__.rsplit(".", 1)[1], name, mistake) for module in CHECK_MODULES
                 for name, mistakes in getattr(module, "WRONG_ANSWERS", {}).items() for mistake in mistakes]


@pytest.mark.parametrize("module, name, mistake", WRONG_ANSWERS, ids=[w[2].key for w in WRONG_ANSWERS])
def test_wrong_answers_of_a_known_kind_are_named(module, name, mistake):
    """A known wrong answer (its value computed from the check's own model), exact or as typed
    from a printed value, fails naming its mistake, never the right answer; a wrong answer of no
    known kind names none."""
    check = getattr(globals()[module], f"check_{name.lower()}")
    wrong = mistake.produce()
    right = float(solved_namespace(next(a for a, c, n in PASSING if c is check))[name])
    assert wrong != right
    typed = float(f"{wrong:.4g}") if not float(wrong).is_integer() else wrong  # as printed
    for answer in (wrong, typed):
        with pytest.raises(AssertionError) as failed:
            check(answer)
        message = str(failed.value)
        assert diagnosis_key(message) == mistake.key and mistake.fix in message, message
        shown = {f"{right:.4g}", f"{right:,.0f}", f"{right:.0f}"} if abs(right) >= 100 else {f"{right:.4g}"}
        assert not re.search(rf"(?<![\d.])({'|'.join(map(re.escape, shown))})(?![\d])", message), message
    with pytest.raises(AssertionError) as failed:
        check(right * 1.37 + 1)
    assert diagnosis_key(str(failed.value)) is None


@pytest.mark.parametrize("aid, check, name", PASSING, ids=[p[1].__name__ for p in PASSING])
def test_every_check_attaches_its_hint_whatever_the_failure(aid, check, name):
    """An exception, NaN, a wrong type or a wrong number: the verdict says what is wrong and then
    what to do (a second sentence), never only the symptom."""
    def raises(*args, **kwargs):
        raise RuntimeError("boom")

    def nans(*args, **kwargs):
        return np.full((3, 3), np.nan)

    if name.startswith("ANSWER_"):
        if check.__module__.endswith("families"):  # letters: the choices are the hint
            return
        attempts = [float("nan"), 123456.789]
    else:
        attempts = [raises, nans]
    for attempt in attempts:
        with pytest.raises(AssertionError) as failed:
            check(attempt)
        message = str(failed.value)
        if attempt is raises:  # the exception's own text, then the advice
            assert message.split("RuntimeError: boom", 1)[1].strip(" ."), message
        else:  # the symptom's sentence, then the advice
            assert re.search(r"\.\s+\S", message), message


def test_every_failure_carries_the_hint():
    """A NaN, a wrong shape or an exception get the check's advice too, not only wrong values."""
    hint = "treat a chunk whose entries are all -inf without producing NaN"
    outputs = [lambda chunks: (np.zeros(3), np.full(3, np.nan)), lambda chunks: (np.zeros(3), np.zeros(7))]
    for fn in outputs:
        with pytest.raises(AssertionError, match=hint):
            flash.check_online_softmax(fn)

    def apply_rope(x, positions, inv_freq):
        raise IndexError("index 8 is out of bounds")

    with pytest.raises(AssertionError, match="IndexError.*Check the pair layout"):
        rope.check_apply_rope(apply_rope)


def test_memory_is_measured_only_through_the_judge():
    """One meter: a plain function cannot be measured (no second, in-process meter)."""
    with pytest.raises(TypeError, match="memory is measured only through the judge"):
        flash.check_flash_memory(_naive_flash)


@pytest.mark.parametrize("check", [under_the_judge(flash.check_flash_memory),
                                   under_the_judge(flash.check_sliding_window_memory)],
                         ids=["flash", "window"])
@pytest.mark.parametrize("fn, words", [
    (lambda *args, **kwargs: 0, "expected an output of shape"),
    (lambda q, k, v, *args, **kwargs: np.zeros_like(q), "values are wrong"),
], ids=["returns-0", "zeros"])
def test_memory_checks_require_a_correct_result(check, fn, words):
    """Allocating nothing is easy for a function that computes nothing: no memory points."""
    with pytest.raises(AssertionError, match=words):
        check(fn)


def test_wrong_conceptual_answers_fail():
    with pytest.raises(AssertionError, match="not correct"):
        gqa.check_answer_kv_bytes_gqa(16106127360)  # the MHA number
    with pytest.raises(AssertionError, match="must be one of"):
        families.check_answer_sentiment("encoder")
    with pytest.raises(AssertionError, match="not correct"):
        families.check_answer_speech_to_text("B")
    with pytest.raises(AssertionError, match="must be a number"):
        rope.check_answer_slowest_wavelength("54410")


def test_stub_fails_with_not_implemented():
    def apply_rope(x, positions, inv_freq):
        raise NotImplementedError()

    with pytest.raises(AssertionError, match="not implemented yet"):
        rope.check_apply_rope(apply_rope)


@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_visible_cells_pass_the_solution_quietly(solutions, aid, capfd):
    for cell in read(source_path(aid)).cells:
        if cell.cell_type == "code" and meta(cell).get("grade") and not meta(cell).get("solution"):
            visible = cell.source.split("### BEGIN HIDDEN TESTS")[0]
            exec(compile(visible, "<visible>", "exec"), dict(solutions[aid]))
    assert capfd.readouterr().err == ""


def test_nan_outputs_fail_with_a_message_that_says_so():
    def apply_rope(x, positions, inv_freq):
        return np.full(x.shape, np.nan)

    with pytest.raises(AssertionError, match="NaN"):
        rope.check_apply_rope_relative(apply_rope)
    with pytest.raises(AssertionError, match="NaN"):
        rope.check_apply_rope(apply_rope)


def test_a_zero_pair_must_not_become_nan(solutions):
    good = solutions["01-rope"]["apply_rope"]

    def apply_rope(x, positions, inv_freq):  # normalises each pair: 0/0 for a zero pair
        out = good(x, positions, inv_freq)
        norm = np.sqrt(x[..., 0::2] ** 2 + x[..., 1::2] ** 2).repeat(2, axis=-1)
        return out * norm / norm

    with pytest.raises(AssertionError, match="NaN"):
        rope.check_apply_rope_relative(apply_rope)


def test_modifying_the_input_fails(solutions):
    good = solutions["01-rope"]["apply_rope"]

    def apply_rope(x, positions, inv_freq):
        out = good(x, positions, inv_freq)
        x[...] = out  # in place
        return out

    with pytest.raises(AssertionError, match="changed its input x"):
        rope.check_apply_rope(apply_rope)


def test_an_honest_float32_flash_attention_passes(solutions):
    good = solutions["06-flash-attention"]["flash_attention"]

    def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
        q, k, v = (a.astype(np.float32) for a in (q, k, v))
        return good(q, k, v, causal, block_q, block_k).astype(np.float32)  # computed in float32

    flash.check_flash_attention(flash_attention)


class _Liar(np.ndarray):
    """An array whose comparisons and arithmetic always claim success."""

    def __eq__(self, other):
        return np.ones(np.broadcast_shapes(self.shape, np.shape(other)), dtype=bool)

    def __ne__(self, other):
        return np.zeros(np.broadcast_shapes(self.shape, np.shape(other)), dtype=bool)

    def __sub__(self, other):
        return np.zeros(np.broadcast_shapes(self.shape, np.shape(other)))

    __rsub__ = __sub__


def test_an_array_subclass_cannot_fake_a_pass():
    def causal_mask(T, S=None):
        return np.zeros((T, T if S is None else S), dtype=bool).view(_Liar)

    def apply_rope(x, positions, inv_freq):
        return np.zeros(x.shape).view(_Liar)

    with pytest.raises(AssertionError, match="entries are wrong"):
        causal.check_causal_mask(causal_mask)
    with pytest.raises(AssertionError, match="values are wrong"):
        rope.check_apply_rope(apply_rope)
