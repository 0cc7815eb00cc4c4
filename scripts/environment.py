"""The grading environment, stated once: versions from the locks, learner requirements, notebook text.

The grader runs Python ``GRADING_PYTHON`` with the exact versions of ``requirements.lock``
(and ``requirements-triton.lock`` for an assignment that ``needs`` Triton). Everything a
learner reads about that environment is derived here from those files, so it cannot drift:

* ``requirements-learner.txt``: what a learner installs to run the chapters and the
  exercises (NumPy, matplotlib, PyTorch, JupyterLab and everything they need, the lock's
  pins), not the build and grading stack; with ``LEARNER_PINS``, the lines for the systems
  (``LEARNER_PLATFORMS`` x ``LEARNER_PYTHONS``) that need another version or one more
  package than the Linux machine the lock was made on (``scripts/platforms.py`` resolves the
  file for each of them);
* the last paragraph of each source notebook's first cell (``solutions/<id>/<id>.ipynb``),
  which states the grader's versions, and the end of its set-up cell, which prints one line
  when the kernel's major.minor versions differ from them;
* the book's substitutions ``{{ grader_python }}``, ``{{ grader_numpy }}``, ... (set by
  ``scripts/book_ext.py``).

    python -m scripts.environment --check   # exit 1 and list what is out of date
    python -m scripts.environment --write   # rewrite it; then `python -m autograder generate --all`
"""

import argparse
import importlib.metadata
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKS = (ROOT / "requirements.lock", ROOT / "requirements-triton.lock")
LEARNER_REQUIREMENTS = ROOT / "requirements-learner.txt"
# The interpreter of the course's venv and of the grader (the Makefile's `PYTHON ?= python3.11`).
GRADING_PYTHON = "3.11"
# What a learner needs: the chapters import NumPy, matplotlib and PyTorch (and IPython,
# which JupyterLab's kernel brings); JupyterLab 4 opens the chapters and the exercises.
LEARNER_ROOTS = ("numpy", "matplotlib", "torch", "jupyterlab")
# Distribution name -> how the text names it, in the order the text lists them.
LABELS = {"numpy": "NumPy", "torch": "PyTorch", "triton": "Triton"}
HEADER_START = "**Grading environment.**"
CHECK_START = "# The grader's versions (from the course's lock files):"


@dataclass(frozen=True)
class Platform:
    """A system a learner's set-up must install on (``uv pip compile --python-platform uv``)."""

    uv: str     # uv's name for it (tags and markers of the resolution)
    label: str  # what the pages call it
    env: tuple = ()  # (variable, value) pairs that uv needs to model it


# Where requirements-learner.txt installs with the versions it names: resolved for every pair
# of platform and Python by tests/book/test_platforms.py. Linux: PyTorch's wheels are
# manylinux_2_28 (glibc 2.28, 2018); macOS: PyTorch 2.13's only wheels are for arm64 and
# macOS 14 (none for Intel Macs).
LEARNER_PLATFORMS = (
    Platform("x86_64-manylinux_2_28", "Linux x86-64 (glibc 2.28 or later)"),
    Platform("aarch64-manylinux_2_28", "Linux aarch64 (glibc 2.28 or later)"),
    Platform("aarch64-apple-darwin", "macOS 14 or later on Apple silicon",
             (("MACOSX_DEPLOYMENT_TARGET", "14.0"),)),
    Platform("x86_64-pc-windows-msvc", "Windows x86-64"),
)
# CPython minor versions, every patch release of each (3.11.0 and up).
LEARNER_PYTHONS = ("3.11", "3.12", "3.13")
# Exercise 7: Triton publishes wheels for Linux only (the grader runs it on x86-64).
TRITON_PLATFORMS = LEARNER_PLATFORMS[:2]
# PyPI's torch is the CUDA build on Linux; this index serves the same versions CPU-only.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@dataclass(frozen=True)
class LearnerPin:
    """A line of ``requirements-learner.txt`` that the lock cannot give, for the systems where
    the PEP 508 ``marker`` holds: another version of a locked package (its lock line then
    gets the opposite marker), or a package that the lock's Linux machine does not need."""

    name: str
    version: str
    marker: str  # one comparison, e.g. 'sys_platform == "win32"'
    where: str   # the systems the marker selects, in words
    why: str     # what needs it there (a clause); none is a package a notebook imports


