"""Hidden tests of assignment 02-gqa-kv-cache.

Tolerances: NumPy float64 attention rtol 1e-7, atol 1e-9; torch float32 attention
rtol 1e-4, atol 1e-5 and its gradients rtol 1e-3, atol 1e-4 (float32 sums over
S keys); byte counts exact.
"""

import numpy as np
from transformer_ref import numpy as ref

from ._common import (Mistake, suspects, assert_close, assert_number, call, expect_value_error, fail,
                      hidden_test, rng, to_numpy)

F64 = dict(rtol=1e-7, atol=1e-9)
F32 = dict(rtol=1e-4, atol=1e-5)
F32_GRAD = dict(rtol=1e-3, atol=1e-4)

# The model of the conceptual questions (a Llama-2-70B-like decoder).
# The typical wrong versions of each function (chapter 2's warnings): what each returns on the
# check's inputs, so that a verdict can name the mistake. The test suite plants every one.
MISTAKES = {
    "grouped_query_attention": (
        Mistake("gqa-no-scale", "the scores are not divided by sqrt(D).",
                "Scale the scores by 1 / sqrt(D) (D = head_dim) before the softmax.",
                lambda q, k, v, mask: ref.grouped_query_attention(q * np.sqrt(q.shape[-1]), k, v, mask)),
    ),
}

# Part 6's decoder: not a model the chapter sizes, so its worked numbers are never the answers.
MODEL = dict(n_layers=48, n_heads=40, n_kv_heads=8, head_dim=128, seq_len=16_384, budget=40 * 10**9)


@hidden_test
def check_repeat_kv(repeat_kv):
    """Repeat-interleave along the head axis, with and without batch dims."""
    g = rng(201)
    for shape, n_rep in [((4, 5, 3), 2), ((2, 3, 6, 4), 4), ((2, 1, 7, 8), 8), ((3, 4, 2), 1)]:
        x = g.standard_normal(shape)
        what = f"repeat_kv(x of shape {shape}, n_rep={n_rep})"
        out = to_numpy(call(repeat_kv, x, n_rep, what=what), what)
        assert_close(out, ref.repeat_kv(x, n_rep), what, rtol=0.0, atol=0.0,
                     hint="Query head h must read KV head h // n_rep: repeat each KV head "
                          "n_rep times in a row (interleave), do not tile the whole stack.")


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
        out = to_numpy(call(grouped_query_attention, q, k, v, mask, what=what), what)
        assert_close(out, ref.grouped_query_attention(q, k, v, mask), what, **F64,
                     mistakes=suspects(MISTAKES["grouped_query_attention"], q, k, v, mask),
                     hint="Scale scores by 1/sqrt(D), mask with -inf before the softmax, and "
                          "let query head h read KV head h // (H_q // H_kv).")
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
        out = call(kv_cache_bytes, *args, what=what)
        assert_number(out, ref.kv_cache_bytes(*args), what, integer=True)
    what = "kv_cache_bytes with default batch_size and bytes_per_element"
    out = call(kv_cache_bytes, 24, 4, 64, 2048, what=what)
    assert_number(out, ref.kv_cache_bytes(24, 4, 64, 2048), what, integer=True)


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
        out = call(gqa_torch, qs, ks, vs, mask=mask, what=what, copy_inputs=False)
        got = to_numpy(out, what, kind="torch")
        if not isinstance(out, torch.Tensor):
            fail(f"{what} must return a torch.Tensor, got {type(out).__name__}.")
        if out.dtype != torch.float32:
            fail(f"{what}: float32 inputs must give a float32 output, got {out.dtype}.")
        qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
        expected = tref.grouped_query_attention(qr, kr, vr, mask)
        assert_close(got, expected.detach().double().numpy(), what, **F32)
        weights = torch.randn(expected.shape, generator=g)
        try:
            (out * weights).sum().backward()
        except Exception as err:  # noqa: BLE001
            fail(f"{what}: backward() failed ({type(err).__name__}); keep the computation "
                 "in torch operations so autograd can differentiate it.")
        (expected * weights).sum().backward()
        for name, mine, theirs in [("q", qs, qr), ("k", ks, kr), ("v", vs, vr)]:
            if mine.grad is None:
                fail(f"{what}: no gradient reached {name}; do not detach or convert to NumPy.")
            assert_close(to_numpy(mine.grad, what, kind="torch"), theirs.grad.double().numpy(),
                         f"{what}, gradient with respect to {name}", **F32_GRAD)


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
            result = call(decode_step, q[..., t:t + 1, :], k[..., t:t + 1, :], v[..., t:t + 1, :],
                          k_cache, v_cache, what=what)
            if not (isinstance(result, tuple) and len(result) == 3):
                fail(f"{what} must return a tuple (out, k_cache, v_cache).")
            out, k_cache, v_cache = (to_numpy(r, what) for r in result)
            if k_cache.shape != (*batch, h_kv, t + 1, d) or v_cache.shape != k_cache.shape:
                fail(f"{what}: after {t + 1} tokens the caches must have shape "
                     f"{(*batch, h_kv, t + 1, d)}, got {k_cache.shape} and {v_cache.shape}.")
            outs.append(out)
        got = np.concatenate(outs, axis=-2)
        expected = ref.grouped_query_attention(q, k, v, ref.causal_mask(length))
        assert_close(got, expected, "decode_step (the decoded sequence)", **F64,
                     hint="Append the new key/value to the caches along the sequence axis, "
                          "then let the new query attend to every cached position.")


