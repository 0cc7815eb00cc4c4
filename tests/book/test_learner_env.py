"""The site's downloads, used the way a reader uses them: outside the course repository.

* One source for the grader's versions: ``requirements-learner.txt``, the student notebooks'
  first and set-up cells and the pages agree with the lock files (``scripts.environment``).
* ``slow``: a virtual environment made from the site's own downloads alone (the wheel
  and ``requirements-learner.txt`` that ``run-yourself.html`` links), installed with
  ``pip install --no-index`` from the wheelhouse ``make test`` fills once
  (``.venv/wheelhouse``): nothing is downloaded here. It is made once for each set of
  downloads and kept (``.venv/learner-envs/<their SHA-256>``): while the downloads, the
  wheelhouse and Python stay the same, the next run reuses it. In that environment's kernel, nbval
  (run under pytest, from the course's venv) executes every student notebook with the solutions
  pasted in (no cell may fail) and every student notebook as released (only its
  ``NotImplementedError`` stubs fail). Every chapter notebook the site offers runs in the same
  environment's kernel in ``tests/book/test_chapter_downloads.py`` (Run All in JupyterLab, no
  cell may fail), so it is not run a second time here.
* ``browser``: JupyterLab 4 from that environment on 127.0.0.1, a downloaded student notebook
  run in headless Chromium, a solution pasted into its first part, and ``nbgrader validate``
  (the course's venv) on the same file.

Exercise 7 needs Triton, which ``requirements-learner.txt`` leaves out (about 1 GB, optional):
it is not run here (``tests/grader/assignments/test_assignment_07.py`` runs it).
"""

import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest
from bs4 import BeautifulSoup

from scripts import environment
from tests.book.pins import pins_where, requirement_lines
from autograder.core.assignments import REGISTRY
from tests.servers import free_port, http_server

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
WHEELHOUSE = ROOT / ".venv" / "wheelhouse"
LEARNER_ENVS = ROOT / ".venv" / "learner-envs"  # one learner venv per set of downloads
CHROMIUM = Path("/usr/bin/chromium")
ASSIGNMENTS = [a.id for a in REGISTRY if not a.needs]  # what the learner's packages run
# Kernels of this test run one thread each, as in the book build (two notebooks at a time).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


# -- one source for the versions (fast) -----------------------------------------------------
def test_learner_files_and_notebooks_match_the_locks():
    """``python -m scripts.environment --check``: nothing derived from the locks is stale."""
    stale = [str(path.relative_to(ROOT)) for path in environment.out_of_date()]
    assert not stale, f"out of date, run `python -m scripts.environment --write`: {stale}"


def test_versions_come_from_the_lock_and_the_grading_interpreter():
    text = (ROOT / "requirements.lock").read_text()
    versions = environment.grading_versions()
    assert f"\nnumpy=={versions['numpy']}\n" in text and f"\ntorch=={versions['torch']}\n" in text
    # the grader is this interpreter (the course's venv), made by the Makefile's PYTHON
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == versions["python"]
    assert re.search(rf"^PYTHON \?= python{re.escape(versions['python'])}$",
                     (ROOT / "Makefile").read_text(), re.M)


def test_learner_requirements_are_the_lock_pins_without_the_build_and_grading_stack():
    """Here (the grader's Python on Linux) the file installs the lock's versions; its lines
    for other systems are ``LEARNER_PINS`` (tests/book/test_platforms.py resolves them)."""
    text = (ROOT / "requirements-learner.txt").read_text()
    pins = pins_where(text)
    lock = environment.lock_pins(environment.LOCKS[:1])
    assert {name: lock[name] for name in pins} == pins
    elsewhere = {(name, version, marker) for name, version, marker
                 in requirement_lines(text) if marker and pins.get(name) != version}
    assert elsewhere == {(pin.name, pin.version, pin.marker) for pin in environment.LEARNER_PINS}
    assert {"numpy", "matplotlib", "torch", "jupyterlab", "ipykernel"} <= set(pins)
    for tool in ("jupyter-book", "sphinx", "myst-nb", "nbgrader", "dask", "psycopg", "nbval",
                 "pytest", "playwright", "triton"):
        assert tool not in pins, tool


