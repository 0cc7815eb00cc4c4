"""Due dates and the late policy (autograder/core/policy.py): arithmetic, spelling, times, course.toml.

The gradebook side (``apply_late_policy``) is tested with the exports, in
tests/grader/host/test_roster_exports.py, on a real gradebook.
"""

from datetime import datetime, timedelta, timezone

import pytest

from autograder.core.times import parse_time
from autograder.core.policy import (CourseSettings, LatePolicy, Lateness, load_settings,
                               penalty)

UTC = timezone.utc
DUE = datetime(2026, 12, 1, 23, 59, tzinfo=UTC)
S, H, D = timedelta(seconds=1), timedelta(hours=1), timedelta(days=1)
US = timedelta(microseconds=1)


@pytest.mark.parametrize("spelling, late_by, score, expected", [
    ("none", 3 * D, 10.0, 0.0),
    ("zero", US, 10.0, 10.0),
    ("zero", 30 * D, 7.5, 7.5),
    ("zero,grace=15m", 15 * 60 * S, 10.0, 0.0),            # within the grace: free
    ("zero,grace=15m", 15 * 60 * S + S, 10.0, 10.0),
    ("10%/day", S, 10.0, 1.0),                             # one second late: one started day
    ("10%/day", D, 10.0, 1.0),                             # exactly a day: still one
    ("10%/day", D + US, 10.0, 2.0),                        # a microsecond more: two
    ("10%/day,grace=1h", H, 10.0, 0.0),
    ("10%/day,grace=1h", H + S, 10.0, 1.0),                # days count from the end of the grace
    ("10%/day,grace=1h", 25 * H, 10.0, 1.0),
    ("10%/day,grace=1h", 25 * H + S, 10.0, 2.0),
    ("10%/day,cap=50%", 10 * D, 10.0, 5.0),
    ("10%/day,cap=50%", 3 * D, 10.0, 3.0),
    ("60%/day", 2 * D, 10.0, 10.0),                        # 120 % of the score: the whole score
    ("25%/hour", 2 * H, 8.0, 4.0),
    ("2/hour", S, 10.0, 2.0),
    ("2/hour", 3 * H, 10.0, 6.0),
    ("2/hour,cap=10", 7 * H, 20.0, 10.0),
    ("2/hour,cap=10", 3 * H, 4.0, 4.0),                    # never below 0
    ("0.5/day,grace=2d", 2 * D + H, 10.0, 0.5),
    ("10%/day", 3 * D, 0.0, 0.0),
])
def test_penalty_arithmetic(spelling, late_by, score, expected):
    policy = LatePolicy.parse(spelling)
    lateness = penalty(policy, DUE, DUE + late_by, score)
    on_time = late_by <= policy.grace  # inside the grace period is on time: no lateness at all
    assert lateness == Lateness(timedelta(0) if on_time else late_by, expected)


@pytest.mark.parametrize("submitted_at", [DUE - D, DUE - US, DUE])
def test_on_time_costs_nothing(submitted_at):
    assert penalty(LatePolicy.parse("zero"), DUE, submitted_at, 10.0) == Lateness(timedelta(0), 0.0)


def test_no_timestamp_or_no_due_date_is_not_late():
    policy = LatePolicy.parse("zero")
    assert penalty(policy, DUE, None, 10.0) == Lateness(timedelta(0), 0.0)
    assert penalty(policy, None, DUE + D, 10.0) == Lateness(timedelta(0), 0.0)


def test_naive_times_are_utc_and_aware_ones_are_converted():
    berlin = timezone(timedelta(hours=1))
    due = datetime(2026, 12, 2, 0, 59, tzinfo=berlin)       # 23:59 UTC
    submitted = datetime(2026, 12, 2, 0, 30)                # naive: 00:30 UTC
    assert penalty(LatePolicy.parse("2/hour"), due, submitted, 10.0) == Lateness(31 * 60 * S, 2.0)
    assert penalty(LatePolicy.parse("2/hour"), DUE.replace(tzinfo=None), submitted, 10.0).late_by == 31 * 60 * S


