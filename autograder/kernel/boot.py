"""The kernel's boot code, run as ``python -c <this source> -f CONNECTION_FILE ...`` before
ipykernel and any student code: :func:`install` adds an audit hook (it cannot be removed),
adopts the worker's listening sockets (:data:`SOCKETS_ENV`), then starts ipykernel without
its debugger.

Contract: the hook counts every call of PyTorch's ``scaled_dot_product_attention`` (SDPA)
by any name: once PyTorch is loaded it wraps ``torch.nn.functional``'s function and every
``aten`` operator whose name holds ``scaled_dot_product``, and, on the main thread while a
judged call runs, keeps a ``TorchFunctionMode`` on the mode stack that counts such
operators by their own names. The probe asks with the audit event :data:`EVENT`; the answer
is ``(calls, intact)``, ``intact`` false when a wrapper was replaced or the mode popped or
buried. What it cannot see is listed in the threat model of ``autograder/README.md``.
Standard library only; PyTorch is never imported here.
"""

import _thread
import sys

EVENT = "autograder.sdpa"  # the probe's question (kept equal to probe.SDPA_EVENT)
# JSON {socket path: listening descriptor} the worker passed in (kept equal to
# autograder.sandbox.launcher.SOCKETS_ENV)
SOCKETS_ENV = "AUTOGRADER_SOCKETS"
NAME = "scaled_dot_product_attention"
TRIGGERS = frozenset({"import", "exec", "compile", EVENT})  # when to look for PyTorch again