@pytest.mark.parametrize("aid", [a.id for a in REGISTRY])
def test_student_notebook_states_the_grading_environment(aid):
    """The released first cell names the lock's versions; the set-up cell checks the same."""
    nb = nbformat.read(ROOT / "release" / aid / f"{aid}.ipynb", as_version=4)
    versions = environment.grading_versions()
    intro, setup = nb.cells[0].source, nb.cells[1].source
    for label, name in (("Python", "python"), ("NumPy", "numpy"), ("PyTorch", "torch")):
        assert f"{label} {versions[name]}" in intro
    assert "make book" not in intro and ".venv" not in intro
    namespace = {}
    exec(setup.split(environment.CHECK_START)[1].split("\n", 1)[1], namespace)  # noqa: S102
    assert namespace["GRADER_VERSIONS"]["Python"] == versions["python"]
    for name, version in namespace["GRADER_VERSIONS"].items():
        assert version == versions.get(name.lower()), name


def test_set_up_check_warns_in_one_line_only_when_major_or_minor_differs(capsys):
    source = environment.setup_check(environment.grading_versions(), ["numpy"])
    namespace = {}
    exec(source, namespace)  # noqa: S102 - here, the versions match: nothing printed
    assert capsys.readouterr().out == ""
    differ = namespace["_versions_differ"]
    import numpy

    major, minor, *_ = numpy.__version__.split(".")
    assert differ({"numpy": f"{major}.{minor}.999"}) == []          # patch level: no warning
    assert differ({"numpy": f"{major}.{int(minor) + 1}.0"}) == [
        f"numpy {numpy.__version__} (graded with {major}.{int(minor) + 1}.0)"]
    assert differ({"not-a-package-here": "1.0"}) == [
        "not-a-package-here not installed (graded with 1.0)"]
    exec(source.replace(f"'numpy': '{numpy.__version__}'", "'numpy': '0.1'"), namespace)  # noqa: S102
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"Warning: not the grader's versions: numpy {numpy.__version__} "
                     "(graded with 0.1)"]


# -- the site's downloads -------------------------------------------------------------------
def site_downloads():
    """``{file name: path}`` of the downloads that the page *Run the chapters yourself* links."""
    page = HTML / "run-yourself.html"
    if not page.is_file():
        pytest.skip("the book is not built: run `make book` first")
    links = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser").select("a.download")
    found = {}
    for link in links:
        path = (page.parent / unquote(urlsplit(link["href"]).path)).resolve()
        assert path.is_file() and path.is_relative_to(HTML), link["href"]
        found[path.name] = path
    return found


def test_run_yourself_page_offers_the_wheel_and_the_requirements():
    downloads = site_downloads()
    wheel = environment.wheel_name()
    assert {wheel, "requirements-learner.txt", "requirements-triton.lock"} <= set(downloads)
    assert downloads["requirements-learner.txt"].read_text() == (
        ROOT / "requirements-learner.txt").read_text()
    import zipfile

    names = zipfile.ZipFile(downloads[wheel]).namelist()
    sources = sorted(p.relative_to(ROOT / "lib").as_posix()
                     for p in (ROOT / "lib" / "transformer_ref").rglob("*.py"))
    assert sorted(n for n in names if n.endswith(".py")) == sources
    text = (HTML / "run-yourself.html").read_text(encoding="utf-8")
    versions = environment.grading_versions()
    shown = " ".join(BeautifulSoup(text, "html.parser").get_text().replace("\u2019", "'").split())
    for value in (f"python{versions['python']} -m venv", f"torch=={versions['torch']}",
                  versions["numpy"], f"requirements-learner.txt {wheel}",
                  environment.TORCH_CPU_INDEX,
                  # which Pythons and systems, and what differs there (tests/book/test_platforms.py)
                  f"You need {environment.supported_pythons()}, on "
                  f"{environment.supported_platforms()}.",
                  *(f"{pin.name} {pin.version} on {pin.where}: {pin.why}"
                    for pin in environment.LEARNER_PINS),
                  "Exercise 7 runs on Linux only", f"installs Triton {versions['triton']}"):
        assert value in shown, value


