"""What a submission did to the notebook it was given, checked before grading.

nbgrader restores edited test cells silently (it logs a checksum warning that
honest students get too) and does not restore deleted ones. Here a submission
is compared with the student version generated from the source notebook:

* ``tampered``: a locked cell (set-up or test) whose source differs;
* ``deleted``: a locked cell whose ``grade_id`` no longer appears. It is put back
  (after the cell that preceded it) so its tests are graded like everyone's;
* ``flags``: student-written code that uses ``transformer_ref``, ``autograder``,
  any name of the ``scaled_dot_product`` family (``mentions-sdpa``) or dynamic imports, or that
  resembles a function of ``transformer_ref`` (``resembles-reference``, details in
  ``resemblances``). Flags go to a human; they never change a score. Patterns in the
  source are only a hint: SDPA fetched by a computed name does not match one, so the
  flag that counts, ``calls-sdpa``, is recorded by the judge from the calls it makes
  (:func:`autograder.judge.verdict.sdpa_flags`);
* ``functions``: name -> source of every function the student wrote, for the
  class-wide comparison (:func:`autograder.core.similarity.fingerprints`, kept by the driver).
"""

import copy
import io
import re
import tokenize
from dataclasses import dataclass, field

from ..core.cells import grade_id, is_locked

# flag name -> pattern searched in student code with comments removed
FORBIDDEN = {
    "imports-transformer_ref": re.compile(r"\btransformer_ref\b"),
    "imports-autograder": re.compile(r"\bautograder\b"),
    # any name of the SDPA family: the public one and the private kernels (_..._math, ...)
    "mentions-sdpa": re.compile(r"scaled_dot_product"),
    "dynamic-import": re.compile(r"\b__import__\b|\bimportlib\b|\bsys\.modules\b"),
}


def locked_cells(release_nb):
    """grade_id -> cell for the locked cells of a student version."""
    return {grade_id(c): c for c in release_nb.cells if is_locked(c) and grade_id(c)}


def strip_comments(source):
    """Source without comments (raw source if it does not tokenize, e.g. magics)."""
    try:
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        return " ".join(t.string for t in tokens if t.type != tokenize.COMMENT)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source


@dataclass(frozen=True)
class AuditFindings:
    """What :func:`audit` found in one notebook (the module's docstring says what each means)."""

    tampered: list[str] = field(default_factory=list)      # grade ids of edited locked cells
    deleted: list[str] = field(default_factory=list)       # grade ids of deleted locked cells
    flags: list[str] = field(default_factory=list)         # flag names, sorted
    resemblances: list[str] = field(default_factory=list)  # one line per resemblance
    functions: dict[str, str] = field(default_factory=dict)  # name -> source the student wrote

    def record(self, result):
        """Add these findings to ``result`` (a :class:`~autograder.core.results.StudentResult`
        that may hold another notebook's): each item once, in the order found."""
        for found, kept in ((self.tampered, result.tampered), (self.deleted, result.deleted),
                            (self.flags, result.flags), (self.resemblances, result.resemblances)):
            kept.extend(x for x in found if x not in kept)
        result.functions.update(self.functions)


def audit(submission_nb, release_nb) -> AuditFindings:
    """Compare a submission with its student version."""
    from ..core.similarity import functions, resembles_reference

    locked = locked_cells(release_nb)
    # the stubs as handed out: a function still equal to its stub is nobody's work
    stubs = {shape_of(source) for c in release_nb.cells if c.cell_type == "code"
             for _, source, _ in functions(c.source)}
    seen, tampered, flags, resemblances, written = set(), [], set(), [], {}
    for cell in submission_nb.cells:
        gid = grade_id(cell)
        if gid in locked:
            seen.add(gid)
            original = locked[gid]
            if cell.cell_type != original.cell_type or cell.source.strip() != original.source.strip():
                tampered.append(gid)
        elif cell.cell_type == "code":
            code = strip_comments(cell.source)
            flags.update(name for name, pattern in FORBIDDEN.items() if pattern.search(code))
            found = resembles_reference(cell.source)
            if found:
                flags.add("resembles-reference")
                resemblances += [r.describe() for r in found]
            written.update((name, source) for name, source, _ in functions(cell.source)
                           if shape_of(source) not in stubs)
    deleted = [gid for gid in locked if gid not in seen]
    return AuditFindings(tampered=tampered, deleted=deleted, flags=sorted(flags),
                         resemblances=resemblances, functions=written)


def shape_of(source):
    """A function's token shape (see :func:`autograder.core.similarity.shape`), as a hashable value."""
    from ..core.similarity import shape

    return tuple(token for token, _ in shape(source))


def restore_deleted(submission_nb, release_nb):
    """A copy of the submission with every deleted locked cell put back in place.

    A missing cell goes right after the submission's copy of the release cell
    that preceded it (or first, if none survives).
    """
    nb = copy.deepcopy(submission_nb)
    present = {grade_id(c) for c in nb.cells}
    previous = None  # grade_id of the last release cell known to be in nb
    for cell in release_nb.cells:
        gid = grade_id(cell)
        if gid is None:
            continue
        if gid not in present and is_locked(cell):
            ids = [grade_id(c) for c in nb.cells]
            at = ids.index(previous) + 1 if previous in ids else 0
            nb.cells.insert(at, copy.deepcopy(cell))
            present.add(gid)
        if gid in present:
            previous = gid
    return nb
