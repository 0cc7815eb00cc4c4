"""Due dates and the late policy: how late a submission was, and what that costs.

* :class:`LatePolicy`: ``none`` (late work accepted as it is), ``zero`` (late work
  scores 0, nbgrader's ``LateSubmissionPlugin`` method ``"zero"``) or a penalty
  per started hour or day, in points or in percent of the score, with a cap and a
  grace period. :meth:`LatePolicy.parse` reads the command line's spelling
  (``10%/day,cap=50%,grace=1h``) and ``str()`` writes it back.
* :func:`penalty`: the :class:`Lateness` of one submission under a policy.
* times are read by :func:`autograder.core.times.parse_time` (``course.toml``'s due dates too).
* :func:`load_settings`: due dates and policies from ``course.toml`` at the course
  root, as :class:`CourseSettings`.
* :func:`apply_late_policy`: write one assignment's due date and every submission's
  penalty into the gradebook, where exports and the formgrader read them.
* :func:`load_service_rules`: what ``serve`` allows each student (attempts, cool-down,
  which attempt counts, what a page shows before the due date), as :class:`AttemptRules`.

Semantics are nbgrader's where the two overlap: a submission is late by
``timestamp - duedate`` (the student's extension included) and only when that is
more than the policy's grace period (inside it, a submission is on time everywhere:
penalty, lists, exports, the report); ``zero`` costs the whole score, ``none``
nothing. Times are compared in UTC. A due date without a zone is read in the
course's declared ``timezone`` (``course.toml``) and refused without one; a
``timestamp.txt`` without a zone is UTC, as nbgrader writes it.

One score: :func:`apply_late_policy` is the one place a penalty is computed and
written (on the gradebook's notebooks: ``None`` when on time, a number, maybe 0,
when late); :func:`autograder.core.gradebook.standings` reads the total, the penalty
and the lateness back for every output.
"""

import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .gradebook import open_gradebook, writing
from .times import as_utc, parse_time

KINDS = ("none", "zero", "per-unit")
UNITS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
SETTINGS_FILE = "course.toml"

# grace spellings: one or more <number><unit>, e.g. 15m, 1h30m, 2d, 90s
DURATION_UNITS = {"d": timedelta(days=1), "h": timedelta(hours=1), "m": timedelta(minutes=1),
                  "s": timedelta(seconds=1)}
NUMBER = r"\d+(?:\.\d+)?(?:e[+-]?\d+)?"
DURATION_PART = re.compile(rf"({NUMBER})([dhms])")
PER_UNIT = re.compile(rf"({NUMBER})(%?)/([a-z]+)")
CAP = re.compile(rf"({NUMBER})(%?)")


