"""The service's queue (fairness, restart) and the course's attempt rules, without grading.

The journal is the real SQLite file the service keeps; the expected orders are worked out
by hand from the rule (round robin across students, one in flight each), not by the code.
"""

import os
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from autograder.core.policy import AttemptRules, load_service_rules, refusal
from autograder.service.journal import DONE, GRADING, QUEUED, Journal


@pytest.fixture
def journal(tmp_path):
    j = Journal(tmp_path)
    yield j
    j.close()


def queue(journal, *students):
    for student in students:
        journal.add(journal.new_token(), student, "toy", "web")


def drain(journal, slots=1):
    """Grade everything, ``slots`` at a time, finishing each batch before the next: the
    students in the order they were started."""
    order = []
    while batch := journal.next_attempts(slots):
        order += [a.student for a in batch]
        for a in batch:
            journal.finish(a.id, "ok", 1.0, 1.0, "")
    return order


def test_ten_uploads_of_one_student_never_delay_anothers_first(journal):
    queue(journal, *["ann"] * 10, "ben", "cat")
    assert drain(journal) == ["ann", "ben", "cat"] + ["ann"] * 9


def test_a_student_who_arrives_later_goes_before_a_second_attempt(journal):
    queue(journal, "ann", "ann", "ann")
    first = journal.next_attempts(1)
    journal.finish(first[0].id, "ok", 1, 1, "")
    queue(journal, "ben")  # arrives after ann was served once, behind ann's 2nd and 3rd
    assert drain(journal) == ["ben", "ann", "ann"]


def test_at_most_one_attempt_per_student_in_flight(journal):
    queue(journal, "ann", "ann", "ann", "ben")
    batch = journal.next_attempts(4)
    assert sorted(a.student for a in batch) == ["ann", "ben"]
    assert journal.next_attempts(4) == []  # both busy: nothing else may start
    ann = next(a for a in batch if a.student == "ann")
    journal.finish(ann.id, "ok", 1, 1, "")
    assert [a.student for a in journal.next_attempts(4)] == ["ann"]  # ben still in flight


def test_round_robin_with_two_slots(journal):
    queue(journal, "ann", "ann", "ann", "ben", "ben", "cat")
    assert drain(journal, slots=2) == ["ann", "ben", "cat", "ann", "ben", "ann"]


def test_the_queue_position_is_the_order_grading_takes(journal):
    queue(journal, "ann", "ann", "ann", "ben", "cat", "cat")
    positions = {a.id: journal.position(a) for a in journal.rows("state = ?", (QUEUED,))}
    order = []
    while batch := journal.next_attempts(1):
        order.append(batch[0].id)
        journal.finish(batch[0].id, "ok", 1, 1, "")
    assert [positions[i] for i in order] == list(range(len(order)))


def test_a_restart_puts_grades_in_progress_back_in_the_queue(tmp_path):
    j = Journal(tmp_path)
    queue(j, "ann", "ben")
    started = j.next_attempts(2)
    assert {a.state for a in started} == {GRADING}
    j.close()  # the service died here, mid-grade
    again = Journal(tmp_path)
    assert again.recover() == 2
    assert sorted(drain(again)) == ["ann", "ben"]
    assert {a.state for a in again.rows()} == {DONE}
    again.close()


def test_tokens_are_the_only_key_and_answer_only_their_student(journal):
    queue(journal, "ann")
    token = journal.rows()[0].token
    assert journal.attempt_of("ann", token) is not None
    assert journal.attempt_of("ben", token) is None
    assert journal.attempt_of("ann", token + "x") is None
    assert len(token) >= 22  # 128 random bits


# -- the rules -------------------------------------------------------------------------------
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)


def test_total_attempts():
    rules = AttemptRules(attempts=2)
    assert refusal(rules, [NOW - timedelta(days=3)], NOW) is None
    assert "all 2 attempts" in refusal(rules, [NOW - timedelta(days=3)] * 2, NOW)


def test_per_day_counts_days_of_the_course_timezone():
    rules, tokyo = AttemptRules(per_day=1), ZoneInfo("Asia/Tokyo")  # UTC+9: its day began 15:00 UTC
    evening = datetime(2026, 12, 5, 16, 0, tzinfo=timezone.utc)
    assert refusal(rules, [evening - timedelta(hours=2)], evening) is not None  # same UTC day
    assert refusal(rules, [evening - timedelta(hours=2)], evening, tokyo) is None  # Tokyo: yesterday


def test_cooldown_says_when():
    rules = AttemptRules(cooldown=timedelta(minutes=10))
    why = refusal(rules, [NOW - timedelta(minutes=4)], NOW)
    assert "6m" in why and "10m" in why
    assert refusal(rules, [NOW - timedelta(minutes=10)], NOW) is None


def test_course_toml_service_tables(tmp_path):
    (tmp_path / "course.toml").write_text(
        '[service]\nattempts = 3\ncooldown = "5m"\ncounts = "best"\ninstructors = ["prof"]\n'
        '[assignments."01-rope"]\ndue = "2026-12-01T23:59:00+00:00"\n'
        '[assignments."01-rope".service]\nattempts = 9\nbefore_due = "visible"\n')
    rules = load_service_rules(tmp_path)
    assert rules.rules("toy") == AttemptRules(attempts=3, cooldown=timedelta(minutes=5), counts="best")
    assert rules.rules("01-rope") == AttemptRules(attempts=9, cooldown=timedelta(minutes=5),
                                                  counts="best", before_due="visible")
    assert rules.instructors == {"prof"}


@pytest.mark.parametrize("text, words", [
    ('[service]\ncounts = "first"\n', "service.counts: write one of 'last', 'best'"),
    ('[service]\nattempts = 0\n', "service.attempts"),
    ('[service]\nretries = 2\n', "unknown key 'retries'"),
    ('[assignments.toy.service]\ncooldown = 5\n', "assignments.toy.service.cooldown"),
])
def test_a_bad_rule_is_one_line_naming_the_key(tmp_path, text, words):
    (tmp_path / "course.toml").write_text(text)
    with pytest.raises(ValueError) as error:
        load_service_rules(tmp_path)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_a_hand_in_is_taken_once_nbgrader_submit_has_written_it_whole(tmp_path):
    import secrets
    import time

    from autograder.service.exchange import Exchange

    exchange = Exchange(tmp_path, "c")
    folder = exchange.inbound / "ann+toy+2026-12-05 12:00:00.000000 UTC+abc"
    folder.mkdir(parents=True)
    (folder / "toy.ipynb").write_text("{}")  # submit copies the files first...
    (folder / "timestamp.txt").write_text("2026-12-05 12:00:00.000000 UTC")
    assert exchange.new_submissions(set()) == []
    (folder / "submission_secret.txt").write_text("")  # ...then opens the secret, then writes it
    assert exchange.new_submissions(set()) == []
    (folder / "submission_secret.txt").write_text(secrets.token_hex(64))
    [found] = exchange.new_submissions(set())
    assert (found.student, found.assignment) == ("ann", "toy")
    assert exchange.new_submissions({found.name}) == []
    other = exchange.inbound / "ben+toy+2026-12-05 12:00:01.000000 UTC+abd"  # another writer: no secret
    other.mkdir()
    (other / "toy.ipynb").write_text("{}")
    assert [f.student for f in exchange.new_submissions({found.name})] == []
    old = time.time() - 10
    for path in (other / "toy.ipynb", other):
        os.utime(path, (old, old))
    assert [f.student for f in exchange.new_submissions({found.name})] == ["ben"]
