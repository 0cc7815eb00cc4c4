"""A reply is bounded before it is parsed, and a grading process has a memory cap of its own.

The attack: a kernel that replaces ``json.dumps`` answers every request with
``"[" + "{}," * 22_000_000 + "{}]"`` (66 MB, under the 64 MiB frame cap). Parsed, that is
22 million dicts: 1.9 GiB in the worker. The codec counts the values on the text first and
refuses it before ``json.loads`` builds anything. Measured with ``tracemalloc`` (every
allocation of the Python heap, the parser's objects included), in the worker's own process.
"""

import resource
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from autograder.core.limits import WORKER_MEMORY_MB, cap_worker_memory
from autograder.judge.transport import KernelTransport
from autograder.judge.verdict import JudgeError
from autograder.kernel import probe
from tests.sandboxed_kernel import need_sandbox, sandboxed_kernel

EMPTY_DICTS = 22_000_000
HOSTILE = "[" + "{}," * EMPTY_DICTS + "{}]"  # 66 MB of 22 million dicts


def peak_while(function):
    """(what ``function()`` raised or returned, bytes allocated at most meanwhile)."""
    tracemalloc.start()
    try:
        try:
            outcome = function()
        except Exception as error:  # noqa: BLE001 - the outcome under test
            outcome = error
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_reply_of_22_million_dicts_is_refused_before_one_is_built():
    outcome, peak = peak_while(lambda: probe.decode(HOSTILE))
    assert isinstance(outcome, probe.ProbeError), outcome
    assert "more than 200,000 values" in str(outcome)
    assert peak < 2**20  # nothing built: not one dict of the 22 million (64 bytes each at least)


@pytest.mark.parametrize("text", [
    "[" + "0," * 300_000 + "0]",                   # numbers: items, not containers
    '["' + '","'.join(["a"] * 300_000) + '"]',     # strings
    "]" * 300_000,                                 # closing brackets only
])
def test_every_kind_of_many_values_is_refused(text):
    with pytest.raises(probe.ProbeError, match="more than"):
        probe.decode(text)


def test_an_honest_reply_at_the_bounds_decodes():
    value = {"value": [np.ones((256, 256)), [1.5] * 50_000, {"text": "[{,}]"}], "seconds": 0.1}
    decoded = probe.decode(probe.encode(value))
    assert decoded["value"][1] == [1.5] * 50_000 and decoded["value"][2] == {"text": "[{,}]"}
    np.testing.assert_array_equal(decoded["value"][0], np.ones((256, 256)))


def test_nesting_is_bounded_while_parsing():
    with pytest.raises(probe.ProbeError, match="RecursionError"):
        probe.decode("[" * 100_000 + "]" * 100_000)
    nested = 1
    for _ in range(probe.MAX_DEPTH + 2):
        nested = [nested]
    with pytest.raises(probe.ProbeError, match="nested too deeply"):
        probe.decode(probe._text(probe._to_jsonable(nested, depth=-5)))


# the probe's replies only (its compact separators): the kernel's own messages stay JSON
REPLACE_DUMPS = f"""
import json
_dumps = json.dumps
def _hostile(*args, **kwargs):
    if kwargs.get("separators") == (",", ":"):
        return "[" + "{{}}," * {EMPTY_DICTS} + "{{}}]"
    return _dumps(*args, **kwargs)
json.dumps = _hostile
"""


@pytest.mark.slow
def test_a_kernel_that_answers_66_mb_of_dicts_costs_the_worker_its_size_not_30_times_it():
    """Through the real line: the kernel's probe answers with the hostile text; the judge
    receives the frame (66 MB), refuses it, and the worker's heap never holds more than the
    frame and its text (2 x 66 MB), not the 1.9 GiB of the parsed dicts."""
    need_sandbox()
    with sandboxed_kernel() as (km, kc):
        transport = KernelTransport(kc, km, 60)
        assert transport.request({"op": "lookup", "name": "x"}, 60) == {"found": False,
                                                                        "callable": False}
        transport.new_cell()
        transport.run_silently(REPLACE_DUMPS, 60)
        outcome, peak = peak_while(lambda: transport.request({"op": "lookup", "name": "x"}, 120))
    assert isinstance(outcome, (probe.ProbeError, JudgeError)), outcome
    assert "more than 200,000 values" in str(outcome)
    assert transport.bytes > len(HOSTILE)  # the whole frame came: it was refused, not lost
    print(f"\nreply {len(HOSTILE) / 2**20:.0f} MiB refused; worker heap peak {peak / 2**20:.0f} MiB")
    assert peak < 3 * len(HOSTILE), peak  # 22 M dicts would be 1.9 GiB


CAPPED = """
import resource, sys
from autograder.core.limits import cap_worker_memory
cap_worker_memory(512)
soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
try:
    ballast = bytearray(1024 * 2**20)
    print("allocated", soft, hard)
except MemoryError:
    print("MemoryError", soft, hard)
"""


def test_a_grading_process_has_an_address_space_cap_of_its_own():
    """Over its cap a local grading worker gets MemoryError (which the judge turns into that
    test cell's verdict), never the whole host's memory; the hard limit stays for the kernels,
    whose launcher lifts the soft one."""
    done = subprocess.run([sys.executable, "-c", CAPPED], capture_output=True, text=True,
                          timeout=120, check=True)
    word, soft, hard = done.stdout.split()
    assert word == "MemoryError"
    assert int(soft) == 512 * 2**20
    assert int(hard) == resource.getrlimit(resource.RLIMIT_DATA)[1]
    assert WORKER_MEMORY_MB >= 2048 and callable(cap_worker_memory)
