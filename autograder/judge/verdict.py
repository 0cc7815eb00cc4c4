"""The outside judge: every graded test cell is scored by the trusted worker.

The student's kernel runs in a sandbox and is never asked for a verdict. For
each graded test cell the executor (:class:`autograder.judge.execute.LimitedExecute`)

1. runs the cell's *visible* lines in the kernel, for the student to read
   (hidden tests, their inputs and their expected values never enter the kernel);
2. runs the *whole* cell, visible and hidden lines, here in the worker, in a
   trusted namespace (:class:`RemoteNamespace`) that holds the set-up cell's
   imports and what earlier test cells defined. A name the namespace does not
   hold is looked up in the kernel through the probe (:mod:`autograder.kernel.probe`):
   a student's function becomes a :class:`RemoteFunction` that sends the
   trusted inputs to the kernel and brings back only its outputs (decoded without
   pickle); an ``ANSWER_...`` variable becomes its value;
3. sets the cell's outputs to what the kernel printed (as plain text, so nothing
   the student prints can score or fail the cell) followed by the verdict: an
   ``error`` output when the trusted run raised, nothing else when it passed.
   nbgrader's ``SaveAutoGrades`` then turns that into points as usual.

So visible and hidden points alike are decided here, with NumPy, torch and
``transformer_ref`` that the student cannot touch.

The same judge has a second way in, for a learner checking their own work before handing it
in (:mod:`autograder.selfcheck`): :class:`LocalNamespace` and :class:`LocalFunction` reach
the student's functions in the learner's own kernel (in-process) instead of through the
probe, so the same test cells, checks, verdicts and messages (:func:`verdict_message`) run
there. A local function's exception is turned into the one the grader would see
(:func:`student_exception`). Memory has one meter, the grader's: a memory test measures a
fresh sandboxed kernel from outside (its cgroup's memory peak over a window that opens
before any student code runs there), see :meth:`RemoteFunction.measure`. A learner's kernel
has no such window, so a local function's call is not measured (its peak is None): the
check judges its output alone, and the self-check says the memory is measured when graded.
Each reply to a call also says whether PyTorch's SDPA ran during it; the channel
keeps that as flags of the cell (:func:`sdpa_flags`), which never change a score.
"""

import builtins
import re
import time

import nbformat

from ..kernel import probe

# replies that say what a judged call did with SDPA (a staged call says it in ``fetch``'s)
SDPA_REPLIES = frozenset({probe.Op.CALL, probe.Op.FETCH})


# -- errors the judge reports ---------------------------------------------------------------
class JudgeError(Exception):
    """The kernel could not answer (timeout, crash, broken probe): the cell scores 0."""


class HostError(JudgeError):
    """The grading host cannot judge this test (e.g. it cannot measure memory): the host's
    fault, never a pass and never a score: the executor ends the notebook with
    :class:`autograder.judge.execute.GradingHostFault`, and the student is ``error``."""

    host_fault = True  # the checks let it through as it is (they cannot import the judge)


class StudentError(Exception):
    """The student's function raised; ``type(self).__name__`` is the type it raised."""


_KNOWN = {"NotImplementedError": NotImplementedError, "ValueError": ValueError,
          "AssertionError": AssertionError, "TypeError": TypeError,
          "IndexError": IndexError, "KeyError": KeyError, "ZeroDivisionError": ZeroDivisionError,
          "MemoryError": MemoryError, "RuntimeError": RuntimeError}


def student_exception(info):
    """An exception like the one the student's code raised (type by name, message)."""
    name = str(info.get("type", "Exception"))
    message = str(info.get("message", ""))[:2000]
    cls = _KNOWN.get(name)
    if cls is None:
        clean = re.sub(r"\W", "", name)[:60] or "Exception"
        cls = type(clean, (StudentError,), {})
    error = cls(message)
    error.raised_by_student = True
    return error


# -- talking to the kernel ------------------------------------------------------------------
class Channel:
    """The judge's requests to the probe in one kernel, each bounded by the cell's deadline.

    ``deadline`` is a time of ``clock`` (the executor's :class:`~autograder.judge.clock.ChargedClock`).
    ``transport`` carries them (:class:`autograder.judge.transport.KernelTransport`: it sends,
    waits and decodes); ``measure(name, args, kwargs, timeout)`` runs one call in a fresh
    kernel and returns ``(output, peak bytes)`` (for memory tests; None where there are none).
    The judge sees nothing else of the executor.
    """

    def __init__(self, transport, deadline, measure=None, clock=time.monotonic):
        self.transport, self.deadline, self.measure = transport, deadline, measure
        self.clock = clock  # what ``deadline`` is measured on (the executor's ChargedClock)
        self.flags = set()  # what the judged calls did, as the probe's replies show it

    def remaining(self):
        left = self.deadline - self.clock()
        if left <= 0:
            raise JudgeError("the test ran out of time while calling your code")
        return left

    def request(self, **payload):
        """The probe's reply to ``payload`` (a dict), within the time the cell has left; the
        student's exception if their code raised."""
        reply = self.transport.request(payload, self.remaining())
        if not isinstance(reply, dict):
            raise JudgeError("your notebook's kernel answered the grader with nonsense")
        if payload["op"] in SDPA_REPLIES or (payload["op"] == probe.Op.CALL_STAGED
                                             and "error" in reply):
            self.flags.update(sdpa_flags(reply.get("sdpa")))
        if "error" in reply:
            raise student_exception(reply["error"])
        return reply

    def torch_module(self):
        import sys

        return sys.modules.get("torch")


