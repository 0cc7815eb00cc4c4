"""Student versions: ``solutions/<id>/`` -> ``release/<id>/`` with nbgrader.

``generate`` is nbgrader's ``generate_assignment`` with this course's settings.
Its output is deterministic, so the committed ``release/`` can be checked
against a fresh generation: :func:`stale_notebooks` lists the notebooks whose
:func:`normalize`-d content differs.

The self-check (``course.toml``'s ``self_check``, :func:`autograder.core.policy.load_self_check`):
the source notebooks carry a self-check set-up cell and a ``check("pN")`` cell at the end of
each part, plain cells tagged :data:`SELF_CHECK_TAG`. ``generate`` keeps them (``full``,
``visible``) or removes them (``off``), and :func:`write_selfcheck` writes the package the
site offers, ``release/selfcheck/<SELFCHECK_WHEEL>``: the judge's in-process way in
(:mod:`autograder.judge.verdict`, :mod:`autograder.selfcheck`), in ``full`` mode the checks
(:mod:`autograder.checks`, the grader's own files) and one bank per assignment
(:func:`selfcheck_bank`). A student version never holds a hidden test, an expected value or a
solution in any mode; with ``off`` nothing of the hidden checks ships.
"""

import ast
import copy
import hashlib
import io
import json
import tempfile
import zipfile
from base64 import urlsafe_b64encode
from pathlib import Path

import nbformat

from ..core.assignments import source_assignments
from .parts import part_id
from ..core.cells import (grade_id, is_setup_cell, is_solution, is_test_cell, is_written_answer,
                          judged_source, nbgrader_meta, visible_source)
from ..core.course_files import GRADEBOOK, RELEASE, SOURCE
from ..core.gradebook import sqlite_url
from ..core.limits import Limits
from ..core.nbgrader_config import course_config, prepare_nbgrader
from ..core.policy import load_self_check

SELF_CHECK_TAG = "self-check"
SELFCHECK_DIR = "selfcheck"  # under release/
SELFCHECK_NAME, SELFCHECK_VERSION = "attention_selfcheck", "0.1.0"
SELFCHECK_WHEEL = f"{SELFCHECK_NAME}-{SELFCHECK_VERSION}-py3-none-any.whl"
# the grader's own modules the package is made of (paths under autograder/)
SELFCHECK_MODULES = ("__init__.py", "judge/__init__.py", "judge/verdict.py", "kernel/__init__.py",
                     "kernel/probe.py", "selfcheck/__init__.py")
# what a notebook's self-check set-up cell imports: a name of its own, so that the course's cell
# never reads as student code that imports the grader (the audit's ``imports-autograder``)
SELFCHECK_ENTRY = ('"""Check my work: ``SelfCheck`` of :mod:`autograder.selfcheck` (this package\'s '
                   'entry point)."""\n\nfrom autograder.selfcheck import CellResult, SelfCheck  '
                   '# noqa: F401\n')


def generate(assignment, root=".", release_dir=None, db_url=None):
    """Generate the student version of ``assignment``; return its folder.

    ``release_dir`` (absolute, or relative to ``root``) defaults to ``release``;
    ``db_url`` to a throw-away SQLite gradebook, because the student version
    does not depend on it (``grade`` registers the assignment in the real one).
    """
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory

    prepare_nbgrader()
    root = Path(root).resolve()
    with tempfile.TemporaryDirectory(prefix="autograder-gen-") as tmp:
        c = course_config(root, db_url or sqlite_url(Path(tmp) / GRADEBOOK), assignment=assignment)
        c.CourseDirectory.release_directory = str(release_dir or RELEASE)
        c.BaseConverter.force = True
        GenerateAssignment(coursedir=CourseDirectory(config=c), config=c).start()
    folder = root / (release_dir or RELEASE) / assignment
    if load_self_check(root).mode == "off":
        for path in sorted(folder.glob("*.ipynb")):
            nb = nbformat.read(path, 4)
            nb.cells = [c for c in nb.cells if not is_self_check_cell(c)]
            nbformat.write(nb, path)
    return folder


def normalize(nb):
    """A copy of notebook ``nb`` without what may legitimately vary between runs.

    Outputs, execution counts, execution timing and widget state are dropped;
    cell sources are compared as text. Two student versions are the same if
    their normalized forms are equal.
    """
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if isinstance(cell.source, list):
            cell.source = "".join(cell.source)
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def stale_notebooks(assignment, root="."):
    """Relative paths of committed student notebooks that differ from a fresh generation."""
    root = Path(root).resolve()
    with tempfile.TemporaryDirectory(prefix="autograder-rel-") as tmp:
        fresh = generate(assignment, root, release_dir=Path(tmp) / "release")
        stale = []
        for new in sorted(fresh.glob("*.ipynb")):
            old = root / RELEASE / assignment / new.name
            if not old.exists() or normalize(nbformat.read(old, 4)) != normalize(nbformat.read(new, 4)):
                stale.append(str(old.relative_to(root)))
        return stale


# -- the self-check -------------------------------------------------------------------------
def is_self_check_cell(cell):
    """A self-check cell of a source or student notebook (its set-up or a part's check)."""
    return SELF_CHECK_TAG in cell.get("metadata", {}).get("tags", [])