@hidden_test
def check_answer_kv_bytes_mha(answer):
    m = MODEL
    expected = ref.kv_cache_bytes(m["n_layers"], m["n_heads"], m["head_dim"], m["seq_len"])
    assert_number(answer, expected, "ANSWER_KV_BYTES_MHA", integer=True,
                  hint="Keys and values (2) x layers x KV heads (every head, for MHA) x head_dim x tokens x 2 bytes (fp16).")


@hidden_test
def check_answer_kv_bytes_gqa(answer):
    m = MODEL
    expected = ref.kv_cache_bytes(m["n_layers"], m["n_kv_heads"], m["head_dim"], m["seq_len"])
    assert_number(answer, expected, "ANSWER_KV_BYTES_GQA", integer=True,
                  hint="As for MHA, with the model's KV heads in place of all its query heads.")


@hidden_test
def check_answer_max_batch(answer):
    """How many 16,384-token sequences fit in 40 GB (10**9 bytes) of cache with GQA."""
    m = MODEL
    per_sequence = ref.kv_cache_bytes(m["n_layers"], m["n_kv_heads"], m["head_dim"], m["seq_len"])
    assert_number(answer, m["budget"] // per_sequence, "ANSWER_MAX_BATCH", integer=True,
                  hint="Divide 40 * 10**9 bytes by one 16,384-token sequence's GQA cache and round down: part of a sequence does not fit.")


def _naive_mla(q_nope, q_rope, c, k_rope, w_uk, w_uv, mask):
    """MLA's attention by the naive formula: every head's keys and values rebuilt from the latents."""
    k_nope = np.einsum("...sr,hrn->...hsn", c, w_uk)  # (..., H, S, d_nope)
    v = np.einsum("...sr,hrv->...hsv", c, w_uv)  # (..., H, S, d_v)
    k = np.concatenate([k_nope, np.broadcast_to(k_rope[..., None, :, :], (*k_nope.shape[:-1], k_rope.shape[-1]))],
                       axis=-1)
    q = np.concatenate([q_nope, q_rope], axis=-1)
    return ref.scaled_dot_product_attention(q, k, v, mask)  # scale 1 / sqrt(d_nope + d_rope)


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
        out = to_numpy(call(mla_absorbed_attention, *args, mask=mask, what=what), what)
        assert_close(out, _naive_mla(*args, mask), what, **F64,
                     hint="Score = (q_nope W_UK^T) c^T + q_rope k_rope^T, scaled by 1/sqrt(d_nope + d_rope); the "
                          "latents c and k_rope are shared by every head; the head output is (softmax c) W_UV.")


@hidden_test
def check_answer_mla_cache_bytes(answer):
    """DeepSeek-V3's latent cache for one 32,768-token sequence in bf16."""
    expected = ref.mla_kv_cache_bytes(61, 512, 64, 32_768)
    assert_number(answer, expected, "ANSWER_MLA_CACHE_BYTES", integer=True,
                  hint="MLA caches, per token and layer, only the latent (kv_lora_rank) and the shared RoPE key (qk_rope_head_dim), 2 bytes each in bf16: no factor 2 for keys and values, no heads.")
