"""The grader's layout is its process map: what each folder's code may import.

Every ``import`` of every module (at the top or inside a function) is read from the source
and resolved, then checked against the folder it lives in:

* ``autograder/kernel/`` (the probe, inside the student's sandbox): the standard library and
  NumPy only;
* ``autograder/sandbox/`` (the launcher, before every kernel): the standard library only,
  which a fresh ``python -I`` also shows by running the launcher's own import line;
* ``autograder/core/``: nothing of ``host``, ``worker``, ``judge``;
* ``autograder/judge/``: nothing of ``worker`` or ``host``;
* ``autograder/worker/``: nothing of ``host``;
* ``autograder/checks/``: the library, NumPy and torch, not the grader's processes;
* ``lib/transformer_ref`` never imports the grader; nothing outside ``tests/`` imports
  ``tests/`` (the test helpers' module names included), but for the benchmarks' use of the
  throwaway servers of ``tests/servers.py``;
* the grader starts no server of its own (no HTTP or socket server module under
  ``autograder/``: the test servers live in ``tests/servers.py``), and it never imports the
  book build (``scripts/``), where the grading environment is derived for the book
  (``scripts/environment.py``).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GRADER = ROOT / "autograder"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
TEST_HELPERS = {"tests", "conftest", "notebooks", "leftovers", "servers"}


def module_name(path, root=ROOT):
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def imports(path, root=ROOT):
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            prefix = ".".join(base + ([node.module] if node.module else []))
            found.add(prefix)  # and each name, which may be a module of it (from . import x)
            found.update(f"{prefix}.{alias.name}" for alias in node.names)
    return found


def grader_layer(name):
    """``host``, ``worker``, ... for ``autograder.<layer>...``; ``top`` for the package itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "top"


def modules(folder):
    return sorted(folder.rglob("*.py"))


def violations(folder, allowed):
    """``(file, import)`` pairs under ``folder`` for which ``allowed(name)`` is False."""
    return [(str(path.relative_to(ROOT)), name) for path in modules(folder)
            for name in sorted(imports(path)) if not allowed(name)]


def top(name):
    return name.split(".")[0]


def test_the_resolver_sees_relative_function_level_and_package_imports(tmp_path):
    """The checks below can fail: a planted module's imports are all found."""
    planted = tmp_path / "autograder" / "worker" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("import os\nfrom ..host import driver\n"
                       "def f():\n    from ..judge.execute import SpareKernel\n    from . import audit\n")
    assert imports(planted, root=tmp_path) == {
        "os", "autograder.host", "autograder.host.driver", "autograder.judge.execute",
        "autograder.judge.execute.SpareKernel",
        "autograder.worker", "autograder.worker.audit"}


# what the boot code may import besides: ZeroMQ (ipykernel's own transport, which the kernel
# loads anyway) to bind on the worker's descriptors, and PyTorch's mode stack once the
# student's code has loaded PyTorch
BOOT_ALSO = {("autograder/kernel/boot.py", "zmq"), ("autograder/kernel/boot.py", "torch.overrides")}


def test_the_kernel_probe_imports_only_the_standard_library_and_numpy():
    found = violations(GRADER / "kernel", lambda n: top(n) in STDLIB | {"numpy"}
                       or n.startswith("autograder.kernel"))
    assert [(f, n) for f, n in found
            if (f, n) not in BOOT_ALSO and (f, n.rpartition(".")[0]) not in BOOT_ALSO] == []


def test_the_sandbox_imports_only_the_standard_library():
    assert violations(GRADER / "sandbox", lambda n: top(n) in STDLIB
                      or n.startswith("autograder.sandbox")) == []
    assert all(top(n) in STDLIB for n in imports(GRADER / "__init__.py")), \
        "autograder/__init__.py runs in every kernel launcher: standard library only"


def test_the_launcher_loads_no_module_outside_the_standard_library():
    """What a kernel's launcher really imports, in a fresh isolated interpreter."""
    from autograder.sandbox.launcher import BOOT

    boot = BOOT.split("; from ")[0]  # the launcher's sys.path line, without launching
    code = (f"{boot}; import autograder.sandbox.launcher, sys; "
            "print('\\n'.join(sorted(k for k, v in sys.modules.items() if v is not None)))")
    loaded = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout.split()
    outside = [m for m in loaded if top(m) not in STDLIB and top(m) != "autograder"
               and not m.startswith("_")]
    assert "autograder.sandbox.launcher" in loaded
    assert outside == []


