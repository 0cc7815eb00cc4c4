"""The trusted boundary without a kernel: how a test cell is split and judged, and the transport.

* what a student's kernel may run of a test cell (:func:`visible_source`) and what the judge
  runs (:func:`judged_source`), against hand-split cells;
* :func:`judge_cell` with the real probe on the far side: the probe's source is executed
  into a module exactly as the judge installs it in a kernel, over a plain dict standing for
  the notebook's namespace, and a small transport hands it each request through the codec.
  The requests the judge makes for a cell, and its verdicts, are checked against
  expectations written out here;
* :class:`KernelTransport` against a scripted kernel (a thread on the far side of the real
  Unix socket, running the session's real code or misbehaving): one session per judged
  cell, the probe installed afresh in each, the kernel idle again after a session, and a
  kernel that refuses, dies, stays silent or breaks the line is a JudgeError that says so
  and is remembered as :class:`Lost`.
"""

import socket
import threading
import time
import types
from queue import Empty

import pytest

from autograder.core.cells import judged_source, visible_source
from autograder.judge import transport as transport_module
from autograder.judge import verdict
from autograder.judge.transport import PROBE_SOURCE, SESSION, KernelTransport, Lost
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


def test_a_variable_comes_with_its_look_up_and_is_never_called():
    failure, sent, _ = judged("assert ANSWER_X == [1, (2.5, 'a')]", {"ANSWER_X": [1, (2.5, "a")]})
    assert failure is None
    assert sent == [{"op": "lookup", "name": "ANSWER_X"}]


def test_no_request_is_sent_after_the_cells_deadline():
    failure, sent, _ = judged(CELL, {"add": lambda a, b: a + b}, deadline_in=-1.0)
    assert isinstance(failure, verdict.JudgeError) and "ran out of time" in str(failure)
    assert sent == []


# -- the transport against a scripted kernel over a real socket ------------------------
class ScriptedKernel:
    """A kernel client and manager whose kernel is a thread: each ``execute`` of a session's
    code runs ``behaviour(code)`` (it connects to the judge's socket, or not); its
    execute_reply (``status``, or none when ``behaviour`` returns None) follows."""

    def __init__(self, folder, behaviour, alive=True):
        self.connection_file = str(folder / "connection.json")
        self.behaviour, self.alive, self.executed, self.replies = behaviour, alive, [], []
        self.shell_channel = self

    def execute(self, code, silent, store_history):
        msg_id = f"m{len(self.executed)}"
        self.executed.append(code)

        def run():
            status = self.behaviour(code) if "__grader_session(" in code else "ok"
            if status is not None:
                self.replies.append({"parent_header": {"msg_id": "stale"}, "content": {}})
                self.replies.append({"parent_header": {"msg_id": msg_id},
                                     "content": {"status": status}})

        threading.Thread(target=run, daemon=True).start()
        return msg_id

    def get_msg(self, timeout):
        end = time.monotonic() + (timeout or 0)
        while not self.replies and time.monotonic() < end:
            time.sleep(0.005)
        if self.replies:
            return self.replies.pop(0)
        raise Empty

    def is_alive(self):
        return self.alive


def serving(namespace):
    """A behaviour: the session's code itself, run as IPython would run it over ``namespace``
    (it takes the probe's source from the line, installs it and serves)."""
    shell = types.SimpleNamespace(user_ns=namespace)
    namespace["get_ipython"] = lambda: shell  # the notebook's globals are its user namespace

    def behaviour(code):
        exec(code, namespace)
        return "ok"

    return behaviour


def socket_path(code):
    return code.rsplit("__grader_session(", 1)[1].split(")")[0].strip("'")


def read_frame(line):
    size = probe.FRAME.unpack(line.recv(probe.FRAME.size, socket.MSG_WAITALL))[0]
    return line.recv(size, socket.MSG_WAITALL)


def connected(then):
    """A behaviour that connects, takes the probe's source and one request, then does
    ``then(line)``."""
    def behaviour(code):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as line:
            line.connect(socket_path(code))
            assert read_frame(line).decode() == PROBE_SOURCE  # a fresh transport: a first session
            read_frame(line)
            return then(line)

    return behaviour


