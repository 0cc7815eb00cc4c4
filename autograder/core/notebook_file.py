"""A notebook file's bytes, read as a notebook within caps: :func:`read_notebook`.

Bytes that are empty, not JSON, JSON that is not a notebook, a notebook newer than
nbformat 4, over :data:`NOTEBOOK_CELLS` cells or nested deeper than :data:`JSON_DEPTH` are
refused with the problem in words (completing "NAME is ..."), before nbformat validates
anything; a file over :data:`NOTEBOOK_BYTES` is never read at all
(:mod:`autograder.core.submission_folder`). Notebooks of nbformat 3 and older are upgraded to
nbformat 4 (nbformat's own conversion). A notebook is returned only when every field grading
reads has the right type.
"""

import json
import warnings

import nbformat

# what one notebook may cost to read (the largest release notebook: 35 cells, 32 kB)
NOTEBOOK_BYTES = 32 * 2**20      # one notebook file
NOTEBOOK_CELLS = 2000            # cells of one notebook
JSON_DEPTH = 100                 # nesting of a notebook's JSON


def read_notebook(data):
    """``(notebook, None)`` for bytes that hold a readable notebook, else ``(None, problem)``.

    The notebook is upgraded to nbformat 4 when it is older. A notebook over
    :data:`NOTEBOOK_CELLS` cells or nested deeper than :data:`JSON_DEPTH` is refused
    before nbformat validates it.
    """
    if not data.strip():
        return None, "empty"
    try:
        text = data.decode("utf-8-sig")
        raw = json.loads(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError, deep nesting
        return None, "not a notebook (not JSON)"
    version = raw.get("nbformat") if isinstance(raw, dict) else None
    if type(version) is not int or not ("cells" in raw or "worksheets" in raw):
        return None, "JSON but not a Jupyter notebook"
    if version > 4:
        return None, f"an nbformat {version} notebook, newer than the grader reads"
    cells = cell_count(raw)
    if cells > NOTEBOOK_CELLS:
        return None, f"a notebook of {cells} cells, more than the {NOTEBOOK_CELLS} the grader takes"
    if too_deep(raw, JSON_DEPTH):
        return None, f"JSON nested deeper than the {JSON_DEPTH} levels the grader takes"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            notebook = nbformat.reads(text, as_version=4)
    except Exception:  # nbformat's reader raises many kinds on a damaged file
        notebook = None
    if notebook is None or not well_formed(notebook):
        return None, "a damaged notebook (its cells cannot be read)"
    return notebook, None


def cell_count(raw):
    """How many cells the notebook JSON ``raw`` holds (nbformat 4, or 3 and older)."""
    def length(value):
        return len(value) if isinstance(value, list) else 0

    if "cells" in raw:
        return length(raw["cells"])
    sheets = raw["worksheets"] if isinstance(raw["worksheets"], list) else []
    return sum(length(sheet.get("cells")) for sheet in sheets if isinstance(sheet, dict))


def too_deep(value, limit):
    """Whether the JSON ``value`` nests lists and objects deeper than ``limit``."""
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= limit:
                    return True
                todo.append((child, depth + 1))
    return False


def well_formed(notebook):
    """Whether every field grading reads has the right type."""
    def good(cell):
        meta = cell.get("metadata")
        return (cell.get("cell_type") in ("code", "markdown", "raw")
                and isinstance(cell.get("source"), str) and isinstance(meta, dict)
                and isinstance(meta.get("nbgrader", {}), dict))
    cells = notebook.get("cells")
    return (isinstance(notebook.get("metadata"), dict) and isinstance(cells, list)
            and all(isinstance(cell, dict) and good(cell) for cell in cells))
