"""Peak-memory measurement for the chapters, the benchmarks and the tests (not part of the reference API).

NumPy reports every array buffer it allocates to :mod:`tracemalloc`, so the peak
that tracemalloc records while a function runs is the largest amount of array
memory that function had alive at once: for attention, whether it ever held a
``T x S`` score matrix. (torch tensors are not reported; a torch measurement
needs the process's resident size or the CUDA allocator's statistics.)
"""

import gc
import tracemalloc
from contextlib import contextmanager

__all__ = ["TracedPeak", "traced_peak"]


class TracedPeak:
    """The result of :func:`traced_peak`: ``bytes`` is filled in when the ``with`` block ends."""

    bytes = None


@contextmanager
def traced_peak():
    """Record the peak of the memory traced by :mod:`tracemalloc` inside a ``with`` block.

    ::

        with traced_peak() as peak:
            ref.flash_attention(q, k, v)
        peak.bytes          # the most bytes allocated (and not yet freed) at any moment of the block

    Only allocations made inside the block count (memory alive before it is not
    traced); garbage is collected first, so a collection of older garbage cannot
    fall into the block. Blocks do not nest: tracemalloc has one peak counter.
    """
    gc.collect()
    result = TracedPeak()
    tracemalloc.start()
    try:
        yield result
    finally:
        result.bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
