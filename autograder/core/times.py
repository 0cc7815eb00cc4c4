"""Times of the course: how they are read and how nbgrader's ``timestamp.txt`` is written.

The one owner of time parsing and of nbgrader's timestamp format:

* :func:`parse_time` reads what ``timestamp.txt`` and ``course.toml`` hold, as an aware UTC
  datetime, or raises ``ValueError`` with one line naming the text;
* :func:`as_utc` makes any datetime an aware UTC one (a naive one is read in a given zone,
  UTC by default): every comparison of times in the grader is between aware UTC datetimes;
* :func:`nbgrader_time` writes a moment as nbgrader writes ``timestamp.txt``
  (:data:`NBGRADER_TIME`, in UTC), which :func:`parse_time` reads back exactly.
"""

import re
from datetime import datetime, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

NBGRADER_TIME = "%Y-%m-%d %H:%M:%S.%f UTC"  # nbgrader's timestamp.txt, always in UTC


def nbgrader_time(moment: datetime) -> str:
    """``moment`` (aware) as nbgrader's ``timestamp.txt`` holds it."""
    return moment.astimezone(timezone.utc).strftime(NBGRADER_TIME)


def as_utc(moment: datetime, zone: tzinfo = timezone.utc) -> datetime:
    """``moment`` as an aware UTC datetime; a naive one is read in ``zone`` (default UTC)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        return moment.replace(tzinfo=zone).astimezone(timezone.utc)
    return moment.astimezone(timezone.utc)


def parse_time(text: str, zone: tzinfo | None = timezone.utc) -> datetime:
    """The moment ``text`` names, as an aware UTC datetime.

    Reads what nbgrader's ``timestamp.txt`` holds and what instructors write:
    ``2026-12-01 23:59:59.123456 UTC`` (a zone name, ``UTC``, ``GMT`` or an IANA name
    such as ``Europe/Berlin``, after a space), ``2026-12-01 23:59:59 +0100``, ISO 8601
    with an offset or ``Z`` (``2026-12-01T23:59:00+01:00``) and without one
    (``2026-12-01T23:59``, read in ``zone``: UTC by default, as nbgrader writes
    ``timestamp.txt``; ``zone=None`` refuses it). A date without a time of day is refused
    (midnight at the start of the day is rarely what a due date means).
    """

    def fail(problem):
        return ValueError(f"cannot read the time {text!r}: {problem} "
                          "(write e.g. 2026-12-01T23:59:00+00:00 or 2026-12-01 23:59:59 UTC)")

    value = text.strip()
    if not re.search(r"\d:\d\d", value):
        raise fail("no time of day")
    head, _, zone_name = value.rpartition(" ")
    named = bool(head) and zone_name[:1].isalpha()
    if not named and zone_name.startswith(("+", "-")):
        value = head + zone_name
    try:
        moment = datetime.fromisoformat(head if named else value)
    except ValueError:
        raise fail("not a date and time") from None
    if not named:
        if moment.tzinfo is None and zone is None:
            raise fail("no time zone, and course.toml declares no timezone")
        return as_utc(moment, zone or timezone.utc)
    if moment.tzinfo is not None:
        raise fail("two time zones")
    try:
        zone = timezone.utc if zone_name.upper() in ("UTC", "GMT", "Z") else ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise fail(f"unknown time zone {zone_name!r}") from None
    return moment.replace(tzinfo=zone).astimezone(timezone.utc)

