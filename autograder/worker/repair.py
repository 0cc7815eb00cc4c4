"""What can be graded in a notebook that breaks nbformat's schema or the assignment's grading
metadata, and what is wrong with it, before nbgrader sees it.

One line of a submission used to make it ungradable for good: nbgrader validates and rewrites
the notebook, and a value nbformat's schema refuses, or a graded cell nbgrader's gradebook does
not know, ends the whole notebook with ``NbGraderException`` and no score. Here each fault is
repaired in the staged copy (the student's files are never changed) and named, so the notebook
is graded on the assignment's own cells and the instructor and the student read what was wrong:

* ``invalid-notebook``: what nbformat's schema refuses is dropped or replaced, one value at a
  time: a metadata entry (a ``name`` with a newline, a tag with a comma, an empty
  ``kernelspec``) is removed from the cell or notebook that holds it, a cell id that is not
  ``[a-zA-Z0-9-_]{1,64}`` or repeats gets a fresh one, a malformed output or attachment is
  dropped. Source cells are never dropped.
* ``edited-metadata``: a cell's nbgrader metadata is the assignment's: a graded or solution
  cell the student version does not have (an extra graded cell, a copied one) becomes an
  ordinary cell, and a known cell whose ``points``, ``grade``, ``solution``, ``locked`` or
  ``task`` differ from the student version's gets them back (a raised ``points`` counts for
  the assignment's points).
* ``missing-attachment``: a markdown image ``attachment:NAME`` that the cell does not hold as
  an image (an honest copy of a cell leaves it behind): it shows as its alt text
  (:func:`autograder.core.sanitize.markdown2html`), and is named.

:func:`repair` returns the notebook to grade and the problems found: ``(flag, message)``.
"""

import copy
import re
import uuid

from nbformat import validator

from ..core.cells import grade_id
from ..core.sanitize import IMAGE_MIME_TYPES
from ..core.untrusted import printable

GRADING_KEYS = ("grade_id", "grade", "solution", "locked", "task", "points")
_ATTACHMENT = re.compile(r"attachment:([^\s)\"'>]+)")
_CELL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
MAX_REPAIRS = 200  # schema repairs of one notebook: past that it is not worth grading


def _shown(value, size=40):
    text = printable(repr(value))
    return text if len(text) <= size else text[:size] + "..."


def repair(nb, release):
    """``(notebook, [(flag, message)])``: a repaired copy of ``nb`` and each problem found.

    ``release`` is the student version of the notebook (the assignment's cells and metadata).
    """
    nb = copy.deepcopy(nb)
    problems = []
    problems += [("invalid-notebook", m) for m in _fix_cell_ids(nb)]
    problems += [("invalid-notebook", m) for m in _fix_schema(nb)]
    problems += [("edited-metadata", m) for m in _restore_grading_metadata(nb, release)]
    problems += [("missing-attachment", m) for m in _missing_attachments(nb)]
    return nb, problems


def describe(problems, most=6):
    """One message for ``problems`` (``[(flag, message)]``): what was wrong, and that it was graded."""
    if not problems:
        return ""
    shown = "; ".join(message for _, message in problems[:most])
    more = f"; and {len(problems) - most} more" if len(problems) > most else ""
    return f"graded on the assignment's cells after repairs: {shown}{more}"


def _fix_cell_ids(nb):
    """Give every cell whose id is not valid, or repeats, a fresh one (nbformat 4.5 ids)."""
    if (nb.nbformat, nb.nbformat_minor) < (4, 5):
        return []
    fixed, seen = [], set()
    for index, cell in enumerate(nb.cells):
        cid = cell.get("id")
        if isinstance(cid, str) and _CELL_ID.fullmatch(cid) and cid not in seen:
            seen.add(cid)
            continue
        new = uuid.uuid4().hex[:8]
        seen.add(new)
        cell["id"] = new
        why = "repeats another cell's id" if cid in seen else "is not a valid cell id"
        fixed.append(f"cell {index + 1}: id {_shown(cid)} {why}: replaced")
    return fixed


