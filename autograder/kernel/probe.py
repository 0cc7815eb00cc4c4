"""The grader's probe: the only grading code that runs inside a student's kernel.

The judge (:mod:`autograder.judge.verdict`, in the trusted worker, through its
:class:`~autograder.judge.transport.KernelTransport`) sends this module's source into the
sandboxed kernel once per judged cell, as the first frame on a Unix socket in the
kernel's private socket folder (see :mod:`autograder.judge.transport`); then :func:`serve`
answers the judge's requests on it in the kernel's main thread for the rest of the cell
(one length-prefixed frame each way per request, no Jupyter message). The judge asks it
to (each operation is a member of :class:`Op`)

* ``lookup(name)``: is ``name`` defined in the notebook, is it callable, and if it is
  not, its value (a variable such as ``ANSWER_...``);
* ``call(name, args, kwargs)``: call the student's function on inputs chosen by
  the judge, and return what it returned (and how long it took);
* ``vjp(handle, grads)``: back-propagate ``grads`` through the torch output of an
  earlier call, and return the gradients of its inputs;
* ``stage``, ``call_staged``, ``fetch``: the three steps of a call whose memory
  the worker measures from outside: the inputs are decoded and kept before any of the
  student's code has run in that kernel (``stage``, outside the window), then the
  function is looked up and called and its output turned into the reply's encodable
  form at once (``call_staged``: a lazy ``__array__``, a generator or a property does
  its work here), and ``fetch`` encodes it; the worker reads the peak after ``fetch``.

Every reply to a call also carries ``sdpa``: how many times PyTorch's
``scaled_dot_product_attention`` ran during it, and whether the hooks that count it
are still in place, as the kernel's boot code (:mod:`autograder.kernel.boot`) answers
an audit event (None when nothing answered: the student removed or replaced it).

Nothing here decides a score, and no expected value ever reaches the kernel: the
probe only carries inputs in and outputs out. A student may replace or break the
probe; that can only change what their own functions appear to return (and the SDPA
record, whose absence the judge flags as ``probe-tampered``). A patched probe that
defers work until ``fetch`` is still measured: the window closes after the reply.

Everything crosses the boundary as JSON text whose arrays are ``.npy`` bytes
(base64), read back with ``allow_pickle=False``: the worker never unpickles data
that a student's process produced. A message is bounded before it is parsed
(:func:`check_bounds`): at most :data:`MAX_TEXT` characters and :data:`MAX_VALUES` values,
counted on the text itself before ``json.loads`` builds a single object, so what decoding
costs the worker is bounded by these figures (a 64 MB message of 22 million empty dicts is
refused before one is built); nesting is bounded while parsing (the JSON parser's recursion
guard) and to :data:`MAX_DEPTH` levels as the value is rebuilt. :func:`encode` and :func:`decode` are the
codec of both sides (the worker imports this module; the kernel executes its
source), so there is one definition of the format.
"""

import base64
import io
import json
import struct
import time
from enum import StrEnum

import numpy as np

# dtypes that may cross the boundary (no object arrays, no structured arrays)
DTYPES = frozenset("?bBhHiIlLqQefdgFDG")
MAX_TEXT = 64 * 2**20  # largest encoded message the worker accepts
MAX_DEPTH = 20  # containers nested deeper than this are refused both ways
MAX_VALUES = 200_000  # containers plus separated items in one message (a tagged number is one
                      # dict of two items; 200,000 dicts cost the worker about 60 MB)
FRAME = struct.Struct("!Q")  # a frame on the judge's line: its length, then that many bytes


class Op(StrEnum):
    """The operations a request may name (its ``op``): the one definition, for the judge
    that sends them and the probe that answers them. Their values are the wire format."""

    LOOKUP = "lookup"            # is ``name`` defined, and callable? if not, its value
    CALL = "call"                # ``name(*args, **kwargs)``: its output, time and SDPA record
    VJP = "vjp"                  # gradients of an earlier call's inputs (its ``handle``)
    STAGE = "stage"              # a measured call, 1/3: keep the decoded inputs
    CALL_STAGED = "call_staged"  # 2/3: call on them, turn the output into its encodable form
    FETCH = "fetch"              # 3/3: the encoded reply of the staged call


