"""A paged KV cache: fixed-size blocks from one pool, found through per-sequence block tables (PyTorch).

A contiguous :class:`KVCache` reserves ``max_seq_len`` positions for every sequence up front,
so a server that cannot know how long each answer will be wastes most of what it reserves.
PagedAttention (Kwon et al. 2023, "Efficient Memory Management for Large Language Model
Serving with PagedAttention", SOSP 2023, arXiv:2309.06180; vLLM) borrows virtual memory's
answer: the cache is one pool of ``n_blocks`` blocks of ``block_size`` positions, a sequence
takes a block from a free list only when its last block is full, and its *block table* maps
logical block ``b`` (positions ``b * block_size .. (b + 1) * block_size - 1``) to a physical
block of the pool. Position ``p`` of a sequence lives at slot ``p % block_size`` of physical
block ``table[p // block_size]``. The only waste is the unfilled tail of each sequence's last
block (fewer than ``block_size`` positions), and a finished sequence's blocks go straight back
to the free list for the next one. As in vLLM, one block table serves every layer: block
``b`` of a sequence is block ``table[b]`` of each layer's pool.

Block tables also let sequences share memory (Kwon et al. 2023, Section 4.4): a sequence
forked from another (parallel sampling, beam search) starts with the same table, each block
counting how many tables hold it, and the first write into a shared block copies it to a
fresh block for the writer (copy-on-write), so a common prefix is stored once.
"""

import math
from collections import deque

import torch

from .._checks import check_int

__all__ = ["PagedKVCache"]