def number_text(x: float) -> str:
    """The shortest spelling of ``x`` that reads back as ``x`` (``2``, ``0.5``, ``1e+20``)."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def duration_text(span: timedelta) -> str:
    """``span`` as the policy spelling writes it: ``1d12h``, ``15m``, ``1.5s``, ``0s``."""
    seconds = span.total_seconds()
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{int(count)}{unit}")
    if seconds or not parts:
        parts.append(f"{number_text(seconds)}s")
    return "".join(parts)


def parse_duration(text: str) -> timedelta:
    """``15m``, ``1h30m``, ``2d``, ``90s`` (or ``0``) as a timedelta; ValueError otherwise."""
    if text == "0":
        return timedelta(0)
    if not text or DURATION_PART.sub("", text):
        raise ValueError(f"grace={text}: write a duration such as 15m, 1h, 1h30m or 2d")
    return sum((float(n) * DURATION_UNITS[u] for n, u in DURATION_PART.findall(text)), timedelta(0))


@dataclass(frozen=True)
class LatePolicy:
    """What lateness costs.

    * ``kind``: ``"none"``, ``"zero"`` or ``"per-unit"``;
    * ``per_unit``: for ``per-unit``, the penalty per started ``unit`` past the grace:
      points, or percent of the score when ``relative``;
    * ``unit``: ``"hour"`` or ``"day"``;
    * ``cap``: the most the penalty may reach (points, or percent when ``relative``),
      ``None`` for no cap; a penalty never takes a score below 0 in any case;
    * ``grace``: lateness up to this much costs nothing (``zero`` and ``per-unit``);
    * ``relative``: ``per_unit`` and ``cap`` are percents of the score.

    The command-line spelling (:meth:`parse`, ``str()``) is the kind, or the rate,
    then options: ``none``, ``zero``, ``zero,grace=15m``, ``10%/day,cap=50%,grace=1h``,
    ``2/hour,cap=10``. A bad combination raises a one-line ValueError.
    """

    kind: str = "none"
    per_unit: float = 0.0
    unit: str = "day"
    cap: float | None = None
    grace: timedelta = timedelta(0)
    relative: bool = True

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown late policy kind {self.kind!r} (use none, zero or per-unit)")
        if self.unit not in UNITS:
            raise ValueError(f"unknown unit {self.unit!r} (use hour or day)")
        if self.grace < timedelta(0):
            raise ValueError(f"grace={duration_text(self.grace)}: a grace period cannot be negative")
        if self.kind == "per-unit":
            if not (math.isfinite(self.per_unit) and self.per_unit > 0):
                raise ValueError(f"a per-unit penalty must be a positive number, not {self.per_unit!r}"
                                 " (use none for no penalty)")
            if self.cap is not None and not (math.isfinite(self.cap) and self.cap > 0):
                raise ValueError(f"cap must be a positive number, not {self.cap!r}")
            return
        if self.per_unit or self.cap is not None or not self.relative or self.unit != "day":
            raise ValueError(f"a {self.kind!r} policy takes no rate, unit or cap")
        if self.kind == "none" and self.grace:
            raise ValueError("a 'none' policy takes no grace period (late work costs nothing)")

    @classmethod
    def parse(cls, text: str, grace: timedelta | None = None) -> "LatePolicy":
        """The policy spelled ``text`` (see the class docstring); one-line ValueError if bad.

        ``grace``: the grace period inherited (the course's) when ``text`` names none;
        a ``none`` policy has no grace to inherit.
        """
        head, *options = [part.strip() for part in text.strip().lower().split(",")]
        try:
            values = {}
            for option in options:
                key, sep, value = option.partition("=")
                if not sep or key not in ("cap", "grace"):
                    raise ValueError(f"unknown option {option!r} (use cap=... or grace=...)")
                if key in values:
                    raise ValueError(f"{key} given twice")
                values[key] = value.strip()
            if head in ("none", "zero"):
                if "cap" in values:
                    raise ValueError(f"a {head!r} policy takes no cap")
                if head == "none" or "grace" in values or grace is None:
                    return cls(head, grace=parse_duration(values.get("grace", "0")))
                return cls(head, grace=grace)
            rate = PER_UNIT.fullmatch(head)
            if not rate:
                raise ValueError(f"{head!r} is not none, zero or a rate such as 10%/day or 2/hour")
            per_unit, percent, unit = rate.groups()
            if unit not in UNITS:
                raise ValueError(f"unknown unit {unit!r} in {head!r} (use hour or day)")
            cap = None
            if "cap" in values:
                found = CAP.fullmatch(values["cap"])
                if not found:
                    raise ValueError(f"cap={values['cap']}: write a number such as cap=50% or cap=10")
                if bool(found.group(2)) != bool(percent):
                    want = f"cap={found.group(1)}%" if percent else f"cap={found.group(1)}"
                    raise ValueError(f"cap={values['cap']}: a {'percent' if percent else 'points'} "
                                     f"rate takes a cap in {'percent' if percent else 'points'} ({want})")
                cap = float(found.group(1))
            given = parse_duration(values["grace"]) if "grace" in values else grace
            return cls("per-unit", float(per_unit), unit, cap, given or timedelta(0),
                       relative=bool(percent))
        except ValueError as error:
            raise ValueError(f"late policy {text!r}: {error}") from None

    def __str__(self) -> str:
        if self.kind == "per-unit":
            percent = "%" if self.relative else ""
            parts = [f"{number_text(self.per_unit)}{percent}/{self.unit}"]
            if self.cap is not None:
                parts.append(f"cap={number_text(self.cap)}{percent}")
        else:
            parts = [self.kind]
        if self.grace:
            parts.append(f"grace={duration_text(self.grace)}")
        return ",".join(parts)


@dataclass(frozen=True)
class Lateness:
    """How late a submission was (``late_by``: zero when it is on time, inside the grace
    period included; else the whole time past the due date) and what it costs (``penalty``,
    points)."""

    late_by: timedelta
    penalty: float


def policy_words(policy: LatePolicy) -> str:
    """``policy`` as a student reads it: ``10% of the score per started day late, at most
    50%, after a grace of 1h``; ``late work scores 0``; ``no penalty``."""
    if policy.kind == "none":
        words = "no penalty"
    elif policy.kind == "zero":
        words = "late work scores 0"
    else:
        rate = (f"{number_text(policy.per_unit)}% of the score" if policy.relative
                else f"{number_text(policy.per_unit)} points")
        words = f"{rate} per started {policy.unit} late"
        if policy.cap is not None:
            words += f", at most {number_text(policy.cap)}{'%' if policy.relative else ' points'}"
    if policy.grace:
        words += f", after a grace of {duration_text(policy.grace)}"
    return words


def late_note(policy: LatePolicy, late_by: timedelta, taken: float) -> str:
    """The feedback page's words on a late submission: how late, under which policy (in
    :func:`policy_words`), and what it took (``taken`` points, as stored by
    :func:`apply_late_policy`): ``handed in 1d2h30m after the due date; late policy: 10% of
    the score per started day late, at most 50%; 2.2 points taken``."""
    return (f"handed in {duration_text(late_by)} after the due date; late policy: "
            f"{policy_words(policy)}; {number_text(round(taken, 2))} points taken")


def penalty(policy: LatePolicy, due: datetime | None, submitted_at: datetime | None,
            score: float) -> Lateness:
    """The lateness of a submission handed in at ``submitted_at`` and scoring ``score``.

    Not late (penalty 0) without a due date or a timestamp. Otherwise ``late_by`` is
    ``submitted_at - due``, zero when that is not more than the grace (on time), and the
    penalty is 0 within the grace, the
    whole score for ``zero``, and for ``per-unit`` ``per_unit`` per started ``unit``
    past the grace (one second past it is one unit), as points or as percent of
    ``score``, at most ``cap``, and never more than the score (a score is never
    taken below 0).
    """
    if due is None or submitted_at is None:
        return Lateness(timedelta(0), 0.0)
    late_by = max(timedelta(0), as_utc(submitted_at) - as_utc(due))
    if late_by <= policy.grace:
        return Lateness(timedelta(0), 0.0)
    if policy.kind == "none" or score <= 0:
        return Lateness(late_by, 0.0)
    if policy.kind == "zero":
        return Lateness(late_by, float(score))
    units = -(-(late_by - policy.grace) // UNITS[policy.unit])  # started units: ceiling
    amount = units * policy.per_unit
    if policy.cap is not None:
        amount = min(amount, policy.cap)
    points = score * min(amount, 100.0) / 100 if policy.relative else min(amount, score)
    return Lateness(late_by, float(points))


@dataclass(frozen=True)
class CourseSettings:
    """Due dates and late policies of the course (from ``course.toml``).

    ``due_dates`` maps an assignment to its aware UTC due date; ``policies`` holds the
    assignments whose policy overrides ``default_policy`` (each already holding the
    course's grace period unless it names its own); ``zone`` is the course's declared
    ``timezone`` (``None`` when it declares none), in which times without a zone are
    read; ``source`` is the file read (``None`` when there was none).
    """

    default_policy: LatePolicy = LatePolicy()
    due_dates: dict[str, datetime] = field(default_factory=dict)
    policies: dict[str, LatePolicy] = field(default_factory=dict)
    source: Path | None = None
    zone: tzinfo | None = None

    def due(self, assignment: str) -> datetime | None:
        """The due date of ``assignment`` (aware, UTC), or ``None`` if it has none."""
        return self.due_dates.get(assignment)

    def policy(self, assignment: str) -> LatePolicy:
        """The late policy of ``assignment``: its own, else the course's."""
        return self.policies.get(assignment, self.default_policy)

    def parse_policy(self, text: str) -> LatePolicy:
        """A policy spelled ``text`` for one assignment: the course's grace unless it names one."""
        return LatePolicy.parse(text, grace=self.default_policy.grace)

    def with_policy(self, assignment: str, text: str) -> "CourseSettings":
        """These settings with ``assignment``'s policy spelled ``text`` (``grade --late-policy``)."""
        return replace(self, policies={**self.policies, assignment: self.parse_policy(text)})


def toml_key(*parts: str) -> str:
    """A dotted TOML key, each part quoted where it is not a bare key."""
    return ".".join(p if re.fullmatch(r"[A-Za-z0-9_]+", p) else f'"{p}"' for p in parts)


def read_due(value, zone: tzinfo | None = None) -> datetime:
    """A due date from TOML: a string :func:`parse_time` reads, or a TOML date-time; one
    without a zone is read in ``zone`` (the course's ``timezone``), refused without one."""
    if isinstance(value, str):
        return parse_time(value, zone)
    if isinstance(value, datetime):
        if value.utcoffset() is None and zone is None:
            raise ValueError(f"{value.isoformat()} has no time zone: add one (e.g. "
                             f"{value.isoformat()}+00:00) or declare the course's timezone")
        return as_utc(value, zone or timezone.utc)
    if isinstance(value, date):
        raise ValueError(f"{value} has no time of day (write e.g. {value}T23:59:00+00:00)")
    raise ValueError('write a date and time such as "2026-12-01T23:59:00+00:00"')


def read_policy(value, grace: timedelta | None = None) -> LatePolicy:
    """A late policy from TOML: a string :meth:`LatePolicy.parse` reads (``grace``: inherited)."""
    if not isinstance(value, str):
        raise ValueError('write the policy as a string, e.g. "10%/day,cap=50%"')
    return LatePolicy.parse(value, grace=grace)


def read_zone(value) -> tzinfo:
    """A time zone from TOML: an IANA name such as ``Europe/Berlin``, or ``UTC``."""
    if not isinstance(value, str):
        raise ValueError('write the time zone as a string, e.g. "Europe/Berlin"')
    if value.upper() in ("UTC", "GMT", "Z"):
        return timezone.utc
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {value!r} (an IANA name such as Europe/Berlin)") from None


def read_table(value, allowed: tuple[str, ...] | None, *key: str) -> dict:
    """``value`` if it is a TOML table whose keys are all in ``allowed`` (``None``: any key)."""
    where = toml_key(*key) if key else "top level"
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a table")
    unknown = sorted(set(value) - set(allowed)) if allowed is not None else []
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(allowed)})")
    return value


