"""The learner's set-up on every platform: ``requirements-learner.txt`` resolved per system.

For each of ``environment.LEARNER_PLATFORMS`` x ``python_releases()``, uv's
resolver (``uv pip compile --python-platform P --python-version V --only-binary :all:``,
which evaluates the markers and the wheel tags of that system, not of this machine) resolves
the requirement files against the package index. A learner's set-up installs there with the
versions the files name when:

* the resolution succeeds with wheels only (a learner has no compilers);
* every package of it is a line of the files (``-r`` in uv's annotations), or is reached
  only through ``torch``: the CUDA libraries of PyPI's default Linux build, which that build
  chooses (the CPU-only build brings none);
* the packages a notebook names (``environment.LABELS``) have the grader's versions.

The Triton matrix (Exercise 7) resolves ``requirements-triton.lock`` with the learner's
file, that is with PyPI's default torch build: on ``TRITON_PLATFORMS`` it must give the
lock's Triton; elsewhere Triton has no wheel (what the pages say).

    python -m scripts.platforms          # the matrix, one row per system; exit 1 if any fails
    python -m scripts.platforms --triton # the same for Exercise 7

It needs the package index (``UV_DEFAULT_INDEX``, else PyPI) and uv (``requirements.lock``).
"""

import argparse
import os
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from scripts import environment

ROOT = environment.ROOT
LEARNER_FILES = ("requirements-learner.txt",)
TRITON_FILES = ("requirements-learner.txt", "requirements-triton.lock")
# Concurrent resolutions: uv waits on the index, not on the CPU.
WORKERS = 24


def index_url():
    """The package index uv resolves against: ``UV_DEFAULT_INDEX``/``UV_INDEX_URL`` or PyPI."""
    return (os.environ.get("UV_DEFAULT_INDEX") or os.environ.get("UV_INDEX_URL")
            or "https://pypi.org/simple")


def index_unreachable(url=None, timeout=10):
    """``None`` when ``url`` (default: the index's page of uv) answers, else one line why not."""
    url = url or index_url().rstrip("/") + "/uv/"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - an index
            response.read(1)
    except OSError as error:
        return f"{url} is unreachable ({error})"
    return None


def python_releases(pythons=environment.LEARNER_PYTHONS, pins=environment.LEARNER_PINS):
    """The CPython releases to resolve for: the first of each minor version, and both sides of
    every ``python_full_version`` bound that a learner pin's marker draws."""
    releases = {f"{minor}.0" for minor in pythons}
    for pin in pins:
        match = re.fullmatch(r'python_full_version\s*(<=|>=|<|>)\s*"(\d+)\.(\d+)\.(\d+)"',
                             pin.marker)
        if match:
            major, minor, patch = (int(part) for part in match.groups()[1:])
            releases |= {f"{major}.{minor}.{patch}", f"{major}.{minor}.{max(patch - 1, 0)}"}
    return sorted(releases, key=lambda release: tuple(int(p) for p in release.split(".")))