def sdpa_flags(record):
    """Flags from a call's ``sdpa`` record (``[calls of SDPA during it, hooks intact]``,
    see :mod:`autograder.kernel.boot`): ``calls-sdpa`` when SDPA ran, ``probe-tampered``
    when the record is missing or malformed or the hooks were removed."""
    if (not isinstance(record, list) or len(record) != 2 or not isinstance(record[0], int)
            or isinstance(record[0], bool) or not isinstance(record[1], bool)):
        return {"probe-tampered"}
    return {name for name, raised in (("calls-sdpa", record[0] > 0),
                                      ("probe-tampered", record[0] < 0 or not record[1])) if raised}


class RemoteFunction:
    """A student's function in the kernel, called with trusted inputs."""

    def __init__(self, channel, name):
        self.channel, self.__name__ = channel, name

    def __repr__(self):
        return f"<your function {self.__name__}>"

    def __call__(self, *args, **kwargs):
        torch = self.channel.torch_module()
        grad = [i for i, a in enumerate(args)
                if torch is not None and isinstance(a, torch.Tensor) and a.requires_grad]
        reply = self.channel.request(op=probe.Op.CALL, name=self.__name__, args=list(args),
                                     kwargs=kwargs, grad=grad)
        out = reply.get("value")
        if grad and reply.get("requires_grad") and isinstance(out, torch.Tensor):
            return _remote_graph(torch, self.channel, reply["handle"], out,
                                 [args[i] for i in grad])
        return out

    def call_keeping_args(self, *args, **kwargs):
        """``(output, the positional arguments as the function left them)``."""
        reply = self.channel.request(op=probe.Op.CALL, name=self.__name__, args=list(args),
                                     kwargs=kwargs, return_args=True)
        return reply.get("value"), tuple(reply.get("args") or ())

    def measure(self, *args, **kwargs):
        """``(output, peak extra bytes)`` of one call, measured outside a fresh kernel."""
        return self.channel.measure(self.__name__, args, kwargs, self.channel.remaining())


def _remote_graph(torch, channel, handle, out, inputs):
    """``out`` as a tensor whose backward asks the kernel for the gradients (a VJP)."""

    class RemoteVJP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *_tensors):
            return out.detach().clone()

        @staticmethod
        def backward(ctx, grad_output):
            reply = channel.request(op=probe.Op.VJP, handle=handle, grad_output=grad_output.detach())
            grads = list(reply.get("grads") or [])
            grads += [None] * (len(inputs) - len(grads))
            return tuple(g if g is None else torch.as_tensor(g, dtype=t.dtype)
                         for g, t in zip(grads, inputs))

    return RemoteVJP.apply(*inputs)


class RemoteNamespace(dict):
    """Globals of the judge's run: trusted names first, then the student's, by lookup."""

    def __init__(self, channel):
        super().__init__()
        self["__builtins__"] = builtins
        self["__name__"] = "__grader__"
        self.channel = channel

    def __missing__(self, name):
        if name in vars(builtins) or name.startswith("__"):
            raise KeyError(name)
        found = self.channel.request(op=probe.Op.LOOKUP, name=name)
        if not found.get("found"):
            raise KeyError(name)
        if found.get("callable"):
            return RemoteFunction(self.channel, name)
        return found.get("value")


# -- verdicts --------------------------------------------------------------------------------
def plain_output(output):
    """What the kernel printed, as text that cannot score or fail a test cell."""
    if output.get("output_type") == "stream":
        text = output.get("text", "")
        return nbformat.v4.new_output("stream", name="stdout", text=text)
    if output.get("output_type") == "error":
        text = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}\n"
        return nbformat.v4.new_output("stream", name="stdout",
                                      text="In your notebook this cell raised " + text)
    data = output.get("data", {})
    text = data.get("text/plain", "")
    return nbformat.v4.new_output("display_data", data={"text/plain": text} if text else {})


def verdict_message(error):
    """``(ename, message)`` of a failed test cell: what the student reads, graded or self-checked."""
    ename = type(error).__name__
    message = str(error)
    if getattr(error, "raised_by_student", False):
        message = (f"your code raised {ename}" + (f": {message}" if message else "")
                   + (" (it is not implemented yet)" if ename == "NotImplementedError" else ""))
    return ename, message or "a test failed"


