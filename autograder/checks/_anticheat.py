"""Catch student functions that hand the task to ``transformer_ref`` or to SDPA.

Two independent nets:

* ``static_violation(fn)`` reads the function without running it: the names its code
  (and nested code, closures, and the notebook functions it calls) loads, and what
  those names are bound to in its globals. A module or function from
  ``transformer_ref`` anywhere in that graph is a violation; so is any use of a
  name containing ``scaled_dot_product`` that is not the student's own function
  when SDPA is forbidden.
* ``Tripwires`` replaces, while the student's function runs, every public
  function of the loaded ``transformer_ref`` modules (and torch's SDPA when it is
  forbidden) by a wrapper that records the call, so dynamic tricks
  (``importlib.import_module``, ``getattr`` with built strings) are caught too.

The hidden checks use both nets (``_common.call``). The visible test cell of each
part ends with a hidden ``_common.check_no_reference(fn)``, the static net alone
(the visible tests already ran the code), so such a part scores 0 in total.
"""

import contextlib
import sys
import types

REFERENCE_PACKAGE = "transformer_ref"
# A solution may use neither the reference nor the grader itself (reaching into
# autograder.checks from a solution can only be an attempt to tamper with the checks).
FORBIDDEN_PACKAGES = (REFERENCE_PACKAGE, "autograder")
SDPA_NAME = "scaled_dot_product"


def _is_reference(obj):
    if isinstance(obj, types.ModuleType):
        return obj.__name__.split(".")[0] in FORBIDDEN_PACKAGES
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and module.split(".")[0] in FORBIDDEN_PACKAGES


def _code_objects(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def static_violation(fn, *, forbid_sdpa=False):
    """A sentence describing the first forbidden use found in ``fn``, or ``None``."""
    seen = set()
    stack = [fn]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if _is_reference(obj):
            package = (obj.__name__ if isinstance(obj, types.ModuleType) else obj.__module__).split(".")[0]
            return f"it uses {getattr(obj, '__name__', obj)!s} from {package}"
        if isinstance(obj, (types.MethodType, classmethod, staticmethod)):
            stack.append(obj.__func__)
            continue
        if isinstance(obj, type) and obj.__module__ == getattr(fn, "__module__", None):
            stack.extend(v for v in vars(obj).values() if callable(v) or isinstance(v, (classmethod, staticmethod)))
            continue
        if not isinstance(obj, types.FunctionType):
            continue
        env = obj.__globals__
        for cell in obj.__closure__ or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # empty cell
                pass
        stack.extend(obj.__defaults__ or ())
        for code in _code_objects(obj.__code__):
            for name in code.co_names:
                if name.split(".")[0] in FORBIDDEN_PACKAGES:  # import x / import x.y.z
                    return f"it imports {name}"
                value = env.get(name)
                own = isinstance(value, types.FunctionType) and value.__module__ == fn.__module__
                if forbid_sdpa and SDPA_NAME in name and not own:
                    return "it calls scaled_dot_product_attention"
                if value is not None:
                    stack.append(value)
    return None


class Tripwires:
    """Record calls into forbidden functions while the student's code runs."""

    def __init__(self, forbid_sdpa=False):
        self.forbid_sdpa = forbid_sdpa
        self.hits = []
        self._patched = []

    def _wrap(self, owner, attr, original, label):
        hits = self.hits

        def tripwire(*args, **kwargs):
            hits.append(label)
            return original(*args, **kwargs)

        tripwire.__wrapped__ = original
        self._patched.append((owner, attr, original))
        setattr(owner, attr, tripwire)

    def __enter__(self):
        for name, module in list(sys.modules.items()):
            if module is None or name.split(".")[0] != REFERENCE_PACKAGE:
                continue
            for attr, value in list(vars(module).items()):
                if (not attr.startswith("_") and callable(value)
                        and not isinstance(value, (type, types.ModuleType))):
                    self._wrap(module, attr, value, f"transformer_ref ({attr})")
        functional = sys.modules.get("torch.nn.functional")
        if self.forbid_sdpa and functional is not None:
            self._wrap(functional, "scaled_dot_product_attention",
                       functional.scaled_dot_product_attention, "scaled_dot_product_attention")
        return self

    def __exit__(self, *exc):
        for owner, attr, original in reversed(self._patched):
            setattr(owner, attr, original)
        self._patched.clear()
        return False


@contextlib.contextmanager
def no_cheating(fn, what, *, forbid_sdpa=False):
    """Fail before and after running ``fn`` if it uses the reference (or SDPA)."""
    reason = static_violation(fn, forbid_sdpa=forbid_sdpa)
    if reason is None:
        with Tripwires(forbid_sdpa) as wires:
            yield
        if wires.hits:
            reason = f"it called {wires.hits[0]}"
    if reason is not None:
        raise AssertionError(cheating_message(what, reason, forbid_sdpa=forbid_sdpa))


def cheating_message(what, reason, *, forbid_sdpa=False):
    """The verdict shown to the student when ``what`` uses the reference (or SDPA)."""
    banned = "transformer_ref" + (" or scaled_dot_product_attention" if forbid_sdpa else "")
    return (f"{what} scores 0: solutions must not use {banned} ({reason}). "
            "Implement it yourself with NumPy/torch operations.")