@dataclass
class Resolution:
    """What uv resolved for one system: ``{name: version}`` and who required each package."""

    platform: environment.Platform
    python: str
    files: tuple
    error: str = ""                             # uv's message when it found no solution
    versions: dict = field(default_factory=dict)
    via: dict = field(default_factory=dict)     # name -> names (or "-r FILE") that require it

    def from_torch_only(self, name):
        """Whether only ``torch`` brings ``name``: no path of requirements leads to it from
        a line of the files without passing through torch."""
        return name in self.versions and name not in self._without_torch()

    def _without_torch(self):
        """The names that the files' lines lead to when torch's requirements are not followed."""
        children = {}
        for child, parents in self.via.items():
            for parent in parents:
                children.setdefault(parent, set()).add(child)
        todo = [name for name, parents in self.via.items()
                if any(parent.startswith("-r ") for parent in parents)]
        reached = set(todo)
        while todo:
            name = todo.pop()
            for child in () if name == "torch" else children.get(name, ()):
                if child not in reached:
                    reached.add(child)
                    todo.append(child)
        return reached

    def problems(self, lock=None):
        """What keeps a learner from installing the files' versions here (empty: nothing)."""
        if self.error:
            return [self.error]
        lock = environment.lock_pins() if lock is None else lock
        found = []
        for name, version in sorted(self.versions.items()):
            direct = any(parent.startswith("-r ") for parent in self.via.get(name, ()))
            if not direct and not self.from_torch_only(name):
                found.append(f"{name}=={version} (for {', '.join(sorted(self.via[name]))}) is "
                             "in no line of " + " or ".join(self.files)
                             + ": pin it in scripts/environment.py LEARNER_PINS")
        for name in environment.LABELS:
            if name in self.versions and public(self.versions[name]) != lock[name]:
                found.append(f"{name} {self.versions[name]}, graded with {lock[name]}")
        return found

    def differences(self, lock=None):
        """``{name: (lock version or None, version here)}`` of the files' packages that differ
        from the grader's lock (``None``: a package the lock does not hold)."""
        lock = environment.lock_pins() if lock is None else lock
        return {name: (lock.get(name), version) for name, version in sorted(self.versions.items())
                if lock.get(name) != public(version) and not self.from_torch_only(name)}

    def torch_only(self):
        """The packages that only torch's build brings (its CUDA libraries on Linux)."""
        return sorted(name for name in self.versions if self.from_torch_only(name))


def public(version):
    """``2.13.0`` of ``2.13.0+cpu``: a build's version without its local label."""
    return version.split("+", 1)[0]


def parse_compiled(text):
    """``({name: version}, {name: {requirer, ...}})`` of uv's ``--annotation-style line`` output."""
    versions, via = {}, {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s*(?:#\s*via\s+(.*))?$", line)
        if match:
            name = environment.canonical(match.group(1))
            versions[name] = match.group(2)
            via[name] = {part.strip() if part.strip().startswith("-r ")
                         else environment.canonical(part.strip())
                         for part in (match.group(3) or "").split(",") if part.strip()}
    return versions, via


def uv_binary():
    """uv beside this interpreter (the venv's ``bin``, where ``requirements.lock`` puts it)."""
    uv = Path(sys.executable).with_name("uv.exe" if os.name == "nt" else "uv")
    if not uv.is_file():
        raise FileNotFoundError(f"no uv at {uv}: pip install -r requirements.lock")
    return str(uv)


def resolve(platform, python, files=LEARNER_FILES, root=ROOT, sources=(), timeout=180):
    """Resolve ``files`` (paths relative to ``root``) for ``platform`` and CPython ``python``
    against the index, and ``sources`` (more uv options: ``cpu_build_sources()``)."""
    command = [uv_binary(), "pip", "compile", "--quiet", "--no-config", "--no-python-downloads",
               "--python-platform", platform.uv, "--python-version", python,
               "--only-binary", ":all:", "--no-header", "--annotation-style", "line",
               "--default-index", index_url(), *sources, *files]
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("UV_", "PIP_", "MACOSX_DEPLOYMENT_TARGET"))}
    env.update(platform.env)
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)
    resolution = Resolution(platform, python, tuple(files))
    if done.returncode:
        lines = [line.strip() for line in done.stderr.splitlines()
                 if line.strip() and not line.startswith("warning")]
        resolution.error = " ".join(lines) or f"uv exited with {done.returncode}"
    else:
        resolution.versions, resolution.via = parse_compiled(done.stdout)
    return resolution


def resolve_all(systems, files=LEARNER_FILES, root=ROOT, sources=()):
    """``{(platform.uv, python): Resolution}`` for each ``(platform, python)``, concurrently."""
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {(platform.uv, python): pool.submit(resolve, platform, python, files, root,
                                                      sources)
                   for platform, python in systems}
        return {key: future.result() for key, future in futures.items()}


