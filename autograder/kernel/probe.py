"""The grader's probe: the only grading code that runs inside a student's kernel.

The judge (:mod:`autograder.judge.verdict`, in the trusted worker) sends this module's
source into the sandboxed kernel once per judged cell and then asks it, through
IPython ``user_expressions``, to

* ``lookup(name)``: is ``name`` defined in the notebook, and is it callable;
* ``value(name)``: the value of a variable (``ANSWER_...``);
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
that a student's process produced. :func:`encode` and :func:`decode` are the
codec of both sides (the worker imports this module; the kernel executes its
source), so there is one definition of the format.
"""

import base64
import io
import json
import time

import numpy as np

# dtypes that may cross the boundary (no object arrays, no structured arrays)
DTYPES = frozenset("?bBhHiIlLqQefdgFDG")
MAX_TEXT = 64 * 2**20  # largest encoded message the worker accepts


class ProbeError(Exception):
    """A message that cannot be decoded: not produced by an honest probe."""


def _array(tag, arr):
    arr = np.ascontiguousarray(arr)
    if arr.dtype.char not in DTYPES:
        raise TypeError(f"arrays of dtype {arr.dtype} cannot be graded")
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return {"$": tag, "npy": base64.b64encode(buf.getvalue()).decode("ascii")}


def _to_jsonable(obj, depth=0):
    if depth > 20:
        raise TypeError("value nested too deeply")
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
        return {"$": "int", "v": str(int(obj))}
    if isinstance(obj, (float, np.floating)):
        return {"$": "float", "v": repr(float(obj))}
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return _array("ndarray", obj)
    if type(obj).__module__ == "torch" and type(obj).__name__ in ("Tensor", "Parameter"):
        tensor = obj.detach().cpu()
        dtype = str(tensor.dtype).replace("torch.", "")
        if dtype == "bfloat16":
            tensor = tensor.float()
        out = _array("tensor", tensor.numpy())
        out["dtype"] = dtype
        return out
    if isinstance(obj, (list, tuple)):
        return {"$": type(obj).__name__, "v": [_to_jsonable(x, depth + 1) for x in obj]}
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError("only dicts with string keys can be graded")
        return {"$": "dict", "v": {k: _to_jsonable(v, depth + 1) for k, v in obj.items()}}
    if hasattr(obj, "__next__") or type(obj).__name__ == "generator":
        return {"$": "iter", "v": [_to_jsonable(x, depth + 1) for x in obj]}
    raise TypeError(f"a value of type {type(obj).__name__} cannot be graded")


def _from_jsonable(obj, torch=None, depth=0):
    if depth > 20:
        raise ProbeError("value nested too deeply")
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if not isinstance(obj, dict) or "$" not in obj:
        raise ProbeError("malformed value")
    tag = obj["$"]
    if tag == "int":
        return int(obj["v"])
    if tag == "float":
        return float(obj["v"])
    if tag in ("ndarray", "tensor"):
        raw = base64.b64decode(obj["npy"], validate=True)
        arr = np.load(io.BytesIO(raw), allow_pickle=False)
        if arr.dtype.char not in DTYPES:
            raise ProbeError(f"array of dtype {arr.dtype}")
        if tag == "ndarray":
            return arr
        if callable(torch):  # the judge's side: torch is imported when a tensor arrives
            torch = torch()
        if torch is None:  # no torch here: compare as NumPy
            return arr
        tensor = torch.from_numpy(arr.copy())
        dtype = getattr(torch, str(obj.get("dtype", "")), None)
        return tensor.to(dtype) if isinstance(dtype, torch.dtype) else tensor
    items = obj.get("v")
    if tag in ("list", "tuple", "iter"):
        if not isinstance(items, list):
            raise ProbeError("malformed sequence")
        values = [_from_jsonable(x, torch, depth + 1) for x in items]
        return tuple(values) if tag == "tuple" else iter(values) if tag == "iter" else values
    if tag == "dict":
        if not isinstance(items, dict):
            raise ProbeError("malformed dict")
        return {str(k): _from_jsonable(v, torch, depth + 1) for k, v in items.items()}
    raise ProbeError(f"unknown tag {tag!r}")


def _torch_if_loaded():
    import sys

    return sys.modules.get("torch")


def encode(obj):
    """``obj`` (arrays, tensors, numbers, strings, lists, tuples, dicts) as base64 JSON text."""
    return _text(_to_jsonable(obj))


def _text(jsonable):
    text = json.dumps(jsonable, separators=(",", ":"))
    return base64.b64encode(text.encode()).decode("ascii")


def decode(text, torch=None):
    """The value :func:`encode` produced; raises :class:`ProbeError` on anything else.

    ``torch``: the module tensors are rebuilt with, or a function that returns it (called
    only if a tensor arrives), or None (tensors arrive as NumPy arrays).
    """
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise ProbeError("message missing or too large")
    try:
        return _from_jsonable(json.loads(base64.b64decode(text, validate=True)), torch)
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


def _sdpa_count():
    """``[calls so far, hooks intact]`` from the boot code, or None if nothing answered."""
    import sys

    box = []
    try:
        sys.audit(SDPA_EVENT, box)
    except Exception:  # noqa: BLE001 - a replaced sys.audit: reported as no answer
        return None
    if len(box) != 1 or not isinstance(box[0], tuple) or len(box[0]) != 2:
        return None
    calls, intact = box[0]
    return [int(calls), bool(intact)] if isinstance(calls, int) else None


def _sdpa_during(before):
    after = _sdpa_count()
    if before is None or after is None:
        return None
    return [after[0] - before[0], before[1] and after[1]]


def handle(request_text):
    """Answer one request of the judge (base64 JSON in, base64 JSON out)."""
    torch = _torch_if_loaded()
    try:
        request = decode(request_text, torch)
        op = request["op"]
        ns = _user_ns()
        if op == "lookup":
            name = request["name"]
            found = name in ns
            return encode({"found": found, "callable": found and callable(ns[name])})
        if op == "value":
            return encode({"value": ns[request["name"]]})
        if op == "call":
            fn = ns[request["name"]]
            args, kwargs = request["args"], request["kwargs"]
            grad_inputs = []
            if torch is not None and request.get("grad"):
                for i in request["grad"]:
                    args[i] = args[i].detach().requires_grad_(True)
                    grad_inputs.append(args[i])
            sdpa = _sdpa_count()
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
        if op == "stage":  # the inputs of a measured call, decoded before any student code
            _KEPT["staged"] = (request["args"], request["kwargs"])
            return encode({"staged": True})
        if op == "call_staged":  # inside the measured window, the output's encoding included
            args, kwargs = _KEPT.pop("staged")
            fn = ns[request["name"]]
            sdpa = _sdpa_count()
            try:
                out = fn(*args, **kwargs)
                _KEPT["out"] = _to_jsonable({"value": out, "sdpa": _sdpa_during(sdpa)})
            except BaseException as error:  # noqa: BLE001
                if isinstance(error, KeyboardInterrupt):
                    raise
                return encode({**_error(error), "sdpa": _sdpa_during(sdpa)})
            return encode({"done": True})
        if op == "fetch":
            return _text(_KEPT.pop("out"))
        if op == "vjp":
            out, inputs = _KEPT.pop(request["handle"])
            grads = torch.autograd.grad(out, inputs, request["grad_output"], allow_unused=True)
            return encode({"grads": list(grads)})
        return encode(_error(ValueError(f"unknown op {op!r}")))
    except BaseException as error:  # noqa: BLE001
        if isinstance(error, KeyboardInterrupt):
            raise
        return encode(_error(error))