def selfcheck_bank(nb, assignment, mode="full", answers="reveal", cell_timeout=Limits.cell_timeout):
    """What the self-check of ``assignment`` needs from its *source* notebook ``nb``.

    ``{"assignment", "mode", "cell_timeout", "setup": set-up cells' source, "parts": [{"id":
    "p1", "number": "Part 1", "title", "functions": names the part's solution cells define,
    "tests": [{"grade_id", "points", "source", "hidden"}], "written": [{"grade_id", "points",
    "model_answer"}]}]}``. A test's ``source`` is what the judge runs (``full``) or only what
    the student version shows (``visible``; ``hidden`` then says the cell has hidden tests it
    cannot run). A model answer is there only in ``full`` mode with ``answers="reveal"``.
    """
    parts = {}

    def part(pid):
        return parts.setdefault(pid, {"id": pid, "number": f"Part {pid[1:]}", "title": f"Part {pid[1:]}",
                                      "functions": [], "tests": [], "written": []})

    setup = []
    for cell in nb.cells:
        gid = grade_id(cell)
        pid = part_id(gid)
        if is_setup_cell(cell):
            setup.append(cell.source)
        elif pid is None:
            continue
        elif cell.cell_type == "markdown" and not nbgrader_meta(cell).get("grade"):
            heading = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
            if heading.startswith("## "):
                part(pid)["title"] = heading[3:].strip()
        elif is_test_cell(cell):
            hidden = judged_source(cell.source) != visible_source(cell.source)
            source = judged_source(cell.source) if mode == "full" else visible_source(cell.source)
            part(pid)["tests"].append({"grade_id": gid, "points": float(nbgrader_meta(cell)["points"]),
                                       "source": source, "hidden": hidden and mode != "full"})
        elif is_written_answer(cell):
            reveal = mode == "full" and answers == "reveal"
            part(pid)["written"].append({"grade_id": gid, "points": float(nbgrader_meta(cell)["points"]),
                                         "model_answer": cell.source.strip() if reveal else None})
        elif cell.cell_type == "code" and is_solution(cell):
            tree = ast.parse(visible_source(cell.source))
            part(pid)["functions"] += [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    return {"assignment": assignment, "mode": mode, "cell_timeout": cell_timeout,
            "setup": "\n\n".join(setup), "parts": list(parts.values())}


def selfcheck_files(root="."):
    """``{path in the package: bytes}`` of the self-check package for the course at ``root``
    under its ``course.toml`` (empty with ``self_check = "off"``)."""
    settings = load_self_check(root)
    if settings.mode == "off":
        return {}
    package = Path(__file__).resolve().parents[1]
    files = {f"autograder/{name}": (package / name).read_bytes() for name in SELFCHECK_MODULES}
    files[f"{SELFCHECK_NAME}/__init__.py"] = SELFCHECK_ENTRY.encode()
    if settings.mode == "full":
        files.update({f"autograder/checks/{p.name}": p.read_bytes()
                      for p in sorted((package / "checks").glob("*.py"))})
    for assignment in source_assignments(root):
        nb = nbformat.read(Path(root) / SOURCE / assignment / f"{assignment}.ipynb", 4)
        bank = selfcheck_bank(nb, assignment, settings.mode, settings.answers)
        files[f"autograder/selfcheck/bank/{assignment}.json"] = \
            (json.dumps(bank, indent=1, sort_keys=True) + "\n").encode()
    return files


def selfcheck_wheel(files):
    """A wheel (bytes) holding ``files``, byte for byte the same for the same files."""
    dist = f"{SELFCHECK_NAME}-{SELFCHECK_VERSION}.dist-info"
    files = dict(files)
    files[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {SELFCHECK_NAME}\nVersion: {SELFCHECK_VERSION}\n"
        "Summary: Check my work: the course's own test cells, run on your functions before you "
        "hand a notebook in (Attention, Part 2).\nRequires-Python: >=3.11\nRequires-Dist: numpy\n"
        "Requires-Dist: nbformat\n").encode()
    files[f"{dist}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: autograder.host.release\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = [f"{name},sha256={urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
              for name, data in sorted(files.items())]
    files[f"{dist}/RECORD"] = ("\n".join(record + [f"{dist}/RECORD,,"]) + "\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return out.getvalue()


def write_selfcheck(root="."):
    """Write ``release/selfcheck/<SELFCHECK_WHEEL>`` (or remove it, ``off``); return its path or None."""
    root = Path(root).resolve()
    folder = root / RELEASE / SELFCHECK_DIR
    files = selfcheck_files(root)
    for old in folder.glob("*.whl") if folder.is_dir() else []:
        old.unlink()
    if not files:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        return None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SELFCHECK_WHEEL).write_bytes(selfcheck_wheel(files))
    return folder / SELFCHECK_WHEEL


def stale_selfcheck(root="."):
    """``[relative path]`` of the self-check package if it differs from a fresh one (or should
    not be there), else ``[]``."""
    root = Path(root).resolve()
    path = root / RELEASE / SELFCHECK_DIR / SELFCHECK_WHEEL
    files = selfcheck_files(root)
    if not files:
        return [str(path.relative_to(root))] if path.exists() else []
    if not path.is_file() or path.read_bytes() != selfcheck_wheel(files):
        return [str(path.relative_to(root))]
    return []
