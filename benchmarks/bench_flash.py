"""FlashAttention tiling vs the naive T x S attention vs PyTorch's fused SDPA: time and peak memory.

    .venv/bin/python benchmarks/bench_flash.py                # T = 1024 .. 16384, both backends
    .venv/bin/python benchmarks/bench_flash.py --max-t 8192 --backend numpy --threads 1
    .venv/bin/python benchmarks/bench_flash.py --sweep --threads 1 --repeats 5 --cpu-time  # tile shapes
    .venv/bin/python benchmarks/bench_flash.py --ratios --max-t 8192 --threads 1 --repeats 9 --cpu-time

One head, D = 64, float32, T = S. For each T the script prints the best of
``--repeats`` interleaved calls (wall clock, or CPU time with ``--cpu-time``), the
1-minute load average, and the peak *extra* memory of one call:

* NumPy: ``tracemalloc`` peak during the call (NumPy reports every array
  buffer to tracemalloc, so this is the largest amount of array memory alive
  at once, inputs excluded).
* torch: peak resident set size (VmHWM) minus the resident size just before the
  call, measured in a fresh subprocess per (function, T) after a small warm-up
  call, with the kernel's peak counter reset through ``/proc/self/clear_refs``.
  torch's CPU allocator returns large blocks to the OS, so RSS tracks the live
  tensors; a fresh process keeps one measurement from inheriting another's peak.

Budgets at T = 8192, one thread (benchmarks/README.md): flash peak memory <= 2 % of
naive's, flash time <= 0.7 x naive (NumPy) and <= 1.0 x ``F.scaled_dot_product_attention``
(torch, CPU). Timings on a shared machine are noisy: compare ratios, rerun.

``--sweep`` times every tile shape (``block_q`` 128 .. 2048 x ``block_k`` 128 .. 8192) at
T = S = 8192, full and causal, each row interleaved with its own yardstick (naive for NumPy,
SDPA for torch): the table behind the default tiles.

``--ratios`` prints only flash / yardstick at each T, full and causal, as the median of
``--repeats`` interleaved pairs (more rounds at small T): the figures behind the budgets on a
loaded machine, where a best call is a lucky one.

``--backend triton`` (needs ``pip install -r requirements-triton.lock``) times
``transformer_ref.triton.flash_attention``. On a GPU: forward and
forward+backward at T = S = 1024 .. 16384, D = 64 and 128, float16 and bfloat16,
batch 1 x 16 heads, against SDPA restricted to its flash backend and the torch
loop backend; time is the best of ``--repeats`` CUDA-synchronised calls, memory
the peak of ``torch.cuda.max_memory_allocated`` above what was allocated before
the call. Without a GPU the kernels run under Triton's interpreter, and the
script times that at the test sizes only: a correctness tool, not a speed claim.
"""

import argparse
import gc
import os
import subprocess
import sys
import time
from functools import partial

from transformer_ref.measure import traced_peak  # imports neither NumPy nor torch

D = 64