@pytest.mark.parametrize("layer, forbidden", [
    ("core", {"host", "worker", "judge", "service"}),
    ("judge", {"host", "worker", "service"}),
    ("worker", {"host", "service"}),
])
def test_lower_layers_never_import_higher_ones(layer, forbidden):
    assert violations(GRADER / layer, lambda n: top(n) != "autograder"
                      or grader_layer(n) not in forbidden) == []


def test_the_checks_use_the_library_not_the_grader():
    assert violations(GRADER / "checks", lambda n: top(n) != "autograder"
                      or n.startswith("autograder.checks")) == []


def test_the_self_check_imports_only_the_judges_verdict():
    """``selfcheck/`` runs in a learner's kernel from the self-check package, which holds
    ``judge/verdict`` and the probe but nothing else of the grader's processes."""
    assert violations(GRADER / "selfcheck", lambda n: top(n) in STDLIB | {"IPython", "__main__"}
                      or n.startswith(("autograder.selfcheck", "autograder.judge.verdict"))) == []


def test_the_library_never_imports_the_grader_or_the_build():
    assert violations(ROOT / "lib", lambda n: top(n) not in {"autograder", "scripts"}
                      | TEST_HELPERS) == []


@pytest.mark.parametrize("folder", ["autograder", "lib", "scripts"])
def test_nothing_outside_tests_imports_tests(folder):
    assert violations(ROOT / folder, lambda n: top(n) not in TEST_HELPERS) == []


def test_top_level_modules_and_benchmarks_import_no_tests_but_the_servers():
    # the benchmarks measure against the same throwaway PostgreSQL and Dask servers as the tests,
    # and hand in the same solved notebooks (tests/notebooks.py)
    root_modules = [(path.name, name) for path in sorted(ROOT.glob("*.py")) for name in sorted(imports(path))
                    if top(name) in TEST_HELPERS]
    assert root_modules == []
    assert violations(ROOT / "benchmarks", lambda n: top(n) not in TEST_HELPERS
                      or n.split(".")[:2] in (["tests", "servers"], ["tests", "notebooks"])) == []


# Modules that serve: a test server (the formgrader's, JupyterLab's, PostgreSQL, Dask) lives in
# tests/servers.py, never in the grader.
SERVER_MODULES = {"http.server", "socketserver", "wsgiref", "xmlrpc.server", "aiohttp", "tornado.web",
                  "tornado.httpserver", "jupyter_server.serverapp", "notebook", "nbgrader.server_extensions"}


def serves(name):
    return any(name == m or name.startswith(m + ".") for m in SERVER_MODULES) or name in {
        "distributed.LocalCluster", "dask.distributed.LocalCluster"}


# the one server of the grader: serve's web page (a JupyterHub service), in its own process
WEB_PROCESS = "autograder/service/web.py"


def test_the_grader_holds_no_server_and_never_imports_the_book_build():
    found = violations(GRADER, lambda n: not serves(n) and top(n) != "scripts")
    assert [v for v in found if v[0] != WEB_PROCESS] == []
    assert {top(name) for _, name in found} == {"tornado"}  # its HTTP server, and no other
    assert serves("http.server") and serves("socketserver") and serves("distributed.LocalCluster")
    assert (ROOT / "scripts" / "environment.py").is_file()  # the grading environment, for the book


def test_the_readme_names_the_process_of_every_grader_module():
    """CONTRIBUTING.md's layout table names every module in its folder's row, so a
    newcomer can tell from the table which process runs any file (``checks/`` is named as a
    folder: each of its modules is a check that test cells import)."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    table = text[text.index("## How the code is laid out"):text.index("## How a grade travels")]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("/`"):
            rows[cells[0].strip("`/")] = cells[1]
    folders = sorted(p.name for p in GRADER.iterdir() if (p / "__init__.py").exists())
    assert sorted(rows) == folders, f"layout table rows {sorted(rows)} != folders {folders}"
    unnamed = [f"{folder}/{path.stem}" for folder in folders if folder != "checks"
               for path in sorted((GRADER / folder).glob("*.py"))
               if path.stem != "__init__" and f"`{path.stem}`" not in rows[folder]]
    assert not unnamed, f"modules the README's layout table does not place: {unnamed}"


def test_only_the_command_line_starts_the_service():
    """``service/`` (``serve``'s loop and web page) sits above ``host/``: of the host, only the
    command line imports it."""
    assert {path for path, _ in violations(GRADER / "host", lambda n: top(n) != "autograder"
                                            or grader_layer(n) != "service")} == {"autograder/host/cli.py"}