LEARNER_PINS = (
    LearnerPin("appnope", "1.0.0", 'platform_system == "Darwin"', "macOS",
               "ipykernel uses it so that macOS does not put a busy kernel to sleep"),
    LearnerPin("colorama", "0.4.6", 'sys_platform == "win32"', "Windows",
               "IPython uses it for coloured text in a terminal"),
    LearnerPin("pywinpty", "3.1.2", 'os_name == "nt"', "Windows",
               "JupyterLab uses it for its terminals"),
    LearnerPin("soupsieve", "2.10", 'python_full_version < "3.11.5"', "Python 3.11.0 to 3.11.4",
               "nbconvert's beautifulsoup4 uses it, and its releases from 3.0 need Python "
               "3.11.5, which fixed the regular expressions they rely on"),
)


def wheel_name(root=ROOT):
    """File name of the course library's wheel, from ``pyproject.toml`` (name and version)."""
    import tomllib

    project = tomllib.loads((Path(root) / "pyproject.toml").read_text())["project"]
    return f"{project['name']}-{project['version']}-py3-none-any.whl"


def canonical(name):
    """A distribution name as PEP 503 compares it: ``Jinja2`` and ``jinja2`` are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(locks=LOCKS):
    """``{canonical name: version}`` of every ``name==version`` line of the lock files."""
    pins = {}
    for lock in locks:
        for line in Path(lock).read_text().splitlines():
            match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line)
            if match:
                pins[canonical(match.group(1))] = match.group(2)
    return pins


def grading_versions(pins=None):
    """``{"python": "3.11", "numpy": ..., "torch": ..., "triton": ...}``: what the grader runs."""
    pins = lock_pins() if pins is None else pins
    return {"python": GRADING_PYTHON, **{name: pins[name] for name in LABELS}}


def _dependencies(name, extras=()):
    """Canonical names of what the installed distribution ``name`` requires here."""
    from packaging.requirements import Requirement

    found = []
    for text in importlib.metadata.distribution(name).requires or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *extras)):
            found.append((canonical(requirement.name), tuple(sorted(requirement.extras))))
    return found


_OPPOSITE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def opposite(marker):
    """The marker that holds exactly where the one-comparison ``marker`` does not."""
    match = re.fullmatch(r'\s*(\w+)\s*(<=|>=|==|!=|<|>)\s*"([^"]*)"\s*', marker)
    if not match:
        raise ValueError(f"not one comparison of a variable with a quoted value: {marker!r}")
    variable, operator, value = match.groups()
    return f'{variable} {_OPPOSITE[operator]} "{value}"'


def learner_differences(pins=None, learner_pins=LEARNER_PINS):
    """The ``LEARNER_PINS`` that replace a locked version (not the platform-only packages)."""
    pins = lock_pins(LOCKS[:1]) if pins is None else pins
    return [pin for pin in learner_pins if canonical(pin.name) in pins]


def learner_requirements(roots=LEARNER_ROOTS, pins=None, learner_pins=LEARNER_PINS):
    """Text of ``requirements-learner.txt``: ``roots`` and all they require, pinned by the lock,
    and ``learner_pins`` for the systems that need them.

    The dependency closure is read from the metadata of the distributions installed in
    this interpreter (the course's venv, made from ``requirements.lock``), with the
    markers evaluated for it; every name must be pinned in the lock (``KeyError``). A
    package that a notebook's version line names (``LABELS``) has the lock's version
    everywhere (``ValueError`` otherwise).
    """
    pins = lock_pins(LOCKS[:1]) if pins is None else pins
    extra = {canonical(pin.name): pin for pin in learner_pins}
    if len(extra) != len(learner_pins) or set(extra) & set(LABELS):
        raise ValueError("LEARNER_PINS: one line per package, and none for "
                         f"{', '.join(LABELS)} (the notebooks state the grader's version)")
    todo = [(canonical(root), ()) for root in roots]
    seen = {}  # name -> the extras already followed
    while todo:
        name, extras = todo.pop()
        known = seen.get(name)
        if known is not None and set(extras) <= known:
            continue
        seen[name] = (known or set()) | set(extras)
        todo.extend(_dependencies(name, tuple(seen[name])))
    lines = []
    for name in sorted(set(seen) | set(extra)):
        pin = extra.get(name)
        if name in seen:
            lines.append(f"{name}=={pins[name]}" + (f" ; {opposite(pin.marker)}" if pin else ""))
        if pin:
            lines.append(f"{name}=={pin.version} ; {pin.marker}")
    wheel = wheel_name()
    return "\n".join([
        "# What you install to run the chapters and the exercise notebooks of \"Attention, Part 2\":",
        "# NumPy, matplotlib, PyTorch and JupyterLab with everything they need, at the exact",
        "# versions the course is built and graded with (Python " + GRADING_PYTHON + ").",
        *_wrapped(f"It installs on {supported_pythons()} on {supported_platforms()}:", "# "),
        f"#   python{GRADING_PYTHON} -m venv attention-env     (or another of these Pythons)",
        "#   attention-env/bin/pip install -r requirements-learner.txt " + wheel,
        "# (on Windows: attention-env\\Scripts\\pip). The wheel is the course library",
        "# transformer_ref, offered beside this file. On Linux, PyPI's torch is the CUDA build",
        "# (several GB); the book's page \"Run the chapters yourself\" shows how to take the CPU",
        "# build. A line ending in \"; <condition>\" applies only where the condition holds:",
        "# there the system needs another version, or one more package, of what no notebook",
        "# imports:",
        *[line for pin in learner_pins
          for line in _wrapped(f"{pin.name} {pin.version} on {pin.where}: {pin.why}.", "#   ")],
        "# Generated from requirements.lock by `python -m scripts.environment --write`.",
        *lines,
    ]) + "\n"


def supported_pythons():
    """The Pythons ``requirements-learner.txt`` installs on, in words."""
    return (f"CPython {_sentence_list(list(LEARNER_PYTHONS), 'or')} "
            f"(every release from {LEARNER_PYTHONS[0]}.0)")


def supported_platforms(platforms=LEARNER_PLATFORMS):
    """The systems ``requirements-learner.txt`` installs on, in words."""
    return _sentence_list([platform.label for platform in platforms])


def _wrapped(text, prefix, width=92):
    import textwrap

    return textwrap.wrap(text, width, initial_indent=prefix, subsequent_indent=prefix + "  ")


def _label(name):
    return "Python" if name == "python" else LABELS[name]


def _sentence_list(items, conjunction="and"):
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def notebook_packages(setup_source):
    """The distributions of ``LABELS`` that a set-up cell imports, in ``LABELS`` order."""
    return [name for name in LABELS
            if re.search(rf"^\s*(import|from)\s+{name}\b", setup_source, re.M)]


def header_paragraph(versions, packages, differences=()):
    """The first cell's last paragraph: the grader's versions, where to get them, and the
    learner's versions that may differ (``differences``: ``LearnerPin`` of locked packages)."""
    stated = ["python", "numpy", "torch", *[p for p in packages if p not in ("numpy", "torch")]]
    named = _sentence_list([f"{_label(name)} {versions[name]}" for name in stated])
    checked = _sentence_list([_label(name) for name in ["python", *packages]], "or")
    differ = _sentence_list([f"{pin.name} {pin.version} on {pin.where}" for pin in differences])
    return (f"{HEADER_START} Your notebook is graded with {named}. The book's page *Run the "
            "chapters yourself* shows how to install exactly these versions from the files it "
            "offers (`requirements-learner.txt`"
            + (" and `requirements-triton.lock`" if "triton" in packages else "")
            + f"), with CPython {_sentence_list(list(LEARNER_PYTHONS), 'or')}. "
            + (f"Where a system needs it, `requirements-learner.txt` takes another version of "
               f"a package that no notebook imports ({differ}), which cannot change your "
               "results. " if differences else "")
            + f"The set-up cell prints one line if your {checked} version differs from "
            "the grader's in its major or minor number.")


def setup_check(versions, packages):
    """The end of the set-up cell: one printed line when the kernel's versions differ."""
    wanted = {"Python": versions["python"], **{name: versions[name] for name in packages}}
    return f'''{CHECK_START} warn if yours differ.
GRADER_VERSIONS = {wanted!r}


def _versions_differ(grader):
    """'name yours (graded with theirs)' for each package whose major.minor differs."""
    import platform
    from importlib import metadata

    differ = []
    for name, version in grader.items():
        try:
            here = platform.python_version() if name == "Python" else metadata.version(name)
        except metadata.PackageNotFoundError:
            here = "not installed"
        if here.split(".")[:2] != version.split(".")[:2]:
            differ.append(f"{{name}} {{here}} (graded with {{version}})")
    return differ


if _versions_differ(GRADER_VERSIONS):
    print("Warning: not the grader's versions:", ", ".join(_versions_differ(GRADER_VERSIONS)))'''


def stamp_notebook(nb, versions=None):
    """Put the header paragraph and the set-up check into source notebook ``nb``; return it.

    Idempotent: an earlier paragraph (from ``HEADER_START``) and check (from
    ``CHECK_START``) are replaced. Only the two cells' sources change, never their metadata.
    """
    versions = grading_versions() if versions is None else versions
    intro, setup = nb.cells[0], nb.cells[1]
    code = setup.source.split(CHECK_START)[0].rstrip()
    packages = notebook_packages(code)
    setup.source = code + "\n\n" + setup_check(versions, packages)
    text = intro.source.split(HEADER_START)[0].rstrip()
    intro.source = text + "\n\n" + header_paragraph(versions, packages, learner_differences())
    return nb


def source_notebooks(root=ROOT):
    """The nbgrader source notebook of every registered assignment."""
    from autograder.core.assignments import ASSIGNMENTS

    return [Path(root) / "solutions" / aid / f"{aid}.ipynb" for aid in ASSIGNMENTS]


def out_of_date(root=ROOT, write=False):
    """Files whose text differs from what this module derives (rewritten if ``write``)."""
    import nbformat

    stale = []
    expected = learner_requirements()
    target = Path(root) / LEARNER_REQUIREMENTS.name
    if not target.is_file() or target.read_text() != expected:
        stale.append(target)
        if write:
            target.write_text(expected)
    for path in source_notebooks(root):
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        before = [cell.source for cell in nb.cells[:2]]
        if [cell.source for cell in stamp_notebook(nb).cells[:2]] != before:
            stale.append(path)
            if write:  # the layout the notebooks are kept in: one string per source
                nbformat.validate(nb)
                path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n",
                                encoding="utf-8")
    return stale


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="list what is out of date; exit 1 if any")
    group.add_argument("--write", action="store_true", help="rewrite what is out of date")
    args = parser.parse_args(argv)
    stale = out_of_date(write=args.write)
    for path in stale:
        print(f"{'rewrote' if args.write else 'out of date'}: {path.relative_to(ROOT)}")
    if args.write and any(path.suffix == ".ipynb" for path in stale):
        print("now regenerate the student versions: python -m autograder generate --all")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