@pytest.mark.parametrize("kind", ["none", "zero"])
@pytest.mark.parametrize("due_text, submitted_text", [
    ("2026-12-01 23:59:00 UTC", "2026-12-01 23:59:01 UTC"),
    ("2026-12-01 23:59:00 UTC", "2026-12-03 01:59:00.250000 UTC"),
    ("2026-12-01T23:59:00+00:00", "2026-12-02T10:00:00+01:00"),
    ("2026-12-01 23:59:00 UTC", "2026-12-01 12:00:00 UTC"),    # early: nbgrader calls no plugin
])
@pytest.mark.parametrize("score", [0.0, 3.5, 10.0])
def test_none_and_zero_match_nbgrader(kind, due_text, submitted_text, score):
    """Same late seconds as nbgrader's SubmittedAssignment, same penalty as its plugin."""
    from nbgrader.api import Assignment, SubmittedAssignment
    from nbgrader.plugins import LateSubmissionPlugin
    from nbgrader.utils import parse_utc

    submission = SubmittedAssignment(assignment=Assignment(name="a", duedate=parse_utc(due_text)),
                                     timestamp=parse_utc(submitted_text))
    seconds = submission.total_seconds_late
    # nbgrader's AssignLatePenalties asks the plugin only when late; None means no penalty
    expected = (LateSubmissionPlugin(penalty_method=kind).late_submission_penalty("ada", score, seconds)
                if seconds > 0 else None) or 0.0
    ours = penalty(LatePolicy(kind), parse_time(due_text), parse_time(submitted_text), score)
    assert ours.late_by.total_seconds() == seconds
    assert ours.penalty == expected


@pytest.mark.parametrize("spelling", [
    "none", "zero", "zero,grace=15m", "10%/day,cap=50%,grace=1h", "2/hour,cap=10",
    "2.5/hour,grace=1h30m", "0.5%/day,grace=1d12h", "3/day,grace=1.5s",
])
def test_spelling_round_trip(spelling):
    policy = LatePolicy.parse(spelling)
    assert str(policy) == spelling
    assert LatePolicy.parse(str(policy)) == policy


def test_parse_reads_what_it_means():
    assert LatePolicy.parse("10%/day,cap=50%,grace=1h") == LatePolicy(
        "per-unit", 10.0, "day", 50.0, H, relative=True)
    assert LatePolicy.parse("2/hour,cap=10") == LatePolicy("per-unit", 2.0, "hour", 10.0, relative=False)
    assert LatePolicy.parse(" ZERO , grace=90s ") == LatePolicy("zero", grace=90 * S)
    assert str(LatePolicy.parse("10%/day,grace=60m")) == "10%/day,grace=1h"   # canonical spelling
    assert str(LatePolicy()) == "none"


@pytest.mark.parametrize("spelling, problem", [
    ("", "is not none, zero or a rate"),
    ("late", "is not none, zero or a rate"),
    ("-1/day", "is not none, zero or a rate"),
    ("10%/week", "unknown unit 'week'"),
    ("0/day", "must be a positive number"),
    ("10%/day,cap=5", "takes a cap in percent (cap=5%)"),
    ("2/hour,cap=5%", "takes a cap in points (cap=5)"),
    ("2/hour,cap=lots", "cap=lots: write a number"),
    ("zero,cap=5", "a 'zero' policy takes no cap"),
    ("none,grace=1h", "a 'none' policy takes no grace period"),
    ("10%/day,grace=1x", "grace=1x: write a duration"),
    ("10%/day,grace", "unknown option 'grace'"),
    ("10%/day,bonus=1", "unknown option 'bonus=1'"),
    ("10%/day,cap=1%,cap=2%", "cap given twice"),
])
def test_bad_spellings_say_what_is_wrong(spelling, problem):
    with pytest.raises(ValueError) as error:
        LatePolicy.parse(spelling)
    message = str(error.value)
    assert message.startswith(f"late policy {spelling!r}: ") and problem in message
    assert "\n" not in message


