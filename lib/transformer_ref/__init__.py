"""Reference implementations for "Attention, Part 2".

Two backends with the same function names and the same semantics::

    from transformer_ref import numpy as ref     # NumPy, float64-friendly, readable
    from transformer_ref import torch as tref    # PyTorch: any device, autograd, nn.Modules

Conventions shared by both backends (``tests/library/test_api_surface.py`` and the
subject tests check them)
---------------------------------------------------------------------------
* attention tensors are ``(..., H, T, D)``; block inputs are ``(..., T, C)``;
* boolean masks: ``True`` = may attend, broadcastable to ``(..., T, S)``; causal
  masks are aligned bottom-right (query ``i`` sees key ``j`` iff ``j <= i + S - T``),
  for ``S < T`` too; integer 0/1 masks are rejected, float masks are additive;
* a fully masked query row, or no keys at all (``S = 0``), yields zeros, never NaN;
* GQA: query head ``h`` reads KV head ``h // (H_q // H_kv)`` (repeat-interleave);
* ``scale`` is any finite real number, ``1 / sqrt(D)`` by default;
* RoPE ``positions`` follow the layout of ``x``: ``(T,)`` or ``(..., T)``;
* incremental decoding: ``multi_head_attention`` and ``transformer_block`` take a
  ``KVCache`` as ``cache=`` with ``layer_idx=``; positions then start at what the
  cache holds;
* the same public names, and for each the same parameters (names, kinds,
  defaults); the torch backend adds only keyword-only ``dtype`` and ``device``
  where it creates tensors, and its ``KVCache`` defaults to float32 where NumPy's
  defaults to float64; torch-only: ``TransformerBlock``, the three model classes and
  ``PagedKVCache``;
* dtypes: "float32 by default" in torch is spelled ``dtype=torch.float32``;
  integer input is promoted (float64 in NumPy, float32 in torch); torch computes
  the softmax and norm statistics of float16/bfloat16 input in float32 and
  returns the input dtype;
* bad input raises ``ValueError`` whose message starts with the offending
  argument's name, with the same message in both backends; the torch backend
  names an array argument that is not a tensor (parameter dicts may hold either);
  flags such as ``bias`` must be real booleans;
* the checks behind those messages live in one private module, ``_checks``;
  neither backend imports the other's private helpers;
* every public name's docstring names the chapter section that teaches it
  ("Taught in chapter N, section '...'"), or a chapter uses it.

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
