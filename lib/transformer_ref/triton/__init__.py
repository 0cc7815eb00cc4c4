"""The Triton backend of transformer_ref: FlashAttention as a real GPU kernel.

::

    from transformer_ref import triton as fref     # needs: pip install -r requirements-triton.lock
    out = fref.flash_attention(q, k, v, causal=True)

One function, :func:`flash_attention`, with the contract of
:func:`transformer_ref.torch.flash_attention` (shapes, GQA, bottom-right causal
alignment, zeros for rows that see no key, ``lse``, autograd), computed by
Triton kernels instead of a Python loop over tiles.

Where the kernels run:

* CUDA tensors: compiled by Triton for the GPU, as in production.
* CPU tensors: the same kernels run under Triton's *interpreter*
  (``TRITON_INTERPRET=1``), which executes each program instance in Python on
  NumPy arrays. That is slow and only meant for testing and reading the kernels
  on a machine without a GPU (the course machine).

Triton decides between compiling and interpreting a function when the function
is defined (decorated with ``@triton.jit``), from the environment variable
``TRITON_INTERPRET``; that includes its own library (``tl.zeros``, ``tl.max``,
...), which is defined when ``triton.language`` is first imported. So the
variable must be set before *anything* imports triton. This package sets
``TRITON_INTERPRET=1`` when no CUDA device is available, the variable is not
set and triton is not imported yet. If triton was imported earlier without it
(``torch.compile`` and ``torch._dynamo`` import triton, for instance), the
kernels are compiled, and CPU tensors raise an error that says to set
``TRITON_INTERPRET=1`` before starting Python. To interpret on a machine that
has a GPU, set ``TRITON_INTERPRET=1`` yourself; ``TRITON_INTERPRET=0`` forbids
the interpreter. ``transformer_ref.triton.INTERPRETED`` tells which mode the kernels run in.

Nothing else in transformer_ref imports this package: ``import transformer_ref``
and the NumPy and torch backends work without triton installed.
"""

import os
import sys

import torch

if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules and not torch.cuda.is_available():
    # No GPU to compile for: interpret. Later would be too late for triton.language's own
    # functions, which would stay compiled while our kernels were interpreted.
    os.environ["TRITON_INTERPRET"] = "1"

try:
    import triton  # noqa: F401
except ImportError as error:  # one clear message instead of a traceback from deep inside
    raise ImportError(
        "transformer_ref.triton needs the triton package, which the course does not install "
        "by default (about 1 GB): run `pip install -r requirements-triton.lock` "
        "(or `make test`, which installs it into .venv)"
    ) from error

from .flash import *  # noqa: E402,F401,F403
from .flash import __all__ as _flash_all  # noqa: E402
from .flash import INTERPRETED  # noqa: E402,F401

__all__ = [*_flash_all]
