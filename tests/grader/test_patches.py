"""The list of the grader's bindings to its dependencies' insides (``autograder/core/patches.py``)
is complete enough to trust and true:

* each dependency is installed at exactly the version its entries were written for, so an
  upgrade of nbgrader, nbclient, jupyter_client, Dask, ... fails here until someone has read the
  patch again and updated its entry;
* each ``replaces`` entry is applied where it says: in a fresh process, after its installer ran,
  the dependency's object is the grader's (from ``by``'s module), and was not before;
* each ``overrides`` entry names private methods that the dependency's class still has (a
  renamed one would silently stop being overridden), and the grader's class overrides or calls
  each one;
* each ``holds`` entry names attributes the dependency's class still has;
* each ``hides`` entry names an optional import the dependency still makes, and the dependency
  still imports without the hidden module.
"""

import importlib
import importlib.metadata
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.core.patches import PATCHES, Patch

REPO = Path(__file__).resolve().parents[2]
KINDS = {"replaces", "overrides", "holds", "hides"}


def resolve(dotted):
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def module_of(dotted):
    """The module part of a dotted path (its longest importable prefix)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            importlib.import_module(".".join(parts[:cut]))
            return ".".join(parts[:cut])
        except ImportError:
            continue
    raise ImportError(dotted)


def ids(patches):
    return [f"{p.kind}:{p.target}" for p in patches]


def test_every_entry_is_well_formed():
    for patch in PATCHES:
        assert patch.kind in KINDS, patch
        assert re.fullmatch(r"\d+(\.\d+)+", patch.version), patch
        assert patch.why and "\n" not in patch.why and len(patch.why) <= 100, patch
        assert patch.by.startswith("autograder"), patch
        resolve(patch.by)
        if patch.kind == "replaces":
            assert patch.install, patch
        else:
            assert patch.names, patch
    assert len({(p.target, p.by) for p in PATCHES}) == len(PATCHES), "an entry listed twice"


@pytest.mark.parametrize("dependency", sorted({p.dependency for p in PATCHES}))
def test_each_dependency_is_the_version_its_patches_were_written_for(dependency):
    listed = {p.version for p in PATCHES if p.dependency == dependency}
    assert len(listed) == 1, f"{dependency}: entries written for different versions {listed}"
    installed = importlib.metadata.version(dependency).split("+")[0]  # torch's +cpu is a build
    assert installed == listed.pop(), (
        f"{dependency} {installed} is installed, the grader's patches of it were written for "
        f"another version: read each entry of autograder/core/patches.py for {dependency} against "
        f"the new version's code, then update its version there")


# In a fresh process: each installer runs, and the target becomes the grader's object. The
# kernel's patches (zmq, PyTorch) are installed as the boot code installs them in a kernel.
APPLY = r"""
import importlib, inspect, json, os, sys
sys.path.insert(0, sys.argv[1])
from tests.grader.test_patches import resolve, module_of
from autograder.core.patches import PATCHES
from autograder.kernel import boot

replaces = [p for p in PATCHES if p.kind == "replaces"]
before = {p.target: None if p.target.startswith("torch.") else resolve(p.target) for p in replaces}
for patch in replaces:
    install = resolve(patch.install)
    parameters = inspect.signature(install).parameters
    if install is boot.adopt_sockets:
        install({boot.SOCKETS_ENV: json.dumps({"/nowhere/shell": 99})})
    elif install is boot.install:
        install()
        import torch.nn.functional  # the audit hook wraps SDPA while PyTorch loads
    elif parameters:  # the installer takes the class it patches
        install(resolve(patch.target.rsplit(".", 1)[0]))
    else:
        install()
found = {}
for patch in replaces:
    after = resolve(patch.target)
    module = getattr(after, "__module__", None) or type(after).__module__
    found[patch.target] = [module, module_of(patch.by), after is not before[patch.target]]
print(json.dumps(found))
"""


def test_each_replacement_is_applied_where_it_says():
    done = subprocess.run([sys.executable, "-c", APPLY, str(REPO)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    replaces = [p for p in PATCHES if p.kind == "replaces"]
    assert set(found) == {p.target for p in replaces}
    for target, (module, expected, changed) in found.items():
        assert changed, f"{target}: its installer left it as it was"
        assert module == expected, f"{target} is {module}'s after its installer, not {expected}'s"


@pytest.mark.parametrize("patch", [p for p in PATCHES if p.kind == "overrides"],
                         ids=ids(p for p in PATCHES if p.kind == "overrides"))
def test_each_override_still_meets_a_method_of_the_dependency(patch: Patch):
    base, ours = resolve(patch.target), resolve(patch.by)
    assert issubclass(ours, base), f"{patch.by} is not a {patch.target}"
    source = inspect.getsource(ours)
    for name in patch.names:
        assert hasattr(base, name), f"{patch.target} has no {name} any more: {patch.by} overrides nothing"
        assert name in vars(ours) or f".{name}(" in source, f"{patch.by} neither overrides nor calls {name}"


def test_the_list_of_overrides_is_complete():
    """Every private method of a dependency's class that the grader's subclass defines is listed
    (in one of the subclass's entries: one per dependency whose class it overrides)."""
    listed = {}
    for patch in (p for p in PATCHES if p.kind == "overrides"):
        listed.setdefault(patch.by, set()).update(patch.names)
    for by, names in listed.items():
        ours = resolve(by)
        private = {name for name, value in vars(ours).items() if inspect.isfunction(value)
                   and name.startswith("_") and not name.startswith("__")
                   and any(name in vars(b) for b in ours.__mro__[1:])}
        assert private <= names, f"{by} overrides {private - names}: list them"


@pytest.mark.parametrize("patch", [p for p in PATCHES if p.kind == "holds"],
                         ids=ids(p for p in PATCHES if p.kind == "holds"))
def test_each_held_object_is_still_where_the_dependency_keeps_it(patch: Patch):
    cls = resolve(patch.target)
    source = inspect.getsource(cls)
    traits = cls.class_traits() if hasattr(cls, "class_traits") else {}
    for name in patch.names:
        assert name in traits or hasattr(cls, name) or re.search(rf"self\.{name}\s*=", source), (
            f"{patch.target} no longer has {name}: {patch.by} holds what it no longer uses")


@pytest.mark.parametrize("patch", [p for p in PATCHES if p.kind == "hides"],
                         ids=ids(p for p in PATCHES if p.kind == "hides"))
def test_each_hidden_module_is_still_an_optional_import(patch: Patch):
    module = patch.names[0]
    spec = importlib.util.find_spec(module)
    assert re.search(rf"\bimport {patch.target}\b|\bfrom {patch.target}\b",
                     Path(spec.origin).read_text()), f"{module} no longer imports {patch.target}"
    code = f"import sys; sys.modules[{patch.target!r}] = None; import {module}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_grader_package_hides_what_its_entry_says():
    """``import autograder`` (every process) marks rfc3987_syntax absent before nbformat loads."""
    code = "import sys, autograder; print(sys.modules.get('rfc3987_syntax', 'absent'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert done.stdout.strip() == "None", done.stderr