def test_one_session_per_cell_installs_the_probe_afresh_and_ends_with_the_kernel_idle(tmp_path):
    namespace = {"f": abs, "X": [1, 2]}
    kernel = ScriptedKernel(tmp_path, serving(namespace))
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    assert wire.path == str(tmp_path / "judge")
    assert wire.request({"op": probe.Op.LOOKUP, "name": "f"}, 5) == {"found": True, "callable": True}
    assert wire.request({"op": probe.Op.LOOKUP, "name": "X"}, 5) == {
        "found": True, "callable": False, "value": [1, 2]}
    assert wire.request({"op": probe.Op.CALL, "name": "f", "args": [-3], "kwargs": {}}, 5)["value"] == 3
    assert kernel.executed == [SESSION.format(path=wire.path)]  # small: the source is on the line
    assert len(kernel.executed[0]) < 1000 < len(PROBE_SOURCE)
    first = namespace["__grader__"]
    wire.end_session()  # the empty frame ends serve; its reply is awaited
    assert wire.lost is None and kernel.replies == []
    assert wire.round_trips == 4 and wire.bytes > len(PROBE_SOURCE)
    assert set(namespace) - {"__builtins__", "get_ipython"} == {"f", "X", "__grader__"}  # no helper left
    wire.request({"op": probe.Op.LOOKUP, "name": "f"}, 5)  # same cell, a second session
    wire.end_session()
    assert len(kernel.executed) == 2 and namespace["__grader__"] is first  # kept
    wire.new_cell()
    namespace["__grader__"].handle = None  # a student's tampering: the next cell undoes it
    assert wire.request({"op": probe.Op.LOOKUP, "name": "f"}, 5)["found"]
    wire.end_session()
    assert len(kernel.executed) == 3 and namespace["__grader__"] is not first
    assert wire.lost is None


def test_code_sent_while_a_session_is_open_ends_it_first(tmp_path):
    kernel = ScriptedKernel(tmp_path, serving({"f": abs}))
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    wire.request({"op": probe.Op.LOOKUP, "name": "f"}, 5)
    assert wire.run_silently("x = 1", 5)["content"]["status"] == "ok"
    assert kernel.executed[-1] == "x = 1" and wire.lost is None


def test_a_kernel_that_refuses_the_probe_is_a_judge_error_at_once(tmp_path):
    kernel = ScriptedKernel(tmp_path, lambda code: "error")
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    start = time.monotonic()
    with pytest.raises(verdict.JudgeError, match="refused the grader's code"):
        wire.request({"op": probe.Op.LOOKUP, "name": "f"}, 20)
    assert time.monotonic() - start < 2


def test_a_kernel_that_dies_while_asked_is_lost_as_died(tmp_path):
    kernel = ScriptedKernel(tmp_path, lambda code: None, alive=False)
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    with pytest.raises(verdict.JudgeError, match="kernel died"):
        wire.request({"op": probe.Op.CALL, "name": "f", "args": [], "kwargs": {}}, 30)
    assert wire.lost is Lost.DIED


def test_a_silent_kernel_is_lost_as_timeout_and_the_message_names_both_limits(tmp_path):
    kernel = ScriptedKernel(tmp_path, connected(lambda line: time.sleep(2)))
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    with pytest.raises(verdict.JudgeError, match=r"in the 1 s this test had left .* \(30 s per cell\)"):
        wire.request({"op": probe.Op.CALL, "name": "f", "args": [], "kwargs": {}}, 0.6)
    assert wire.lost is Lost.TIMEOUT
    sent = len(kernel.executed)
    with pytest.raises(verdict.JudgeError, match=r"lost earlier in this test \(timeout\)"):
        wire.request({"op": probe.Op.LOOKUP, "name": "f"}, 5)  # a late reply must not answer it
    wire.end_session()  # a lost line is closed, no empty frame and no wait
    assert wire.lost is Lost.TIMEOUT and len(kernel.executed) == sent


@pytest.mark.parametrize("then", [
    lambda line: None,                                                  # hangs up
    lambda line: line.sendall(probe.FRAME.pack(probe.MAX_TEXT + 1)),    # a frame too large
    lambda line: line.sendall(probe.FRAME.pack(10) + b"short"),          # then hangs up
], ids=["hang-up", "too-large", "cut-short"])
def test_a_broken_line_is_a_judge_error_and_lost_as_broken(tmp_path, then):
    kernel = ScriptedKernel(tmp_path, connected(then))
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    with pytest.raises(verdict.JudgeError, match="broke off the grader's line"):
        wire.request({"op": probe.Op.LOOKUP, "name": "x"}, 5)
    assert wire.lost is Lost.BROKEN


@pytest.mark.parametrize("text", [b"42", b"{'a': 1}", b"__import__('os').system('true')",
                                  "\u00e9".encode(), b'{"$":"pickle","v":"x"}'])
def test_a_reply_that_is_not_an_encoded_value_is_refused(tmp_path, text):
    kernel = ScriptedKernel(tmp_path, connected(
        lambda line: line.sendall(probe.FRAME.pack(len(text)) + text)))
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    with pytest.raises((verdict.JudgeError, probe.ProbeError)):
        reply = wire.request({"op": probe.Op.LOOKUP, "name": "x"}, 5)
        assert isinstance(reply, dict)  # 42 decodes: the channel refuses a non-dict reply


def test_code_the_kernel_refuses_is_a_judge_error(tmp_path):
    kernel = ScriptedKernel(tmp_path, None)
    kernel.execute = lambda code, silent, store_history: (
        kernel.replies.append({"parent_header": {"msg_id": "m"},
                               "content": {"status": "error"}}) or "m")
    wire = KernelTransport(kernel, kernel, cell_timeout=30)
    with pytest.raises(verdict.JudgeError, match="refused the grader's code"):
        wire.run_silently("import numpy", 5)
    assert wire.run_silently("import numpy", 5, check=False)["content"]["status"] == "error"