@pytest.mark.parametrize("aid", [a.id for a in REGISTRY])
def test_exercise_page_states_the_versions_and_never_sends_to_the_repository(aid):
    page = HTML / "exercises" / f"{aid}.html"
    if not page.is_file():
        pytest.skip("the book is not built: run `make book` first")
    text = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser").find("article").get_text()
    versions = environment.grading_versions()
    assert (f"Python {versions['python']}, NumPy {versions['numpy']}" in text
            and f"PyTorch {versions['torch']}" in text)
    assert "make book" not in text and ".venv" not in text and "{{" not in text
    if any(a.needs for a in REGISTRY if a.id == aid):   # Triton: where it installs
        assert "It runs on Linux only" in " ".join(text.split())


def test_no_launch_button_by_default():
    for page in sorted((HTML / "chapters").glob("*.html")):
        soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        assert not soup.select(".dropdown-launch-buttons, [href*='git-pull'], "
                               "[href*='mybinder'], [href*='colab.research']"), page.name


# -- the learner environment (slow) ---------------------------------------------------------
def clean_env(**extra):
    """This process's environment without what would leak the course's tree or pip settings."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PIP_", "PYTHON", "JUPYTER", "MPLBACKEND", "VIRTUAL_ENV"))}
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf: no index, no find-links but ours
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(ONE_THREAD, **extra)
    return env


def made_from(downloaded):
    """SHA-256 of everything a learner venv is made from: the downloads, the wheelhouse's
    list and the Python that makes it."""
    digest = hashlib.sha256(sys.version.encode())
    for path in sorted(downloaded.iterdir()) + [WHEELHOUSE / ".requirements-learner.txt"]:
        digest.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def learner_venv(downloaded):
    """The learner venv made from ``downloaded`` with ``pip install --no-index`` from the
    wheelhouse: made the first time (the older ones removed), then kept and reused.

    A venv cannot move (its scripts name their own path), so it is made where it stays; it
    counts as made once its marker file is written, and a half-made one is made again."""
    key = made_from(downloaded)
    venv = LEARNER_ENVS / key[:16]
    marker = venv / ".made-from"
    LEARNER_ENVS.mkdir(parents=True, exist_ok=True)
    with open(LEARNER_ENVS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest run making it: wait for it
        if marker.is_file() and marker.read_text() == key:
            print(f"\nlearner venv: reused {venv.name} (made from the same downloads)")
            return venv / "bin" / "python"
        for old in LEARNER_ENVS.iterdir():
            if old.is_dir():
                shutil.rmtree(old)
        start = time.perf_counter()
        # No byte-compiling of every installed module (torch alone has thousands): Python
        # compiles what a kernel imports when it imports it. Minutes saved on two cores.
        quick = clean_env(PIP_NO_COMPILE="1")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=quick)
        python = venv / "bin" / "python"
        made = time.perf_counter()
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-index",
                        "--find-links", str(WHEELHOUSE), "-r", "requirements-learner.txt",
                        environment.wheel_name()], check=True, cwd=downloaded, env=quick)
        marker.write_text(key)
        print(f"\nlearner venv: created in {made - start:.1f} s, "
              f"installed in {time.perf_counter() - made:.1f} s")
        return python


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """``(folder, python)``: a fresh folder holding the site's downloads, and the Python of the
    venv made from them and the wheelhouse only (:func:`learner_venv`)."""
    if not (WHEELHOUSE / ".requirements-learner.txt").is_file():
        pytest.skip("no wheelhouse: `make test` downloads it once into .venv/wheelhouse")
    if (WHEELHOUSE / ".requirements-learner.txt").read_text() != (
            ROOT / "requirements-learner.txt").read_text():
        pytest.skip("the wheelhouse is older than requirements-learner.txt: run `make test`")
    downloads = site_downloads()
    folder = tmp_path_factory.mktemp("learner")
    downloaded = folder / "downloads"   # what a reader saves from the page
    downloaded.mkdir()
    for name in ("requirements-learner.txt", environment.wheel_name()):
        shutil.copy(downloads[name], downloaded / name)
    return folder, learner_venv(downloaded)


@pytest.mark.slow
def test_learner_env_holds_exactly_the_pinned_packages_and_the_wheel(learner):
    folder, python = learner
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=json"],
                            capture_output=True, text=True, check=True, env=clean_env()).stdout
    installed = {environment.canonical(item["name"]): item["version"].split("+")[0]
                 for item in json.loads(listed)}
    pins = pins_where((ROOT / "requirements-learner.txt").read_text())
    assert installed.pop("pip")  # the venv's own installer
    assert installed.pop("transformer-ref") == environment.wheel_name().split("-")[1]
    assert installed == pins
    where = subprocess.run([str(python), "-c", "import transformer_ref, torch; "
                            "print(transformer_ref.__file__); print(torch.__version__)"],
                           capture_output=True, text=True, check=True, cwd=folder,
                           env=clean_env()).stdout.split()
    assert Path(where[0]).is_relative_to(python.parent.parent), where  # the wheel, not lib/
    assert where[1].startswith(pins["torch"]) and "cpu" in where[1], where


def kernel_spec(folder, python):
    """A Jupyter data folder whose kernel ``learner`` is the learner venv's Python."""
    spec = folder / "jupyter" / "kernels" / "learner"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "learner", "language": "python"}))
    return folder / "jupyter"