def cpu_build_sources(where=environment.TORCH_CPU_INDEX):
    """uv options that put PyTorch's CPU-only build within reach, as the page's first ``pip
    install`` does: ``where`` is its index URL or a folder of wheels (``--find-links``). With
    both indexes' candidates compared, ``torch==V`` takes ``V+cpu``, the higher version."""
    if "://" in str(where):
        return ("--extra-index-url", str(where), "--index-strategy", "unsafe-best-match")
    return ("--find-links", str(where))


def learner_systems():
    return [(platform, python) for platform in environment.LEARNER_PLATFORMS
            for python in python_releases()]


def triton_systems(platforms=environment.LEARNER_PLATFORMS):
    """Every learner platform (where Triton has no wheel, the resolution must fail), one
    Python each but for ``TRITON_PLATFORMS``, which get every minor version."""
    return [(platform, f"{minor}.0") for platform in platforms
            for minor in (environment.LEARNER_PYTHONS
                          if platform in environment.TRITON_PLATFORMS
                          else environment.LEARNER_PYTHONS[:1])]


def triton_problems(resolution, lock=None):
    """What is wrong with Exercise 7's set-up on this system (empty: nothing): on
    ``TRITON_PLATFORMS`` it must install with the lock's Triton; elsewhere Triton must have
    no wheel, as the pages say."""
    lock = environment.lock_pins() if lock is None else lock
    if resolution.platform not in environment.TRITON_PLATFORMS:
        if resolution.error and "triton" in resolution.error:
            return []
        return [f"Triton installs on {resolution.platform.label} now (or fails for another "
                f"reason: {resolution.error or 'none'}): update the pages and TRITON_PLATFORMS"]
    found = resolution.problems(lock)
    if not resolution.error and public(resolution.versions.get("triton", "")) != lock["triton"]:
        found.append(f"triton {resolution.versions.get('triton')}, graded with {lock['triton']}")
    return found


def row(resolution, problems):
    """One line of the matrix: the system, then what resolved and how it differs."""
    head = f"{resolution.platform.uv:<24} {resolution.python:<7}"
    if resolution.error:
        return f"{head} {'FAILS' if problems else 'no solution, as expected'}: {resolution.error}"
    differ = ", ".join(f"{name} {mine}" + (f" (lock {theirs})" if theirs else " (added)")
                       for name, (theirs, mine) in resolution.differences().items())
    torch_only = resolution.torch_only()
    return (f"{head} {'PROBLEM: ' + '; '.join(problems) if problems else 'resolves'}"
            f" [{len(resolution.versions)} packages]"
            + (f"; differs: {differ}" if differ else "; the lock's versions")
            + (f"; torch's own build adds {len(torch_only)}: "
               + ("triton and " if "triton" in torch_only else "") + "CUDA libraries"
               if torch_only else ""))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--triton", action="store_true",
                        help="Exercise 7: the learner file with requirements-triton.lock")
    parser.add_argument("--cpu-build", metavar="INDEX_OR_FOLDER", nargs="?",
                        const=environment.TORCH_CPU_INDEX,
                        help="with --triton: PyTorch's CPU-only build, from its index (default "
                             f"{environment.TORCH_CPU_INDEX}) or a folder of wheels")
    args = parser.parse_args(argv)
    reason = index_unreachable()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    systems, files = ((triton_systems(), TRITON_FILES) if args.triton
                      else (learner_systems(), LEARNER_FILES))
    if args.cpu_build:
        systems = triton_systems(environment.TRITON_PLATFORMS)
    sources = cpu_build_sources(args.cpu_build) if args.cpu_build else ()
    check = triton_problems if args.triton else Resolution.problems
    failed = False
    for resolution in resolve_all(systems, files, sources=sources).values():
        problems = check(resolution)
        failed = failed or bool(problems)
        print(row(resolution, problems))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
