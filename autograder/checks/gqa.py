"""Hidden tests of assignment 02-gqa-kv-cache.

Tolerances: NumPy float64 attention rtol 1e-7, atol 1e-9; torch float32 attention
rtol 1e-4, atol 1e-5 and its gradients rtol 1e-3, atol 1e-4 (float32 sums over
S keys); byte counts exact.
"""

import numpy as np
from transformer_ref import numpy as ref

from ._common import (Mistake, answer_cascade, assert_close, assert_number, call, cascade, expect_value_error, fail,
                      fail_as, hidden_test, hinted, identify, rng, suspects, to_numpy, wrong_answers)

F64 = dict(rtol=1e-7, atol=1e-9)
F32 = dict(rtol=1e-4, atol=1e-5)
F32_GRAD = dict(rtol=1e-3, atol=1e-4)

# The model of the conceptual questions (a Llama-2-70B-like decoder).
# The typical wrong versions of each function (chapter 2's warnings): what each returns on the
# check's inputs, so that a verdict can name the mistake. The test suite plants every one.
def _gqa(q, k, v, mask, repeat=ref.repeat_kv, scale=None):
    """GQA with ``repeat`` for ``repeat_kv`` (a known mistake's, for a cascade)."""
    n_rep = q.shape[-3] // k.shape[-3]
    return ref.scaled_dot_product_attention(q, repeat(k, n_rep), repeat(v, n_rep), mask, scale=scale)


def _decode(q, k, v, gqa=ref.grouped_query_attention, prepend_v=False):
    """Token-by-token decoding of the whole sequence as ``decode_step`` does it, with ``gqa`` for
    ``grouped_query_attention``; ``prepend_v``: each new value put in front of the cache."""
    outs = []
    for t in range(q.shape[-2]):
        values = v[..., t::-1, :] if prepend_v else v[..., :t + 1, :]
        outs.append(gqa(q[..., t:t + 1, :], k[..., :t + 1, :], values, None))
    return np.concatenate(outs, axis=-2)


