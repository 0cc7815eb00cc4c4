"""Hidden tests of assignment 06-flash-attention (NumPy, float64 inputs).

Tolerances follow the dtype the student's function returns: float64 rtol 1e-7,
atol 1e-9 (the online rescaling changes the summation order, float64 keeps that
far below 1e-9); an honest float32 computation gets rtol 1e-4, atol 1e-5. Memory
is measured from outside the student's kernel (the memory peak of a fresh
sandboxed kernel's cgroup during the call, see ``_common.measure``; the self-check, which
cannot measure it, judges the result only): the tiled
functions must stay far below the size of the full T x S score matrix, whatever
they compute with. A memory check first requires the result of that run to be
correct, so a function that computes nothing earns no memory points.
"""

import numpy as np
from transformer_ref import numpy as ref

from ._common import (Mistake, assert_close, assert_number, call, fail, hidden_test, hinted, measure, rng,
                      suspects, to_numpy, tolerance, wrong_answers)

F64 = dict(rtol=1e-7, atol=1e-9)
F32 = dict(rtol=1e-4, atol=1e-5)


def _online_wrong(x, sizes, *, rescale=True, guard=True):
    """The normaliser l of one pass over ``x``'s chunks, computed as a known mistake does:
    ``rescale=False`` adds each chunk's sum without rescaling l when the max grows;
    ``guard=False`` subtracts a max of -inf (an all -inf chunk gives NaN)."""
    bounds = np.cumsum([0, *sizes])
    m = l = None
    for a, b in zip(bounds[:-1], bounds[1:]):
        chunk = x[..., a:b]
        m_new = chunk.max(axis=-1) if m is None else np.maximum(m, chunk.max(axis=-1))
        safe = np.where(np.isfinite(m_new), m_new, 0.0) if guard else m_new
        chunk_sum = np.exp(chunk - safe[..., None]).sum(axis=-1)
        l = chunk_sum if l is None else (l * np.exp(m - safe) if rescale else l) + chunk_sum
        m = m_new
    return l


def _flash_like(q, k, v, mask, *, divide=True, scale=None):
    """Attention over the keys ``mask`` (T, S) allows (a row with none gives zeros);
    ``divide=False``: the weights left unnormalised (exp(s - row max), not divided by l)."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = np.where(mask, q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    p = np.exp(scores - np.where(np.isfinite(m), m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    return (p / np.where(l > 0, l, 1.0) if divide else p) @ v


def _tiled(q, k, v, causal, block_q, block_k, *, rescale_acc=True):
    """The tile loop of ``flash_attention``; ``rescale_acc=False``: the accumulator is not rescaled
    when the running max grows (l is), the known mistake."""
    T, S = q.shape[-2], k.shape[-2]
    out = np.empty(q.shape[:-1] + v.shape[-1:])
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        q_tile = q[..., i0:i1, :] / np.sqrt(q.shape[-1])
        m = np.full(q_tile.shape[:-1], -np.inf)
        l = np.zeros(q_tile.shape[:-1])
        acc = np.zeros(q_tile.shape[:-1] + v.shape[-1:])
        for j0 in range(0, S, block_k):
            j1 = min(j0 + block_k, S)
            scores = q_tile @ np.swapaxes(k[..., j0:j1, :], -1, -2)
            if causal:
                scores = np.where(np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None] + S - T, scores, -np.inf)
            m_new = np.maximum(m, scores.max(axis=-1))
            safe = np.where(np.isfinite(m_new), m_new, 0.0)
            p = np.exp(scores - safe[..., None])
            rescale = np.exp(m - safe)
            l = rescale * l + p.sum(axis=-1)
            acc = (rescale[..., None] * acc if rescale_acc else acc) + p @ v[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = acc / np.where(l > 0, l, 1.0)[..., None]
    return out


def _flash_mask(T, S, causal, block_k=None):
    """The keys a query row may see: all, or the bottom-right causal ones; with ``block_k``, only
    those of the whole key tiles (a loop that drops the last, ragged tile)."""
    mask = ref.causal_mask(T, S) if causal else np.ones((T, S), dtype=bool)
    if block_k is not None:
        mask = mask & (np.arange(S) < S // block_k * block_k)
    return mask


def _window_plus_one(T, window, block=64):
    """The keys a query sees when its window is one too wide (offset >= -window) in the notebook's
    loop over query blocks of ``block`` (its default): a block reads keys from its first query's
    window on, so the extra key is seen only where that slice holds it (every query when T <= block)."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return ref.sliding_window_mask(T, window + 1) & (j >= np.maximum(0, i // block * block - window + 1))