def read_setting(table: dict, name: str, reader, *key: str):
    """``reader(table[name])``, its ValueError prefixed with the full key."""
    try:
        return reader(table[name])
    except ValueError as error:
        raise ValueError(f"{toml_key(*key, name)}: {error}") from None


def read_course_file(root: str | Path) -> tuple[Path, dict | None]:
    """``<root>/course.toml`` and its tables (``None`` when there is no file): the one reader
    of the file. Not valid TOML raises a one-line ValueError naming the file."""
    path = Path(root) / SETTINGS_FILE
    if not path.is_file():
        return path, None
    try:
        with open(path, "rb") as f:
            return path, tomllib.load(f)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML: {error}") from None


def load_settings(root: str | Path) -> CourseSettings:
    """The course's due dates and late policies, from ``<root>/course.toml``.

    The file (all of it optional)::

        timezone = "Europe/Berlin"               # where times without a zone are read
        [late]
        policy = "10%/day,cap=50%,grace=1h"      # the course's policy (default: none)

        [assignments."01-rope"]
        due = "2026-12-01T23:59:00+01:00"        # or a TOML date-time; no zone: timezone's
        policy = "zero"                          # its own policy, with the course's grace
                                                 # (1h here) unless it names one (zero,grace=0)

    No file: no due dates, policy ``none``. A bad value or an unknown key raises a
    one-line ValueError naming the file and the key.
    """
    path, data = read_course_file(root)
    if data is None:
        return CourseSettings()
    try:
        read_table(data, ("timezone", "late", "assignments", "service") + SELF_CHECK_KEYS)
        zone = read_setting(data, "timezone", read_zone) if "timezone" in data else None
        late = read_table(data.get("late", {}), ("policy",), "late")
        default = read_setting(late, "policy", read_policy, "late") if "policy" in late else LatePolicy()
        due_dates, policies = {}, {}
        for name, table in read_table(data.get("assignments", {}), None, "assignments").items():
            read_table(table, ("due", "policy", "service"), "assignments", name)
            if "due" in table:
                due_dates[name] = read_setting(table, "due", lambda v: read_due(v, zone),
                                               "assignments", name)
            if "policy" in table:
                policies[name] = read_setting(table, "policy",
                                              lambda v: read_policy(v, default.grace),
                                              "assignments", name)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return CourseSettings(default, due_dates, policies, path, zone)