@pytest.mark.parametrize("fields, problem", [
    (dict(kind="late"), "unknown late policy kind 'late'"),
    (dict(kind="per-unit", per_unit=1.0, unit="week"), "unknown unit 'week'"),
    (dict(kind="per-unit"), "must be a positive number"),
    (dict(kind="per-unit", per_unit=1.0, cap=0.0), "cap must be a positive number"),
    (dict(kind="zero", per_unit=1.0), "takes no rate, unit or cap"),
    (dict(kind="zero", grace=-S), "cannot be negative"),
])
def test_constructor_refuses_bad_combinations(fields, problem):
    with pytest.raises(ValueError, match=problem):
        LatePolicy(**fields)


@pytest.mark.parametrize("text, expected", [
    ("2026-12-01 23:59:59.123456 UTC", datetime(2026, 12, 1, 23, 59, 59, 123456, tzinfo=UTC)),
    ("2026-12-01 23:59:59 GMT", datetime(2026, 12, 1, 23, 59, 59, tzinfo=UTC)),
    ("2026-12-01 23:59:59 Europe/Berlin", datetime(2026, 12, 1, 22, 59, 59, tzinfo=UTC)),
    ("2026-12-01 23:59:59 +0100", datetime(2026, 12, 1, 22, 59, 59, tzinfo=UTC)),
    ("2026-12-01 23:59:59 -05:00", datetime(2026, 12, 2, 4, 59, 59, tzinfo=UTC)),
    ("2026-12-01T23:59:00+01:00", datetime(2026, 12, 1, 22, 59, tzinfo=UTC)),
    ("2026-12-01T23:59:00Z", datetime(2026, 12, 1, 23, 59, tzinfo=UTC)),
    ("2026-12-01T23:59", datetime(2026, 12, 1, 23, 59, tzinfo=UTC)),
    ("  2026-12-01 23:59:00\n", datetime(2026, 12, 1, 23, 59, tzinfo=UTC)),
])
def test_parse_time_formats(text, expected):
    moment = parse_time(text)
    assert moment == expected and moment.tzinfo == UTC


