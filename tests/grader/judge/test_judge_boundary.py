"""The trusted boundary without a kernel: how a test cell is split and judged, and the transport.

* what a student's kernel may run of a test cell (:func:`visible_source`) and what the judge
  runs (:func:`judged_source`), against hand-split cells;
* :func:`judge_cell` with the real probe on the far side: the probe's source is executed
  into a module exactly as the judge installs it in a kernel, over a plain dict standing for
  the notebook's namespace, and a small transport hands it each request through the codec.
  The requests the judge makes for a cell, and its verdicts, are checked against
  expectations written out here;
* :class:`KernelTransport` against a scripted kernel client: the probe is installed in the
  first request only, replies are read as literals, and a kernel that dies or stays silent
  is a JudgeError that says so and is remembered as :class:`Lost`.
"""

import types
from queue import Empty

import pytest

from autograder.core.cells import judged_source, visible_source
from autograder.judge import transport as transport_module
from autograder.judge import verdict
from autograder.judge.transport import INSTALL_PROBE, KernelTransport, Lost
from autograder.kernel import probe

CELL = """\
out = add(2, 3)
### BEGIN HIDDEN TESTS
assert add(-1, 1) == 0
    ### END HIDDEN TESTS
assert out == 5
  ### BEGIN HIDDEN TESTS
assert add(10, 20) == 30
### END HIDDEN TESTS"""


def test_the_kernel_runs_only_the_visible_lines_and_the_judge_runs_all():
    assert visible_source(CELL) == "out = add(2, 3)\nassert out == 5"
    assert judged_source(CELL) == ("out = add(2, 3)\nassert add(-1, 1) == 0\nassert out == 5\n"
                                   "assert add(10, 20) == 30")


def test_an_unclosed_hidden_block_hides_the_rest_of_the_cell():
    source = "visible()\n### BEGIN HIDDEN TESTS\nsecret()\nmore_secret()"
    assert visible_source(source) == "visible()"
    assert judged_source(source) == "visible()\nsecret()\nmore_secret()"


# -- the judge against the real probe, without a kernel -----------------------------------
class ProbeInProcess:
    """A transport whose "kernel" is the probe's source executed over ``namespace``."""

    def __init__(self, namespace):
        self.probe = types.ModuleType("__grader__")
        self.probe.get_ipython = lambda: types.SimpleNamespace(user_ns=namespace)
        exec(compile(transport_module.PROBE_SOURCE, "<grader probe>", "exec"), self.probe.__dict__)
        self.sent = []

    def request(self, payload, timeout):
        assert timeout > 0
        self.sent.append({k: v for k, v in payload.items() if k in ("op", "name", "args")})
        return probe.decode(self.probe.handle(probe.encode(payload)))


def judged(cell_source, namespace, deadline_in=60.0):
    import time

    from nbformat.v4 import new_code_cell

    wire = ProbeInProcess(namespace)
    channel = verdict.Channel(wire, time.monotonic() + deadline_in)
    failure = verdict.judge_cell(new_code_cell(cell_source), verdict.RemoteNamespace(channel))
    return failure, wire.sent, channel.flags


def test_each_name_is_looked_up_and_each_call_carries_the_tests_inputs():
    failure, sent, flags = judged(CELL, {"add": lambda a, b: a + b})
    assert failure is None
    # ``out`` is the test's own variable, set in the judge's namespace: never asked for
    assert sent == [{"op": "lookup", "name": "add"}, {"op": "call", "name": "add", "args": [2, 3]},
                    {"op": "lookup", "name": "add"}, {"op": "call", "name": "add", "args": [-1, 1]},
                    {"op": "lookup", "name": "add"}, {"op": "call", "name": "add", "args": [10, 20]}]
    # no boot hook answers outside a sandboxed kernel: the SDPA record is missing, and said so
    assert flags == {"probe-tampered"}


def test_a_wrong_function_fails_on_the_hidden_line():
    failure, sent, _ = judged(CELL, {"add": lambda a, b: a + b if a > 0 else 7})
    assert isinstance(failure, AssertionError)
    assert [s["args"] for s in sent if s["op"] == "call"] == [[2, 3], [-1, 1]]  # stops there


def test_the_students_exception_comes_back_by_type_and_message():
    def add(a, b):
        raise NotImplementedError()

    failure, _, _ = judged(CELL, {"add": add})
    assert type(failure) is NotImplementedError and failure.raised_by_student
    out = verdict.verdict_output(failure)
    assert out.evalue == "your code raised NotImplementedError (it is not implemented yet)"