def apply_late_policy(db_url: str, assignment: str, settings: CourseSettings) -> dict[str, Lateness]:
    """Write ``assignment``'s due date and late penalties into the gradebook at ``db_url``.

    The due date of ``course.toml`` (if it names one) becomes the gradebook's; each
    submission's penalty is :func:`penalty` under the assignment's policy, from the
    gradebook's due date with the student's extension, its timestamp and its current
    score (manual grades included), and is stored on its notebooks the way nbgrader's
    ``AssignLatePenalties`` stores it (no more on a notebook than that notebook
    scores), with one rule of its own: ``None`` on every notebook of a submission that
    is on time (inside the grace period included), a number (maybe 0) on every notebook
    of one that is late, so that every reader tells late from on time by the gradebook
    alone (:func:`autograder.core.gradebook.standings`). Run it after grading and again after
    manual grading: a penalty in percent, or ``zero``, follows the score. Returns the
    lateness of every submission, by student id. ValueError for an unknown assignment,
    :class:`~autograder.core.gradebook.GradebookError` for a URL that cannot be a gradebook.

    The one writer of late penalties (nbgrader's ``AssignLatePenalties`` is not run, and
    :func:`autograder.core.gradebook.record` copies none), called once per process that
    needs a penalty:

    * a worker, in its scratch gradebook after each autograde
      (:func:`autograder.worker.pipeline.grade_student`), so that the feedback page it
      renders shows the penalty;
    * the driver, in the class gradebook once the class is recorded
      (:func:`autograder.host.driver.finish`): extensions and earlier manual grades are
      there, and ``grades.csv`` and the pages show what it stored;
    * ``feedback``, ``export`` and ``report`` (:func:`autograder.host.cli.settle_scores`),
      since manual grades, extensions, due dates and policies given since then move a
      penalty.
    """
    from nbgrader.api import MissingEntry

    policy, due = settings.policy(assignment), settings.due(assignment)
    with writing(db_url), open_gradebook(db_url) as gb:
        try:
            record = gb.find_assignment(assignment)
        except MissingEntry:
            raise ValueError(f"no assignment {assignment!r} in the gradebook {db_url}") from None
        if due is not None:
            record.duedate = due.astimezone(timezone.utc).replace(tzinfo=None)  # nbgrader: naive UTC
        found = {}
        for submission in record.submissions:
            lateness = penalty(policy, submission.duedate, submission.timestamp, submission.score)
            left = lateness.penalty
            for notebook in sorted(submission.notebooks, key=lambda nb: nb.name):
                share = min(left, max(notebook.score, 0.0))
                notebook.late_submission_penalty = share if lateness.late_by else None
                left -= share
            found[submission.student_id] = lateness
        gb.db.commit()
    return found


