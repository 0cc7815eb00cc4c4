"""The audit's findings as a typed record, and how they join a student's result.

A hand-made student version with two locked cells; the submission edits one and
deletes the other, imports ``autograder`` and writes one function.
"""

import nbformat

from autograder.core.results import StudentResult
from autograder.worker.audit import AuditFindings, audit


def cell(source, gid=None, locked=False):
    c = nbformat.v4.new_code_cell(source)
    if gid:
        c.metadata["nbgrader"] = {"grade_id": gid, "locked": locked, "grade": False,
                                  "solution": False, "schema_version": 3}
    return c


RELEASE = nbformat.v4.new_notebook(cells=[
    cell("import numpy as np", "setup", locked=True),
    cell("def f(x):\n    raise NotImplementedError()", "answer"),
    cell("assert f(1) == 2", "check", locked=True),
])


def test_an_edited_and_a_deleted_locked_cell_and_a_flag_are_found():
    submission = nbformat.v4.new_notebook(cells=[
        cell("import numpy as np  # edited\nimport os", "setup"),
        cell("import autograder\ndef f(x):\n    return 2 * x", "answer"),
    ])
    found = audit(submission, RELEASE)
    assert isinstance(found, AuditFindings)
    assert (found.tampered, found.deleted) == (["setup"], ["check"])
    assert found.flags == ["imports-autograder"]
    assert list(found.functions) == ["f"] and "return 2 * x" in found.functions["f"]


def test_findings_join_a_result_once_each_in_order():
    result = StudentResult(student="eve", flags=["reseated"], tampered=["a"])
    AuditFindings(tampered=["a", "b"], flags=["mentions-sdpa"], functions={"f": "def f(): 1"}
                  ).record(result)
    AuditFindings(tampered=["b", "c"], deleted=["d"], flags=["mentions-sdpa"],
                  resemblances=["r"]).record(result)
    assert result.tampered == ["a", "b", "c"] and result.deleted == ["d"]
    assert result.flags == ["reseated", "mentions-sdpa"] and result.resemblances == ["r"]
    assert result.functions == {"f": "def f(): 1"}
