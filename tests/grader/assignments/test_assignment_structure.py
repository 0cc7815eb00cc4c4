"""The six assignments' notebooks: structure, points, stubs, and nothing hidden leaks.

* every solution cell has a stub, grade ids are unique, the points table of each
  intro matches the cells' metadata, hidden tests are one call into ``autograder.checks``;
* student versions (``release/``) and the built site (when built) hold no solution or
  hidden-test text; each exercise page links its student version;
* the student versions declare exactly the signatures the solutions have, so the
  checks' calls (by keyword where they can) bind to what students see.
"""

import ast
import html
import json
import re

import pytest

from notebooks import (ASSIGNMENTS, FORBIDDEN_MARKERS, ROOT, meta, read, release_path,
                       solution_lines, source_path)


@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_folder_holds_only_the_notebook(aid):
    """nbgrader copies every file of solutions/<id>/ to students."""
    files = sorted(p.name for p in (ROOT / "solutions" / aid).iterdir() if p.name != ".ipynb_checkpoints")
    assert files == [f"{aid}.ipynb"]


@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_source_structure(aid):
    nb = read(source_path(aid))
    assert nb.metadata.kernelspec.name == "python3"
    ids = [meta(c)["grade_id"] for c in nb.cells if meta(c)]
    assert len(ids) == len(set(ids)), "grade ids must be unique"
    setup = nb.cells[1]
    assert meta(setup)["locked"] and not meta(setup)["solution"] and "filterwarnings" in setup.source
    for cell in nb.cells:
        m = meta(cell)
        if m.get("solution") and cell.cell_type == "code":
            assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source, m["grade_id"]
        if m.get("grade") and cell.cell_type == "code":
            assert m["locked"] and m["points"] > 0, m["grade_id"]
            hidden = re.findall(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", cell.source, re.S)
            visible = m["grade_id"].endswith("_visible")
            assert len(hidden) == (0 if visible else 1), \
                f"{m['grade_id']}: hidden tests only in hidden-test cells, one block each"
            if hidden:
                calls = [line for line in hidden[0].splitlines() if not line.startswith("import ")]
                assert len(calls) == 1 and calls[0].startswith("_checks."), \
                    f"{m['grade_id']}: the hidden block is one call into autograder.checks"
    written = [c for c in nb.cells if c.cell_type == "markdown" and meta(c).get("grade")]
    assert len(written) == 1 and meta(written[0])["solution"], "one manually graded answer"


@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_intro_points_table_matches_metadata(aid):
    nb = read(source_path(aid))
    rows = re.findall(r"^\| (\d+) \| .* \| (\d+) \|$", nb.cells[0].source, re.M)
    table = {int(part): int(points) for part, points in rows}
    metadata = {}
    for cell in nb.cells:
        m = meta(cell)
        if m.get("grade"):
            part = int(re.match(r"p(\d+)_", m["grade_id"]).group(1))
            metadata[part] = metadata.get(part, 0) + m["points"]
    assert table == metadata
    total = re.search(r"\*\*Total\*\* \| \*\*(\d+)\*\*", nb.cells[0].source).group(1)
    assert int(total) == sum(metadata.values())


@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_student_version_has_stubs_and_nothing_hidden(aid):
    source, release = read(source_path(aid)), read(release_path(aid))
    assert [meta(c).get("grade_id") for c in source.cells] == [meta(c).get("grade_id") for c in release.cells]
    text = json.dumps([c.source for c in release.cells])
    for marker in FORBIDDEN_MARKERS:
        assert marker not in text, marker
    for line in solution_lines(aid):
        assert line not in text, line
    for cell in release.cells:
        if meta(cell).get("solution"):
            stub = "raise NotImplementedError()" if cell.cell_type == "code" else "YOUR ANSWER HERE"
            assert stub in cell.source, meta(cell)["grade_id"]
        assert not cell.get("outputs"), "student versions carry no outputs"


def test_built_site_has_no_solution_text():
    site = ROOT / "_build" / "html"
    if not site.exists():
        pytest.skip("the book is not built (make book)")
    secrets = set(FORBIDDEN_MARKERS) | {line for aid in ASSIGNMENTS for line in solution_lines(aid, 60)}
    for path in list(site.rglob("*.html")) + list(site.rglob("*.ipynb")):
        text = path.read_text(errors="replace")
        if path.suffix == ".html":
            text = html.unescape(re.sub(r"<[^>]+>", "", text))
        for secret in secrets:
            assert secret not in text, f"{path.relative_to(site)} contains {secret!r}"


@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_exercise_page_links_the_student_version(aid):
    page = (ROOT / "exercises" / f"{aid}.md").read_text()
    assert f"../release/{aid}/{aid}.ipynb>`" in page
    assert "{doc}`../chapters/" in page


def stub_signatures(path):
    """name -> argument list of every function a notebook's solution cells define."""
    found = {}
    for cell in read(path).cells:
        if cell.cell_type == "code" and meta(cell).get("solution"):
            tree = ast.parse(cell.source.replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", ""))
            found.update({n.name: ast.unparse(n.args) for n in tree.body if isinstance(n, ast.FunctionDef)})
    return found


@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_stubs_declare_the_signatures_the_checks_call(aid):
    """The checks call the solution's signature (by keyword where they can): students see the same one."""
    source, release = stub_signatures(source_path(aid)), stub_signatures(release_path(aid))
    assert source and source == release


def test_the_registry_is_the_courses_source_folders():
    """One answer to which assignments exist: the registry the tests, benchmarks and book read
    is the list the grader reads from ``solutions/``."""
    from autograder.core.assignments import REGISTRY, source_assignments

    assert [a.id for a in REGISTRY] == source_assignments(ROOT)