@pytest.mark.parametrize("text, problem", [
    ("", "no time of day"),
    ("tomorrow", "no time of day"),
    ("2026-12-01", "no time of day"),
    ("2026-13-01 10:00", "not a date and time"),
    ("01/12/2026 10:00", "not a date and time"),
    ("2026-12-01 10:00 Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
    ("2026-12-01T10:00+01:00 UTC", "two time zones"),
])
def test_parse_time_errors(text, problem):
    with pytest.raises(ValueError) as error:
        parse_time(text)
    message = str(error.value)
    assert message.startswith(f"cannot read the time {text!r}: {problem}") and "\n" not in message


def test_a_policy_inherits_the_course_grace_unless_it_names_one(tmp_path):
    """The README's own example: a per-assignment ``zero`` keeps the course's grace hour; so
    does ``grade --late-policy`` (:meth:`CourseSettings.with_policy`)."""
    settings = load_settings(write_settings(tmp_path, '[late]\npolicy = "10%/day,grace=1h"\n'
                                            '[assignments."01-rope"]\npolicy = "zero"\n'
                                            'due = "2026-12-01T23:59:00+00:00"\n'))
    rope = settings.policy("01-rope")
    assert penalty(rope, DUE, DUE + 30 * S, 10.0) == Lateness(timedelta(0), 0.0)   # 30 s: on time
    assert penalty(rope, DUE, DUE + H + S, 10.0) == Lateness(H + S, 10.0)
    assert settings.with_policy("01-rope", "2/hour").policy("01-rope") == LatePolicy(
        "per-unit", 2.0, "hour", grace=H, relative=False)
    assert settings.with_policy("01-rope", "2/hour,grace=0").policy("01-rope").grace == timedelta(0)
    assert settings.with_policy("01-rope", "none").policy("01-rope") == LatePolicy()


def write_settings(tmp_path, text):
    (tmp_path / "course.toml").write_text(text)
    return tmp_path


def test_no_course_toml_means_no_due_dates_and_no_penalty(tmp_path):
    settings = load_settings(tmp_path)
    assert settings == CourseSettings()
    assert settings.due("01-rope") is None and settings.policy("01-rope") == LatePolicy()


def test_course_toml_due_dates_and_policies(tmp_path):
    root = write_settings(tmp_path, """
timezone = "Europe/Berlin"
[late]
policy = "10%/day,cap=50%,grace=1h"

[assignments."01-rope"]
due = "2026-12-01T23:59:00+00:00"
policy = "zero"   # this one: nothing late

[assignments.02-gqa]
due = 2026-12-08T23:59:00+01:00

[assignments.03-mask]
due = 2026-12-15T12:00:00

[assignments.05-fam]
due = "2026-07-01 12:00"

[assignments.06-flash]
policy = "zero,grace=0"
""")
    settings = load_settings(root)
    assert settings.source == root / "course.toml"
    assert settings.due("01-rope") == datetime(2026, 12, 1, 23, 59, tzinfo=UTC)
    assert settings.due("02-gqa") == datetime(2026, 12, 8, 22, 59, tzinfo=UTC)
    assert settings.due("03-mask") == datetime(2026, 12, 15, 11, 0, tzinfo=UTC)   # no zone: Berlin's
    assert settings.due("05-fam") == datetime(2026, 7, 1, 10, 0, tzinfo=UTC)     # summer time
    assert settings.due("04-block") is None
    assert settings.policy("01-rope") == LatePolicy("zero", grace=H)     # the course's grace, inherited
    assert settings.policy("06-flash") == LatePolicy("zero")             # it says otherwise
    assert str(settings.policy("02-gqa")) == "10%/day,cap=50%,grace=1h"
    assert str(settings.policy("04-block")) == "10%/day,cap=50%,grace=1h"


@pytest.mark.parametrize("text, problem", [
    ('[late]\npolicy = "10%/fortnight"\n', "late.policy: late policy '10%/fortnight': unknown unit"),
    ("[late]\npolicy = 10\n", "late.policy: write the policy as a string"),
    ('[late]\npolcy = "zero"\n', "late: unknown key 'polcy' (allowed: policy)"),
    ('[assignments."01-rope"]\ndue = "next friday"\n',
     'assignments."01-rope".due: cannot read the time \'next friday\''),
    ('[assignments."01-rope"]\ndue = 2026-12-01\n', 'assignments."01-rope".due: 2026-12-01 has no time of day'),
    ('[assignments."01-rope"]\ndue = 5\n', 'assignments."01-rope".due: write a date and time'),
    ('[assignments."01-rope"]\npolicy = "zero,cap=1"\n', 'assignments."01-rope".policy: late policy'),
    ('[assignments."01-rope"]\ndeadline = "2026-12-01T23:59"\n',
     'assignments."01-rope": unknown key \'deadline\''),
    ('assignments = 3\n', "assignments: expected a table"),
    ('[assignment."01-rope"]\ndue = "2026-12-01T23:59"\n', "top level: unknown key 'assignment'"),
    ('[late\n', "not valid TOML"),
    ('[assignments."01-rope"]\ndue = "2026-12-01T23:59"\n',
     "cannot read the time '2026-12-01T23:59': no time zone, and course.toml declares no timezone"),
    ('[assignments."01-rope"]\ndue = 2026-12-01T23:59:00\n', "2026-12-01T23:59:00 has no time zone"),
    ('timezone = "Mars/Olympus"\n', "timezone: unknown time zone 'Mars/Olympus'"),
])
def test_course_toml_errors_name_the_file_and_the_key(tmp_path, text, problem):
    root = write_settings(tmp_path, text)
    with pytest.raises(ValueError) as error:
        load_settings(root)
    message = str(error.value)
    assert message.startswith(f"{root / 'course.toml'}: ") and problem in message
    assert "\n" not in message