class ProbeError(Exception):
    """A message that cannot be decoded: not produced by an honest probe."""


def _array(tag, arr):
    arr = np.ascontiguousarray(arr)
    if arr.dtype.char not in DTYPES:
        raise TypeError(f"arrays of dtype {arr.dtype} cannot be graded")
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return {"$": tag, "npy": base64.b64encode(buf.getvalue()).decode("ascii")}


def _is_tensor(obj):
    """A torch tensor, told by its type's name: the kernel need not have imported torch."""
    return type(obj).__module__ == "torch" and type(obj).__name__ in ("Tensor", "Parameter")


def _tensor(obj, depth):
    tensor = obj.detach().cpu()
    dtype = str(tensor.dtype).replace("torch.", "")
    if dtype == "bfloat16":
        tensor = tensor.float()
    out = _array("tensor", tensor.numpy())
    out["dtype"] = dtype
    return out


def _string_keyed(obj, depth):
    if not all(isinstance(k, str) for k in obj):
        raise TypeError("only dicts with string keys can be graded")
    return {"$": "dict", "v": {k: _to_jsonable(v, depth + 1) for k, v in obj.items()}}


# (types, encoder) in the order they are tried: a bool is an int, so it is taken before
_ENCODERS = (
    ((int, np.integer), lambda obj, depth: {"$": "int", "v": str(int(obj))}),
    ((float, np.floating), lambda obj, depth: {"$": "float", "v": repr(float(obj))}),
    ((np.bool_,), lambda obj, depth: bool(obj)),
    ((np.ndarray,), lambda obj, depth: _array("ndarray", obj)),
    ((list, tuple), lambda obj, depth: {"$": type(obj).__name__,
                                        "v": [_to_jsonable(x, depth + 1) for x in obj]}),
    ((dict,), _string_keyed),
)


def _to_jsonable(obj, depth=0):
    """``obj`` as JSON-able data: scalars and containers tagged with ``$``, arrays as .npy."""
    if depth > MAX_DEPTH:
        raise TypeError("value nested too deeply")
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    for types, encoder in _ENCODERS:
        if isinstance(obj, types):
            return encoder(obj, depth)
    if _is_tensor(obj):
        return _tensor(obj, depth)
    if hasattr(obj, "__next__") or type(obj).__name__ == "generator":
        return {"$": "iter", "v": [_to_jsonable(x, depth + 1) for x in obj]}
    raise TypeError(f"a value of type {type(obj).__name__} cannot be graded")


def _decoded_array(obj, torch, depth):
    raw = base64.b64decode(obj["npy"], validate=True)
    arr = np.load(io.BytesIO(raw), allow_pickle=False)
    if arr.dtype.char not in DTYPES:
        raise ProbeError(f"array of dtype {arr.dtype}")
    if obj["$"] == "ndarray":
        return arr
    if callable(torch):  # the judge's side: torch is imported when a tensor arrives
        torch = torch()
    if torch is None:  # no torch here: compare as NumPy
        return arr
    tensor = torch.from_numpy(arr.copy())
    dtype = getattr(torch, str(obj.get("dtype", "")), None)
    return tensor.to(dtype) if isinstance(dtype, torch.dtype) else tensor


def _decoded_sequence(obj, torch, depth):
    items = obj.get("v")
    if not isinstance(items, list):
        raise ProbeError("malformed sequence")
    return _SEQUENCES[obj["$"]](_from_jsonable(x, torch, depth + 1) for x in items)


def _decoded_dict(obj, torch, depth):
    items = obj.get("v")
    if not isinstance(items, dict):
        raise ProbeError("malformed dict")
    return {str(k): _from_jsonable(v, torch, depth + 1) for k, v in items.items()}


_SEQUENCES = {"list": list, "tuple": tuple, "iter": lambda values: iter(list(values))}
_DECODERS = {  # tag -> decoder(obj, torch, depth)
    "int": lambda obj, torch, depth: int(obj["v"]),
    "float": lambda obj, torch, depth: float(obj["v"]),
    "ndarray": _decoded_array,
    "tensor": _decoded_array,
    "list": _decoded_sequence,
    "tuple": _decoded_sequence,
    "iter": _decoded_sequence,
    "dict": _decoded_dict,
}