# The typical wrong versions of each function (chapter 6's warnings): what each returns on the
# check's inputs, so that a verdict can name the mistake. The test suite plants every one.
MISTAKES = {
    "online_softmax": (
        Mistake("online-no-rescale", "l adds each chunk's sum without rescaling when the max grows.",
                "When the max grows from m to m_new, multiply l by exp(m - m_new) before adding the chunk.",
                lambda x, sizes: _online_wrong(x, sizes, rescale=False)),
        Mistake("online-nan-on-masked-chunk", "a chunk whose entries are all -inf gives exp(-inf - (-inf)) = NaN.",
                "While the running max is still -inf, subtract 0 instead (the chunk then adds exp(-inf) = 0).",
                lambda x, sizes: _online_wrong(x, sizes, guard=False)),
    ),
    "sliding_window_attention": (
        Mistake("window-off-by-one", "each query sees window + 1 keys.",
                "Query i sees keys i - window + 1 .. i: window keys, itself included.",
                lambda q, k, v, window: ref.scaled_dot_product_attention(q, k, v, _window_plus_one(q.shape[-2], window))),
        Mistake("window-one-short", "each query sees window - 1 keys.",
                "Query i sees keys i - window + 1 .. i: window keys, itself included.",
                lambda q, k, v, window: ref.scaled_dot_product_attention(
                    q, k, v, ref.sliding_window_mask(q.shape[-2], window - 1))),
        Mistake("window-no-scale", "the scores are not divided by sqrt(D).",
                "Scale the scores by 1 / sqrt(D) (D = head_dim) before the softmax.",
                lambda q, k, v, window: ref.scaled_dot_product_attention(
                    q, k, v, ref.sliding_window_mask(q.shape[-2], window), scale=1.0)),
    ),
    "flash_attention": (
        Mistake("flash-no-scale", "the scores are not divided by sqrt(D).",
                "Scale each tile's scores by 1 / sqrt(D) (D = head_dim) before the running max.",
                lambda q, k, v, causal, *_tiles: ref.scaled_dot_product_attention(
                    q, k, v, ref.causal_mask(q.shape[-2], k.shape[-2]) if causal else None, scale=1.0)),
        Mistake("flash-top-left-tiles", "the causal mask is aligned top-left (query i sees keys 0 .. i) when T < S.",
                "Align it bottom-right: query i sees key j iff j <= i + S - T, in every tile.",
                lambda q, k, v, causal, *_tiles: ref.scaled_dot_product_attention(
                    q, k, v, np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool)) if causal else None)),
        Mistake("flash-no-acc-rescale", "the accumulator is not rescaled when the running max grows (only l is).",
                "When m grows to m_new, multiply both l and the accumulator by exp(m - m_new) before adding the tile.",
                lambda q, k, v, causal, block_q, block_k: _tiled(q, k, v, causal, block_q, block_k, rescale_acc=False)),
        Mistake("flash-no-final-division", "the accumulator is returned without dividing it by the normaliser l.",
                "After the last key tile, divide each row's accumulator by its l (rows with l = 0 stay 0).",
                lambda q, k, v, causal, *_tiles: _flash_like(q, k, v, _flash_mask(q.shape[-2], k.shape[-2], causal),
                                                            divide=False)),
        Mistake("flash-drops-ragged-tile", "the key loop stops before the last, shorter tile: the last S % block_k keys "
                "are never seen.", "Loop over range(0, S, block_k) and clip each tile's end to S: "
                "min(j0 + block_k, S).",
                lambda q, k, v, causal, block_q, block_k: _flash_like(
                    q, k, v, _flash_mask(q.shape[-2], k.shape[-2], causal, block_k))),
    ),
}


def _stats(x):
    """Row maximum and sum(exp(x - max)); a row of only -inf gives (-inf, 0)."""
    m = x.max(axis=-1)
    finite_m = np.where(np.isfinite(m), m, 0.0)
    return m, np.exp(x - finite_m[..., None]).sum(axis=-1)


def _softmax_cases():
    g = rng(601)
    x = g.standard_normal((3, 10))
    yield "equal chunks", x, [4, 4, 2]
    yield "ragged chunks with batch dims", g.standard_normal((2, 4, 13)), [5, 1, 7]
    yield "single chunk", g.standard_normal((5,)), [5]
    yield "large scores", 1e3 * g.standard_normal((4, 9)), [3, 3, 3]
    x = g.standard_normal((3, 8))
    x[0, :4] = -np.inf   # the first chunk of row 0 is fully masked
    x[1, :] = -np.inf    # row 1 is fully masked
    yield "masked (-inf) chunks", x, [4, 4]