# -- what the student versions carry (the self-check) --------------------------------------
SELF_CHECK_MODES = ("full", "visible", "off")
SELF_CHECK_ANSWERS = ("reveal", "hide")
SELF_CHECK_KEYS = ("self_check", "self_check_answers")


@dataclass(frozen=True)
class SelfCheckSettings:
    """What the student versions carry to check a learner's work before handing it in.

    * ``mode``: ``"full"`` (every test cell, hidden tests included, ships in the self-check
      package; the site's default), ``"visible"`` (the package runs only the test lines the
      student version shows), ``"off"`` (no check cells and no package);
    * ``answers``: ``"reveal"`` (a check shows the model answer of a written part once the
      learner wrote one: self-study) or ``"hide"`` (a graded course).
    """

    mode: str = "full"
    answers: str = "reveal"


def load_self_check(root: str | Path) -> SelfCheckSettings:
    """``self_check`` and ``self_check_answers`` of ``<root>/course.toml`` (defaults when absent)::

        self_check = "full"            # or "visible", "off"
        self_check_answers = "reveal"  # or "hide"

    A bad value raises a one-line ValueError naming the file, the key and the choices.
    """
    path, data = read_course_file(root)
    if data is None:
        return SelfCheckSettings()
    values = {}
    for key, name, choices in (("self_check", "mode", SELF_CHECK_MODES),
                               ("self_check_answers", "answers", SELF_CHECK_ANSWERS)):
        if key in data:
            if data[key] not in choices:
                raise ValueError(f"{path}: {key}: write one of {', '.join(map(repr, choices))}, "
                                 f"not {data[key]!r}")
            values[name] = data[key]
    return SelfCheckSettings(**values)


