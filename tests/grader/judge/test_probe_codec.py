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
            "from autograder.judge import transport; from autograder.kernel import probe; "
            "import numpy as np; text = probe._text({'$': 'dict', 'v': {'value': "
            "probe._array('tensor', np.ones(3))}}); assert 'torch' not in sys.modules; "
            "print(type(probe.decode(text, transport.import_torch)['value']).__name__)")
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


# -- the wire format, written out by hand -------------------------------------------------
def wire(text):
    """An encoded message read as plain JSON (it is JSON text, ASCII only)."""
    import json

    assert text.isascii()
    return json.loads(text)


def test_the_operations_are_the_wire_strings():
    assert {op.value for op in probe.Op} == {"lookup", "call", "vjp", "stage", "call_staged",
                                             "fetch"}
    request = {"op": probe.Op.CALL, "name": "f", "args": [1, 2.5, None, True, "s"], "kwargs": {}}
    assert wire(probe.encode(request)) == {"$": "dict", "v": {
        "op": "call", "name": "f", "kwargs": {"$": "dict", "v": {}},
        "args": {"$": "list", "v": [{"$": "int", "v": "1"}, {"$": "float", "v": "2.5"},
                                    None, True, "s"]}}}


def test_the_judge_names_operations_only_through_op():
    """No request of the judge spells an operation as a string of its own."""
    import ast

    for path in (REPO / "autograder" / "judge").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "op":
                assert not isinstance(node.value, ast.Constant), f"{path.name}:{node.lineno}"


@pytest.mark.parametrize("value", [
    0, -2**70, 3.25, float("inf"), np.float32(0.5), np.int8(-3), np.bool_(True), "ü",
    [1, [2, (3,)]], {"a": {"b": [None]}}, (), np.zeros((2, 0, 3), dtype=np.float16),
    np.arange(6, dtype=np.int64).reshape(2, 3), np.array([1 + 2j]), np.array([True, False]),
])
def test_every_kind_of_value_comes_back_equal(value):
    back = probe.decode(probe.encode(value))
    if isinstance(value, np.ndarray):
        assert back.dtype == value.dtype and back.shape == value.shape
        assert np.array_equal(back, value)
    else:
        assert back == value and type(back) is type(value.item() if isinstance(value, np.generic)
                                                     else value)


def test_a_generator_arrives_as_an_iterator_of_its_values():
    back = probe.decode(probe.encode(x * x for x in range(3)))
    assert iter(back) is back and list(back) == [0, 1, 4]


@pytest.mark.parametrize("value, message", [
    (np.array([object()]), "dtype object"),
    (np.zeros(2, dtype=[("a", "i4")]), "cannot be graded"),
    (np.array(["text"]), "cannot be graded"),
    ({1: 2}, "string keys"),
    (object(), "type object cannot be graded"),
])
def test_what_cannot_cross_is_refused_by_the_encoder(value, message):
    with pytest.raises(TypeError, match=message):
        probe.encode(value)


def nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_is_bounded_both_ways():
    probe.decode(probe.encode(nested(probe.MAX_DEPTH)))
    with pytest.raises(TypeError, match="nested too deeply"):
        probe.encode(nested(probe.MAX_DEPTH + 1))
    deep = {"$": "list", "v": []}
    for _ in range(probe.MAX_DEPTH + 1):
        deep = {"$": "list", "v": [deep]}
    with pytest.raises(probe.ProbeError, match="nested too deeply"):
        probe.decode(probe._text(deep))


def npy_message(array, allow_pickle=False):
    import base64
    import io

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=allow_pickle)
    return probe._text({"$": "ndarray", "npy": base64.b64encode(buf.getvalue()).decode()})


@pytest.mark.parametrize("text, message", [
    (None, "missing or too large"),
    ("A" * (probe.MAX_TEXT + 1), "missing or too large"),
    ("not json!", "malformed message"),
    (probe._text({"$": "pickle", "v": "x"}), "unknown tag 'pickle'"),
    (probe._text({"$": ["int"], "v": "1"}), "unknown tag"),
    (probe._text({"v": 1}), "malformed value"),
    (probe._text({"$": "list", "v": {"a": 1}}), "malformed sequence"),
    (probe._text({"$": "dict", "v": [1]}), "malformed dict"),
    (probe._text({"$": "int", "v": "1e3"}), "malformed message"),
    (npy_message(np.array(["text"])), "array of dtype"),
    (npy_message(np.array([{"x": 1}], dtype=object), allow_pickle=True), "malformed message"),
])
def test_anything_an_honest_probe_would_not_send_is_refused(text, message):
    with pytest.raises(probe.ProbeError, match=message):
        probe.decode(text)


# -- the kernel side, run in this process over a plain namespace --------------------------
@pytest.fixture
def kernel_probe():
    """The probe's source executed as the judge installs it, over ``namespace``."""
    import types

    from autograder.judge.transport import PROBE_SOURCE

    namespace = {"double": lambda x: 2 * x, "ANSWER": np.arange(3), "bad": lambda: 1 / 0}
    module = types.ModuleType("__grader__")
    module.get_ipython = lambda: types.SimpleNamespace(user_ns=namespace)
    exec(compile(PROBE_SOURCE, "<grader probe>", "exec"), module.__dict__)
    return lambda **payload: probe.decode(module.handle(probe.encode(payload)))


def test_each_operation_answers_as_documented(kernel_probe):
    Op = probe.Op
    assert kernel_probe(op=Op.LOOKUP, name="double") == {"found": True, "callable": True}
    answer = kernel_probe(op=Op.LOOKUP, name="ANSWER")  # a variable comes with its value
    assert answer.pop("found") and not answer.pop("callable")
    assert np.array_equal(answer.pop("value"), [0, 1, 2]) and answer == {}
    assert kernel_probe(op=Op.LOOKUP, name="nothing") == {"found": False, "callable": False}
    called = kernel_probe(op=Op.CALL, name="double", args=[21], kwargs={})
    assert called["value"] == 42 and called["seconds"] >= 0 and called["sdpa"] is None
    kept = kernel_probe(op=Op.CALL, name="double", args=[[1]], kwargs={}, return_args=True)
    assert kept["args"] == [[1]]
    failed = kernel_probe(op=Op.CALL, name="bad", args=[], kwargs={})
    assert failed["error"] == {"type": "ZeroDivisionError", "message": "division by zero"}
    # a measured call: stage the inputs, call, fetch the reply encoded inside the window
    assert kernel_probe(op=Op.STAGE, args=[5], kwargs={}) == {"staged": True}
    assert kernel_probe(op=Op.CALL_STAGED, name="double") == {"done": True}
    assert kernel_probe(op=Op.FETCH) == {"value": 10, "sdpa": None}


@pytest.mark.parametrize("payload, error", [
    ({"op": "format_disk"}, ("ValueError", "unknown op 'format_disk'")),
    ({"op": ["call"]}, ("ValueError", "unknown op ['call']")),
    ({"name": "double"}, ("KeyError", "'op'")),
    ({"op": "fetch"}, ("KeyError", "'out'")),  # nothing staged
])
def test_a_bad_request_is_answered_with_an_error_not_raised(kernel_probe, payload, error):
    assert kernel_probe(**payload)["error"] == {"type": error[0], "message": error[1]}