class PagedKVCache:
    """Paged K and V pools ``(n_layers, n_blocks, H_kv, block_size, D)`` with a block table per sequence.

    Usage in a decoder step of sequence ``seq`` (``T_new`` new tokens, ``k, v (H_kv, T_new, D)``)::

        offset = cache.length(layer, seq)              # positions this sequence already holds
        k_all, v_all = cache.update(layer, k, v, seq)  # (H_kv, offset + T_new, D)
        out = scaled_dot_product_attention(q, k_all, v_all, causal_mask(T_new, offset + T_new))

    Sequences are named by integers ``seq >= 0`` chosen by the caller (default 0); a sequence
    exists from its first ``update`` until ``free(seq)``. ``update(layer, k, v, seq=0)`` appends
    to ``layer``, takes blocks from the front of the free list when the sequence's blocks are
    full, writes position ``p`` to slot ``p % block_size`` of block ``block_table(seq)[p // block_size]``
    and returns the sequence's keys and values gathered through its block table, in order
    (a copy, as PagedAttention's kernel reads them). ``gather(layer, seq)`` returns them without
    appending; ``length(layer, seq)`` counts them (0 for an unknown sequence).
    ``fork(seq, new_seq)`` starts ``new_seq`` as a copy of ``seq`` that shares its blocks; a write
    into a block that several tables hold first copies it (copy-on-write). ``free(seq)`` forgets
    a sequence and puts the blocks no other sequence holds at the end of the free list;
    ``reset()`` frees all.

    Measured, for the chapter's fragmentation figures: ``n_free_blocks``, ``n_used_blocks``,
    ``n_tokens`` (positions the sequences hold, the longest layer of each, a shared prefix
    counted once per sequence), ``wasted_slots`` (allocated slots that hold nothing: the
    unfilled tails of last blocks, ``n_used_blocks * block_size - n_tokens`` when no block is
    shared) and ``fragmentation`` (``wasted_slots`` over the allocated slots, 0 when none are);
    ``nbytes`` is the size of the two pools, ``kv_cache_bytes(n_layers, H_kv, D, n_blocks *
    block_size, 1, itemsize)``. An update that needs more blocks than are free, a wrong shape
    or a bad ``layer`` raises ``ValueError`` and stores nothing (the copies a copy-on-write
    needs count as blocks). ``dtype`` defaults to float32,
    ``device`` to the CPU; stored tensors are detached (a cache is for inference).
    """

    def __init__(self, n_layers, n_kv_heads, head_dim, *, block_size, n_blocks, dtype=torch.float32, device=None):
        self.n_layers = check_int("n_layers", n_layers, minimum=1)
        self.n_kv_heads = check_int("n_kv_heads", n_kv_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.block_size = check_int("block_size", block_size, minimum=1)
        self.n_blocks = check_int("n_blocks", n_blocks, minimum=1)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self._dtype = dtype
        self.k = torch.zeros(self.shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(self.shape, dtype=dtype, device=self.device)
        self.reset()

    @property
    def shape(self):
        """Shape of each of the two pools, ``(n_layers, n_blocks, H_kv, block_size, D)``."""
        return (self.n_layers, self.n_blocks, self.n_kv_heads, self.block_size, self.head_dim)

    @property
    def nbytes(self):
        """Bytes held by the two preallocated pools."""
        return 2 * self.k.numel() * self.k.element_size()

    def reset(self):
        """Free every sequence: the free list is blocks ``0 .. n_blocks - 1`` again (the pools are kept)."""
        self._free = deque(range(self.n_blocks))
        self._tables = {}  # seq -> list of physical block ids
        self._lengths = {}  # seq -> positions stored per layer
        self._refs = [0] * self.n_blocks  # how many block tables hold each block

    # -- bookkeeping ----------------------------------------------------------------------------
    @property
    def sequences(self):
        """The ids of the sequences the cache holds, in order of their first update."""
        return list(self._tables)

    @property
    def free_blocks(self):
        """The free list: the physical blocks that are free, in the order they will be handed out."""
        return list(self._free)

    @property
    def n_free_blocks(self):
        """Number of free blocks."""
        return len(self._free)

    @property
    def n_used_blocks(self):
        """Number of blocks held by sequences."""
        return self.n_blocks - len(self._free)

    @property
    def n_tokens(self):
        """Positions held: for each sequence the length of its longest layer, summed."""
        return sum(max(lengths) for lengths in self._lengths.values())

    @property
    def wasted_slots(self):
        """Allocated slots that hold nothing: the unfilled tails of the sequences' last blocks
        (a block several sequences share is as full as the fullest of them makes it)."""
        filled = {}
        for seq, table in self._tables.items():
            longest = max(self._lengths[seq])
            for logical, block in enumerate(table):
                filled[block] = max(filled.get(block, 0), min(self.block_size, longest - logical * self.block_size))
        return sum(self.block_size - n for n in filled.values())

    @property
    def fragmentation(self):
        """``wasted_slots`` as a fraction of the allocated slots (0.0 when no block is allocated)."""
        allocated = self.n_used_blocks * self.block_size
        return self.wasted_slots / allocated if allocated else 0.0

    def block_table(self, seq=0):
        """The physical blocks of sequence ``seq`` in logical order (a copy; empty for an unknown sequence)."""
        return list(self._tables.get(self._check_seq(seq), []))

    def length(self, layer, seq=0):
        """Number of positions sequence ``seq`` holds in ``layer`` (0 for an unknown sequence)."""
        layer, seq = self._check_layer(layer), self._check_seq(seq)
        return self._lengths[seq][layer] if seq in self._lengths else 0

    def free(self, seq=0):
        """Forget sequence ``seq``; the blocks no other sequence holds go to the end of the free list."""
        seq = self._known_seq("seq", seq)
        for block in self._tables.pop(seq):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free.append(block)
        del self._lengths[seq]

    def fork(self, seq, new_seq):
        """Start sequence ``new_seq`` as a copy of ``seq`` that shares all its blocks (nothing is copied
        until a write into a shared block)."""
        seq = self._known_seq("seq", seq)
        new_seq = self._check_seq(new_seq, "new_seq")
        if new_seq in self._tables:
            raise ValueError(f"new_seq {new_seq} is already in the cache")
        self._tables[new_seq] = list(self._tables[seq])
        self._lengths[new_seq] = list(self._lengths[seq])
        for block in self._tables[new_seq]:
            self._refs[block] += 1

    # -- storing and reading ----------------------------------------------------------------------
    def update(self, layer, k, v, seq=0):
        """Append ``k, v (H_kv, T_new, D)`` to ``layer`` of sequence ``seq``; return ``(k_all, v_all)``.

        ``k_all, v_all (H_kv, S, D)``, ``S = previous length + T_new``: everything the sequence holds
        in that layer, gathered through its block table. A failed update stores nothing.
        """
        layer, seq = self._check_layer(layer), self._check_seq(seq)
        k, v = self._as_entries("k", k), self._as_entries("v", v)
        if k.shape[1] != v.shape[1]:
            raise ValueError(f"k and v must hold the same number of new positions, got {k.shape[1]} and {v.shape[1]}")
        table = self._tables.get(seq, [])
        start = self._lengths[seq][layer] if seq in self._lengths else 0
        stop = start + k.shape[1]
        needed = max(0, math.ceil(stop / self.block_size) - len(table))
        # the blocks this write touches that other sequences hold too: copied first (copy-on-write)
        touched = range(start // self.block_size, min(len(table), math.ceil(stop / self.block_size))) \
            if stop > start else range(0)
        shared = [logical for logical in touched if self._refs[table[logical]] > 1]
        if needed + len(shared) > len(self._free):
            raise ValueError(f"k adds {k.shape[1]} positions to sequence {seq}, which holds {start} in layer {layer}: "
                             f"that needs {needed + len(shared)} more blocks of block_size={self.block_size}, but "
                             f"only {len(self._free)} of n_blocks={self.n_blocks} are free")
        if seq not in self._tables:
            self._tables[seq], self._lengths[seq] = table, [0] * self.n_layers
        for logical in shared:
            old, new = table[logical], self._take_block()
            self.k[:, new], self.v[:, new] = self.k[:, old], self.v[:, old]  # every layer: one table serves all
            self._refs[old] -= 1
            table[logical] = new
        table.extend(self._take_block() for _ in range(needed))
        positions = torch.arange(start, stop, device=self.device)
        blocks = torch.tensor(table, dtype=torch.long, device=self.device)[positions // self.block_size]
        slots = positions % self.block_size
        # pool[layer][blocks, :, slots] is (T_new, H_kv, D): one row per new position
        self.k[layer][blocks, :, slots] = k.transpose(0, 1)
        self.v[layer][blocks, :, slots] = v.transpose(0, 1)
        self._lengths[seq][layer] = stop
        return self.gather(layer, seq)

    def gather(self, layer, seq=0):
        """The keys and values sequence ``seq`` holds in ``layer``, ``(H_kv, S, D)`` each, in position order.

        Reads the blocks of its block table in order and drops the unfilled tail of the last one.
        """
        S = self.length(layer, seq)
        table = torch.tensor(self._tables.get(seq, []), dtype=torch.long, device=self.device)
        gathered = []
        for pool in (self.k, self.v):
            blocks = pool[layer][table]  # (n_table, H_kv, block_size, D)
            gathered.append(blocks.transpose(0, 1).reshape(self.n_kv_heads, -1, self.head_dim)[:, :S])
        return tuple(gathered)

    def _take_block(self):
        """The block at the front of the free list, now held by one table."""
        block = self._free.popleft()
        self._refs[block] = 1
        return block

    # -- checks -------------------------------------------------------------------------------------
    def _check_layer(self, layer):
        layer = check_int("layer", layer, minimum=0)
        if layer >= self.n_layers:
            raise ValueError(f"layer must be < n_layers={self.n_layers}, got {layer}")
        return layer

    def _check_seq(self, seq, name="seq"):
        return check_int(name, seq, minimum=0)

    def _known_seq(self, name, seq):
        seq = self._check_seq(seq, name)
        if seq not in self._tables:
            raise ValueError(f"{name} {seq} is not in the cache (sequences: {self.sequences})")
        return seq

    def _as_entries(self, name, x):
        """``x`` as a detached tensor of the pools' dtype and device, of shape ``(H_kv, T_new, D)``."""
        x = torch.as_tensor(x, dtype=self._dtype, device=self.device).detach()
        if x.ndim != 3 or x.shape[0] != self.n_kv_heads or x.shape[2] != self.head_dim:
            raise ValueError(f"{name} must have shape (H_kv={self.n_kv_heads}, T_new, D={self.head_dim}), "
                             f"got {tuple(x.shape)}")
        return x