# -- what ``serve`` allows each student (the [service] tables) --------------------------
COUNTS = ("last", "best")
BEFORE_DUE = ("all", "visible")
RULE_KEYS = ("attempts", "per_day", "cooldown", "counts", "before_due")
SERVICE_KEYS = RULE_KEYS + ("instructors",)


@dataclass(frozen=True)
class AttemptRules:
    """The attempts ``serve`` takes from one student for one assignment.

    * ``attempts``: attempts in total (``None``: no limit); ``per_day``: attempts per day,
      a day in the course's ``timezone`` (UTC without one); ``cooldown``: the least time
      between two attempts;
    * ``counts``: ``"last"`` (the newest graded attempt is the grade) or ``"best"`` (the
      highest score; the newest of equals);
    * ``before_due``: what a student is shown of an attempt before the due date:
      ``"all"`` (the feedback page: every test cell's verdict) or ``"visible"`` (the score
      and the verdicts of the test cells whose tests the student version shows; the page
      once the due date has passed). An assignment without a due date is always past it.

    Attempts refused by these rules are never graded and never counted.
    """

    attempts: int | None = None
    per_day: int | None = None
    cooldown: timedelta = timedelta(0)
    counts: str = "last"
    before_due: str = "all"


@dataclass(frozen=True)
class ServiceRules:
    """``serve``'s settings of the course: the rules of each assignment, and the Hub users
    who are instructors (besides the Hub's admins)."""

    default: AttemptRules = AttemptRules()
    assignments: dict[str, AttemptRules] = field(default_factory=dict)
    instructors: frozenset[str] = frozenset()
    zone: tzinfo = timezone.utc

    def rules(self, assignment: str) -> AttemptRules:
        """The rules of ``assignment``: its own table's, over the course's."""
        return self.assignments.get(assignment, self.default)