@hidden_test
def check_online_softmax(online_softmax):
    """One pass over chunks gives the row max and sum(exp(x - max)) of the whole row."""
    for label, x, sizes in _softmax_cases():
        bounds = np.cumsum([0, *sizes])
        chunks = (x[..., a:b] for a, b in zip(bounds[:-1], bounds[1:]))
        what = f"online_softmax ({label})"
        m_exp, l_exp = _stats(x)
        known = suspects(MISTAKES["online_softmax"], x, sizes)
        with hinted("When the max grows from m to m_new, rescale l by exp(m - m_new); "
                    "treat a chunk whose entries are all -inf without producing NaN."):
            result = call(online_softmax, chunks, what=what)
            if not (isinstance(result, tuple) and len(result) == 2):
                fail(f"{what} must return a tuple (m, l).")
            tol = tolerance(result[1], f64=F64, f32=F32)
            assert_close(to_numpy(result[0], what), m_exp, f"{what}, running max m", **tol)
            assert_close(to_numpy(result[1], what, mistakes=known), l_exp, f"{what}, normaliser l",
                         **tol, mistakes=known)


def _flash_cases():
    g = rng(602)
    for shape_q, shape_kv, causal, block_q, block_k in [
            ((2, 37, 8), (2, 53, 8), False, 16, 16),   # ragged tiles, T != S
            ((2, 3, 40, 16), (2, 3, 40, 16), True, 8, 8),
            ((1, 29, 4), (1, 61, 4), True, 16, 8),    # causal, T < S, tiles skip/clip
            ((3, 5, 8), (3, 5, 8), True, 1, 1),       # one query, one key per tile
            ((1, 7, 8), (1, 30, 8), True, 4, 6),      # T < S, several ragged key tiles
            ((2, 6, 8), (2, 9, 8), False, 64, 64)]:   # one tile larger than the input
        q = g.standard_normal(shape_q)
        k, v = g.standard_normal(shape_kv), g.standard_normal(shape_kv)
        yield q, k, v, causal, block_q, block_k


@hidden_test
def check_flash_attention(flash_attention):
    """Tiled attention equals plain attention: ragged tiles, T != S, causal and not."""
    for q, k, v, causal, block_q, block_k in _flash_cases():
        T, S = q.shape[-2], k.shape[-2]
        what = (f"flash_attention (T={T}, S={S}, causal={causal}, "
                f"block_q={block_q}, block_k={block_k})")
        with hinted(FLASH_HINT):
            out = call(flash_attention, q, k, v, causal=causal, block_q=block_q, block_k=block_k, what=what)
        mask = ref.causal_mask(T, S) if causal else None
        expected = ref.scaled_dot_product_attention(q, k, v, mask)
        known = suspects(MISTAKES["flash_attention"], q, k, v, causal, block_q, block_k)
        with hinted(FLASH_HINT):
            assert_close(to_numpy(out, what, mistakes=known), expected, what, **tolerance(out, f64=F64, f32=F32),
                         hint=FLASH_HINT, mistakes=known)


FLASH_HINT = ("Keep a running max m, normaliser l and accumulator per query row, "
              "rescale them when m grows, divide by l once at the end, and use "
              "the bottom-right causal mask for each tile.")


def _reference_by_rows(q, k, v, mask, rows=256):
    """Reference attention with a (T, S) ``mask``, ``rows`` queries at a time (small memory)."""
    T = q.shape[-2]
    return np.concatenate([ref.scaled_dot_product_attention(q[..., i:i + rows, :], k, v, mask[i:i + rows])
                           for i in range(0, T, rows)], axis=-2)


def _assert_correct_for_memory(out, expected, what, mistakes):
    """Memory points only for a correct result: the same comparison, and the same known
    ``mistakes``, as the value checks."""
    hint = "The memory test counts only when the result is correct."
    with hinted(hint):
        assert_close(to_numpy(out, what, mistakes=mistakes), expected, what, **tolerance(out, f64=F64, f32=F32),
                     hint=hint, mistakes=mistakes)


@hidden_test
def check_flash_memory(flash_attention):
    """Correct, with no T x S matrix: peak memory below half the score matrix at T = S = 1024.

    Half, not less: measured from outside, a tiled function shows ~2.5 MiB (its output,
    tiles and the interpreter's own growth); one T x S float64 array alone is 8 MiB.
    """
    g = rng(603)
    T, D = 1024, 32
    q, k, v = g.standard_normal((3, T, D))
    what = "flash_attention (T = S = 1024)"
    with hinted(FLASH_HINT):
        out, peak = measure(flash_attention, q, k, v, True, 64, 64, what=what)
    _assert_correct_for_memory(out, _reference_by_rows(q, k, v, ref.causal_mask(T, T)), what,
                               suspects(MISTAKES["flash_attention"], q, k, v, True, 64, 64))
    if peak is not None and peak > T * T * 8 // 2:
        fail(f"flash_attention (T = S = {T}, 64 x 64 tiles) allocated {peak / 2**20:.1f} MiB at "
             f"peak; the full score matrix is {T * T * 8 / 2**20:.0f} MiB. Work tile by tile "
             "and never build a T x S array.")


