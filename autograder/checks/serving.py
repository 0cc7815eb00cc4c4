"""Hidden tests of assignment 08-serving (NumPy, float64 inputs).

Attention over split keys: the per-piece output and log-sum-exp, the log-sum-exp merge and
Flash-Decoding, against ``transformer_ref.numpy.flash_decoding`` (whose pieces follow the same
rule: contiguous, sizes differing by at most one, the longer ones first). The paged KV cache:
gathering and appending through block tables, against the position rule written out here
(position ``p`` lives at slot ``p % block_size`` of block ``block_table[p // block_size]``) and
the allocation rule the notebook states (new blocks from the front of the free list, as
``transformer_ref.torch.PagedKVCache`` takes them).

Tolerances follow the dtype the student's function returns: float64 rtol 1e-7, atol 1e-9; an
honest float32 computation rtol 1e-4, atol 1e-5; pools and gathers are copies: exact.
"""

import math

import numpy as np
from transformer_ref import numpy as ref

from ._common import (Mistake, assert_close, assert_number, call, cascade, expect_value_error, fail, fail_as,
                      hidden_test, hinted, rng, suspects, to_numpy, tolerance, wrong_answers)

F64 = dict(rtol=1e-7, atol=1e-9)
F32 = dict(rtol=1e-4, atol=1e-5)
EXACT = dict(rtol=0.0, atol=0.0)

# Part 6: three requests served from blocks of 16 positions, or from a contiguous cache that
# reserves 2,048 positions per request
BLOCK_SIZE = 16
REQUEST_LENGTHS = (100, 37, 512)
RESERVED = 2048


def _pair(result, what, names=("out", "lse"), n=2):
    if not (isinstance(result, tuple) and len(result) == n):
        fail(f"{what} must return a tuple ({', '.join(names)}).")
    return result


def _reference(q, k, v, n_splits=1):
    """``(out, lse)`` of attention over all keys (``ref.flash_decoding`` needs a head axis: added)."""
    extra = q.ndim < 3
    if extra:
        q, k, v = q[None], k[None], v[None]
    out, lse = ref.flash_decoding(q, k, v, n_splits=n_splits, return_lse=True)
    return (out[0], lse[0]) if extra else (out, lse)


