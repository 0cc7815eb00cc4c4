"""The copy detectors: a flag for a human, never a score.

* the course's own solutions (written independently of the library's code paths)
  do not resemble ``transformer_ref``;
* a function pasted from ``transformer_ref``, with its local names changed, does,
  and the flag names the reference function and the matching lines;
* across a class, two students with the same function (renamed) are paired, a
  student with a different implementation is not.
"""

import inspect
import textwrap
from pathlib import Path

import nbformat
import pytest

from autograder.core import similarity
from autograder.worker.audit import audit
from transformer_ref import numpy as ref

ROOT = Path(__file__).resolve().parents[3]
SOURCES = sorted((ROOT / "solutions").glob("*/*.ipynb"))


def solution_cells(path):
    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")]


@pytest.mark.parametrize("path", SOURCES, ids=[p.parent.name for p in SOURCES])
def test_the_course_solutions_do_not_resemble_the_reference(path):
    for source in solution_cells(path):
        assert similarity.resembles_reference(source) == []


def renamed(fn, old, new):
    return textwrap.dedent(inspect.getsource(fn)).replace(old, new)


@pytest.mark.parametrize("fn, old, new", [(ref.apply_rope, "x", "vec"),
                                          (ref.flash_attention, "q", "queries"),
                                          (ref.layer_norm, "x", "h")])
def test_a_pasted_reference_function_is_flagged_with_its_lines(fn, old, new):
    source = "import numpy as np\n\n" + renamed(fn, old, new)
    found = similarity.resembles_reference(source)
    assert len(found) == 1 and found[0].function == fn.__name__
    assert found[0].source.endswith(f":{fn.__name__}") and found[0].share >= 0.8
    assert found[0].lines[0] >= 3 and found[0].lines[-1] <= source.count("\n") + 1


def test_audit_flags_resemblance_and_collects_functions():
    release = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    pasted = "import numpy as np\n" + renamed(ref.apply_rope, "x", "y")
    submission = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(pasted)])
    found = audit(submission, release)
    assert "resembles-reference" in found.flags
    assert found.resemblances and "apply_rope" in found.resemblances[0]
    assert set(found.functions) == {"apply_rope"}


def test_classmates_with_the_same_function_are_paired():
    cells = solution_cells(ROOT / "solutions" / "03-causal-mask" / "03-causal-mask.ipynb")
    masked = next(s for s in cells if "def masked_softmax" in s).replace("### BEGIN SOLUTION", "") \
        .replace("### END SOLUTION", "")
    own = ("def masked_softmax(scores, mask):\n"
           "    allowed = np.broadcast_to(mask, scores.shape)\n"
           "    top = np.max(np.where(allowed, scores, -np.inf), axis=-1, keepdims=True)\n"
           "    top = np.where(np.isfinite(top), top, 0.0)\n"
           "    e = np.where(allowed, np.exp(scores - top), 0.0)\n"
           "    total = e.sum(axis=-1, keepdims=True)\n"
           "    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)\n")
    solutions = {"ann": {"masked_softmax": masked},
                 "ben": {"masked_softmax": masked.replace("scores", "logits")},
                 "cat": {"masked_softmax": own}}
    pairs = similarity.similar_pairs(solutions)
    assert [(a, b, f) for a, b, f, _ in pairs] == [("ann", "ben", "masked_softmax")]


def test_functions_still_equal_to_their_stub_are_nobodys_work():
    """Two untouched notebooks share the stubs: that is not copying."""
    release = nbformat.read(ROOT / "release" / "06-flash-attention" / "06-flash-attention.ipynb",
                            as_version=4)
    assert audit(release, release).functions == {}
    solved = nbformat.read(ROOT / "solutions" / "06-flash-attention" / "06-flash-attention.ipynb",
                           as_version=4)
    assert "flash_attention" in audit(solved, release).functions