@hidden_test
def check_sliding_window_attention(sliding_window_attention):
    """Causal sliding window of W keys (the current one included)."""
    g = rng(604)
    for shape, window in [((2, 10, 8), 3), ((2, 3, 16, 4), 1), ((1, 7, 8), 7), ((1, 6, 8), 20),
                          ((4, 25, 16), 5)]:
        q, k, v = g.standard_normal((3, *shape))
        T = shape[-2]
        what = f"sliding_window_attention (T={T}, window={window})"
        hint = WINDOW_HINT
        known = suspects(MISTAKES["sliding_window_attention"], q, k, v, window)
        with hinted(hint):
            out = call(sliding_window_attention, q, k, v, window=window, what=what)
            expected = ref.scaled_dot_product_attention(q, k, v, ref.sliding_window_mask(T, window))
            assert_close(to_numpy(out, what, mistakes=known), expected, what, **tolerance(out, f64=F64, f32=F32),
                         hint=hint, mistakes=known)


WINDOW_HINT = "Query i sees keys i - window + 1 .. i (clipped at 0): window keys, itself included."


@hidden_test
def check_sliding_window_memory(sliding_window_attention):
    """Correct, in O(T * W) memory: at T = 4096, W = 8 far below the T x T score matrix."""
    g = rng(605)
    T, D, W = 4096, 8, 8
    q, k, v = g.standard_normal((3, T, D))
    what = "sliding_window_attention (T = 4096, window = 8)"
    with hinted(WINDOW_HINT):
        out, peak = measure(sliding_window_attention, q, k, v, W, what=what)
    _assert_correct_for_memory(out, _reference_by_rows(q, k, v, ref.sliding_window_mask(T, W)), what,
                               suspects(MISTAKES["sliding_window_attention"], q, k, v, W))
    if peak is not None and peak > T * T * 8 // 8:
        fail(f"sliding_window_attention (T = {T}, window = {W}) allocated {peak / 2**20:.1f} MiB "
             f"at peak; the full score matrix is {T * T * 8 / 2**20:.0f} MiB. Only compute the "
             "scores of the window keys.")


# Known wrong answers of the conceptual questions, from the same model as the answer
_SCORES = 100_000 * 100_000
WRONG_ANSWERS = {
    "ANSWER_SCORE_BYTES": (
        Mistake("score-bytes-fp32", "the answer counts 4 bytes per entry (fp32); the scores are fp16.",
                "An fp16 entry is 2 bytes.", lambda: 4 * _SCORES),
        Mistake("score-bytes-entries", "the answer counts entries, not bytes.",
                "Multiply the N x N entries by 2 bytes each (fp16).", lambda: _SCORES),
        Mistake("score-bytes-in-gb", "the answer is in GB (or GiB); the question asks for bytes.",
                "Give the number of bytes, not GB: do not divide by 10**9 or 2**30.", lambda: 2 * _SCORES / 1e9),
        Mistake("score-bytes-in-gib", "the answer is in GiB (or GB); the question asks for bytes.",
                "Give the number of bytes, not GiB: do not divide by 10**9 or 2**30.", lambda: 2 * _SCORES / 2**30),
    ),
    "ANSWER_WINDOW_ENTRIES": (
        Mistake("window-entries-full", "the answer counts W keys for every query, also the first ones, which have "
                "fewer keys before them.", "Query i sees min(i + 1, W) keys: the first W - 1 queries see fewer.",
                lambda: 10 * 3),
        Mistake("window-entries-plus-one", "the answer counts W + 1 keys per query (the window's edge counted twice).",
                "Query i sees keys i - W + 1 .. i: W keys, itself included.",
                lambda: int(ref.sliding_window_mask(10, 4).sum())),
    ),
}


@hidden_test
def check_answer_score_bytes(answer):
    """fp16 score matrix of one head at N = 100,000."""
    assert_number(answer, 100_000 * 100_000 * 2, "ANSWER_SCORE_BYTES", integer=True,
                  wrong=wrong_answers(WRONG_ANSWERS["ANSWER_SCORE_BYTES"]),
                  hint="One head's N x N score matrix in fp16: 2 bytes per entry, N = 100,000.")


@hidden_test
def check_answer_window_entries(answer):
    assert_number(answer, int(ref.sliding_window_mask(10, 3).sum()), "ANSWER_WINDOW_ENTRIES",
                  integer=True, wrong=wrong_answers(WRONG_ANSWERS["ANSWER_WINDOW_ENTRIES"]),
                  hint="Count the True entries of the sliding-window mask with T = 10 and W = 3: query i sees the keys i - W + 1 .. i that exist.")
