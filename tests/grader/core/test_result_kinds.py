"""Every limit kind and every status reaches ``grades.csv`` and the class summary.

The cases are made from the enums themselves, so a member added to
:class:`~autograder.core.results.LimitKind` or :class:`~autograder.core.results.Status`
is tested here the day it is added: the summary and the CSV must show it, by its value,
without anyone listing it anywhere else.
"""

import csv
import io
from types import SimpleNamespace

import pytest

from autograder.core.limits import Limits
from autograder.core.results import LimitEvent, LimitKind, Status, StudentResult
from autograder.host import summary


def settings(root):
    return SimpleNamespace(limits=Limits(), course=SimpleNamespace(policy=lambda a: "none"),
                           root=root, sandboxed=False)


def csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("kind", list(LimitKind))
def test_every_limit_kind_reaches_the_csv_and_the_summary(kind, tmp_path):
    # as the worker reads it back from the executed notebook's metadata: a plain string
    event = LimitEvent.from_dict({"notebook": "a1", "cell": 4, "grade_id": "cell-t1",
                                  "kind": str(kind.value), "detail": "what happened"})
    assert event.kind is kind
    result = StudentResult(student="eve", events=[event], score=1.0, max_score=2.0)
    summary.write_csv(tmp_path / "grades.csv", "a1", [result])
    assert csv_rows(tmp_path / "grades.csv")[0]["limits"] == kind.value
    out = io.StringIO()
    summary.print_summary("a1", [result], [], 1.0, 1, settings(tmp_path), out=out)
    assert f"Hit a limit: 1\n  eve: {kind.value} in cell-t1\n" in out.getvalue()


def test_several_kinds_are_listed_once_each_in_order(tmp_path):
    events = [LimitEvent("a1", i, f"t{i}", kind, "") for i, kind in
              enumerate(reversed(list(LimitKind) * 2))]
    result = StudentResult(student="eve", events=events)
    summary.write_csv(tmp_path / "grades.csv", "a1", [result])
    assert csv_rows(tmp_path / "grades.csv")[0]["limits"].split(";") == sorted(
        k.value for k in LimitKind)


@pytest.mark.parametrize("status", list(Status))
def test_every_status_reaches_the_csv_and_the_summary(status, tmp_path):
    result = StudentResult(student="eve", status=status, message=f"message of {status.value}",
                           error=f"error of {status.value}" if status == Status.ERROR else None)
    summary.write_csv(tmp_path / "grades.csv", "a1", [result])
    assert csv_rows(tmp_path / "grades.csv")[0]["status"] == status.value
    out = io.StringIO()
    summary.print_summary("a1", [result], [], 1.0, 1, settings(tmp_path), out=out)
    said = "error of error" if status == Status.ERROR else f"message of {status.value}"
    assert f"\n  eve: {said}\n" in out.getvalue(), out.getvalue()