def run_nbval(folder, python, notebooks, name):
    """Run nbval (``--nbval-lax``: every cell runs, errors fail it) in the learner kernel.

    Returns ``{notebook name: {cell index: failure text or None}}`` from its JUnit XML.
    """
    report = folder / f"{name}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
               "--rootdir", str(folder), "--nbval-lax", "--nbval-kernel-name", "learner",
               "--nbval-cell-timeout", "600", f"--junitxml={report}",
               # one kernel's start took longer than nbval's default 60 s once, in a full
               # `make test` on 2 cores with the two nbval runs at once (it passed alone)
               "--nbval-kernel-startup-timeout", "240",
               *[str(nb) for nb in notebooks]]
    return subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=clean_env(JUPYTER_PATH=str(kernel_spec(folder, python))))


ANSI = re.compile(r"(\x1b|#x1B)\[[0-9;]*m")  # IPython's colours in a traceback (as XML text)


def results(process, report):
    """``({notebook file name: {code cell number: failure text or None}}, output)``.

    nbval names its items ``Cell N``, N counting code cells only; JUnit's classname is the
    notebook's path with dots for slashes (``exercises.01-rope.ipynb``).
    """
    output = process.communicate()[0]
    assert report.is_file(), output[-3000:]
    cells = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        notebook = case.get("classname").removesuffix(".ipynb").rsplit(".", 1)[-1] + ".ipynb"
        match = re.fullmatch(r"Cell (\d+)", case.get("name", ""))
        assert match, case.attrib
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        text = None if failure is None else ANSI.sub("", failure.get("message", "")
                                                     + (failure.text or ""))
        cells.setdefault(notebook, {})[int(match.group(1))] = text
    return cells, output


def nbgrader(cell):
    return cell.metadata.get("nbgrader", {})


def with_solutions(aid):
    """The released notebook with each solution cell's source from the source notebook."""
    release = nbformat.read(ROOT / "release" / aid / f"{aid}.ipynb", as_version=4)
    source = {nbgrader(c).get("grade_id"): c.source
              for c in nbformat.read(ROOT / "solutions" / aid / f"{aid}.ipynb", as_version=4).cells}
    for cell in release.cells:
        if nbgrader(cell).get("solution"):
            cell.source = source[nbgrader(cell)["grade_id"]]
    return release


