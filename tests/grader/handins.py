"""Handed-in folders for the intake tests: the course's real release and source notebooks,
written under pytest's ``tmp_path`` with fixed modification times."""

import json
import os
from pathlib import Path

import nbformat

from autograder.core.cells import grade_id

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000  # modification time of every handed-in file, plus offsets
OWN = "01-rope.ipynb"


def release(aid="01-rope"):
    return nbformat.read(ROOT / "release" / aid / f"{aid}.ipynb", as_version=4)


def source(aid):
    return nbformat.read(ROOT / "solutions" / aid / f"{aid}.ipynb", as_version=4)


def hand_in(folder, name, content, mtime=T0):
    """Write ``content`` (a notebook, bytes or JSON data) as ``folder/name``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if isinstance(content, nbformat.NotebookNode):
        nbformat.write(content, path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(json.dumps(content), encoding="utf-8")
    os.utime(path, (mtime, mtime))
    return path


def worked(marker):
    """The 01-rope release notebook with ``marker`` written into its part 1 cell."""
    nb = release()
    cell = next(c for c in nb.cells if grade_id(c) == "p1_solution")
    cell.source = cell.source.replace("# YOUR CODE HERE", f"# {marker}")
    return nb


def part1(nb):
    return next(c.source for c in nb.cells if grade_id(c) == "p1_solution")
