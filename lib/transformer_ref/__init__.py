"""Reference implementations for "Attention, Part 2".

Two backends with the same function names and the same semantics::

    from transformer_ref import numpy as ref     # NumPy, float64-friendly, readable
    from transformer_ref import torch as tref    # PyTorch: any device, autograd, nn.Modules

Conventions shared by both backends
-----------------------------------
* attention tensors are ``(..., H, T, D)``; block inputs are ``(..., T, C)``;
* boolean masks: ``True`` = may attend, broadcastable to ``(..., T, S)``; causal
  masks are aligned bottom-right (query ``i`` sees key ``j`` iff ``j <= i + S - T``);
* a fully masked query row attends to nothing and yields zeros, never NaN;
* GQA: query head ``h`` reads KV head ``h // (H_q // H_kv)`` (repeat-interleave);
* bad input raises ``ValueError`` naming the offending argument.

Backend-free arithmetic (parameter counts, KV-cache and score-matrix sizes)
lives in :mod:`transformer_ref.counts` and is re-exported by both backends.
"""

__all__ = ["numpy", "torch", "counts"]
__version__ = "0.1.0"


def __getattr__(name):
    # ``import transformer_ref`` stays cheap: the torch backend (and torch itself)
    # is only imported when asked for.
    if name in __all__:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