def _from_jsonable(obj, torch=None, depth=0):
    """The value ``obj`` (what :func:`_to_jsonable` made) stands for; ProbeError otherwise."""
    if depth > MAX_DEPTH:
        raise ProbeError("value nested too deeply")
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if not isinstance(obj, dict) or "$" not in obj:
        raise ProbeError("malformed value")
    tag = obj["$"]
    decoder = _DECODERS.get(tag) if isinstance(tag, str) else None
    if decoder is None:
        raise ProbeError(f"unknown tag {tag!r}")
    return decoder(obj, torch, depth)


def _torch_if_loaded():
    import sys

    return sys.modules.get("torch")


def encode(obj):
    """``obj`` (arrays, tensors, numbers, strings, lists, tuples, dicts) as JSON text (ASCII)."""
    return _text(_to_jsonable(obj))


def _text(jsonable):
    return json.dumps(jsonable, separators=(",", ":"))


def check_bounds(text):
    """Raise :class:`ProbeError` unless ``text`` is at most :data:`MAX_TEXT` characters that
    would build at most :data:`MAX_VALUES` values.

    Counted on the text with ``str.count`` before anything is parsed: every opening bracket
    is a container and every comma separates one more item (brackets and commas inside
    strings count too, which only makes the bound stricter), and closing brackets are
    counted alike (a message of nothing but ``]`` is refused as well).
    """
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise ProbeError("message missing or too large")
    opened = text.count("{") + text.count("[")
    if opened + text.count(",") > MAX_VALUES or text.count("}") + text.count("]") > MAX_VALUES:
        raise ProbeError(f"message of more than {MAX_VALUES:,} values")


def decode(text, torch=None):
    """The value :func:`encode` produced; raises :class:`ProbeError` on anything else.

    ``torch``: the module tensors are rebuilt with, or a function that returns it (called
    only if a tensor arrives), or None (tensors arrive as NumPy arrays). The text is bounded
    (:func:`check_bounds`) before it is parsed.
    """
    check_bounds(text)
    try:
        return _from_jsonable(json.loads(text), torch)
    except ProbeError:
        raise
    except Exception as error:  # noqa: BLE001 - anything malformed
        raise ProbeError(f"malformed message ({type(error).__name__})") from None


# -- kernel side --------------------------------------------------------------------
_KEPT = {}  # handle -> (output tensor, input tensors): graphs kept for vjp


def _user_ns():
    return get_ipython().user_ns  # noqa: F821 - defined inside an IPython kernel


def _error(error):
    return {"error": {"type": type(error).__name__, "message": str(error)[:2000]}}


SDPA_EVENT = "autograder.sdpa"  # the audit event that the kernel's boot code answers


def _sdpa_count(phase=None):
    """``[calls so far, hooks intact]`` from the boot code, or None if nothing answered.

    ``phase`` ``"open"`` (before a judged call) and ``"close"`` (after it) bracket the window
    in which the boot code's dispatcher mode counts every SDPA operator (see
    :mod:`autograder.kernel.boot`)."""
    import sys

    box = []
    try:
        sys.audit(SDPA_EVENT, box, phase)
    except Exception:  # noqa: BLE001 - a replaced sys.audit: reported as no answer
        return None
    if len(box) != 1 or not isinstance(box[0], tuple) or len(box[0]) != 2:
        return None
    calls, intact = box[0]
    return [int(calls), bool(intact)] if isinstance(calls, int) else None


def _sdpa_during(before):
    after = _sdpa_count("close")
    if before is None or after is None:
        return None
    return [after[0] - before[0], before[1] and after[1]]


def _lookup(request, ns, torch):
    name = request["name"]
    found = name in ns
    reply = {"found": found, "callable": found and callable(ns[name])}
    if found and not reply["callable"]:
        reply["value"] = ns[name]
    return encode(reply)