def expected_student_failures(aid):
    """``{code cell number: names the failure may name}`` for the released notebook.

    A stub that raises at top level fails with NotImplementedError; a test cell with code
    fails with NotImplementedError (it calls a stub) or with a NameError for an ``ANSWER_...``
    variable that only the solution defines.
    """
    release = nbformat.read(ROOT / "release" / aid / f"{aid}.ipynb", as_version=4)
    answers = set()
    for cell in nbformat.read(ROOT / "solutions" / aid / f"{aid}.ipynb", as_version=4).cells:
        if nbgrader(cell).get("solution") and cell.cell_type == "code":
            answers |= set(re.findall(r"^(\w+)\s*=", cell.source, re.M))
    expected = {}
    for index, cell in enumerate(c for c in release.cells if c.cell_type == "code"):
        code = [line for line in cell.source.splitlines() if line.strip() and
                not line.strip().startswith("#")]
        if nbgrader(cell).get("solution") and "raise NotImplementedError()" in code:
            expected[index] = set()
        elif nbgrader(cell).get("grade") and not nbgrader(cell).get("solution") and code:
            expected[index] = answers
    return expected


@pytest.mark.slow
def test_downloaded_exercises_run_in_the_learner_env(learner):
    """Student notebooks with solutions: no cell fails. As released: exactly the stubs and
    the tests that call them fail, with NotImplementedError."""
    folder, python = learner
    (folder / "exercises").mkdir()
    for aid in ASSIGNMENTS:
        shutil.copy(ROOT / "release" / aid / f"{aid}.ipynb", folder / "exercises")
        nbformat.write(with_solutions(aid), folder / "exercises" / f"{aid}-solved.ipynb")
    start = time.perf_counter()
    process = run_nbval(folder, python, sorted((folder / "exercises").glob("*.ipynb")), "exercises")
    exercise_cells = results(process, folder / "exercises.xml")[0]
    print(f"\nnbval: exercises {time.perf_counter() - start:.1f} s")

    assert sorted(exercise_cells) == sorted(
        [f"{aid}.ipynb" for aid in ASSIGNMENTS] + [f"{aid}-solved.ipynb" for aid in ASSIGNMENTS])
    for aid in ASSIGNMENTS:
        solved = exercise_cells[f"{aid}-solved.ipynb"]
        assert solved and not any(solved.values()), f"{aid} with solutions: {solved}"
        student = exercise_cells[f"{aid}.ipynb"]
        failed = {i for i, text in student.items() if text}
        expected = expected_student_failures(aid)
        assert failed == set(expected), (aid, sorted(failed), sorted(expected))
        for index in failed:
            text = student[index]
            names = re.findall(r"NameError: name '(\w+)' is not defined", text)
            assert "NotImplementedError" in text or (names and set(names) <= expected[index]), (
                aid, index, text[-800:])


# -- the student's path in a browser ---------------------------------------------------------
@pytest.fixture
def jupyterlab(learner):
    """``(base URL, token, folder)`` of JupyterLab 4 from the learner venv, stopped at the end."""
    folder, python = learner
    work = folder / "lab"
    work.mkdir()
    port, token = free_port(), secrets.token_hex(16)
    # every cell in the page (JupyterLab 4 may otherwise leave off-screen cells unrendered)
    settings = folder / "lab-settings"
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    # and the notebook's kernel started without asking (the box "Always start the preferred
    # kernel" of the dialog JupyterLab may show first)
    tracker.write_text(json.dumps({"windowingMode": "none", "autoStartDefaultKernel": True}))
    env = clean_env(JUPYTER_CONFIG_DIR=str(folder / "lab-config"),
                    JUPYTER_DATA_DIR=str(folder / "lab-data"),
                    JUPYTER_RUNTIME_DIR=str(folder / "lab-runtime"))
    argv = [str(python), "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}",
            "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly", f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={folder / 'lab-workspaces'}",
            *(["--allow-root"] if os.geteuid() == 0 else [])]  # CI containers run as root
    base = f"http://127.0.0.1:{port}"
    with http_server(argv, cwd=work, env=env, log_path=folder / "jupyterlab.log",
                     ready_url=f"{base}/api/status?token={token}"):
        yield base, token, work