MISTAKES = {
    "repeat_kv": (
        Mistake("repeat-tiled", "it tiles the whole stack of KV heads (0, 1, 0, 1, ...).",
                "Query head h must read KV head h // n_rep: repeat each KV head n_rep times in a row "
                "(interleave, np.repeat), do not tile the whole stack.",
                lambda x, n_rep: np.concatenate([x] * n_rep, axis=-3)),
    ),
    "grouped_query_attention": (
        Mistake("gqa-no-scale", "the scores are not divided by sqrt(D).",
                "Scale the scores by 1 / sqrt(D) (D = head_dim) before the softmax.",
                lambda q, k, v, mask: _gqa(q, k, v, mask, scale=1.0)),
    ),
    "kv_cache_bytes": (
        Mistake("kv-bytes-no-two", "it counts the keys or the values, not both.",
                "The cache holds a key and a value per layer, KV head, position and sequence: multiply by 2.",
                lambda *args: ref.kv_cache_bytes(*args) // 2),
    ),
    "grouped_query_attention_torch": (
        Mistake("torch-detached", "the output is cut off from the inputs' autograd graph (detach, NumPy or .data).",
                "Keep the computation in torch operations and do not detach, so autograd can differentiate it."),
    ),
    "decode_step": (
        Mistake("decode-no-append", "it returns the new key and value as the caches, not the caches with them appended.",
                "Concatenate k_new and v_new to the end of k_cache and v_cache (axis -2) and return the grown caches.",
                lambda k_new: k_new),
        Mistake("decode-prepend", "the new value goes in front of the value cache, so values no longer line up "
                "with their keys.", "Append at the end: np.concatenate([v_cache, v_new], axis=-2), as for the keys.",
                lambda q, k, v: _decode(q, k, v, prepend_v=True)),
    ),
}
# grouped_query_attention calls repeat_kv; decode_step calls grouped_query_attention
MISTAKES["grouped_query_attention"] += cascade(
    MISTAKES["repeat_kv"], "repeat_kv", lambda produce: lambda q, k, v, mask: _gqa(q, k, v, mask, repeat=produce))
MISTAKES["decode_step"] += cascade(
    MISTAKES["grouped_query_attention"], "grouped_query_attention",
    lambda produce: lambda q, k, v: _decode(q, k, v, gqa=produce))

# Part 6's decoder: not a model the chapter sizes, so its worked numbers are never the answers.
MODEL = dict(n_layers=48, n_heads=40, n_kv_heads=8, head_dim=128, seq_len=16_384, budget=40 * 10**9)


@hidden_test
def check_repeat_kv(repeat_kv):
    """Repeat-interleave along the head axis, with and without batch dims."""
    g = rng(201)
    for shape, n_rep in [((4, 5, 3), 2), ((2, 3, 6, 4), 4), ((2, 1, 7, 8), 8), ((3, 4, 2), 1)]:
        x = g.standard_normal(shape)
        what = f"repeat_kv(x of shape {shape}, n_rep={n_rep})"
        hint = ("Query head h must read KV head h // n_rep: repeat each KV head "
                "n_rep times in a row (interleave), do not tile the whole stack.")
        with hinted(hint):
            out = to_numpy(call(repeat_kv, x, n_rep, what=what), what)
            assert_close(out, ref.repeat_kv(x, n_rep), what, rtol=0.0, atol=0.0, hint=hint,
                         mistakes=suspects(MISTAKES["repeat_kv"], x, n_rep))


def _attention_cases():
    g = rng(202)
    yield "MHA, no mask", g.standard_normal((4, 6, 8)), g.standard_normal((4, 6, 8)), g.standard_normal((4, 6, 8)), None
    yield ("GQA 8/2, batch, causal T < S", g.standard_normal((2, 8, 5, 16)),
           g.standard_normal((2, 2, 9, 16)), g.standard_normal((2, 2, 9, 16)), ref.causal_mask(5, 9))
    mask = g.random((3, 7)) < 0.6
    mask[:, -1] = True
    yield ("MQA 6/1, random mask", g.standard_normal((6, 3, 4)), g.standard_normal((1, 7, 4)),
           g.standard_normal((1, 7, 4)), mask)
    yield ("GQA 4/2, per-batch mask", g.standard_normal((2, 4, 3, 8)), g.standard_normal((2, 2, 3, 8)),
           g.standard_normal((2, 2, 3, 8)), np.array([[[[True, False, True]]], [[[True, True, False]]]]))


@hidden_test
def check_grouped_query_attention(grouped_query_attention):
    """GQA/MQA/MHA against the reference on random inputs, masks and T != S."""
    for label, q, k, v, mask in _attention_cases():
        what = f"grouped_query_attention ({label})"
        hint = ("Scale scores by 1/sqrt(D), mask with -inf before the softmax, and "
                "let query head h read KV head h // (H_q // H_kv).")
        with hinted(hint):
            out = to_numpy(call(grouped_query_attention, q, k, v, mask, what=what), what)
            assert_close(out, ref.grouped_query_attention(q, k, v, mask), what, **F64,
                         mistakes=suspects(MISTAKES["grouped_query_attention"], q, k, v, mask), hint=hint)
    g = rng(203)
    q, k = g.standard_normal((6, 2, 4)), g.standard_normal((4, 2, 4))
    expect_value_error(grouped_query_attention, q, k, k, None,
                       what="grouped_query_attention with 6 query heads and 4 KV heads",
                       argument="number of heads")


@hidden_test
def check_kv_cache_bytes(kv_cache_bytes):
    """The KV-cache formula 2 * layers * kv_heads * head_dim * seq * batch * bytes."""
    for args in [(1, 1, 1, 1, 1, 2), (32, 8, 128, 8192, 1, 2), (80, 8, 128, 4096, 4, 2),
                 (12, 12, 64, 1024, 16, 4), (61, 1, 256, 100_000, 3, 1)]:
        what = f"kv_cache_bytes{args}"
        with hinted(KV_BYTES_HINT):
            out = call(kv_cache_bytes, *args, what=what)
            assert_number(out, ref.kv_cache_bytes(*args), what, integer=True, hint=KV_BYTES_HINT,
                          wrong=wrong_answers(MISTAKES["kv_cache_bytes"], *args))
    what = "kv_cache_bytes with default batch_size and bytes_per_element"
    with hinted(KV_BYTES_HINT):
        out = call(kv_cache_bytes, 24, 4, 64, 2048, what=what)
        assert_number(out, ref.kv_cache_bytes(24, 4, 64, 2048), what, integer=True, hint=KV_BYTES_HINT,
                      wrong=wrong_answers(MISTAKES["kv_cache_bytes"], 24, 4, 64, 2048, 1, 2))


KV_BYTES_HINT = ("Keys and values (2) x layers x KV heads x head_dim x positions x sequences x bytes per element; "
                 "batch_size defaults to 1 and bytes_per_element to 2.")


@hidden_test
def check_grouped_query_attention_torch(gqa_torch):
    """The torch version: float32 values, autograd gradients, dtype and device kept."""
    import torch
    from transformer_ref import torch as tref

    g = torch.Generator().manual_seed(204)
    cases = [((2, 8, 5, 16), (2, 2, 9, 16), True), ((4, 6, 8), (1, 6, 8), False),
             ((3, 4, 7, 4), (3, 4, 7, 4), True)]
    for q_shape, kv_shape, causal in cases:
        q = torch.randn(q_shape, generator=g)
        k, v = torch.randn(kv_shape, generator=g), torch.randn(kv_shape, generator=g)
        mask = tref.causal_mask(q_shape[-2], kv_shape[-2]) if causal else None
        what = f"grouped_query_attention_torch (q {tuple(q_shape)}, k/v {tuple(kv_shape)})"
        qs, ks, vs = (t.clone().requires_grad_(True) for t in (q, k, v))
        with hinted(TORCH_HINT):
            out = call(gqa_torch, qs, ks, vs, mask=mask, what=what, copy_inputs=False)
            got = to_numpy(out, what, kind="torch")
        if not isinstance(out, torch.Tensor):
            fail(f"{what} must return a torch.Tensor, got {type(out).__name__}.")
        if out.dtype != torch.float32:
            fail(f"{what}: float32 inputs must give a float32 output, got {out.dtype}.")
        qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
        expected = tref.grouped_query_attention(qr, kr, vr, mask)
        with hinted(TORCH_HINT):
            assert_close(got, expected.detach().double().numpy(), what, **F32, hint=TORCH_HINT)
        weights = torch.randn(expected.shape, generator=g)
        detached = next(m for m in MISTAKES["grouped_query_attention_torch"] if m.key == "torch-detached")
        try:
            (out * weights).sum().backward()
        except Exception as err:  # noqa: BLE001
            fail_as(f"{what}: backward() failed ({type(err).__name__})", detached)
        (expected * weights).sum().backward()
        for name, mine, theirs in [("q", qs, qr), ("k", ks, kr), ("v", vs, vr)]:
            if mine.grad is None:
                fail_as(f"{what}: no gradient reached {name}", detached)
            with hinted(TORCH_HINT):
                assert_close(to_numpy(mine.grad, what, kind="torch"), theirs.grad.double().numpy(),
                             f"{what}, gradient with respect to {name}", **F32_GRAD, hint=TORCH_HINT)


TORCH_HINT = ("As the NumPy version, in torch operations: repeat_interleave the KV heads, scale by 1/sqrt(D), "
              "masked_fill with -inf, torch.softmax; keep the inputs' dtype and device.")


@hidden_test
def check_decode_step(decode_step):
    """Token-by-token decoding from an empty cache equals causal GQA on the whole sequence."""
    g = rng(205)
    for batch, h_q, h_kv, length, d in [((), 4, 2, 6, 8), ((2,), 8, 1, 5, 4)]:
        q = g.standard_normal((*batch, h_q, length, d))
        k, v = g.standard_normal((2, *batch, h_kv, length, d))
        k_cache = np.zeros((*batch, h_kv, 0, d))
        v_cache = np.zeros((*batch, h_kv, 0, d))
        outs = []
        for t in range(length):
            what = f"decode_step (step {t}, {h_q} query heads, {h_kv} KV heads)"
            with hinted(DECODE_HINT):
                result = call(decode_step, q[..., t:t + 1, :], k[..., t:t + 1, :], v[..., t:t + 1, :],
                              k_cache, v_cache, what=what)
                if not (isinstance(result, tuple) and len(result) == 3):
                    fail(f"{what} must return a tuple (out, k_cache, v_cache).")
                out, k_cache, v_cache = (to_numpy(r, what) for r in result)
            if k_cache.shape != (*batch, h_kv, t + 1, d) or v_cache.shape != k_cache.shape:
                message = (f"{what}: after {t + 1} tokens the caches must have shape "
                           f"{(*batch, h_kv, t + 1, d)}, got {k_cache.shape} and {v_cache.shape}")
                known = identify(k_cache, suspects(MISTAKES["decode_step"][:1], k[..., t:t + 1, :]))
                if known:
                    fail_as(message, known)
                fail(f"{message}. {DECODE_HINT}")
            outs.append(out)
        got = np.concatenate(outs, axis=-2)
        expected = ref.grouped_query_attention(q, k, v, ref.causal_mask(length))
        assert_close(got, expected, "decode_step (the decoded sequence)", **F64, hint=DECODE_HINT,
                     mistakes=suspects(MISTAKES["decode_step"][1:], q, k, v))


DECODE_HINT = ("Append the new key/value to the caches along the sequence axis, "
               "then let the new query attend to every cached position.")


def _cache(kv_heads, kv_bytes=ref.kv_cache_bytes):
    """One sequence's KV cache of :data:`MODEL` with ``kv_heads`` KV heads, counted by ``kv_bytes``."""
    return kv_bytes(MODEL["n_layers"], kv_heads, MODEL["head_dim"], MODEL["seq_len"])


def _units(name, exact):
    """The known slips of units of a byte count ``exact()``: GB, GiB, fp32."""
    return (Mistake(f"{name}-in-gb", "the answer is in GB (or GiB); the question asks for bytes.",
                    "Give the number of bytes, not GB: do not divide by 10**9 or 2**30.", lambda: exact() / 1e9),
            Mistake(f"{name}-in-gib", "the answer is in GiB (or GB); the question asks for bytes.",
                    "Give the number of bytes, not GiB: do not divide by 10**9 or 2**30.", lambda: exact() / 2**30),
            Mistake(f"{name}-fp32", "the answer counts 4 bytes per element (fp32); the cache is fp16.",
                    "An fp16 element is 2 bytes.", lambda: 2 * exact()))


# Known wrong answers of the conceptual questions, from MODEL: an answer computed with Part 3's
# mistake (the answer cell calls kv_cache_bytes), per-head for total, bytes for GB, and so on.
_NO_TWO = answer_cascade(MISTAKES["kv_cache_bytes"], "kv_cache_bytes", lambda produce: lambda heads: _cache(heads, produce))
WRONG_ANSWERS = {
    "ANSWER_KV_BYTES_MHA": (
        Mistake("mha-bytes-kv-heads", "the MHA cache counts the model's 8 KV heads; MHA has a KV head per query head.",
                "In MHA every query head has its own key and value head: use all the query heads.",
                lambda: _cache(MODEL["n_kv_heads"])),
        Mistake("mha-bytes-one-head", "the answer is one head's cache, not all heads'.",
                "Multiply by the number of KV heads (for MHA, every head).", lambda: _cache(1)),
        *_units("mha-bytes", lambda: _cache(MODEL["n_heads"])),
        *(Mistake(m.key, m.what, m.fix, lambda p=m.produce: p(MODEL["n_heads"]), cause=m.cause) for m in _NO_TWO),
    ),
    "ANSWER_KV_BYTES_GQA": (
        Mistake("gqa-bytes-query-heads", "the GQA cache counts the 40 query heads; only the KV heads are cached.",
                "With GQA only the KV heads are cached: use n_kv_heads, not the query heads.",
                lambda: _cache(MODEL["n_heads"])),
        Mistake("gqa-bytes-one-head", "the answer is one KV head's cache, not all KV heads'.",
                "Multiply by the number of KV heads.", lambda: _cache(1)),
        *_units("gqa-bytes", lambda: _cache(MODEL["n_kv_heads"])),
        *(Mistake(m.key, m.what, m.fix, lambda p=m.produce: p(MODEL["n_kv_heads"]), cause=m.cause) for m in _NO_TWO),
    ),
    "ANSWER_MAX_BATCH": (
        Mistake("max-batch-mha", "the answer divides the budget by the MHA cache; the question is about GQA.",
                "Divide by one sequence's GQA cache (its KV heads only).",
                lambda: MODEL["budget"] // _cache(MODEL["n_heads"])),
        Mistake("max-batch-rounded-up", "the answer rounds up: the last sequence would not fit.",
                "Round down: only whole sequences fit in the budget.",
                lambda: -(-MODEL["budget"] // _cache(MODEL["n_kv_heads"]))),
        *(Mistake(m.key, m.what, m.fix, lambda p=m.produce: MODEL["budget"] // p(MODEL["n_kv_heads"]), cause=m.cause)
          for m in _NO_TWO),
    ),
    "ANSWER_MLA_CACHE_BYTES": (
        Mistake("mla-bytes-times-two", "the answer counts the latent twice, as if keys and values were cached apart.",
                "MLA caches one latent per token and layer (it stands for both keys and values): no factor 2.",
                lambda: 2 * ref.mla_kv_cache_bytes(61, 512, 64, 32_768)),
        Mistake("mla-bytes-no-rope", "the answer leaves out the shared RoPE key (qk_rope_head_dim).",
                "Per token and layer MLA caches the latent and the RoPE key: kv_lora_rank + qk_rope_head_dim values.",
                lambda: ref.mla_kv_cache_bytes(61, 512, 0, 32_768)),
        Mistake("mla-bytes-in-gb", "the answer is in GB (or GiB); the question asks for bytes.",
                "Give the number of bytes, not GB.", lambda: ref.mla_kv_cache_bytes(61, 512, 64, 32_768) / 1e9),
    ),
}


@hidden_test
def check_answer_kv_bytes_mha(answer):
    m = MODEL
    expected = ref.kv_cache_bytes(m["n_layers"], m["n_heads"], m["head_dim"], m["seq_len"])
    assert_number(answer, expected, "ANSWER_KV_BYTES_MHA", integer=True,
                  wrong=wrong_answers(WRONG_ANSWERS["ANSWER_KV_BYTES_MHA"]),
                  hint="Keys and values (2) x layers x KV heads (every head, for MHA) x head_dim x tokens x 2 bytes (fp16).")


@hidden_test
def check_answer_kv_bytes_gqa(answer):
    m = MODEL
    expected = ref.kv_cache_bytes(m["n_layers"], m["n_kv_heads"], m["head_dim"], m["seq_len"])
    assert_number(answer, expected, "ANSWER_KV_BYTES_GQA", integer=True,
                  wrong=wrong_answers(WRONG_ANSWERS["ANSWER_KV_BYTES_GQA"]),
                  hint="As for MHA, with the model's KV heads in place of all its query heads.")


@hidden_test
def check_answer_max_batch(answer):
    """How many 16,384-token sequences fit in 40 GB (10**9 bytes) of cache with GQA."""
    m = MODEL
    per_sequence = ref.kv_cache_bytes(m["n_layers"], m["n_kv_heads"], m["head_dim"], m["seq_len"])
    assert_number(answer, m["budget"] // per_sequence, "ANSWER_MAX_BATCH", integer=True,
                  wrong=wrong_answers(WRONG_ANSWERS["ANSWER_MAX_BATCH"]),
                  hint="Divide 40 * 10**9 bytes by one 16,384-token sequence's GQA cache and round down: part of a sequence does not fit.")


def _naive_mla(q_nope, q_rope, c, k_rope, w_uk, w_uv, mask, scale=None):
    """MLA's attention by the naive formula: every head's keys and values rebuilt from the latents
    (``scale``: of the scores, by default 1 / sqrt(d_nope + d_rope))."""
    k_nope = np.einsum("...sr,hrn->...hsn", c, w_uk)  # (..., H, S, d_nope)
    v = np.einsum("...sr,hrv->...hsv", c, w_uv)  # (..., H, S, d_v)
    k = np.concatenate([k_nope, np.broadcast_to(k_rope[..., None, :, :], (*k_nope.shape[:-1], k_rope.shape[-1]))],
                       axis=-1)
    q = np.concatenate([q_nope, q_rope], axis=-1)
    return ref.scaled_dot_product_attention(q, k, v, mask, scale=scale)  # default 1 / sqrt(d_nope + d_rope)


MISTAKES["mla_absorbed_attention"] = (
    Mistake("mla-scale-nope-only", "the scores are scaled by 1 / sqrt(d_nope), leaving out the RoPE part of the head.",
            "A query-key dot product runs over d_nope + d_rope features: scale by 1 / sqrt(d_nope + d_rope).",
            lambda q_nope, *rest: _naive_mla(q_nope, *rest, scale=1 / np.sqrt(q_nope.shape[-1]))),
    Mistake("mla-no-rope-term", "the scores leave out the decoupled RoPE term q_rope k_rope^T.",
            "Add q_rope @ k_rope^T (k_rope shared by every head) to the latent scores before scaling.",
            lambda q_nope, q_rope, c, k_rope, *rest: _naive_mla(q_nope, np.zeros_like(q_rope), c, k_rope, *rest,
                                                                scale=1 / np.sqrt(q_nope.shape[-1] + q_rope.shape[-1]))),
)


def _mla_cases():
    g = rng(206)

    def case(batch, H, T, S, r, d_nope, d_rope, d_v):
        return (g.standard_normal((*batch, H, T, d_nope)), g.standard_normal((*batch, H, T, d_rope)),
                g.standard_normal((*batch, S, r)), g.standard_normal((*batch, S, d_rope)),
                g.standard_normal((H, r, d_nope)) / np.sqrt(r), g.standard_normal((H, r, d_v)) / np.sqrt(r))

    yield "one decoding step, no mask", case((), 4, 1, 9, 16, 8, 4, 8), None
    yield "batch, 3 new tokens over 7, causal", case((2,), 3, 3, 7, 12, 6, 2, 5), ref.causal_mask(3, 7)
    per_head = g.random((2, 5, 6)) < 0.5
    per_head[..., 0] = True
    yield "a mask per head", case((), 2, 5, 6, 8, 4, 6, 3), per_head


@hidden_test
def check_mla_absorbed_attention(mla_absorbed_attention):
    """Absorbed MLA attention equals the naive formula (keys and values rebuilt per head) on seeded inputs."""
    for label, args, mask in _mla_cases():
        what = f"mla_absorbed_attention ({label})"
        hint = ("Score = (q_nope W_UK^T) c^T + q_rope k_rope^T, scaled by 1/sqrt(d_nope + d_rope); the "
                "latents c and k_rope are shared by every head; the head output is (softmax c) W_UV.")
        with hinted(hint):
            out = to_numpy(call(mla_absorbed_attention, *args, mask=mask, what=what), what)
            assert_close(out, _naive_mla(*args, mask), what, **F64, hint=hint,
                         mistakes=suspects(MISTAKES["mla_absorbed_attention"], *args, mask))


@hidden_test
def check_answer_mla_cache_bytes(answer):
    """DeepSeek-V3's latent cache for one 32,768-token sequence in bf16."""
    expected = ref.mla_kv_cache_bytes(61, 512, 64, 32_768)
    assert_number(answer, expected, "ANSWER_MLA_CACHE_BYTES", integer=True,
                  wrong=wrong_answers(WRONG_ANSWERS["ANSWER_MLA_CACHE_BYTES"]),
                  hint="MLA caches, per token and layer, only the latent (kv_lora_rank) and the shared RoPE key (qk_rope_head_dim), 2 bytes each in bf16: no factor 2 for keys and values, no heads.")