def _grad_inputs(request, args, torch):
    """The positional inputs the judge differentiates, made leaves that require grad."""
    inputs = []
    if torch is not None and request.get("grad"):
        for i in request["grad"]:
            args[i] = args[i].detach().requires_grad_(True)
            inputs.append(args[i])
    return inputs


def _call(request, ns, torch):
    fn = ns[request["name"]]
    args, kwargs = request["args"], request["kwargs"]
    grad_inputs = _grad_inputs(request, args, torch)
    sdpa = _sdpa_count("open")
    start = time.perf_counter()
    try:
        out = fn(*args, **kwargs)
    except BaseException as error:  # noqa: BLE001 - reported to the judge
        if isinstance(error, KeyboardInterrupt):
            raise
        return encode({**_error(error), "sdpa": _sdpa_during(sdpa)})
    seconds = time.perf_counter() - start
    reply = {"value": out, "seconds": seconds, "sdpa": _sdpa_during(sdpa)}
    if request.get("return_args"):
        reply["args"] = list(args)
    if grad_inputs:
        handle_id = str(len(_KEPT))
        _KEPT[handle_id] = (out, grad_inputs)
        reply["handle"] = handle_id
        reply["requires_grad"] = bool(getattr(out, "requires_grad", False))
    return encode(reply)


def _stage(request, ns, torch):
    """The inputs of a measured call, decoded before any student code."""
    _KEPT["staged"] = (request["args"], request["kwargs"])
    return encode({"staged": True})


def _call_staged(request, ns, torch):
    """Inside the measured window, the output's encodable form included."""
    args, kwargs = _KEPT.pop("staged")
    fn = ns[request["name"]]
    sdpa = _sdpa_count("open")
    try:
        out = fn(*args, **kwargs)
        _KEPT["out"] = _to_jsonable({"value": out, "sdpa": _sdpa_during(sdpa)})
    except BaseException as error:  # noqa: BLE001 - reported to the judge
        if isinstance(error, KeyboardInterrupt):
            raise
        return encode({**_error(error), "sdpa": _sdpa_during(sdpa)})
    return encode({"done": True})


def _fetch(request, ns, torch):
    return _text(_KEPT.pop("out"))


def _vjp(request, ns, torch):
    out, inputs = _KEPT.pop(request["handle"])
    grads = torch.autograd.grad(out, inputs, request["grad_output"], allow_unused=True)
    return encode({"grads": list(grads)})


_ANSWERS = {Op.LOOKUP: _lookup, Op.CALL: _call, Op.VJP: _vjp,
            Op.STAGE: _stage, Op.CALL_STAGED: _call_staged, Op.FETCH: _fetch}


def handle(request_text):
    """Answer one request of the judge (JSON text in, JSON text out)."""
    torch = _torch_if_loaded()
    try:
        request = decode(request_text, torch)
        op = request["op"]
        ns = _user_ns()
        answer = _ANSWERS.get(op) if isinstance(op, str) else None
        if answer is None:
            return encode(_error(ValueError(f"unknown op {op!r}")))
        return answer(request, ns, torch)
    except BaseException as error:  # noqa: BLE001
        if isinstance(error, KeyboardInterrupt):
            raise
        return encode(_error(error))


def _read(line, size):
    """``size`` bytes from the socket ``line``; None when the judge has hung up."""
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = line.recv_into(view[got:])
        if not n:
            return None
        got += n
    return bytes(buf)


def serve(line):
    """Answer the judge's requests for one judged cell, in the kernel's main thread.

    ``line`` is the socket connected to the judge (see
    :data:`autograder.judge.transport.SESSION`); each frame (a length, then a request for
    :func:`handle`) gets a frame back, until an empty frame or the judge hanging up ends
    the cell. An interrupt (the judge's, after a call ran out of time) ends it too.
    """
    with line:
        while (header := _read(line, FRAME.size)) is not None:
            (size,) = FRAME.unpack(header)
            request = _read(line, size) if size else None
            if request is None:
                return
            reply = handle(request.decode("ascii")).encode("ascii")
            line.sendall(FRAME.pack(len(reply)) + reply)