def validate(notebook):
    """``nbgrader validate`` in the course's venv: the text it reports."""
    nbgrader_exe = Path(sys.executable).with_name("nbgrader")
    done = subprocess.run([str(nbgrader_exe), "validate", str(notebook)], capture_output=True,
                          text=True, cwd=notebook.parent, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "MPLBACKEND"})
    return done.stdout + done.stderr


def without_markers(source):
    return "\n".join(line for line in source.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))



@pytest.mark.slow
@pytest.mark.browser
def test_student_notebook_in_jupyterlab_then_nbgrader_validate(jupyterlab):
    if not CHROMIUM.is_file():
        pytest.skip("Chromium not found at /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    from tests.book.test_site_browser import loopback_chromium

    base, token, work = jupyterlab
    aid = "01-rope"
    notebook = work / f"{aid}.ipynb"
    shutil.copy(site_student_notebook(aid), notebook)
    release = nbformat.read(notebook, as_version=4)
    index = {nbgrader(c).get("grade_id"): i for i, c in enumerate(release.cells)}
    solution = without_markers(with_solutions(aid).cells[index["p1_solution"]].source)
    first_visible = release.cells[index["p1_visible"]].source.splitlines()[0]
    second_visible = release.cells[index["p2_visible"]].source.splitlines()[0]

    with loopback_chromium() as chromium:
        with chromium.new_context(viewport={"width": 1280, "height": 900}) as context:
            page = context.new_page()
            page.goto(f"{base}/lab/tree/{notebook.name}?token={token}")
            cells = page.locator(".jp-Notebook .jp-Cell")
            cells.nth(index["p1_solution"]).wait_for(timeout=90_000)
            sync_api.expect(page.locator(".jp-StatusBar-Widget", has_text="| Idle")).to_be_visible(
                timeout=90_000)   # the status bar: "Python 3 (ipykernel) | Idle"
            news = page.get_by_role("button", name="No", exact=True)  # "notified about news?"
            if news.count():
                news.click()

            def menu(name, item):   # what a student clicks, e.g. Run -> Run All Cells
                page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{name}$")).click()
                page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).click()

            def run_all():
                menu("Run", "Run All Cells")

            def output(grade_id):
                return cells.nth(index[grade_id]).locator(".jp-OutputArea")

            run_all()   # Jupyter stops at the first error: part 1's visible test calls a stub
            sync_api.expect(output("p1_visible")).to_contain_text("NotImplementedError",
                                                                  timeout=90_000)
            assert "Warning" not in output("setup").inner_text()  # the grader's versions
            editor = cells.nth(index["p1_solution"]).locator(".cm-content")
            editor.click()
            page.keyboard.press("Control+A")
            page.keyboard.insert_text(solution)   # as a paste: no auto-indent
            run_all()
            sync_api.expect(output("p1_visible")).to_contain_text("visible tests passed",
                                                                  timeout=90_000)
            sync_api.expect(output("p2_visible")).to_contain_text("NotImplementedError",
                                                                  timeout=90_000)
            def saved():
                return "base ** (-2.0 * i / head_dim)" in notebook.read_text()

            # Wait with Playwright, not time.sleep: every request of the page, the save's
            # PUT included, goes through ``guard``, which runs only while Playwright has the
            # thread (a time.sleep held the save back until the next click, 40 s later).
            menu("File", "Save Notebook")
            deadline = time.monotonic() + 60
            while not saved() and time.monotonic() < deadline:
                page.wait_for_timeout(200)
            assert saved(), "JupyterLab did not save the notebook"
    assert not chromium.offsite, chromium.offsite

    # Validate on the saved file says what the browser showed: part 1 passes, part 2 raises
    report = validate(notebook)
    assert "VALIDATION FAILED" in report and "NotImplementedError" in report
    assert first_visible not in report and second_visible in report


def site_student_notebook(aid):
    """The student notebook that the exercise page's download link serves."""
    page = HTML / "exercises" / f"{aid}.html"
    for link in BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser").select("a.download"):
        if link["href"].endswith(f"{aid}.ipynb"):
            return (page.parent / unquote(urlsplit(link["href"]).path)).resolve()
    raise AssertionError(f"{page.name} links no {aid}.ipynb")
