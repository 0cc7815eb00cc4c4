"""What the probe's encoder runs of a student's output, and what the judge's decoder makes of it.

Work can be deferred past a measured call only into code the encoder runs: it calls no
method of an ndarray subclass (so a "lazy array" has nothing to defer into), never pickles,
and hands a "tensor" (anything that says it is one) to its own methods, which is why the
measured window closes only after the reply is encoded. A reply tagged as a tensor always
decodes as a torch tensor, whatever the worker imported before.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autograder.judge import verdict
from autograder.kernel import probe

REPO = Path(__file__).resolve().parents[3]

class Lazy(np.ndarray):
    """Every hook a lazy array could use to compute late, each one fails the test if called."""

    def __array__(self, *args, **kwargs):
        raise AssertionError("__array__ called")

    def __array_function__(self, *args, **kwargs):
        raise AssertionError("__array_function__ called")

    def __array_finalize__(self, obj):
        if getattr(self, "armed", False):
            raise AssertionError("__array_finalize__ called")

    def __reduce__(self):
        raise AssertionError("__reduce__ called")


def test_the_encoder_calls_nothing_of_an_ndarray_subclass():
    lazy = np.arange(6.0).reshape(2, 3).view(Lazy)
    lazy.armed = True
    back = probe.decode(probe.encode({"value": lazy}))["value"]
    assert type(back) is np.ndarray and np.array_equal(back, np.arange(6.0).reshape(2, 3))


@pytest.mark.slow
def test_a_tensor_tag_is_a_tensor_even_where_torch_was_not_imported():
    pytest.importorskip("torch")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from autograder.judge import verdict; from autograder.kernel import probe; "
            "import numpy as np; text = probe._text({'$': 'dict', 'v': {'value': "
            "probe._array('tensor', np.ones(3))}}); assert 'torch' not in sys.modules; "
            "print(type(probe.decode(text, verdict._import_torch)['value']).__name__)")
    done = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.strip() == "Tensor", done.stderr[-1000:]


@pytest.mark.parametrize("record, flags", [
    ([0, True], set()),
    ([2, True], {"calls-sdpa"}),
    ([1, False], {"calls-sdpa", "probe-tampered"}),
    ([-1, True], {"probe-tampered"}),
    (None, {"probe-tampered"}),
    ([True, True], {"probe-tampered"}),
    (["1", True], {"probe-tampered"}),
])
def test_the_sdpa_record_becomes_flags(record, flags):
    assert verdict.sdpa_flags(record) == flags