def test_a_name_the_notebook_lacks_is_a_name_error_with_a_hint():
    failure, sent, _ = judged(CELL, {})
    assert isinstance(failure, NameError) and "define it in your notebook" in str(failure)
    assert sent == [{"op": "lookup", "name": "add"}]


def test_a_variable_is_fetched_by_value_and_never_called():
    failure, sent, _ = judged("assert ANSWER_X == [1, (2.5, 'a')]", {"ANSWER_X": [1, (2.5, "a")]})
    assert failure is None
    assert sent == [{"op": "lookup", "name": "ANSWER_X"}, {"op": "value", "name": "ANSWER_X"}]


def test_no_request_is_sent_after_the_cells_deadline():
    failure, sent, _ = judged(CELL, {"add": lambda a, b: a + b}, deadline_in=-1.0)
    assert isinstance(failure, verdict.JudgeError) and "ran out of time" in str(failure)
    assert sent == []


# -- the transport against a scripted kernel client ---------------------------------------
class ScriptedKernel:
    """A kernel client and manager: each execute is answered by ``answer(code, expressions)``
    (a user expression's text/plain, or None for no reply at all)."""

    def __init__(self, answer, alive=True):
        self.answer, self.alive, self.executed, self.replies = answer, alive, [], []
        self.shell_channel = self

    def execute(self, code, silent, store_history, user_expressions=None):
        msg_id = f"m{len(self.executed)}"
        self.executed.append(code)
        text = self.answer(code, user_expressions)
        if text is not None:
            expressions = {"r": {"status": "ok", "data": {"text/plain": text}}} \
                if user_expressions else {}
            self.replies.append({"parent_header": {"msg_id": "stale"}, "content": {}})
            self.replies.append({"parent_header": {"msg_id": msg_id},
                                 "content": {"status": "ok", "user_expressions": expressions}})
        return msg_id

    def get_msg(self, timeout):
        if self.replies:
            return self.replies.pop(0)
        raise Empty

    def is_alive(self):
        return self.alive


def probe_reply(value):
    return repr(probe.encode(value))


def test_the_probe_is_installed_with_the_first_request_only_and_replies_are_decoded():
    kernel = ScriptedKernel(lambda code, expressions: probe_reply({"found": True}))
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    assert wire.request({"op": probe.Op.LOOKUP, "name": "f"}, 5) == {"found": True}
    assert wire.request({"op": probe.Op.LOOKUP, "name": "g"}, 5) == {"found": True}
    assert kernel.executed == [INSTALL_PROBE, ""]
    assert wire.round_trips == 2 and wire.bytes > len(INSTALL_PROBE)
    wire.installed = False  # the next judged cell
    wire.request({"op": probe.Op.LOOKUP, "name": "h"}, 5)
    assert kernel.executed[-1] == INSTALL_PROBE and wire.lost is None


@pytest.mark.parametrize("text", ["42", "{'a': 1}", "__import__('os').system('true')",
                                  "'" + "x" * 10 + "'"])
def test_a_reply_that_is_not_an_encoded_string_is_refused(text):
    kernel = ScriptedKernel(lambda code, expressions: text)
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    with pytest.raises((verdict.JudgeError, probe.ProbeError)):
        wire.request({"op": probe.Op.VALUE, "name": "x"}, 5)


def test_a_kernel_that_dies_while_asked_is_lost_as_died():
    kernel = ScriptedKernel(lambda code, expressions: None, alive=False)
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    with pytest.raises(verdict.JudgeError, match="kernel died"):
        wire.request({"op": probe.Op.CALL, "name": "f", "args": [], "kwargs": {}}, 30)
    assert wire.lost is Lost.DIED


def test_a_silent_kernel_is_lost_as_timeout_and_the_message_names_both_limits():
    kernel = ScriptedKernel(lambda code, expressions: None)
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    with pytest.raises(verdict.JudgeError, match=r"in the 0 s this test had left .* \(30 s per cell\)"):
        wire.request({"op": probe.Op.CALL, "name": "f", "args": [], "kwargs": {}}, 0.2)
    assert wire.lost is Lost.TIMEOUT


def test_code_the_kernel_refuses_is_a_judge_error():
    kernel = ScriptedKernel(lambda code, expressions: "'x'")
    kernel.execute = lambda code, silent, store_history, user_expressions=None: (
        kernel.replies.append({"parent_header": {"msg_id": "m"},
                               "content": {"status": "error"}}) or "m")
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    with pytest.raises(verdict.JudgeError, match="refused the grader's code"):
        wire.run_silently("import numpy", 5)
    assert wire.run_silently("import numpy", 5, check=False)["content"]["status"] == "error"
