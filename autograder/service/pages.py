"""The pages ``serve`` writes itself, and what of a result a student sees.

Before the due date under ``before_due = "visible"`` a student sees the score and the verdicts
of the test cells whose tests the student version shows (:func:`shown_test_cells`,
:func:`verdicts`), on :func:`summary_page`; a submission that is not graded gets
:func:`refusal_page`. Both carry the feedback pages' Content-Security-Policy. Read by the
grading loop (:mod:`autograder.service.engine`) and the web page (:mod:`autograder.service.web`).
"""

import html
from pathlib import Path

import nbformat

from ..core.cells import grade_id, is_test_cell
from ..core.course_files import SOURCE
from ..core.feedback_page import CSP_META


def shown_test_cells(root, assignment, withheld):
    """Grade ids of the test cells whose verdicts a student sees: every test cell, or
    (``withheld``: before the due date under ``before_due = "visible"``) only those whose
    tests the student version shows (no hidden tests in them)."""
    shown = set()
    for path in sorted((Path(root) / SOURCE / assignment).glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if is_test_cell(cell) and not (withheld and "BEGIN HIDDEN TESTS" in cell.source):
                shown.add(grade_id(cell))
    return shown


def verdicts(result, shown):
    """``[(notebook, grade id, score, max score)]`` of the test cells of ``result`` (a
    :class:`StudentResult`) that are in ``shown``."""
    return [(nb.name, g.name, g.auto_score, g.max_score) for nb in result.notebooks
            for g in nb.grades if g.auto_score is not None and g.name in shown]


def summary_page(assignment, result, shown, due):
    """The page a student gets before the due date under ``before_due = "visible"``."""
    rows = "".join(f"<tr><td>{html.escape(cell)}</td><td>{score:g} / {top:g}</td></tr>"
                   for _, cell, score, top in verdicts(result, shown))
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{CSP_META}"
            f"<title>{html.escape(assignment)}: score</title></head><body>"
            f"<h1>{html.escape(assignment)}</h1><p>Score: {result.score:g} / {result.max_score:g}</p>"
            f"<p>Until the due date ({due:%Y-%m-%d %H:%M} UTC) this page shows the score and the "
            f"verdicts of the tests you can see; the full feedback comes after it.</p>"
            f"<table><tr><th>test cell</th><th>score</th></tr>{rows}</table></body></html>").encode()


def refusal_page(assignment, why):
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{CSP_META}"
            f"<title>{html.escape(assignment)}: not graded</title></head><body>"
            f"<h1>{html.escape(assignment)}</h1><p>This submission was not graded: "
            f"{html.escape(why)}.</p></body></html>").encode()