def install():
    """Add the audit hook that hooks SDPA once PyTorch is loaded and answers the probe."""
    calls = [0]
    hooked = []     # (owner, attribute, wrapper) of every wrapper put in place
    state = {"busy": False, "inside": 0, "mode": None, "stack": None, "window": False,
             "pushed": False}
    main = _thread.get_ident()  # the kernel's main thread: cells and the probe run there

    # a call is counted once: by a wrapper, or by the dispatcher mode when no wrapper (whose
    # own call of the original the mode sees) is on the way (state["inside"])
    def counted(original):
        def scaled_dot_product_attention(*args, **kwargs):
            calls[0] += not state["inside"]  # the mode may hand the call back to a wrapper
            state["inside"] += 1
            try:
                return original(*args, **kwargs)
            finally:
                state["inside"] -= 1

        scaled_dot_product_attention.__doc__ = getattr(original, "__doc__", None)
        return scaled_dot_product_attention

    class CountedOp:
        """An aten operator (packet or overload) that counts its calls."""

        __slots__ = ("_op",)

        def __init__(self, op):
            object.__setattr__(self, "_op", op)

        def __call__(self, *args, **kwargs):
            calls[0] += not state["inside"]  # the mode may hand the call back to a wrapper
            state["inside"] += 1
            try:
                return self._op(*args, **kwargs)
            finally:
                state["inside"] -= 1

        def __getattr__(self, name):
            value = getattr(self._op, name)
            return CountedOp(value) if type(value).__name__ == "OpOverload" else value

        def __repr__(self):
            return repr(self._op)

    def hook_functional():
        """The functional API: as soon as ``torch.nn.functional`` has defined it."""
        functional = sys.modules.get("torch.nn.functional")
        if functional is None or NAME not in functional.__dict__:
            return False
        wrapper = counted(functional.__dict__[NAME])
        wrappers = [(functional, NAME, wrapper), (sys.modules["torch"]._C._nn, NAME, wrapper)]
        for owner, attribute, value in wrappers:  # both found first: nothing is wrapped twice
            setattr(owner, attribute, value)
        hooked.extend(wrappers)
        return True

    def hook_aten():
        """The dispatcher's operators: only once PyTorch's import has finished (its own
        decompositions are registered on the real operator objects while it loads)."""
        torch = sys.modules.get("torch")
        if torch is None or getattr(torch.__spec__, "_initializing", True) is not False:
            return False
        aten = torch.ops.aten
        names = {full.partition("aten::")[2].partition(".")[0]
                 for full in torch._C._dispatch_get_all_op_names()}
        wrappers = [(aten, name, CountedOp(getattr(aten, name))) for name in sorted(names)
                    if "scaled_dot_product" in name and "backward" not in name]
        for owner, attribute, value in wrappers:
            setattr(owner, attribute, value)
        hooked.extend(wrappers)
        return True

    def hook_dispatch():
        """The torch function mode that counts on the main thread while a judged call runs
        (once PyTorch's import has finished): every Python entry to an SDPA operator passes
        it, whatever the name or path (``torch._scaled_dot_product_attention_math``,
        ``torch.ops.aten...``, ``torch._C._jit_get_operation('aten::...')``, the original dug
        out of a wrapper); it counts the operator's own name, not the student's spelling."""
        torch = sys.modules.get("torch")
        if torch is None or getattr(torch.__spec__, "_initializing", True) is not False:
            return False
        from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

        class CountingMode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if "scaled_dot_product" in name and "backward" not in name:
                    calls[0] += not state["inside"]
                    state["inside"] += 1  # func may be a wrapper: counted here, not again
                    try:
                        return func(*args, **(kwargs or {}))
                    finally:
                        state["inside"] -= 1
                return func(*args, **(kwargs or {}))

        state["stack"], state["mode"] = _get_current_function_mode_stack, CountingMode()
        if state["window"]:  # PyTorch was imported inside the judged call: count from now
            push()
        return True

    def push():
        if state["mode"] is not None and not state["pushed"] and _thread.get_ident() == main:
            state["mode"].__enter__()
            state["pushed"] = True

    def window(phase):
        """Open or close the window of a judged call; False if the mode was tampered with
        (popped, or buried under another mode the student pushed) while it was open."""
        if phase == "open":
            state["window"] = True
            push()
        elif phase == "close" and _thread.get_ident() == main:
            state["window"] = False
            if state["pushed"]:
                stack = state["stack"]()
                if not stack or stack[-1] is not state["mode"]:
                    return False
                state["mode"].__exit__(None, None, None)
                state["pushed"] = False
        return True

    def intact():
        return all(owner.__dict__.get(attribute) is wrapper for owner, attribute, wrapper in hooked)

    def audit(event, args):
        if event == "sys.addaudithook":  # a later hook could rewrite the answer: refused
            raise RuntimeError("the grader's kernel takes no other audit hooks")
        if pending and not state["busy"] and event in TRIGGERS:
            state["busy"] = True
            try:
                for step in list(pending):  # each step once: a wrapper is never wrapped again
                    try:
                        if step():
                            pending.remove(step)
                    except Exception:  # noqa: BLE001 - PyTorch half imported: at the next event
                        pass
            finally:
                state["busy"] = False
        if event == EVENT and args and isinstance(args[0], list):
            kept = window(args[1] if len(args) > 1 else None)
            args[0].append((calls[0], intact() and kept))

    pending = [hook_functional, hook_aten, hook_dispatch]
    sys.addaudithook(audit)


def adopt_sockets(environ):
    """Make ZeroMQ bind each of the kernel's sockets on the listening descriptor the worker
    passed in (:data:`SOCKETS_ENV`) instead of creating a socket file: the socket folder is
    read-only in the sandbox, and only the worker creates anything there. Each descriptor
    is used once; a bind to any other address is ZeroMQ's own."""
    import json

    passed = json.loads(environ.pop(SOCKETS_ENV, "") or "{}")
    if not passed:
        return
    import zmq

    bind = zmq.Socket.bind

    def bind_passed(self, address):
        path = address[len("ipc://"):] if address.startswith("ipc://") else None
        fd = passed.pop(path, None)
        if fd is not None:
            self.setsockopt(zmq.USE_FD, fd)
        return bind(self, address)

    zmq.Socket.bind = bind_passed


def main():
    """Install the hook, then run ipykernel as ``python -m ipykernel_launcher`` does.

    Without its debugger, which grading never uses: with ``debugpy`` marked absent
    ipykernel starts as it does where debugpy is not installed.
    """
    import runpy

    import os

    install()
    adopt_sockets(os.environ)
    sys.modules["debugpy"] = None  # an import of it raises ImportError: ipykernel skips it
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