def _lse_no_max(q, k, v):
    """attention_with_lse without the row maximum: exp overflows for large scores (inf / inf = NaN),
    and a piece with no key gives 0 / 0."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    m = 0.0 * scores.max(axis=-1, keepdims=True, initial=-np.inf)
    p = np.exp(scores)
    total = p.sum(axis=-1, keepdims=True)
    return (p @ v) / total, (m + np.log(total))[..., 0]


def _merge(outs, lses, *, weighted=True, guard=True):
    """merge_attention as the known mistakes compute it: ``weighted=False`` weighs every block 1;
    ``guard=False`` subtracts a maximum of -inf (a row no block saw gives NaN)."""
    outs, lses = np.stack(outs), np.stack(lses)
    m = lses.max(axis=0)
    m = np.where(np.isfinite(m), m, 0.0) if guard else m
    w = np.exp(lses - m) if weighted else np.ones_like(lses)
    total = w.sum(axis=0)
    out = (w[..., None] * outs).sum(axis=0) / np.where(total > 0, total, 1.0)[..., None]
    return out, m + np.log(total)


def _decoding(q, k, v, n_splits, lse=None, merge=None, *, remainder_last=False):
    """flash_decoding from ``lse(q, k, v)`` and ``merge(outs, lses)`` (each possibly a known
    mistake's); ``remainder_last``: the remainder of S / n_splits given to the last piece."""
    S = k.shape[-2]
    sizes = ([S // n_splits] * (n_splits - 1) + [S - (n_splits - 1) * (S // n_splits)] if remainder_last
             else [S // n_splits + (i < S % n_splits) for i in range(n_splits)])
    cuts = np.cumsum([0] + sizes)
    pieces = [(lse or _reference)(q, k[..., a:b, :], v[..., a:b, :]) for a, b in zip(cuts[:-1], cuts[1:])]
    out, total = (merge or ref.merge_attention)([p[0] for p in pieces], [p[1] for p in pieces])
    return out, total, np.stack([p[1] for p in pieces])


def _gather(pool, block_table, length, *, use_table=True):
    """gather_kv; ``use_table=False``: block p // block_size read straight from the pool (the mistake)."""
    positions = np.arange(length)
    blocks = positions // pool.shape[2]
    if use_table:
        blocks = np.asarray(block_table, dtype=int)[blocks]
    return np.swapaxes(pool[blocks, :, positions % pool.shape[2]], 0, 1)


GATHER_IGNORES_THE_TABLE = Mistake(
    "gather-ignores-the-table", "position p is looked up in pool block p // block_size, not in the block the "
    "block table names.", "Read the block number from the table: block_table[p // block_size], then slot "
    "p % block_size.", lambda pool, table, length: _gather(pool, table, length, use_table=False))

# The typical wrong versions of each function (chapter 8's warnings): what each returns on the
# check's inputs, so that a verdict can name the mistake. The test suite plants every one.
MISTAKES = {
    "attention_with_lse": (
        Mistake("lse-no-max", "exp of the scores is taken without subtracting the row maximum: large scores "
                "overflow (inf / inf = NaN).", "Subtract the row maximum m before exp and add it back to the lse: "
                "lse = m + log(sum exp(s - m)); with no keys use m = 0 so that out is 0 and lse = -inf.",
                _lse_no_max),
    ),
    "merge_attention": (
        Mistake("merge-by-block-size", "every block gets the same weight, whatever its lse.",
                "Weight block b by exp(lse_b - lse): a block whose scores are larger counts more.",
                lambda outs, lses: _merge(outs, lses, weighted=False)),
        Mistake("merge-nan-unseen-rows", "a row that no block saw (every lse_b = -inf) gives exp(-inf - (-inf)) = NaN.",
                "Where the largest lse_b is -inf, subtract 0 instead: the row gets zeros and lse = -inf.",
                lambda outs, lses: _merge(outs, lses, guard=False)),
    ),
    "flash_decoding": (
        Mistake("decoding-remainder-last", "the last piece takes the whole remainder of S / n_splits.",
                "Give the remainder to the first pieces, one key each: the longer pieces first "
                "(np.array_split does this).",
                lambda q, k, v, n: _decoding(q, k, v, n, remainder_last=True)),
    ),
    "gather_kv": (GATHER_IGNORES_THE_TABLE,),
    "append_kv": (
        Mistake("append-takes-from-the-back", "new blocks are taken from the back of the free list.",
                "Take new blocks from the front of the free list: free_list[:needed].",
                lambda table, free, needed: list(table) + list(free[::-1][:needed])),
        Mistake("append-ignores-room-in-the-last-block", "a new block is taken for the new positions even when the "
                "last block still has room.", "Count the blocks the sequence needs in all, "
                "ceil((length + T_new) / block_size), and take only those it does not have yet.",
                lambda table, free, needed, block_size, t_new: list(table) + list(free[:-(-t_new // block_size)])),
        Mistake("append-no-value-error", "it does not check that the free list holds the blocks it needs.",
                "Raise ValueError when the sequence needs more new blocks than the free list holds."),
    ),
}
# flash_decoding calls attention_with_lse and merge_attention
MISTAKES["flash_decoding"] += (
    cascade(MISTAKES["attention_with_lse"], "attention_with_lse",
            lambda produce: lambda q, k, v, n: _decoding(q, k, v, n, lse=produce))
    + cascade(MISTAKES["merge_attention"], "merge_attention",
              lambda produce: lambda q, k, v, n: _decoding(q, k, v, n, merge=produce)))


def _lse_cases():
    g = rng(801)
    yield "one decoding query, batch and heads", g.standard_normal((2, 3, 1, 8)), \
        g.standard_normal((2, 3, 17, 8)), g.standard_normal((2, 3, 17, 5))
    yield "several queries, no batch", g.standard_normal((6, 4)), g.standard_normal((9, 4)), \
        g.standard_normal((9, 4))
    yield "one key", g.standard_normal((2, 3, 8)), g.standard_normal((2, 1, 8)), g.standard_normal((2, 1, 8))
    yield "large scores", 30 * g.standard_normal((2, 4, 16)), 30 * g.standard_normal((2, 11, 16)), \
        g.standard_normal((2, 11, 16))
    yield "no keys at all (an empty piece)", g.standard_normal((2, 3, 8)), np.zeros((2, 0, 8)), np.zeros((2, 0, 6))


@hidden_test
def check_attention_with_lse(attention_with_lse):
    """Output and log-sum-exp of one piece of keys; an empty piece gives zeros and -inf."""
    for label, q, k, v in _lse_cases():
        what = f"attention_with_lse ({label})"
        out_exp, lse_exp = _reference(q, k, v)
        hint = ("out = softmax(q k^T / sqrt(D)) v; lse = m + log(sum exp(s - m)) with m the row maximum "
                "(subtracting it keeps exp from overflowing); with no keys, out is zeros and lse = -inf (log 0).")
        with hinted(hint):
            out, lse = _pair(call(attention_with_lse, q, k, v, what=what), what)
            tol = tolerance(out, f64=F64, f32=F32)
            for i, name, expected in [(0, "out", out_exp), (1, "lse", lse_exp)]:
                known = suspects(MISTAKES["attention_with_lse"], q, k, v, pick=i)
                assert_close(to_numpy((out, lse)[i], what, mistakes=known), expected, f"{what}, {name}", **tol,
                             hint=hint, mistakes=known)


def _pieces(q, k, v, cuts):
    """The library's partial results of the key blocks ``cuts`` (boundaries), as lists."""
    outs, lses = [], []
    for j0, j1 in zip(cuts, cuts[1:]):
        out, lse = _reference(q, k[..., j0:j1, :], v[..., j0:j1, :])
        outs.append(out)
        lses.append(lse)
    return outs, lses


def _merge_cases():
    g = rng(802)
    q, k, v = g.standard_normal((2, 3, 2, 8)), g.standard_normal((2, 3, 20, 8)), g.standard_normal((2, 3, 20, 6))
    yield "three ragged blocks", (q, k, v), [0, 7, 8, 20]
    yield "one block", (q, k, v), [0, 20]
    yield "an empty block among them", (q, k, v), [0, 5, 5, 20]
    q, k, v = 20 * g.standard_normal((4, 16)), 20 * g.standard_normal((12, 16)), g.standard_normal((12, 3))
    yield "large scores (lse in the hundreds)", (q, k, v), [0, 3, 6, 9, 12]


@hidden_test
def check_merge_attention(merge_attention):
    """Merging the blocks' (out, lse) equals attention over all keys; unseen blocks count for nothing."""
    for label, (q, k, v), cuts in _merge_cases():
        outs, lses = _pieces(q, k, v, cuts)
        what = f"merge_attention ({label})"
        out_exp, lse_exp = ref.merge_attention(outs, lses)
        with hinted(MERGE_HINT):
            out, lse = _pair(call(merge_attention, outs, lses, what=what), what)
            tol = tolerance(out, f64=F64, f32=F32)
            for i, name, expected in [(0, "out", out_exp), (1, "lse", lse_exp)]:
                known = suspects(MISTAKES["merge_attention"], outs, lses, pick=i)
                assert_close(to_numpy((out, lse)[i], what, mistakes=known), expected, f"{what}, {name}", **tol,
                             hint=MERGE_HINT, mistakes=known)
    # rows that some or all blocks did not see (lse = -inf, zero outputs), as masks produce them
    outs = [np.array([[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]]), np.array([[3.0, 4.0], [5.0, 6.0], [0.0, 0.0]])]
    lses = [np.array([0.0, -np.inf, -np.inf]), np.array([np.log(3.0), 0.5, -np.inf])]
    what = "merge_attention (a row one block did not see, a row no block saw)"
    hint = "A row that no block saw has every lse_b = -inf: return zeros and lse = -inf, not NaN."
    with hinted(hint):
        out, lse = _pair(call(merge_attention, outs, lses, what=what), what)
        tol = tolerance(out, f64=F64, f32=F32)
        for i, name, expected in [(0, "out", [[2.5, 3.5], [5.0, 6.0], [0.0, 0.0]]),
                                  (1, "lse", [np.log(4.0), 0.5, -np.inf])]:
            known = suspects(MISTAKES["merge_attention"], outs, lses, pick=i)
            assert_close(to_numpy((out, lse)[i], what, mistakes=known), expected, f"{what}, {name}", **tol,
                         hint=hint, mistakes=known)


MERGE_HINT = ("Weight block b by exp(lse_b - lse) with lse = log sum_b exp(lse_b), computed after "
              "subtracting the largest lse_b.")


def _decoding_cases():
    g = rng(803)
    q, k, v = g.standard_normal((2, 4, 1, 8)), g.standard_normal((2, 4, 37, 8)), g.standard_normal((2, 4, 37, 8))
    for n_splits in (1, 4, 5, 37):
        yield f"one query, 37 keys, n_splits={n_splits}", q, k, v, n_splits
    yield "3 queries, 10 keys, n_splits=3", g.standard_normal((3, 3, 8)), g.standard_normal((3, 10, 8)), \
        g.standard_normal((3, 10, 4)), 3
    yield "more pieces than keys (6 keys, n_splits=8)", g.standard_normal((2, 1, 8)), g.standard_normal((2, 6, 8)), \
        g.standard_normal((2, 6, 8)), 8


@hidden_test
def check_flash_decoding(flash_decoding):
    """Split-K attention: the merged result equals one pass, and each piece's lse is that piece's."""
    for label, q, k, v, n_splits in _decoding_cases():
        what = f"flash_decoding ({label})"
        out_exp, lse_exp = _reference(q, k, v, n_splits)
        S = k.shape[-2]
        cuts = np.cumsum([0] + [S // n_splits + (i < S % n_splits) for i in range(n_splits)])
        hint = (f"Cut the {S} keys into {n_splits} contiguous pieces whose sizes differ by at most "
                "one, the longer pieces first (np.array_split does this), attend to each with attention_with_lse, "
                "merge them with merge_attention, and stack the pieces' lse.")
        with hinted(hint):
            out, lse, piece_lses = _pair(call(flash_decoding, q, k, v, n_splits, what=what), what,
                                         ("out", "lse", "piece_lses"), 3)
            tol = tolerance(out, f64=F64, f32=F32)
            for i, name, expected in [(0, "out", out_exp), (1, "lse", lse_exp),
                                      (2, "piece_lses", np.stack(_pieces(q, k, v, cuts)[1]))]:
                known = suspects(MISTAKES["flash_decoding"], q, k, v, n_splits, pick=i)
                assert_close(to_numpy((out, lse, piece_lses)[i], what, mistakes=known), expected, f"{what}, {name}",
                             **tol, hint=hint, mistakes=known)


def _expected_gather(pool, block_table, length):
    """Position p from slot p % block_size of block block_table[p // block_size], one by one."""
    block_size = pool.shape[2]
    out = np.empty((pool.shape[1], length, pool.shape[3]))
    for p in range(length):
        out[:, p] = pool[block_table[p // block_size], :, p % block_size]
    return out


@hidden_test
def check_gather_kv(gather_kv):
    """The keys of a sequence read back through its block table, in position order."""
    g = rng(804)
    pool = g.standard_normal((12, 2, 4, 3))  # 12 blocks of 4 positions, 2 KV heads, D = 3
    for table, length in [([7, 2, 9], 11), ([0], 4), ([5, 11, 3, 0, 8], 17), ([6], 1), ([], 0), ([4, 1], 8)]:
        what = f"gather_kv(block_table={table}, length={length})"
        hint = ("Position p is at pool[block_table[p // block_size], :, p % block_size]; "
                "return (H_kv, length, D) and drop the unused end of the last block.")
        with hinted(hint):
            out = to_numpy(call(gather_kv, pool, table, length, what=what), what)
            assert_close(out, _expected_gather(pool, table, length), what, **EXACT, hint=hint,
                         mistakes=suspects(MISTAKES["gather_kv"], pool, table, length))


def _as_ints(value, what, name):
    try:
        values = [int(x) for x in value]
    except (TypeError, ValueError):
        fail(f"{what}: {name} must be a list of block numbers, got {type(value).__name__}.")
    if any(float(x) != int(x) for x in value):
        fail(f"{what}: {name} must hold whole block numbers.")
    return values


@hidden_test
def check_append_kv(append_kv):
    """Appends of several interleaved sequences into one pool: blocks from the front of the free
    list only when needed, every position where its table says, other sequences untouched."""
    g = rng(805)
    n_blocks, H, block_size, D = 10, 2, 4, 3
    pool = np.zeros((n_blocks, H, block_size, D))
    free = [3, 8, 0, 5, 1, 9, 2, 7, 6, 4]  # a free list in no particular order, as after some frees
    tables, lengths, stored = {}, {}, {}
    steps = [("a", 3), ("b", 5), ("a", 1), ("a", 4), ("c", 0), ("b", 3), ("c", 9), ("a", 0), ("b", 1)]
    for seq, t_new in steps:
        table, length = tables.get(seq, []), lengths.get(seq, 0)
        new = g.standard_normal((H, t_new, D))
        what = f"append_kv (sequence {seq!r} holding {length} positions, {t_new} new)"
        with hinted(APPEND_HINT):
            result = call(append_kv, pool, list(table), list(free), length, new, what=what)
            if not (isinstance(result, tuple) and len(result) == 3):
                fail(f"{what} must return a tuple (pool, block_table, free_list).")
            new_pool, new_table, new_free = result
            needed = max(0, math.ceil((length + t_new) / block_size) - len(table))
            new_table = _as_ints(new_table, what, "block_table")
            new_free = _as_ints(new_free, what, "free_list")
        if new_table != table + free[:needed]:
            message = f"{what}: the block table should become {table + free[:needed]}, got {new_table}"
            back, room = MISTAKES["append_kv"][:2]
            if needed and new_table == back.produce(table, free, needed):
                fail_as(message, back)
            if new_table == room.produce(table, free, needed, block_size, t_new):
                fail_as(message, room)
            fail(f"{message}. {APPEND_HINT}")
        if new_free != free[needed:]:
            fail(f"{what}: the free list should become {free[needed:]}, got {new_free}. {APPEND_HINT}")
        stored[seq] = np.concatenate([stored.get(seq, np.zeros((H, 0, D))), new], axis=1)
        expected = pool.copy()
        for p in range(length, length + t_new):
            expected[new_table[p // block_size], :, p % block_size] = new[:, p - length]
        wrong_blocks = pool.copy()  # the positions written to block p // block_size, table or not
        for p in range(length, length + t_new):
            wrong_blocks[p // block_size, :, p % block_size] = new[:, p - length]
        hint = ("Write position p to pool[block_table[p // block_size], :, p % block_size] and "
                "leave every other slot as it was.")
        with hinted(hint):
            assert_close(to_numpy(new_pool, what), expected, f"{what}, pool", **EXACT, hint=hint,
                         mistakes=[(GATHER_IGNORES_THE_TABLE, wrong_blocks)])
        pool, free = expected, free[needed:]
        tables[seq], lengths[seq] = new_table, length + t_new
    for seq in tables:  # and what each sequence holds reads back in order
        assert_close(_expected_gather(pool, tables[seq], lengths[seq]), stored[seq],
                     f"append_kv (sequence {seq!r} read back)", **EXACT)
    # block 2 holds 3 positions (1 slot left) and 1 block is free: room for 5 positions, not 6
    expect_value_error(append_kv, pool, [2], [1], 3, np.zeros((H, 6, D)),
                       what="append_kv with 6 new positions, 1 free slot in the last block and 1 free block",
                       argument="number of new positions (more than the free blocks hold)",
                       mistake=MISTAKES["append_kv"][2])


APPEND_HINT = ("Take a block only when the sequence's blocks are full, and take them from the front of the free "
               "list; raise ValueError when the free list is too short.")


def _request_blocks():
    return sum(math.ceil(n / BLOCK_SIZE) for n in REQUEST_LENGTHS)


# Known wrong answers of the conceptual questions, from the same model as the answers
WRONG_ANSWERS = {
    "ANSWER_BLOCKS": (
        Mistake("blocks-rounded-down", "each request's blocks are rounded down: its last, partly filled block is "
                "missing.", "A request of n positions needs ceil(n / block_size) blocks: round up.",
                lambda: sum(n // BLOCK_SIZE for n in REQUEST_LENGTHS)),
        Mistake("blocks-pooled", "the positions of all requests are packed together; each request has its own blocks.",
                "A block belongs to one request: add up ceil(n / block_size) request by request.",
                lambda: math.ceil(sum(REQUEST_LENGTHS) / BLOCK_SIZE)),
    ),
    "ANSWER_WASTED_SLOTS": (
        Mistake("wasted-slots-pooled", "the waste is counted as if the requests shared blocks.",
                "Each request wastes the empty end of its own last block: blocks * block_size - positions, with the "
                "blocks counted request by request.",
                lambda: math.ceil(sum(REQUEST_LENGTHS) / BLOCK_SIZE) * BLOCK_SIZE - sum(REQUEST_LENGTHS)),
        Mistake("wasted-slots-used", "the answer counts the used slots, not the empty ones.",
                "Wasted slots are the allocated ones no position uses: blocks * block_size - positions.",
                lambda: sum(REQUEST_LENGTHS)),
    ),
    "ANSWER_CONTIGUOUS_WASTE": (
        Mistake("contiguous-waste-reserved", "the answer is every reserved position; the positions in use are not "
                "waste.", "Subtract the positions the requests use from the 3 x 2,048 reserved.",
                lambda: len(REQUEST_LENGTHS) * RESERVED),
    ),
}


@hidden_test
def check_answer_blocks(answer):
    assert_number(answer, _request_blocks(), "ANSWER_BLOCKS", integer=True,
                  wrong=wrong_answers(WRONG_ANSWERS["ANSWER_BLOCKS"]),
                  hint=f"Each request of n positions takes ceil(n / {BLOCK_SIZE}) blocks of its own; add them up.")


@hidden_test
def check_answer_wasted_slots(answer):
    assert_number(answer, _request_blocks() * BLOCK_SIZE - sum(REQUEST_LENGTHS), "ANSWER_WASTED_SLOTS",
                  integer=True, wrong=wrong_answers(WRONG_ANSWERS["ANSWER_WASTED_SLOTS"]),
                  hint=f"The slots of the allocated blocks ({BLOCK_SIZE} each) that no position fills.")


@hidden_test
def check_answer_contiguous_waste(answer):
    assert_number(answer, len(REQUEST_LENGTHS) * RESERVED - sum(REQUEST_LENGTHS), "ANSWER_CONTIGUOUS_WASTE",
                  integer=True, wrong=wrong_answers(WRONG_ANSWERS["ANSWER_CONTIGUOUS_WASTE"]),
                  hint=f"Each request reserves {RESERVED:,} positions; the waste is what the requests leave unused.")
