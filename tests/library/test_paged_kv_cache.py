"""The paged KV cache: gathers through block tables equal a contiguous cache, allocation, fragmentation, errors."""

import numpy as np
import pytest
import torch
from conftest import DEVICES  # tests/ is on sys.path (rootdir conftest, no package)

from transformer_ref import counts
from transformer_ref import torch as tref

LAYERS, H_KV, D = 2, 2, 4


def new_cache(block_size=4, n_blocks=32, device="cpu"):
    return tref.PagedKVCache(LAYERS, H_KV, D, block_size=block_size, n_blocks=n_blocks, dtype=torch.float64,
                             device=device)


def entries(gen, T_new, device="cpu"):
    return (torch.randn(H_KV, T_new, D, generator=gen, dtype=torch.float64).to(device),
            torch.randn(H_KV, T_new, D, generator=gen, dtype=torch.float64).to(device))


def check_invariants(cache):
    """Every block is either free or in exactly one block table, and tables are just long enough."""
    tables = [cache.block_table(seq) for seq in cache.sequences]
    held = [block for table in tables for block in table]
    assert sorted(held + cache.free_blocks) == list(range(cache.n_blocks))
    for seq, table in zip(cache.sequences, tables):
        longest = max(cache.length(layer, seq) for layer in range(LAYERS))
        assert len(table) == -(-longest // cache.block_size)


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("device", DEVICES)
def test_random_appends_gather_what_a_contiguous_cache_holds(block_size, seed, device):
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    cache = new_cache(block_size, n_blocks=64, device=device)
    contiguous = {seq: tref.KVCache(LAYERS, 1, H_KV, D, 40, dtype=torch.float64, device=device) for seq in range(3)}
    appended = {(seq, layer): [] for seq in range(3) for layer in range(LAYERS)}
    for _ in range(24):  # interleaved sequences, layers and chunk sizes (a prefill, then a few tokens)
        seq, layer = int(rng.integers(3)), int(rng.integers(LAYERS))
        if contiguous[seq].length(layer) >= 34:
            continue
        k, v = entries(gen, int(rng.choice([1, 1, 2, 5])), device)
        k_all, v_all = cache.update(layer, k, v, seq)
        want_k, want_v = contiguous[seq].update(layer, k[None], v[None])
        assert k_all.device.type == device and k_all.dtype == torch.float64
        torch.testing.assert_close(k_all, want_k[0], rtol=0, atol=0)
        torch.testing.assert_close(v_all, want_v[0], rtol=0, atol=0)
        appended[seq, layer].append(k)
        check_invariants(cache)
    for (seq, layer), parts in appended.items():
        assert cache.length(layer, seq) == sum(p.shape[1] for p in parts)
        if parts:  # gather without appending, against a plain concatenation
            torch.testing.assert_close(cache.gather(layer, seq)[0], torch.cat(parts, dim=1), rtol=0, atol=0)


def test_positions_live_where_the_block_table_says():
    cache = new_cache(block_size=3, n_blocks=8)
    gen = torch.Generator().manual_seed(0)
    k_a, v_a = entries(gen, 4)
    k_b, v_b = entries(gen, 2)
    cache.update(0, k_a[:, :2], v_a[:, :2], seq=7)
    cache.update(0, k_b, v_b, seq=2)
    cache.update(0, k_a[:, 2:], v_a[:, 2:], seq=7)  # sequence 7 grows past its first block
    assert cache.block_table(7) == [0, 2] and cache.block_table(2) == [1]  # handed out in free-list order
    assert cache.sequences == [7, 2] and cache.free_blocks == [3, 4, 5, 6, 7]
    for p in range(4):  # position p: slot p % 3 of physical block table[p // 3]
        block = cache.block_table(7)[p // 3]
        torch.testing.assert_close(cache.k[0, block, :, p % 3], k_a[:, p], rtol=0, atol=0)
        torch.testing.assert_close(cache.v[0, block, :, p % 3], v_a[:, p], rtol=0, atol=0)
    assert cache.length(1, 7) == 0 and cache.length(0, 7) == 4 and cache.length(0, 99) == 0
    assert cache.block_table(99) == []


def test_free_returns_blocks_to_the_end_of_the_free_list_and_they_are_reused():
    cache = new_cache(block_size=2, n_blocks=4)
    gen = torch.Generator().manual_seed(1)
    cache.update(0, *entries(gen, 3), seq=0)  # blocks 0, 1
    cache.update(0, *entries(gen, 1), seq=1)  # block 2
    cache.free(0)
    assert cache.free_blocks == [3, 0, 1] and cache.sequences == [1]
    k, v = entries(gen, 5)
    k_all, _ = cache.update(0, k, v, seq=4)  # blocks 3, 0, 1: not contiguous in the pool
    assert cache.block_table(4) == [3, 0, 1]
    torch.testing.assert_close(k_all, k, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"^seq 0 is not in the cache \(sequences: \[1, 4\]\)"):
        cache.free(0)
    cache.reset()
    assert cache.free_blocks == [0, 1, 2, 3] and cache.sequences == [] and cache.n_tokens == 0


def test_running_out_of_blocks_is_a_clear_error_that_stores_nothing():
    cache = new_cache(block_size=4, n_blocks=3)
    gen = torch.Generator().manual_seed(2)
    cache.update(0, *entries(gen, 6), seq=0)  # 2 blocks
    before = (cache.block_table(0), cache.free_blocks, cache.length(0, 0), cache.k.clone())
    with pytest.raises(ValueError, match=r"^k adds 7 positions to sequence 0, which holds 6 in layer 0: that needs "
                                         r"2 more blocks of block_size=4, but only 1 of n_blocks=3 are free"):
        cache.update(0, *entries(gen, 7), seq=0)
    with pytest.raises(ValueError, match=r"^k adds 5 positions to sequence 1, .* needs 2 more blocks"):
        cache.update(1, *entries(gen, 5), seq=1)
    assert (cache.block_table(0), cache.free_blocks, cache.length(0, 0)) == before[:3]
    assert torch.equal(cache.k, before[3]) and cache.sequences == [0]
    cache.update(0, *entries(gen, 6), seq=0)  # exactly fills the last block: fine
    assert cache.n_free_blocks == 0 and cache.wasted_slots == 0


def test_fragmentation_is_the_unfilled_tail_of_last_blocks():
    cache = new_cache(block_size=4, n_blocks=16)
    gen = torch.Generator().manual_seed(3)
    assert cache.fragmentation == 0.0 and cache.n_used_blocks == 0
    for seq, length in enumerate([5, 8, 1]):
        cache.update(0, *entries(gen, length), seq=seq)
    cache.update(1, *entries(gen, 2), seq=0)  # a layer behind: the blocks follow the longest layer
    # blocks 2 + 2 + 1 = 5 (20 slots) for 5 + 8 + 1 = 14 positions: 6 slots wasted
    assert (cache.n_used_blocks, cache.n_tokens, cache.wasted_slots) == (5, 14, 6)
    assert cache.fragmentation == pytest.approx(6 / 20)
    assert cache.wasted_slots < cache.block_size * len(cache.sequences)  # under one block per sequence
    # a contiguous cache reserving 8 positions for each of the 3 sequences wastes 24 - 14 = 10
    contiguous_waste = 3 * 8 - cache.n_tokens
    assert cache.wasted_slots < contiguous_waste


def test_decoding_through_the_paged_cache_equals_the_full_pass():
    gen = torch.Generator().manual_seed(4)
    H, T = 4, 11
    q, k, v = (torch.randn(n, T, D, generator=gen, dtype=torch.float64) for n in (H, H_KV, H_KV))
    full = tref.grouped_query_attention(q, k, v, tref.causal_mask(T))
    cache = new_cache(block_size=3, n_blocks=8)
    outputs, start = [], 0
    for n in [4, 1, 1, 3, 2]:  # a prompt, then tokens one or a few at a time
        k_all, v_all = cache.update(0, k[:, start:start + n], v[:, start:start + n])
        outputs.append(tref.grouped_query_attention(q[:, start:start + n], k_all, v_all,
                                                    tref.causal_mask(n, start + n)))
        start += n
    torch.testing.assert_close(torch.cat(outputs, dim=1), full, rtol=1e-12, atol=1e-14)


def test_forked_sequences_share_their_prefix_until_one_writes():
    cache = new_cache(block_size=4, n_blocks=8)
    gen = torch.Generator().manual_seed(5)
    prompt = [entries(gen, 6) for _ in range(LAYERS)]  # 6 positions: one full block, one half full
    for layer, (k, v) in enumerate(prompt):
        cache.update(layer, k, v, seq=0)
    cache.fork(0, 1)
    cache.fork(0, 2)
    assert cache.block_table(1) == cache.block_table(0) == [0, 1] and cache.n_used_blocks == 2
    assert cache.n_tokens == 18 and cache.wasted_slots == 2  # three sequences of 6 in 8 shared slots
    continuations = {seq: [entries(gen, 1) for _ in range(LAYERS)] for seq in (0, 1, 2)}
    for seq in (1, 0, 2):
        for layer in range(LAYERS):
            k_all, v_all = cache.update(layer, *continuations[seq][layer], seq=seq)
            want = torch.cat([prompt[layer][0], continuations[seq][layer][0]], dim=1)
            torch.testing.assert_close(k_all, want, rtol=0, atol=0)
    # the full first block is still shared; the half-full one was copied for the first two writers
    # (the last writer holds the original alone by then)
    assert cache.block_table(1) == [0, 2] and cache.block_table(0) == [0, 3] and cache.block_table(2) == [0, 1]
    assert cache.n_used_blocks == 4 and cache.wasted_slots == 3 * 1
    for seq in (0, 1, 2):  # every sequence still reads its own prompt and continuation
        for layer in range(LAYERS):
            want = torch.cat([prompt[layer][1], continuations[seq][layer][1]], dim=1)
            torch.testing.assert_close(cache.gather(layer, seq)[1], want, rtol=0, atol=0)
    cache.free(0)
    assert cache.free_blocks == [4, 5, 6, 7, 3]  # block 0 is still held by 1 and 2
    cache.free(1)
    cache.free(2)
    assert sorted(cache.free_blocks) == list(range(8)) and cache.n_used_blocks == 0


def test_copy_on_write_needs_free_blocks_too():
    cache = new_cache(block_size=4, n_blocks=3)
    gen = torch.Generator().manual_seed(6)
    cache.update(0, *entries(gen, 6), seq=0)  # blocks 0, 1
    cache.fork(0, 1)
    cache.update(0, *entries(gen, 1), seq=1)  # copies block 1 into block 2: the pool is full
    cache.update(0, *entries(gen, 1), seq=0)  # block 1 is no longer shared: no copy, room in it
    assert cache.length(0, 0) == 7 and cache.n_free_blocks == 0 and cache.block_table(0) == [0, 1]
    cache.fork(0, 2)
    with pytest.raises(ValueError, match=r"^k adds 1 positions to sequence 2, which holds 7 in layer 0: that needs 1 "
                                         r"more blocks of block_size=4, but only 0 of n_blocks=3 are free"):
        cache.update(0, *entries(gen, 1), seq=2)  # writing into shared block 1 needs a copy, none is free
    assert cache.block_table(2) == [0, 1] and cache.length(0, 2) == 7
    with pytest.raises(ValueError, match=r"^new_seq 1 is already in the cache"):
        cache.fork(0, 1)
    with pytest.raises(ValueError, match=r"^seq 9 is not in the cache"):
        cache.fork(9, 3)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_forks_appends_and_frees_read_back_what_each_sequence_wrote(seed):
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    cache = new_cache(block_size=3, n_blocks=64)
    written = {}  # seq -> per layer, the keys it holds, kept independently of the cache
    next_id = 0
    for _ in range(40):
        action = rng.choice(["append", "append", "fork", "free"]) if written else "append"
        if action == "append":
            seq = int(rng.choice(list(written) + [next_id]))
            if seq == next_id:
                next_id += 1
            n = int(rng.integers(1, 5))
            parts = written.setdefault(seq, [torch.zeros(H_KV, 0, D, dtype=torch.float64)] * LAYERS)
            for layer in range(LAYERS):
                k, v = entries(gen, n)
                cache.update(layer, k, v, seq)
                parts[layer] = torch.cat([parts[layer], k], dim=1)
        elif action == "fork":
            parent = int(rng.choice(list(written)))
            cache.fork(parent, next_id)
            written[next_id] = list(written[parent])
            next_id += 1
        else:
            seq = int(rng.choice(list(written)))
            cache.free(seq)
            del written[seq]
        held = {block for seq in cache.sequences for block in cache.block_table(seq)}
        assert sorted(held | set(cache.free_blocks)) == list(range(cache.n_blocks))
        assert not held & set(cache.free_blocks) and cache.wasted_slots >= 0
        for seq, parts in written.items():
            for layer in range(LAYERS):
                torch.testing.assert_close(cache.gather(layer, seq)[0], parts[layer], rtol=0, atol=0)


def test_pools_sizes_device_and_dtype(device):
    cache = tref.PagedKVCache(3, 2, 8, block_size=16, n_blocks=10, device=device)
    assert cache.shape == (3, 10, 2, 16, 8) and cache.k.shape == cache.shape
    assert cache.k.device.type == device and cache.k.dtype == torch.float32
    assert cache.nbytes == counts.kv_cache_bytes(3, 2, 8, 10 * 16, 1, 4)
    x = torch.ones(2, 3, 8, requires_grad=True, device=device)
    k_all, _ = cache.update(2, x * 2, x)
    assert not k_all.requires_grad and k_all.device.type == device  # a cache is for inference


def test_bad_arguments_name_the_argument():
    for kwargs, name in [({"block_size": 0, "n_blocks": 4}, "block_size"), ({"block_size": 4, "n_blocks": 0}, "n_blocks"),
                         ({"block_size": 2.0, "n_blocks": 4}, "block_size")]:
        with pytest.raises(ValueError, match=f"^{name} must"):
            tref.PagedKVCache(1, 1, 4, **kwargs)
    with pytest.raises(ValueError, match="^n_kv_heads must"):
        tref.PagedKVCache(1, 0, 4, block_size=2, n_blocks=2)
    cache = new_cache()
    ok = torch.zeros(H_KV, 2, D)
    cases = [
        (lambda: cache.update(2, ok, ok), r"^layer must be < n_layers=2, got 2"),
        (lambda: cache.update(0, torch.zeros(1, H_KV, 2, D), ok), r"^k must have shape \(H_kv=2, T_new, D=4\)"),
        (lambda: cache.update(0, ok, torch.zeros(H_KV, 2, 5)), r"^v must have shape"),
        (lambda: cache.update(0, ok, torch.zeros(H_KV, 3, D)), r"^k and v must hold the same number"),
        (lambda: cache.update(0, ok, ok, seq=-1), r"^seq must be >= 0"),
        (lambda: cache.length(0, seq="a"), r"^seq must be an integer"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert cache.sequences == [] and cache.n_free_blocks == cache.n_blocks
