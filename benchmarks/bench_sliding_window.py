"""Sliding-window attention at a fixed window: time grows linearly in T (full causal attention: quadratically).

    .venv/bin/python benchmarks/bench_sliding_window.py             # W = 256, T = 2048 .. 32768
    .venv/bin/python benchmarks/bench_sliding_window.py --max-t 8192 --threads 1

One head, D = 64, float32, T = S. For each T the script prints the best of
``--repeats`` wall-clock times of ``sliding_window_attention(q, k, v, W)`` and
the time per query (microseconds), which stays flat when the cost is O(T * W),
next to full causal ``flash_attention`` (O(T^2), up to ``--max-causal-t``).
Timings on a shared machine are noisy: compare the per-query column, rerun.
"""

import argparse

from bench_flash import D, best_time, set_threads  # one timing helper for all attention benchmarks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=256, help="window W (default 256)")
    parser.add_argument("--max-t", type=int, default=32768, help="largest T = S (default 32768)")
    parser.add_argument("--max-causal-t", type=int, default=16384, help="largest T for causal flash")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per measurement, best kept")
    parser.add_argument("--threads", type=int, default=2, help="BLAS / torch threads (default 2)")
    args = parser.parse_args()
    set_threads(args.threads)  # before NumPy and torch load their thread pools

    import numpy as np
    import torch

    from transformer_ref import numpy as ref
    from transformer_ref import torch as tref

    torch.set_num_threads(args.threads)
    W = args.window
    sizes = [T for T in (2048, 4096, 8192, 16384, 32768) if T <= args.max_t]
    rng = np.random.default_rng(0)
    print(f"sliding_window_attention, W = {W}, one head, D = {D}, float32, T = S, "
          f"{args.threads} thread(s), best of {args.repeats}")
    print(f"{'T':>6} | {'numpy s':>8} {'us/query':>8} {'causal s':>8} | "
          f"{'torch s':>8} {'us/query':>8} {'causal s':>8}")
    for T in sizes:
        q, k, v = (rng.standard_normal((1, T, D), dtype=np.float32) for _ in range(3))
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        row = [best_time(lambda: ref.sliding_window_attention(q, k, v, W), args.repeats)]
        full = T <= args.max_causal_t
        row.append(best_time(lambda: ref.flash_attention(q, k, v, causal=True), args.repeats) if full else None)
        with torch.no_grad():
            row.append(best_time(lambda: tref.sliding_window_attention(tq, tk, tv, W), args.repeats))
            row.append(best_time(lambda: tref.flash_attention(tq, tk, tv, causal=True), args.repeats) if full else None)

        def cell(t):
            return f"{t:8.3f}" if t is not None else f"{'-':>8}"

        print(f"{T:>6} | {row[0]:8.3f} {1e6 * row[0] / T:8.1f} {cell(row[1])} | "
              f"{row[2]:8.3f} {1e6 * row[2] / T:8.1f} {cell(row[3])}", flush=True)


if __name__ == "__main__":
    main()
