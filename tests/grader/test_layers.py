"""The grader's layout is its process map: what each process loads, and what each folder may import.

Which process runs a module is derived from real imports, not from a table: each process's
entry point is imported in a fresh interpreter (:data:`ENTRY_POINTS`), and every module it
loads is followed into the imports its functions make when called (read from the source,
since a function body runs only when called), until nothing new loads. So:

* the host (``python -m autograder``: ``host/cli``, every subcommand, ``serve`` included)
  loads nothing of ``worker/`` nor ``judge/``: it starts worker code by name
  (:func:`autograder.core.grading_run.call_by_name`);
* a grading worker (the local loop, the Dask plugin) loads nothing of ``host/`` or ``service/``;
* ``serve``'s web page (its own process) loads nothing of ``host/``, ``worker/``, ``judge/``;
* ``core/`` is what several processes load (or nbgrader's own commands and the formgrader,
  through the course's ``nbgrader_config.py``), and every grader module but the kernel's, the
  sandbox's, the checks' and the self-check's is loaded by some process, or is a listing that
  no grader module imports (``core/patches``, read by its test);
* ``autograder/kernel/`` (the probe, inside the student's sandbox): the standard library and
  NumPy only; ``autograder/sandbox/`` (the launcher, before every kernel): the standard
  library only, which a fresh ``python -I`` also shows by running the launcher's own import line;
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
import json
import shutil
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


# The processes of the grader, each by the modules it starts from.
ENTRY_POINTS = {
    "host": ["autograder.__init__", "autograder.host.cli"],  # python -m autograder (every command)
    "worker": ["autograder.worker.loop", "autograder.worker.plugin"],  # forked, or a Dask worker
    "web": ["autograder.service.web"],  # serve's page, its own process
    # stock nbgrader commands and the formgrader, through the course's configuration file: a
    # process with no folder of its own (every grader module the file names, as it may load them)
    "nbgrader": ["nbgrader_config.py"],
}
# Every module a process loads, from its entry points: imported for real, then followed into
# the imports inside the functions of every grader module it loaded, until nothing new loads.
LOADED = """
import ast, importlib, json, sys
from pathlib import Path

def deferred(module):
    \"\"\"Grader modules that ``module``'s function bodies import.\"\"\"
    path = Path(module.__file__)
    package = module.__name__.split(".") if path.name == "__init__.py" else module.__name__.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            prefix = ".".join(base + ([node.module] if node.module else []))
            names.add(prefix)
            names.update(f"{prefix}.{alias.name}" for alias in node.names)
    return {n for n in names if n.split(".")[0] == "autograder"}

def named(path):
    \"\"\"Grader modules a source file outside the package names in any import.\"\"\"
    names = set()
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.split(".")[0] == "autograder"}

for entry in sys.argv[1:]:
    for name in named(entry) if entry.endswith(".py") else [entry.removesuffix(".__init__")]:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
done = set()
while todo := [m for name, m in list(sys.modules.items()) if name.split(".")[0] == "autograder"
               and getattr(m, "__file__", None) and name not in done]:
    for module in todo:
        done.add(module.__name__)
        for name in deferred(module):
            try:
                importlib.import_module(name)
            except ImportError:  # a name imported from a module, not a module
                pass
print(json.dumps(sorted(n for n, m in sys.modules.items()
                        if n.split(".")[0] == "autograder" and getattr(m, "__file__", None))))
"""


def loaded_by(entries, root=ROOT):
    """The grader modules a fresh interpreter loads from ``entries`` (see :data:`LOADED`)."""
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(root)!r})\n" + LOADED,
                           *entries], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout))


@pytest.fixture(scope="module")
def processes():
    """``{process: the grader modules it loads}`` for every process of :data:`ENTRY_POINTS`."""
    return {process: loaded_by(entries) for process, entries in ENTRY_POINTS.items()}


def in_folder(modules, *folders):
    return sorted(m for m in modules if grader_layer(m) in folders)


def test_the_host_loads_nothing_of_the_worker_or_the_judge(processes):
    assert "autograder.host.driver" in processes["host"] and "autograder.service.engine" in processes["host"]
    assert in_folder(processes["host"], "worker", "judge", "kernel") == []


def test_a_grading_worker_loads_nothing_of_the_host_or_the_service(processes):
    assert {"autograder.worker.pipeline", "autograder.judge.execute"} <= processes["worker"]
    assert in_folder(processes["worker"], "host", "service") == []


def test_the_web_page_loads_nothing_of_the_host_the_worker_or_the_judge(processes):
    assert in_folder(processes["web"], "host", "worker", "judge", "kernel") == []


def unloaded(processes):
    """Grader modules of a process folder that no process loads."""
    everywhere = set().union(*processes.values())
    placed = {module_name(p) for folder in ("host", "service", "worker", "judge", "core")
              for p in modules(GRADER / folder)}
    return placed - everywhere


def test_core_is_what_several_processes_load(processes):
    """A module of ``core/`` is loaded by more than one process, or by nbgrader's own commands
    (which have no folder): one that only the host, the worker or the web page loads belongs
    in that process's folder."""
    core = {module_name(p) for p in modules(GRADER / "core")} - unloaded(processes)
    alone = {m for m in core if sum(m in loaded for loaded in processes.values()) < 2}
    assert sorted(alone - processes["nbgrader"]) == []


def test_a_module_no_process_loads_is_a_listing_nothing_imports(processes):
    """The map is complete: a module of a process's folder that no process loads is one that
    no grader module imports either (a listing read by its own test, as ``core/patches``),
    never code a process would need."""
    imported = {name for path in modules(GRADER) for name in imports(path)}
    assert sorted(unloaded(processes) & imported) == []


def test_a_worker_import_planted_in_host_code_is_found(tmp_path):
    """The checks above can fail: a function of ``host/`` that imports ``worker/`` is seen."""
    shutil.copytree(GRADER, tmp_path / "autograder", ignore=shutil.ignore_patterns("__pycache__"))
    summary = tmp_path / "autograder" / "host" / "summary.py"
    summary.write_text(summary.read_text() + "\n\ndef planted():\n    from ..worker import audit\n")
    loaded = loaded_by(ENTRY_POINTS["host"], root=tmp_path)
    assert in_folder(loaded, "worker") == ["autograder.worker", "autograder.worker.audit"]


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
    # hand in the same solved notebooks (tests/notebooks.py) and load the host with the same
    # CPU hogs (tests/hogs.py)
    root_modules = [(path.name, name) for path in sorted(ROOT.glob("*.py")) for name in sorted(imports(path))
                    if top(name) in TEST_HELPERS]
    assert root_modules == []
    assert violations(ROOT / "benchmarks", lambda n: top(n) not in TEST_HELPERS
                      or n.split(".")[:2] in (["tests", "servers"], ["tests", "notebooks"], ["tests", "hogs"])) == []


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
