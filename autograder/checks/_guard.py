"""Tamper guard for the grader-only checks.

The grading kernel imports this module *before* any student code runs. It takes a
snapshot of the objects the checks rely on:

* the public attributes of NumPy (and of ``numpy.linalg``, ``numpy.random``,
  ``numpy.testing``), of torch when it is already loaded, of ``math`` and of a
  fixed list of Python builtins;
* every module of ``transformer_ref`` (the references the checks compare with)
  and of ``autograder.checks`` (the checks themselves), including the code object,
  defaults and closure of every function they define.

``verify()`` compares the live objects with the snapshot. If a notebook replaced
``np.allclose``, a reference function, a check helper, or a function's
``__code__``, the comparison fails with an ``AssertionError`` naming what changed,
so a test cell that calls it scores 0: monkeypatching cannot turn a failing test
into a passing one.

When the kernel did not pre-import this module (e.g. a plain ``nbgrader autograde``)
the snapshot is taken when the first hidden test imports the checks, i.e. after the
student's cells ran. The checks still work, with less protection.
A module that is imported later (torch, ``transformer_ref.torch``) is added to the
snapshot on its first ``verify()`` (``watch_loaded_modules``).
"""

import builtins
import importlib
import sys
import types

# Modules whose public attributes must not be replaced.
_LIBRARY_MODULES = (
    "numpy", "numpy.linalg", "numpy.random", "numpy.testing", "math",
    "torch", "torch.nn", "torch.nn.functional", "torch.testing", "torch.linalg",
)
# Packages watched deeply (every submodule, every function's code object).
_DEEP_PACKAGES = ("transformer_ref", "autograder.checks")
# Attributes that torch itself rebinds at run time: importing torch._dynamo (which
# torch.compile and several torch features do lazily) wraps torch.manual_seed. The
# checks compare against references on the same inputs, so the seed function cannot
# turn a failure into a pass; watching it would only flag honest notebooks.
_REBOUND_BY_LIBRARY = {("torch", "manual_seed")}
# Python builtins the checks and the visible tests use.
_BUILTINS = (
    "abs", "all", "any", "bool", "callable", "dict", "enumerate", "float", "getattr",
    "hasattr", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max",
    "min", "next", "range", "repr", "round", "set", "sorted", "str", "sum", "tuple",
    "type", "zip", "__import__", "AssertionError", "Exception", "ValueError",
    "TypeError", "NotImplementedError",
)

# One module of checks per assignment, plus the shared helpers.
CHECK_MODULES = ("_common", "_anticheat", "rope", "gqa", "causal", "block", "families", "flash")

_snapshot = {}  # (module name, attribute) -> object seen at snapshot time
_code = {}      # (module name, function name) -> (__code__, __defaults__, __kwdefaults__, closure)


def _fingerprint(fn):
    """The objects that decide what a Python function does."""
    cells = tuple(cell.cell_contents for cell in fn.__closure__ or ())
    return (fn.__code__, fn.__defaults__, fn.__kwdefaults__, *cells)


def _same(a, b):
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _watch(name, module, deep):
    for attr, value in list(vars(module).items()):
        if attr.startswith("__") or (not deep and attr.startswith("_")) or (name, attr) in _REBOUND_BY_LIBRARY:
            continue
        _snapshot.setdefault((name, attr), value)
        if deep and isinstance(value, types.FunctionType) and value.__module__ == name:
            _code.setdefault((name, attr), _fingerprint(value))
    _snapshot.setdefault(("sys.modules", name), module)


def watch_loaded_modules():
    """Add every watched module that is loaded now and not yet in the snapshot."""
    for name in _LIBRARY_MODULES:
        module = sys.modules.get(name)
        if module is not None and ("sys.modules", name) not in _snapshot:
            _watch(name, module, deep=False)
    for name, module in list(sys.modules.items()):
        if (module is not None and name.startswith(_DEEP_PACKAGES)
                and ("sys.modules", name) not in _snapshot):
            _watch(name, module, deep=True)


def _changes(*, _snapshot=_snapshot, _code=_code, builtins=builtins, sys=sys):
    """Names of the watched objects that differ from the snapshot."""
    changed = []
    for name in _BUILTINS:
        if getattr(builtins, name, None) is not _snapshot[("builtins", name)]:
            changed.append(f"builtins.{name}")
    for (module_name, attr), value in _snapshot.items():
        if module_name == "builtins":
            continue
        if module_name == "sys.modules":
            if sys.modules.get(attr) is not value:
                changed.append(f"sys.modules[{attr!r}]")
            continue
        module = sys.modules.get(module_name)
        if module is not None and vars(module).get(attr, _MISSING) is not value:
            changed.append(f"{module_name}.{attr}")
    for (module_name, attr), fingerprint in _code.items():
        fn = _snapshot[(module_name, attr)]
        if not _same(_fingerprint(fn), fingerprint):
            changed.append(f"the code of {module_name}.{attr}")
    return changed


_MISSING = object()


def verify(*, _changes=_changes, watch_loaded_modules=watch_loaded_modules):
    """Raise ``AssertionError`` if a library, reference or check object was replaced.

    The helpers are bound as defaults now, at import (before student code), so
    rebinding ``_guard._changes`` cannot switch the comparison off.
    """
    changed = _changes()
    if changed:
        shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
        raise AssertionError(
            "This notebook replaced objects the grader relies on "
            f"({shown}). Tests cannot be trusted after that, so this test scores 0. "
            "Do not monkeypatch NumPy, torch, transformer_ref or the grader."
        )
    watch_loaded_modules()


def _take_snapshot():
    for name in _BUILTINS:
        _snapshot[("builtins", name)] = getattr(builtins, name)
    importlib.import_module("numpy")
    importlib.import_module("transformer_ref.numpy")
    for name in CHECK_MODULES:
        importlib.import_module(f"autograder.checks.{name}")
    watch_loaded_modules()


_take_snapshot()
