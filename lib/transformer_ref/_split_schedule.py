"""Which keys go where when attention is split, shared by both backends.

:func:`split_bounds` cuts a range into contiguous pieces (Flash-Decoding's pieces of keys,
ring attention's blocks of queries and keys); :func:`ring_schedule` is the order in which a
simulated ring of devices meets the key/value blocks. Both are arithmetic on Python integers;
the backends do the attention and the merge.
"""

__all__ = ["split_bounds", "ring_schedule"]


def split_bounds(length, n_parts):
    """``[(start, stop), ...]``: ``range(length)`` cut into ``n_parts`` contiguous pieces whose sizes
    differ by at most one, the longer ones first (``numpy.array_split``'s rule); pieces are empty
    when ``n_parts > length``."""
    size, extra = divmod(length, n_parts)
    bounds, start = [], 0
    for part in range(n_parts):
        stop = start + size + (part < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_schedule(T, S, n_devices, causal):
    """Yield ``(device, (i0, i1), (j0, j1))``: device ``r`` attends queries ``i0:i1`` to keys ``j0:j1``.

    Device ``r`` holds query block ``r`` and starts with key/value block ``r``; after each of the
    ``n_devices`` steps every device passes the block it holds to device ``r + 1`` (so at step ``t``
    device ``r`` holds block ``(r - t) mod n_devices``). The pairs come step by step, devices in
    order within a step (on real hardware a step's devices run at once). With ``causal`` (query
    ``i`` sees key ``j`` iff ``j <= i + S - T``) a block entirely in the future of a device's
    queries is skipped, except at step 0, which starts each device's running result.
    """
    q_blocks, kv_blocks = split_bounds(T, n_devices), split_bounds(S, n_devices)
    held = list(range(n_devices))  # held[r]: the key/value block device r holds at this step
    for step in range(n_devices):
        for r, (i0, i1) in enumerate(q_blocks):
            j0, j1 = kv_blocks[held[r]]
            if not (causal and step > 0 and j0 > i1 - 1 + S - T):
                yield r, (i0, i1), (j0, j1)
        held = [held[r - 1] for r in range(n_devices)]  # device r receives device r - 1's block