def set_threads(n):
    """Thread pools of OpenBLAS (NumPy), MKL/OpenMP (torch); call before importing them."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)


def interleaved_times(fns, repeats, clock=time.perf_counter):
    """Seconds of ``repeats`` calls of each function of the dict ``fns``, interleaved: name -> list.

    Round r calls every function once (a, b, c, a, b, c, ...), so load that comes and goes on a
    shared machine falls on all of them alike and their ratios stay fair. ``clock``:
    ``time.perf_counter`` (wall clock) or ``time.process_time`` (CPU time of this process: with
    one thread, the wall time of an undisturbed call, since time spent waiting for a core is not
    counted).
    """
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return times


def best_times(fns, repeats, clock=time.perf_counter):
    """Best seconds of ``repeats`` interleaved calls of each function (the least disturbed call)."""
    return {name: min(t) for name, t in interleaved_times(fns, repeats, clock).items()}


def clock_name(clock):
    return "CPU time" if clock is time.process_time else "wall clock"


def best_time(fn, repeats):
    """Best wall-clock seconds of ``repeats`` calls of ``fn`` (the least disturbed by other load)."""
    return best_times({"fn": fn}, repeats)["fn"]


def numpy_peak_bytes(fn):
    with traced_peak() as peak:
        fn()
    return peak.bytes


def numpy_functions(causal):
    from transformer_ref import numpy as ref

    def naive(q, k, v):
        T, S = q.shape[-2], k.shape[-2]
        return ref.scaled_dot_product_attention(q, k, v, ref.causal_mask(T, S) if causal else None)

    return {"naive": naive, "flash": lambda q, k, v: ref.flash_attention(q, k, v, causal=causal)}


def torch_functions(causal):
    import torch.nn.functional as F

    from transformer_ref import torch as tref

    def naive(q, k, v):
        T, S = q.shape[-2], k.shape[-2]
        return tref.scaled_dot_product_attention(q, k, v, tref.causal_mask(T, S) if causal else None)

    return {
        "naive": naive,
        "flash": lambda q, k, v: tref.flash_attention(q, k, v, causal=causal),
        "F.sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
    }


def _proc_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def torch_probe(name, T, causal, threads):
    """Child process: print the peak RSS growth (bytes) of one call of ``name`` at size T."""
    import torch

    torch.set_num_threads(threads)
    fn = torch_functions(causal)[name]
    with torch.no_grad():
        fn(*(torch.randn(1, 1, 256, D) for _ in range(3)))  # warm-up: load kernels, thread pools
        q, k, v = (torch.randn(1, 1, T, D) for _ in range(3))
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        before = _proc_kib("VmRSS")
        fn(q, k, v)
        print((_proc_kib("VmHWM") - before) * 1024)


def torch_peak_bytes(name, T, causal, threads):
    args = [sys.executable, __file__, "--probe", name, str(T), "--threads", str(threads)]
    args += ["--causal"] if causal else []
    return int(subprocess.run(args, check=True, capture_output=True, text=True).stdout.split()[-1])


def mib(n):
    return f"{n / 2**20:9.1f}"


def run_numpy(sizes, repeats, causal_t, threads, clock):
    import numpy as np

    rng = np.random.default_rng(0)
    print(f"\nNumPy {np.__version__} ({threads} BLAS threads): one head, D = {D}, float32, T = S; "
          f"best of {repeats} interleaved ({clock_name(clock)}); memory = tracemalloc peak")
    print(f"{'T':>6} {'mask':>6} | {'naive s':>8} {'flash s':>8} {'flash/naive':>11} | "
          f"{'naive MiB':>9} {'flash MiB':>9} {'flash/naive':>11} | {'load':>5}")
    rows = [(T, False) for T in sizes] + ([(causal_t, True)] if causal_t else [])
    for T, causal in rows:
        q, k, v = (rng.standard_normal((1, T, D), dtype=np.float32) for _ in range(3))
        fns = numpy_functions(causal)
        t = best_times({name: partial(fn, q, k, v) for name, fn in fns.items()}, repeats, clock)
        m = {name: numpy_peak_bytes(lambda: fn(q, k, v)) for name, fn in fns.items()}
        print(f"{T:>6} {'causal' if causal else 'full':>6} | {t['naive']:8.3f} {t['flash']:8.3f} "
              f"{t['flash'] / t['naive']:10.2f}x | {mib(m['naive'])} {mib(m['flash'])} "
              f"{100 * m['flash'] / m['naive']:10.2f}% | {os.getloadavg()[0]:5.2f}", flush=True)


def run_torch(sizes, repeats, causal_t, threads, clock):
    import torch

    torch.set_num_threads(threads)
    print(f"\ntorch {torch.__version__} (CPU, {torch.get_num_threads()} threads): one head, D = {D}, "
          f"float32, T = S; best of {repeats} interleaved ({clock_name(clock)}); "
          "memory = peak RSS growth in a fresh process")
    print(f"{'T':>6} {'mask':>6} | {'naive s':>8} {'sdpa s':>8} {'flash s':>8} {'flash/sdpa':>10} "
          f"{'flash/naive':>11} | {'naive MiB':>9} {'sdpa MiB':>9} {'flash MiB':>9} {'flash/naive':>11} | {'load':>5}")
    rows = [(T, False) for T in sizes] + ([(causal_t, True)] if causal_t else [])
    for T, causal in rows:
        q, k, v = (torch.randn(1, 1, T, D) for _ in range(3))
        fns = torch_functions(causal)
        with torch.no_grad():
            t = best_times({name: partial(fn, q, k, v) for name, fn in fns.items()}, repeats, clock)
        m = {name: torch_peak_bytes(name, T, causal, threads) for name in fns}
        print(f"{T:>6} {'causal' if causal else 'full':>6} | {t['naive']:8.3f} {t['F.sdpa']:8.3f} "
              f"{t['flash']:8.3f} {t['flash'] / t['F.sdpa']:9.2f}x {t['flash'] / t['naive']:10.2f}x | "
              f"{mib(m['naive'])} {mib(m['F.sdpa'])} {mib(m['flash'])} {100 * m['flash'] / m['naive']:10.2f}% | "
              f"{os.getloadavg()[0]:5.2f}", flush=True)


def run_ratios(backend, sizes, repeats, threads, clock):
    """flash / yardstick at each T, full and causal: the medians of ``repeats`` interleaved pairs.

    The yardstick is ``F.scaled_dot_product_attention`` for torch and the naive version for
    NumPy. Medians, not best calls: on a machine shared with other work the best call of a
    fast function is a lucky one, while the median of many alternated calls moves with the
    load on both sides alike. Small T get more rounds (as many calls as T = 8192 takes in time).
    """
    import statistics

    if backend == "numpy":
        import contextlib

        import numpy as np

        rng = np.random.default_rng(0)
        make = lambda T: tuple(rng.standard_normal((1, T, D), dtype=np.float32) for _ in range(3))  # noqa: E731
        yardstick, functions, no_grad = "naive", numpy_functions, contextlib.nullcontext
        print(f"\nNumPy {np.__version__} ({threads} BLAS threads)", end="")
    else:
        import torch

        torch.set_num_threads(threads)
        make = lambda T: tuple(torch.randn(1, 1, T, D) for _ in range(3))  # noqa: E731
        yardstick, functions, no_grad = "F.sdpa", torch_functions, torch.no_grad
        print(f"\ntorch {torch.__version__} (CPU, {torch.get_num_threads()} threads)", end="")
    print(f": one head, D = {D}, float32, T = S; median of interleaved calls ({clock_name(clock)})")
    print(f"{'T':>6} {'mask':>6} {'rounds':>6} | {yardstick + ' s':>8} {'flash s':>8} {'flash / ' + yardstick:>15} | "
          f"{'load':>5}")
    for T in sizes:
        q, k, v = make(T)
        rounds = repeats * max(1, (8192 // T) ** 2 // 4)
        for causal in (False, True):
            fns = {name: partial(functions(causal)[name], q, k, v) for name in ("flash", yardstick)}
            with no_grad():
                t = {name: statistics.median(ts) for name, ts in interleaved_times(fns, rounds, clock).items()}
            print(f"{T:>6} {'causal' if causal else 'full':>6} {rounds:>6} | {t[yardstick]:8.4f} {t['flash']:8.4f} "
                  f"{t['flash'] / t[yardstick]:14.2f}x | {os.getloadavg()[0]:5.2f}", flush=True)


# Tile shapes of --sweep: query rows x keys per tile
SWEEP_BLOCK_Q = (128, 256, 512, 1024, 2048)
SWEEP_BLOCK_K = (128, 256, 512, 1024, 2048, 4096, 8192)


def run_sweep(backend, T, repeats, threads, clock):
    """Time ``flash_attention`` at every tile shape against the backend's yardstick, full and causal.

    The yardstick is the naive version for NumPy and ``F.scaled_dot_product_attention`` for torch.
    Each row times its tile shape interleaved with its own yardstick calls (:func:`best_times`),
    so a row's ratio compares calls made under the same load even when the load drifts between
    rows; the load average is printed with every row. ``*`` marks the library's default tiles.
    """
    if backend == "numpy":
        import contextlib

        import numpy as np

        from transformer_ref.numpy import flash

        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((1, T, D), dtype=np.float32) for _ in range(3))
        yardstick, functions, no_grad = "naive", numpy_functions, contextlib.nullcontext
        print(f"\nNumPy {np.__version__} tile sweep ({threads} BLAS threads)", end="")
    else:
        import torch

        from transformer_ref.torch import flash

        torch.set_num_threads(threads)
        q, k, v = (torch.randn(1, 1, T, D) for _ in range(3))
        yardstick, functions, no_grad = "F.sdpa", torch_functions, torch.no_grad
        print(f"\ntorch {torch.__version__} tile sweep (CPU, {threads} threads)", end="")
    print(f": T = S = {T}, D = {D}, float32, one head; best of {repeats} "
          f"({clock_name(clock)}), each row interleaved with {yardstick}")
    print(f"{'block_q':>7} {'block_k':>7} | {'full s':>7} {'/ ' + yardstick:>9} | {'causal s':>8} "
          f"{'/ ' + yardstick:>9} | {'load':>5}")
    yard = {causal: partial(functions(causal)[yardstick], q, k, v) for causal in (False, True)}
    for bq, bk in [(bq, bk) for bq in SWEEP_BLOCK_Q for bk in SWEEP_BLOCK_K if bq <= T and bk <= T]:
        ratio = {}
        for causal in (False, True):
            flash_fn = partial(flash.flash_attention, q, k, v, causal=causal, block_q=bq, block_k=bk)
            with no_grad():
                t = best_times({"flash": flash_fn, yardstick: yard[causal]}, repeats, clock)
            ratio[causal] = (t["flash"], t["flash"] / t[yardstick])
        default = "*" if (bq, bk) == (flash.DEFAULT_BLOCK_Q, flash.DEFAULT_BLOCK_K) else " "
        print(f"{bq:>6}{default} {bk:>7} | {ratio[False][0]:7.3f} {ratio[False][1]:8.2f}x | "
              f"{ratio[True][0]:8.3f} {ratio[True][1]:8.2f}x | {os.getloadavg()[0]:5.2f}", flush=True)


# Triton: the interpreter on CPU, the compiled kernels on a GPU
TRITON_HEADS = 16
# (T, S, H, H_kv, D, tile): the sizes of tests/library/test_flash_triton.py, 16 x 16 tiles, and
# its default-tile case (64 x 64)
TRITON_CPU_SIZES = [(37, 53, 4, 2, 24, 16), (45, 19, 3, 1, 16, 16), (32, 32, 2, 2, 32, 16), (100, 70, 2, 1, 16, 64)]


def _forward_backward(fn, q, k, v, g):
    """One forward and backward pass of ``fn``; the gradients land in q.grad, k.grad, v.grad."""
    q.grad = k.grad = v.grad = None
    fn(q, k, v).backward(g)


def run_triton_cpu(repeats, threads):
    import torch
    import torch.nn.functional as F

    import triton

    from transformer_ref import torch as tref
    from transformer_ref import triton as fref

    torch.set_num_threads(threads)
    print(f"\nTriton {triton.__version__} INTERPRETER on CPU (no GPU here), float32, best of {repeats}.")
    print("A correctness tool, not a speed claim: every program instance of every kernel runs as Python")
    print("on NumPy arrays, one after another. These times say nothing about the kernels on a GPU.")
    print(f"{'T':>5} {'S':>5} {'H':>3} {'H_kv':>4} {'D':>4} {'tile':>4} {'mask':>6} | {'triton fwd s':>12} {'fwd+bwd s':>10} | "
          f"{'loop fwd s':>10} {'sdpa fwd s':>10} | {'max |out - sdpa|':>16}")
    gen = torch.Generator().manual_seed(0)
    for T, S, H, H_kv, Dh, tile in TRITON_CPU_SIZES:
        for causal in (False, True):
            q, k, v = (torch.randn(1, h, n, Dh, generator=gen).requires_grad_()
                       for h, n in ((H, T), (H_kv, S), (H_kv, S)))
            g = torch.randn(1, H, T, Dh, generator=gen)
            # SDPA's is_causal is aligned top-left: pass the bottom-right mask instead
            mask = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T) if causal else None
            fns = {
                "triton": lambda q, k, v: fref.flash_attention(q, k, v, causal=causal, block_q=tile, block_k=tile),
                "loop": lambda q, k, v: tref.flash_attention(q, k, v, causal=causal),
                "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
            }
            with torch.no_grad():
                t = {name: best_time(lambda: fn(q, k, v), repeats) for name, fn in fns.items()}
                err = (fns["triton"](q, k, v) - fns["sdpa"](q, k, v)).abs().max().item()
            t_fb = best_time(lambda: _forward_backward(fns["triton"], q, k, v, g), repeats)
            print(f"{T:>5} {S:>5} {H:>3} {H_kv:>4} {Dh:>4} {tile:>4} {'causal' if causal else 'full':>6} | "
                  f"{t['triton']:12.3f} {t_fb:10.3f} | {t['loop']:10.4f} {t['sdpa']:10.4f} | {err:16.1e}", flush=True)


def _cuda_time_and_peak(fn, repeats):
    """Best CUDA-synchronised seconds of ``repeats`` calls (after one warm-up call) and peak extra bytes."""
    import torch

    fn()  # warm-up: compiles the Triton kernels, picks the SDPA kernel, fills the allocator's cache
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return min(times), torch.cuda.max_memory_allocated() - before


def run_triton_gpu(sizes, repeats, causal_t):
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from transformer_ref import torch as tref
    from transformer_ref import triton as fref

    def sdpa_flash(q, k, v, causal):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    impls = {
        "triton": lambda q, k, v, causal: fref.flash_attention(q, k, v, causal=causal),
        "sdpa": sdpa_flash,
        "loop": lambda q, k, v, causal: tref.flash_attention(q, k, v, causal=causal),
    }
    print(f"\nTriton {triton.__version__} compiled, torch {torch.__version__} on {torch.cuda.get_device_name()}: "
          f"batch 1 x {TRITON_HEADS} heads, T = S; best of {repeats}; memory = peak CUDA allocation above the inputs")
    print("sdpa = F.scaled_dot_product_attention restricted to its flash backend; loop = transformer_ref.torch")
    names = list(impls)
    print(f"{'T':>6} {'mask':>6} {'dtype':>8} {'D':>4} | " + " ".join(f"{n + ' fwd ms':>14}" for n in names) + " | "
          + " ".join(f"{n + ' f+b ms':>14}" for n in names) + " | " + " ".join(f"{n + ' f+b MiB':>14}" for n in names))
    rows = [(T, False) for T in sizes] + ([(causal_t, True)] if causal_t else [])
    for dtype in (torch.float16, torch.bfloat16):
        for Dh in (64, 128):
            for T, causal in rows:
                fwd, fb, mem = _triton_gpu_row(impls, T, causal, dtype, Dh, repeats)
                print(f"{T:>6} {'causal' if causal else 'full':>6} {str(dtype).removeprefix('torch.'):>8} {Dh:>4} | "
                      + " ".join(f"{1e3 * fwd[n]:14.2f}" for n in names) + " | "
                      + " ".join(f"{1e3 * fb[n]:14.2f}" for n in names) + " | "
                      + " ".join(f"{mem[n] / 2**20:14.1f}" for n in names), flush=True)
                torch.cuda.empty_cache()


def _triton_gpu_row(impls, T, causal, dtype, Dh, repeats):
    """Forward seconds, forward+backward seconds and forward+backward peak bytes of each implementation."""
    import torch

    q, k, v, g = (torch.randn(1, TRITON_HEADS, T, Dh, device="cuda", dtype=dtype) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_()
    fwd, fb, mem = {}, {}, {}
    for name, fn in impls.items():
        def forward(fn=fn):
            with torch.no_grad():
                fn(q, k, v, causal)

        def forward_backward(fn=fn):
            _forward_backward(lambda q, k, v: fn(q, k, v, causal), q, k, v, g)

        fwd[name], _ = _cuda_time_and_peak(forward, repeats)
        fb[name], mem[name] = _cuda_time_and_peak(forward_backward, repeats)
    return fwd, fb, mem


def run_triton(sizes, repeats, causal_t, threads):
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        sys.exit("--backend triton needs triton: .venv/bin/python -m pip install -r requirements-triton.lock")
    # imported before anything else can import triton, so that it may choose the interpreter
    from transformer_ref import triton as fref

    if fref.INTERPRETED:
        run_triton_cpu(repeats, threads)
    else:
        run_triton_gpu(sizes, repeats, causal_t)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-t", type=int, default=16384, help="largest T = S (default 16384)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per measurement, best kept")
    parser.add_argument("--backend", choices=["numpy", "torch", "both", "triton"], default="both",
                        help="triton: the Triton kernels (GPU, or the interpreter on CPU); not part of 'both'")
    parser.add_argument("--threads", type=int, default=2, help="BLAS / torch threads (default 2)")
    parser.add_argument("--sweep", action="store_true",
                        help="instead of the T rows: every tile shape at T = S = min(8192, --max-t), full and causal")
    parser.add_argument("--ratios", action="store_true",
                        help="instead of the T rows: flash / yardstick at T = 1024 .. --max-t, full and causal, "
                             "medians of interleaved calls (no memory)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time calls by this process's CPU time, not the wall clock (use with --threads 1)")
    parser.add_argument("--probe", nargs=2, metavar=("NAME", "T"), help=argparse.SUPPRESS)
    parser.add_argument("--causal", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    set_threads(args.threads)
    if args.probe:
        torch_probe(args.probe[0], int(args.probe[1]), args.causal, args.threads)
        return
    clock = time.process_time if args.cpu_time else time.perf_counter
    if args.sweep:
        if args.backend not in ("numpy", "torch", "both"):
            sys.exit("--sweep times the numpy and torch backends: --backend numpy, torch or both")
        for backend in ("numpy", "torch") if args.backend == "both" else (args.backend,):
            run_sweep(backend, min(8192, args.max_t), args.repeats, args.threads, clock)
        return
    sizes = [T for T in (1024, 2048, 4096, 8192, 16384) if T <= args.max_t]
    if args.ratios:
        if args.backend not in ("numpy", "torch", "both"):
            sys.exit("--ratios times the numpy and torch backends: --backend numpy, torch or both")
        for backend in ("numpy", "torch") if args.backend == "both" else (args.backend,):
            run_ratios(backend, sizes, args.repeats, args.threads, clock)
        return
    causal_t = min(8192, args.max_t) if sizes else None
    if args.backend in ("numpy", "both"):
        run_numpy(sizes, args.repeats, causal_t, args.threads, clock)
    if args.backend in ("torch", "both"):
        run_torch(sizes, args.repeats, causal_t, args.threads, clock)
    if args.backend == "triton":
        run_triton(sizes, args.repeats, causal_t, args.threads)


if __name__ == "__main__":
    main()