def verdict_output(error):
    """The error output that scores a test cell 0, with a message for the student."""
    ename, message = verdict_message(error)
    return nbformat.v4.new_output("error", ename=ename, evalue=message,
                                  traceback=[f"{ename}: {message}"])


def judge_cell(cell, namespace):
    """Run ``cell``'s test code in ``namespace``; return None (passed) or the failure."""
    from ..core.cells import judged_source, nbgrader_meta  # nbgrader's: not in a learner's kernel

    return judge_source(judged_source(cell.source), nbgrader_meta(cell).get("grade_id"), namespace)


def judge_source(source, grade_id, namespace):
    """Run a test cell's judged ``source`` in ``namespace``; return None (passed) or the failure."""
    try:
        code = compile(source, f"<test cell {grade_id}>", "exec")
        exec(code, namespace)  # noqa: S102 - the instructor's test code, in the trusted worker
    except JudgeError as error:
        return error
    except NameError as error:
        return NameError(f"{error} (define it in your notebook, with this exact name)")
    except BaseException as error:  # noqa: BLE001 - any failure of the test is its verdict
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            return JudgeError(f"the test stopped ({type(error).__name__})")
        return error
    return None


# -- the second way in: the learner's own kernel ------------------------------------------
def _judge_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def over_the_wire(value, *, to_judge=True):
    """``value`` as the probe's codec carries it between the kernel and the judge (NumPy
    scalars become numbers, tuples stay tuples, arrays come back as plain arrays, ...); a
    value the codec cannot carry raises the error the grader would report for it."""
    import sys

    try:
        text = probe.encode(value)
    except Exception as error:  # noqa: BLE001 - e.g. "a value of type X cannot be graded"
        raise student_exception({"type": type(error).__name__, "message": str(error)}) from None
    return probe.decode(text, _judge_torch if to_judge else sys.modules.get("torch"))


def _wants_grad(values):
    return any(type(v).__module__ == "torch" and getattr(v, "requires_grad", False) for v in values)


class LocalFunction:
    """A student's function in this process (the learner's kernel), called as the grader would.

    Same interface as :class:`RemoteFunction`, and the same values cross: inputs and outputs
    go through the probe's codec (:func:`over_the_wire`; a call that differentiates keeps its
    tensors, as :class:`RemoteFunction`'s graph does), and an exception of the student's code
    becomes the one the grader rebuilds from the probe's reply (:func:`student_exception`).
    :meth:`measure` calls it unmeasured (peak None: memory has the sandbox's meter only) and
    records ``("memory", name)`` in ``log``; ``log`` also records every call (``("call", name)``).
    """

    def __init__(self, fn, name, log):
        self.fn, self.__name__, self.log = fn, name, log

    def __repr__(self):
        return f"<your function {self.__name__}>"

    def _run(self, args, kwargs, keep_args=False):
        self.log.append(("call", self.__name__))
        grad = _wants_grad(list(args) + list(kwargs.values()))
        if not grad:  # the kernel decodes the judge's request
            args, kwargs = over_the_wire([list(args), kwargs], to_judge=False)
        try:
            out = self.fn(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - raised by the student's code
            raise student_exception({"type": type(error).__name__,
                                     "message": str(error)[:2000]}) from error
        if grad and getattr(out, "requires_grad", False):
            return out, args
        if keep_args:
            return over_the_wire([out, list(args)])
        return over_the_wire(out), args

    def __call__(self, *args, **kwargs):
        return self._run(args, kwargs)[0]

    def call_keeping_args(self, *args, **kwargs):
        """``(output, the positional arguments as the function left them)``."""
        out, args = self._run(args, kwargs, keep_args=True)
        return out, tuple(args)

    def measure(self, *args, **kwargs):
        """``(output, None)``: the call, not measured here (see the module's docstring)."""
        out = self(*args, **kwargs)
        self.log.append(("memory", self.__name__))
        return out, None


class LocalNamespace(dict):
    """Globals of a self-check run: trusted names first, then the learner's (``user_ns``), by
    lookup, as :class:`RemoteNamespace` looks them up in the kernel: a callable becomes a
    :class:`LocalFunction`, anything else its value as the probe's codec carries it."""

    def __init__(self, user_ns):
        super().__init__()
        self["__builtins__"] = builtins
        self["__name__"] = "__grader__"
        self.user_ns, self.log = user_ns, []

    def __missing__(self, name):
        if name in vars(builtins) or name.startswith("__") or name not in self.user_ns:
            raise KeyError(name)
        value = self.user_ns[name]
        if callable(value):
            return LocalFunction(value, name, self.log)
        return over_the_wire(value)