def read_count(value) -> int:
    """A positive whole number of attempts."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("write a whole number of attempts, 1 or more")
    return value


def read_choice(choices):
    def read(value):
        if value not in choices:
            raise ValueError(f"write one of {', '.join(map(repr, choices))}, not {value!r}")
        return value
    return read


def read_cooldown(value) -> timedelta:
    if not isinstance(value, str):
        raise ValueError('write the cool-down as a string, e.g. "10m"')
    try:
        return parse_duration(value)
    except ValueError:
        raise ValueError(f"{value!r}: write a duration such as 30s, 10m or 1h") from None


RULE_READERS = {"attempts": read_count, "per_day": read_count, "cooldown": read_cooldown,
                "counts": read_choice(COUNTS), "before_due": read_choice(BEFORE_DUE)}


def read_rules(table: dict, base: AttemptRules, *key: str) -> AttemptRules:
    """``base`` with the keys of the TOML table ``table`` (at ``key``) replaced."""
    values = {name: read_setting(table, name, RULE_READERS[name], *key)
              for name in RULE_KEYS if name in table}
    return replace(base, **values)


def load_service_rules(root: str | Path) -> ServiceRules:
    """``serve``'s rules from ``<root>/course.toml`` (all optional; defaults: no limits, the
    last attempt counts, every verdict shown)::

        [service]
        attempts = 10            # per assignment, in total
        per_day = 3              # per day (the course's timezone)
        cooldown = "10m"         # between two attempts of one student
        counts = "best"          # or "last"
        before_due = "visible"   # or "all"
        instructors = ["ada"]    # Hub users who see the instructor's view (Hub admins do)

        [assignments."01-rope".service]
        attempts = 20            # this assignment's own rules, over [service]'s

    Late attempts are graded under the assignment's late policy (:func:`load_settings`). A bad
    value or an unknown key raises a one-line ValueError naming the file and the key.
    """
    settings = load_settings(root)  # the file is checked whole: the same errors as grade's
    if settings.source is None:
        return ServiceRules()
    _, data = read_course_file(root)
    try:
        table = read_table(data.get("service", {}), SERVICE_KEYS, "service")
        default = read_rules(table, AttemptRules(), "service")
        instructors = table.get("instructors", [])
        if not isinstance(instructors, list) or not all(isinstance(n, str) for n in instructors):
            raise ValueError("service.instructors: write a list of Hub user names")
        own = {}
        for name, entry in data.get("assignments", {}).items():
            if "service" in entry:
                sub = read_table(entry["service"], RULE_KEYS, "assignments", name, "service")
                own[name] = read_rules(sub, default, "assignments", name, "service")
    except ValueError as error:
        raise ValueError(f"{settings.source}: {error}") from None
    return ServiceRules(default, own, frozenset(instructors), settings.zone or timezone.utc)


def refusal(rules: AttemptRules, earlier: list[datetime], now: datetime,
            zone: tzinfo = timezone.utc) -> str | None:
    """Why a new attempt at ``now`` is refused under ``rules``, given the times of the
    student's ``earlier`` accepted attempts of the assignment (aware); ``None`` if it is taken."""
    if rules.attempts is not None and len(earlier) >= rules.attempts:
        return f"all {rules.attempts} attempts of this assignment are used"
    day = now.astimezone(zone).date()
    if rules.per_day is not None and sum(t.astimezone(zone).date() == day for t in earlier) >= rules.per_day:
        return f"the {rules.per_day} attempts of today are used; try again tomorrow"
    if earlier and rules.cooldown and (wait := max(earlier) + rules.cooldown - now) > timedelta(0):
        return f"the next attempt is possible in {duration_text(wait)} (cool-down {duration_text(rules.cooldown)})"
    return None
