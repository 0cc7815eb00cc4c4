"""The scheduling loop that local workers and the Dask cluster share (``host/schedule.py``).

A scripted transport grades in memory and logs every call, so the loop's rules are checked
step by step against the order the rules themselves give: the window is never exceeded, a
freed slot gets its next student before the driver records the result, a student not back
after the watchdog is given up with its log and the class goes on, three host faults in a
row stop the run (any other result in between resets the count), and any exception, an
interruption included, aborts the transport. The real transports run in
``test_autograder_cli.py``, ``test_host_faults.py`` and ``test_cluster.py``.
"""

import pytest

from autograder.core.results import Status, StudentResult
from autograder.host.schedule import HostFault, parse_result, run_schedule


class Scripted:
    """A transport whose students finish in the order, and with the results, of ``script``."""

    def __init__(self, slots, script, hang=()):
        self.slots, self.script, self.hang = slots, dict(script), set(hang)
        self.calls, self.running = [], []
        self.more = {}  # student -> what submit was told: whether students waited after it

    def start(self, count):
        self.calls.append(("start", count))
        return min(self.slots, count)

    def submit(self, student, more):
        assert len(self.running) < self.slots, "the window was exceeded"
        self.calls.append(("submit", student))
        self.more[student] = more
        self.running.append(student)

    def finished(self, timeout):
        ready = [s for s in self.running if s not in self.hang][:1]  # one at a time, in order
        for student in ready:
            self.running.remove(student)
        return [self.script.get(student) or StudentResult(student=student) for student in ready]

    def give_up(self, student):
        self.calls.append(("give_up", student))
        self.running.remove(student)
        return f"log of {student}"

    def stop(self):
        self.calls.append(("stop",))

    def abort(self):
        self.calls.append(("abort",))


def run(transport, students, watchdog=3600.0, fail_on=None):
    recorded = []

    def on_result(result):
        transport.calls.append(("record", result.student))
        recorded.append(result)
        if result.student == fail_on:
            raise KeyboardInterrupt

    run_schedule(transport, students, watchdog, on_result)
    return recorded


def test_a_freed_slot_gets_its_next_student_before_the_result_is_recorded():
    t = Scripted(2, {})
    recorded = run(t, ["a", "b", "c", "d"])
    assert [r.student for r in recorded] == ["a", "b", "c", "d"]
    assert t.calls == [("start", 4), ("submit", "a"), ("submit", "b"),
                       ("submit", "c"), ("record", "a"),
                       ("submit", "d"), ("record", "b"),
                       ("record", "c"), ("record", "d"), ("stop",)]


def test_only_the_queues_last_student_is_submitted_without_more_to_come():
    """What grades the last student starts no spare kernel for a next one (N kernels for N
    notebooks); every other submission says more students wait."""
    t = Scripted(2, {})
    run(t, list("abcde"))
    assert t.more == {"a": True, "b": True, "c": True, "d": True, "e": False}
    t = Scripted(3, {})
    run(t, ["only"])
    assert t.more == {"only": False}


def test_no_students_start_nothing_and_stop():
    t = Scripted(4, {})
    assert run(t, []) == [] and t.calls == [("start", 0), ("stop",)]


def test_a_student_past_the_watchdog_is_given_up_with_its_log_and_the_class_goes_on():
    t = Scripted(1, {}, hang={"slow"})
    recorded = run(t, ["slow", "next"], watchdog=0.0)
    slow = recorded[0]
    assert (slow.student, slow.status, slow.log) == ("slow", Status.ERROR, "log of slow")
    assert slow.error.startswith("gave up after ") and "the watchdog" in slow.error
    assert [r.student for r in recorded] == ["slow", "next"] and recorded[1].status == Status.OK
    assert t.calls.index(("give_up", "slow")) < t.calls.index(("submit", "next")) \
        < t.calls.index(("record", "slow"))


def fault(student):
    return StudentResult(student=student, status=Status.ERROR, host_fault=True, error="no kernel")


def test_three_host_faults_in_a_row_stop_the_run_and_abort_the_transport():
    t = Scripted(1, {s: fault(s) for s in "abc"})
    with pytest.raises(HostFault, match="3 submissions in a row could not be graded: no kernel"):
        run(t, list("abcde"))
    assert t.calls[-1] == ("abort",) and ("record", "d") not in t.calls


def test_any_other_result_between_host_faults_resets_the_count():
    t = Scripted(1, {"a": fault("a"), "b": fault("b"), "d": fault("d"), "e": fault("e")})
    assert [r.student for r in run(t, list("abcde"))] == list("abcde")
    assert t.calls[-1] == ("stop",)


def test_an_interruption_while_recording_aborts_at_once():
    t = Scripted(2, {})
    with pytest.raises(KeyboardInterrupt):
        run(t, list("abcd"), fail_on="a")
    assert t.calls[-1] == ("abort",) and ("record", "b") not in t.calls


@pytest.mark.parametrize("data", [None, "ada", ["ada"], {"student": "bob"}, {"student": "ada", "x": 1},
                                  {"student": "ada", "status": "graded"}])
def test_an_answer_that_is_not_this_students_result_is_an_error(data):
    result = parse_result(data, "ada", 1.5)
    assert (result.student, result.status, result.seconds) == ("ada", Status.ERROR, 1.5)
    assert result.error == "the worker returned something else than this student's result"


def test_a_students_result_comes_through_whole():
    sent = StudentResult(student="ada", flags=["reseated"], files={"feedback/ada/x.html": b"<p>"})
    assert parse_result(sent.to_dict(), "ada", 9.0) == sent
