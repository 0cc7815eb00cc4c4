"""The typed records a worker sends the host: whole through ``to_dict``/``from_dict``.

What travels on a local worker's pipe and back from a Dask task is ``to_dict()``: builtins
only (checked by walking it), from which ``from_dict()`` builds the same record, nested
scores, limit events, times and file bytes included. The one rule for a cell that awaits a
grade by hand is nbgrader's, checked against what nbgrader itself does after an autograde.
"""

import pickle
from datetime import datetime

import pytest

from autograder.core.results import (CellScore, LimitEvent, LimitKind, NotebookScores, Status,
                                     StudentResult, WorkerStart, needs_manual_grade)

BUILTINS = (str, int, float, bool, bytes, type(None), datetime)


def builtins_only(value):
    if isinstance(value, dict):
        return all(isinstance(k, str) and builtins_only(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(builtins_only(v) for v in value)
    return type(value) in BUILTINS or isinstance(value, str)  # a StrEnum is a str


def full_result():
    return StudentResult(
        student="ada lovelace [ü]", status=Status.OK, message="graded 01-rope (1).ipynb",
        digest="ab" * 32, events=[LimitEvent("01-rope", 4, "test_rope", LimitKind.HANG, "30 s")],
        tampered=["setup"], flags=["reseated"], functions={"rope": "def rope(): ..."},
        timestamp=datetime(2026, 12, 1, 23, 59, 59, 123456),
        notebooks=[NotebookScores("01-rope", (CellScore("test_rope", 2.0, 3.0),
                                              CellScore("why", None, 1.0)),
                                  (("why", None), ("rope", "see me")))],
        files={"feedback/ada lovelace [ü]/01-rope/01-rope.html": b"<p>\x00\xff"},
        seconds=12.5, log="line\n", host_fault=False)


def test_a_result_goes_as_builtins_and_comes_back_whole():
    sent = full_result()
    data = sent.to_dict()
    assert builtins_only(data)
    back = StudentResult.from_dict(pickle.loads(pickle.dumps(data)))
    assert back == sent
    assert isinstance(back.events[0], LimitEvent) and back.events[0].kind is LimitKind.HANG
    assert isinstance(back.notebooks[0].grades[1], CellScore) and back.status is Status.OK
    assert back.manual_cells() == {"why"}


def test_a_worker_start_goes_as_a_dict():
    assert WorkerStart.from_dict(WorkerStart("no bubblewrap").to_dict()) == WorkerStart("no bubblewrap")
    assert WorkerStart.from_dict(WorkerStart().to_dict()).fault == ""


@pytest.mark.parametrize("data, error", [
    ("ada", TypeError), ({}, TypeError), ({"student": "ada", "score_x": 1}, TypeError),
    ({"student": "ada", "status": "graded"}, ValueError),
    ({"student": "ada", "events": [{"notebook": "n"}]}, KeyError),
])
def test_something_else_is_no_result(data, error):
    with pytest.raises(error):
        StudentResult.from_dict(data)


def test_an_executor_event_is_read_by_its_fields():
    event = {"notebook": "toy", "cell": 3, "grade_id": None, "kind": "crash", "detail": "died"}
    assert LimitEvent.from_dict(event) == LimitEvent("toy", 3, None, LimitKind.CRASH, "died")
    with pytest.raises(ValueError):
        LimitEvent.from_dict({**event, "kind": "nap"})


@pytest.mark.parametrize("auto, manual, needs", [
    (None, None, True),   # a written answer: the autograder gives it no score
    (0.0, None, False), (2.0, None, False),
    (None, 1.0, True), (1.0, 0.0, True), (0.0, 2.0, True),  # graded by hand: to review again
])
def test_needs_manual_grade_is_nbgraders_rule_after_an_autograde(auto, manual, needs):
    """nbgrader's ``SaveAutoGrades._add_score``: a grade without an automatic score needs one
    by hand, and a grade that has a manual score is marked for review again."""
    assert needs_manual_grade(auto, manual) is needs
    assert CellScore("c", auto, 1.0).needs_manual is (auto is None)