def _fix_schema(nb):
    """Drop, one at a time, each value nbformat's schema refuses (see the module's docstring)."""
    fixed, last = [], None
    for _ in range(MAX_REPAIRS):
        error = next(iter(validator.iter_validate(nb)), None)
        if error is None:
            return fixed
        path = list(error.absolute_path)  # from the notebook's root, inside a oneOf of cell types
        what = None if (path, error.message) == last else _drop(nb, path)
        last = (path, error.message)
        if what is None:  # nothing we may drop (a cell's source, the notebook's shape): leave it
            fixed.append(f"{'/'.join(map(str, path)) or 'the notebook'}: {error.message[:80]} (left as is)")
            return fixed
        fixed.append(f"{what}: not valid nbformat ({printable(error.message[:60])}): removed")
    return fixed


def _drop(nb, path):
    """Remove the part of ``nb`` at schema error ``path`` that may go; a description, or None."""
    if len(path) >= 2 and path[0] == "metadata":
        value = nb.metadata.pop(path[1], None)
        return f"notebook metadata {_shown(path[1])} = {_shown(value)}"
    if len(path) >= 4 and path[0] == "cells" and path[2] in ("metadata", "attachments", "outputs"):
        cell = nb.cells[path[1]]
        container = cell[path[2]]
        key = path[3]
        value = container.pop(key) if isinstance(container, list) else container.pop(key, None)
        kind = {"metadata": "metadata", "attachments": "attachment", "outputs": "output"}[path[2]]
        name = _shown(key) if kind != "output" else str(key + 1)
        return f"cell {path[1] + 1}: {kind} {name} = {_shown(value)}"
    if len(path) == 3 and path[0] == "cells" and path[2] in ("metadata", "attachments", "outputs"):
        cell = nb.cells[path[1]]
        cell[path[2]] = [] if path[2] == "outputs" else {}
        return f"cell {path[1] + 1}: its {path[2]}"
    return None


def _restore_grading_metadata(nb, release):
    """Make every cell's nbgrader metadata the student version's (see the module's docstring)."""
    expected = {grade_id(c): c.metadata["nbgrader"] for c in release.cells if grade_id(c)}
    fixed, seen = [], set()
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader")
        if meta is None:
            continue
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        counts = isinstance(meta, dict) and any(meta.get(k) for k in ("grade", "solution", "task", "locked"))
        if not isinstance(gid, str) or gid not in expected or gid in seen:
            del cell.metadata["nbgrader"]
            if counts or gid is not None:
                why = "repeats another cell's" if gid in seen else "is not the assignment's"
                fixed.append(f"cell {index + 1}: grading metadata {_shown(gid)} {why}: graded as an ordinary cell")
            continue
        seen.add(gid)
        changed = [k for k in GRADING_KEYS if meta.get(k) != expected[gid].get(k)]
        if changed:
            cell.metadata["nbgrader"] = copy.deepcopy(expected[gid])
            fixed.append(f"{printable(gid)}: " + ", ".join(
                f"{k} {_shown(meta.get(k))} restored to {_shown(expected[gid].get(k))}" for k in changed))
    return fixed


def _missing_attachments(nb):
    """Name each ``attachment:NAME`` of a markdown cell that the cell does not hold as an image."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        attachments = cell.get("attachments") or {}
        for name in dict.fromkeys(_ATTACHMENT.findall(cell.source)):
            bundle = attachments.get(name)
            if not isinstance(bundle, dict):
                found.append(f"cell {index + 1}: image {_shown(name)} is not attached (its alt text is shown)")
            elif not IMAGE_MIME_TYPES & set(bundle):
                kinds = ", ".join(printable(k) for k in bundle) or "nothing"
                found.append(f"cell {index + 1}: attachment {_shown(name)} is not an image ({kinds}): not shown")
    return found
