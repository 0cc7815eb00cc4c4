"""``python -m autograder collect ASSIGNMENT --from canvas|moodle ZIP``: an LMS bulk download
into ``submitted/<student>/<assignment>/``.

It plays the role of nbgrader's ``zip_collect`` (its ``FileNameCollectorPlugin`` reads the
student from each file name) for the two layouts an LMS gives its bulk download:

* **Canvas**: ``lastnamefirstname_<user id>_<submission id>_<file name>``, with ``_LATE``
  after the name for a late submission (``lovelaceada_LATE_1234_5678_01-rope.ipynb``);
  a resubmission's file name gets ``-1``, ``-2``...
* **Moodle**: ``Full Name_<id>_assignsubmission_file_/<file name>`` (one folder per
  student), or the same without the ``/`` (all files in one folder).

**Whose file it is never depends on what the student named it.** A name is parsed anchored at
the start of the entry's path, which is the LMS's own part: the student's name and id as the
LMS wrote them; whatever follows (the student's file name, or folders they uploaded) is only a
file name, so ``Ada Lovelace_0_assignsubmission_file_01-rope.ipynb`` in Eve's folder is Eve's
file. Each ``*.ipynb`` file goes to the roster student (``roster.csv``, read with
:func:`autograder.host.roster.read_roster`) whose ``lms_id`` is the id in the name; else, by
name, to the one roster student of that name, and only when that student has no ``lms_id`` (a
student with one is found by it alone: a name never overrides an id). Ambiguity is an error
naming the entries: a name that fits several roster students, or one student reached by
entries with different ids. The student's folder
``submitted/<student>/<assignment>/`` is replaced by their files (as ``zip_collect``
clears it) and a ``timestamp.txt``: the newest archive-entry time of their files, as
nbgrader's collection writes it; each file keeps its entry time as its modification
time, so grading takes the newest. A zip entry's time is UTC when the entry carries
the zip format's *extended timestamp* (a Unix time); otherwise it is a wall-clock time
without a zone, read in the course's declared ``timezone`` (``course.toml``), and an
archive with such times is refused when the course declares none. Files that match no
roster student, and other files, are reported, not written.

**Nothing is lost.** A folder that is replaced is kept beside it, under a dated name the
grader ignores (``submitted/<student>/.<assignment>.replaced-<UTC time>``), and the
report names every student whose submission was replaced and where it went. A notebook
that carries nbgrader cells but not the assignment's (by :func:`autograder.worker.intake`'s
rule: the release's solution cells, by ``grade_id``, type and the names they define) is
not collected: the archive of another assignment is refused whole, with one line
(``collect 01-rope`` given 06's download), and a single student's notebook of another
assignment is skipped and reported, their folder left as it was. An archive in which no
notebook matches a roster student is refused (the roster's ``lms_id`` or names are
wrong). Canvas's ``_LATE`` mark is compared with the entry times and the due date of
``course.toml``; where they disagree, the report says so.

**The archive is hostile.** Nothing of an entry's path is ever used to make a path: a
file is written as ``submitted/<roster id>/<assignment>/<its base name>``, and a base name
that is not a plain printable name becomes ``<assignment>.ipynb``. An archive whose entries
try to climb out (``..``, absolute paths, backslashes, drive letters), that holds links,
devices or encrypted entries, that has more than :attr:`Bounds.entries` entries, or that
expands beyond :attr:`Bounds.total_bytes` or more than :attr:`Bounds.ratio` times an
entry's compressed size (a zip bomb) is refused as a whole, with one line, before anything
is written: sizes are counted while inflating, never taken from the headers. An entry larger
than :attr:`Bounds.file_bytes` (the grader's own cap on one notebook) is skipped and
reported. Student folders that are links are not written into.
"""

import os
import re
import shutil
import stat
import tempfile
import unicodedata
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import StrEnum
from pathlib import Path

import nbformat

from ..core.cells import grade_id
from ..core.course_files import SUBMITTED, TIMESTAMP
from ..core.times import nbgrader_time
from ..core.untrusted import printable
from ..core.notebook_file import NOTEBOOK_BYTES, read_notebook
from ..core.solution_cells import belongs_by_grade_ids, solution_cells
from .roster import COLUMNS as ROSTER_COLUMNS
from .roster import RosterEntry, read_roster

CHUNK = 1 << 20
NEW = "new"  # the staging folder's part that holds what is written


class Lms(StrEnum):
    """The learning management systems whose bulk downloads ``collect`` reads."""

    CANVAS = "canvas"
    MOODLE = "moodle"


LAYOUTS = {
    Lms.CANVAS: re.compile(r"^(?P<name>[^_/]+?)(?P<late>_late)?_(?P<id>\d+)_\d+_(?P<file>[^/]+)$",
                           re.IGNORECASE),
    Lms.MOODLE: re.compile(r"^(?P<name>[^/]+?)_(?P<id>\d+)_assignsubmission_[a-z]+_"
                           r"(?:/(?:.*/)?)?(?P<file>[^/]+)$"),
}


@dataclass(frozen=True)
class Bounds:
    """What one archive may cost to collect."""

    entries: int = 10_000              # entries in the archive
    file_bytes: int = NOTEBOOK_BYTES   # one file, inflated (larger ones are skipped)
    total_bytes: int = 2 * 2**30       # all files, inflated
    ratio: int = 200                   # inflated / compressed size of one entry, past 1 MiB


@dataclass(frozen=True)
class Collected:
    """One file written: the roster student, its name in their folder, the archive entry,
    its time (aware UTC), and whether the LMS marked it late (Canvas's ``_LATE``)."""

    student: str
    name: str
    entry: str
    time: datetime
    marked_late: bool = False


@dataclass(frozen=True)
class CollectReport:
    """What ``collect`` did: files written, and archive entries not written (with why)."""

    collected: tuple[Collected, ...]
    unmatched: tuple[str, ...]               # notebooks that name no roster student
    skipped: tuple[tuple[str, str], ...]     # (entry, why) of the other entries not written
    replaced: tuple[tuple[str, str], ...] = ()  # (student, where their earlier folder is kept)
    disagreements: tuple[str, ...] = ()      # the LMS's late mark against the entry times


class ArchiveError(ValueError):
    """The archive cannot be collected: one line for the instructor; nothing was written."""


@dataclass(frozen=True)
class Expected:
    """What the archive's notebooks are checked against: the assignment's source notebooks
    (``sources``), the other assignments' (``others``: name -> notebooks, to say whose a
    stray notebook is), the zone of zip times without one and the due date."""

    sources: tuple = ()
    others: tuple = ()            # (assignment, (notebooks...))
    zone: object = None           # a tzinfo, or None: naive zip times are refused
    due: datetime | None = None


def collect(archive: Path, lms: Lms, assignment: str, root: Path,
            roster: list[RosterEntry], bounds: Bounds = Bounds(),
            expected: Expected = Expected(zone=timezone.utc)) -> CollectReport:
    """Collect ``archive`` (a bulk download of ``lms``) into ``root/submitted``; a report.

    ArchiveError, one line, for an archive that cannot be read or is hostile, whose
    notebooks are another assignment's, or that matches no roster student (nothing is
    written then).
    """
    archive, root = Path(archive), Path(root)
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            if len(infos) > bounds.entries:
                raise ArchiveError(f"{archive}: {len(infos)} entries, more than the "
                                   f"{bounds.entries} collect takes")
            for info in infos:
                check_entry(archive, info)
            try:
                plan, unmatched, skipped = assign(infos, lms, assignment, roster, expected.zone)
            except ArchiveError as error:
                raise ArchiveError(f"{archive}: {error}") from None
            if not plan and unmatched:
                raise ArchiveError(f"{archive}: none of its {len(unmatched)} notebook(s) matches a "
                                   f"roster student by lms_id or name: check the roster's "
                                   f"lms_id and name columns ({','.join(ROSTER_COLUMNS)})")
            staging = Path(tempfile.mkdtemp(prefix=".collect-", dir=root))
            try:
                skipped += extract(zf, archive, plan, staging, bounds)
                kept = [c for c, _ in plan.values() if (staging / NEW / c.student / c.name).exists()]
                foreign = strays(archive, staging, kept, assignment, expected)
                skipped += foreign
                kept = [c for c in kept if c.student not in {s for s, _ in foreign_students(kept, foreign)}]
                refused, replaced = install(staging, root / SUBMITTED, assignment, kept)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as error:
        raise ArchiveError(f"{archive}: not a readable zip archive ({error})") from None
    except UnicodeDecodeError:
        raise ArchiveError(f"{archive}: an entry name marked UTF-8 is not UTF-8") from None
    except OSError as error:
        raise ArchiveError(f"{archive}: {error.strerror or error}") from None
    skipped += [(c.entry, f"{SUBMITTED}/{c.student} or its {assignment} folder is a link or "
                          "not a folder: not written into") for c in kept if c.student in refused]
    collected = tuple(c for c in kept if c.student not in refused)
    return CollectReport(collected, tuple(unmatched), tuple(skipped), tuple(replaced),
                         tuple(late_disagreements(collected, expected.due)) if lms == Lms.CANVAS else ())


def foreign_students(kept, foreign):
    """``[(student, entry)]`` of the students one of whose notebooks is in ``foreign``: none of
    their files is collected (their folder stays as it was)."""
    entries = {entry for entry, _ in foreign}
    return [(c.student, c.entry) for c in kept if c.entry in entries]


def nbgrader_cells(notebook):
    """Whether ``notebook`` carries nbgrader cells (a ``grade_id``)."""
    return any(grade_id(cell) for cell in notebook.cells)


def belongs(notebook, sources):
    """Whether ``notebook`` is one of ``sources``'s by intake's rule (its solution cells)."""
    return any(belongs_by_grade_ids(notebook, source, solution_cells(source)) for source in sources)


def strays(archive, staging, kept, assignment, expected):
    """``[(entry, why)]`` of the staged notebooks that carry nbgrader cells but not the
    assignment's; ArchiveError when none of the archive's notebooks is the assignment's and
    some are another's (the wrong download)."""
    if not expected.sources:
        return []
    found, ours = [], 0
    for c in kept:
        notebook, _ = read_notebook((staging / NEW / c.student / c.name).read_bytes())
        if notebook is None or not nbgrader_cells(notebook):
            continue  # unreadable, or retyped without metadata: grading says what it is
        if belongs(notebook, expected.sources):
            ours += 1
            continue
        whose = next((name for name, notebooks in expected.others if belongs(notebook, notebooks)), None)
        found.append((c.entry, f"a notebook of {whose or 'another assignment'}, not of {assignment} "
                               "(by its nbgrader cells): not collected, the student's folder is "
                               "left as it was"))
    if found and not ours:
        names = sorted({why.split(",")[0].removeprefix("a notebook of ") for _, why in found})
        raise ArchiveError(f"{archive}: its notebooks are not {assignment}'s: {len(found)} of "
                           f"{len(kept)} hold the nbgrader cells of {' and '.join(names)}; "
                           "nothing was collected (the download of another assignment?)")
    return found


def late_disagreements(collected, due):
    """Lines where Canvas's ``_LATE`` mark and the entry times disagree about ``due``."""
    if due is None:
        return []
    lines = []
    for student in sorted({c.student for c in collected}):
        mine = [c for c in collected if c.student == student]
        newest, marked = max(c.time for c in mine), any(c.marked_late for c in mine)
        if marked and newest <= due:
            lines.append(f"{printable(student)}: Canvas marks the submission late, but its newest "
                         f"file is from {newest:%Y-%m-%d %H:%M:%S} UTC, before the due date "
                         f"{due:%Y-%m-%d %H:%M:%S} UTC (an extension or a due date of Canvas's own?)")
        elif not marked and newest > due:
            lines.append(f"{printable(student)}: Canvas does not mark the submission late, but its "
                         f"newest file is from {newest:%Y-%m-%d %H:%M:%S} UTC, after the due date "
                         f"{due:%Y-%m-%d %H:%M:%S} UTC (an extension in Canvas?)")
    return lines


def entry_time(info, zone):
    """When the entry was written, aware UTC: the extended timestamp's Unix time if the entry
    has one, else its wall-clock time read in ``zone``. ArchiveError naming the entry when that
    time has no zone (``zone`` None) or is no time at all (the header's fields are what the
    archive says: a 13th month, 31 February)."""
    extra = info.extra
    while len(extra) >= 4:
        kind, size = int.from_bytes(extra[:2], "little"), int.from_bytes(extra[2:4], "little")
        body = extra[4:4 + size]
        if kind == 0x5455 and len(body) >= 5 and body[0] & 1:
            return datetime.fromtimestamp(int.from_bytes(body[1:5], "little", signed=True), timezone.utc)
        extra = extra[4 + size:]
    if zone is None:
        raise ArchiveError(f"entry '{printable(info.filename)}' has a time without a time "
                           "zone: declare the zone the LMS writes its zip times in, e.g. "
                           'timezone = "UTC", at the top of course.toml')
    try:
        return datetime(*info.date_time).replace(tzinfo=zone).astimezone(timezone.utc)
    except ValueError as error:
        raise ArchiveError(f"entry '{printable(info.filename)}' has no valid time "
                           f"({'-'.join(map(str, info.date_time[:3]))} "
                           f"{':'.join(map(str, info.date_time[3:]))}: {error})") from None


def check_entry(archive, info):
    """Raise ArchiveError unless ``info`` is a plain file or folder with a path that stays inside."""
    name = info.filename
    parts = re.split(r"[/\\]", name)
    shown = printable(name)
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts:
        raise ArchiveError(f"{archive}: entry '{shown}' would be written outside the folder it "
                           "is unpacked in (zip slip)")
    if "\\" in name:
        raise ArchiveError(f"{archive}: entry '{shown}' has a backslash in its path")
    mode = info.external_attr >> 16
    if info.create_system == 3 and stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
        raise ArchiveError(f"{archive}: entry '{shown}' is {kind}")
    if info.flag_bits & 0x1:
        raise ArchiveError(f"{archive}: entry '{shown}' is encrypted")


def owner(match, by_id, by_name, entry):
    """The roster student an entry's LMS part names (see the module's docstring), or None.

    ArchiveError when its name fits several roster students and its id none.
    """
    if match["id"] in by_id:
        return by_id[match["id"]]
    named = by_name.get(squeeze(match["name"]), ())
    if len(named) > 1:
        raise ArchiveError(f"entry '{printable(entry)}': its name fits {len(named)} roster students "
                           f"({', '.join(printable(s) for s in sorted(named))}) and its id "
                           f"{match['id']} none of them: give them their lms_id in the roster")
    return next(iter(named), None)


def assign(infos, lms, assignment, roster, zone=timezone.utc):
    """``(plan, unmatched, skipped)``: ``{(student, name): (Collected, ZipInfo)}`` of the
    newest entry for each file a roster student gets, and the entries that get none.
    Entry times are :func:`entry_time`'s (``zone``: where a time without one is read).

    ArchiveError (naming the entries) when whose an entry is cannot be told (see above).
    """
    by_id = {e.lms_id: e.student_id for e in roster if e.lms_id}
    by_name = {}
    for entry in roster:
        if entry.lms_id:  # found by the id alone
            continue
        for key in name_keys(entry, lms):
            by_name.setdefault(key, set()).add(entry.student_id)
    ids_of = {}  # student -> {id in the path: an entry with it}
    plan, unmatched, skipped = {}, [], []
    for info in infos:
        if info.is_dir():
            continue
        entry = info.filename
        match = LAYOUTS[lms].match(entry)
        if not entry.lower().endswith(".ipynb"):
            skipped.append((entry, "not a notebook"))
            continue
        if match is None:
            unmatched.append(entry)
            continue
        student = owner(match, by_id, by_name, entry)
        if student is None:
            unmatched.append(entry)
            continue
        ids_of.setdefault(student, {}).setdefault(match["id"], entry)
        if len(ids_of[student]) > 1:
            raise ArchiveError(f"entries {' and '.join(repr(printable(e)) for e in ids_of[student].values())} "
                               f"both go to roster student {printable(student)} under different ids "
                               f"({', '.join(ids_of[student])}): give them their lms_id in the roster")
        found = Collected(student, safe_name(match["file"], assignment), entry,
                          entry_time(info, zone), bool(match.groupdict().get("late")))
        key = (student, found.name)
        older = plan.get(key, (None, None))[0]
        if older is not None and older.time > found.time:
            skipped.append((entry, f"an older copy of {printable(older.entry)}"))
            continue
        if older is not None:
            skipped.append((older.entry, f"an older copy of {printable(entry)}"))
        plan[key] = (found, info)
    return plan, unmatched, skipped


def squeeze(text):
    """``text`` as a name key: case-folded, accents, spaces and punctuation dropped."""
    plain = unicodedata.normalize("NFKD", text).casefold()
    return "".join(ch for ch in plain if ch.isalnum())


def name_keys(entry, lms):
    """The keys an LMS writes for a roster student's name (Canvas: last name first)."""
    first, last = entry.first_name or "", entry.last_name or ""
    key = squeeze(last + first) if lms == Lms.CANVAS else squeeze(f"{first} {last}")
    return {key} if key else set()


def safe_name(name, assignment):
    """``name`` when it is a plain, printable, visible ``*.ipynb`` base name, else ``<assignment>.ipynb``."""
    if (printable(name) == name and name.isprintable() and not name.startswith(".")
            and "/" not in name and "\\" not in name and len(name.encode()) <= 200):
        return name
    return f"{assignment}.ipynb"


def extract(zf, archive, plan, staging, bounds):
    """Inflate the planned entries into ``staging/new/<student>/<name>``, counting every byte.

    Returns ``[(entry, why)]`` of entries skipped for size; raises ArchiveError for a
    zip bomb (the ratio or the total).
    """
    skipped, total = [], 0
    for item, info in plan.values():
        folder = staging / NEW / item.student
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / item.name
        size = 0
        with zf.open(info) as source, open(path, "wb") as target:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                total += len(chunk)
                if size > CHUNK and size > bounds.ratio * max(info.compress_size, 1):
                    raise ArchiveError(f"{archive}: entry '{printable(item.entry)}' inflates more "
                                       f"than {bounds.ratio} times its size (a zip bomb)")
                if total > bounds.total_bytes:
                    raise ArchiveError(f"{archive}: inflates to more than "
                                       f"{bounds.total_bytes // 2**20} MiB")
                if size > bounds.file_bytes:
                    break
                target.write(chunk)
        if size > bounds.file_bytes:
            path.unlink()
            skipped.append((item.entry, f"larger than the {bounds.file_bytes // 2**20} MiB the "
                                        "grader reads"))
            continue
        moment = item.time.timestamp()
        os.utime(path, (moment, moment))
    return skipped


def install(staging, submitted, assignment, kept):
    """Replace each student's ``submitted/<student>/<assignment>`` by their staged files and a
    ``timestamp.txt``; ``(refused, replaced)``: the students whose folder is a link or not a
    folder (not written into), and ``[(student, where the earlier folder is kept)]``.

    An earlier folder is moved, never removed, to ``submitted/<student>/.<assignment>.replaced-<UTC
    time>`` (a hidden name: neither ``grade`` nor stock nbgrader reads it).
    """
    refused, replaced = set(), []
    now = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for student in sorted({c.student for c in kept}):
        folder = staging / NEW / student
        newest = max(c.time for c in kept if c.student == student)
        (folder / TIMESTAMP).write_text(nbgrader_time(newest))
        home, target = submitted / student, submitted / student / assignment
        if any(p.is_symlink() or (p.exists() and not p.is_dir()) for p in (home, target)):
            refused.add(student)
            continue
        home.mkdir(parents=True, exist_ok=True)
        if target.exists():  # replaced whole, as zip_collect clears it; the earlier one kept
            aside, n = home / f".{assignment}.replaced-{now}", 1
            while aside.exists():
                n += 1
                aside = home / f".{assignment}.replaced-{now}-{n}"
            os.rename(target, aside)
            replaced.append((student, f"{SUBMITTED}/{student}/{aside.name}"))
        os.rename(folder, target)
    return refused, replaced


def collect_into_course(root: Path, assignment: str, lms: Lms, archive: Path) -> list[str]:
    """Collect ``archive`` with the course's ``roster.csv``, its source notebooks and its
    ``course.toml`` (the zone of zip times, the due date); the report's lines for the
    terminal (student-controlled text escaped). ArchiveError or ValueError (one line) when
    the roster, the settings or the archive cannot be used."""
    from ..core.course_files import ROSTER_CSV, SOURCE
    from ..core.policy import load_settings
    from ..core.assignments import source_assignments

    root = Path(root)
    path = root / ROSTER_CSV
    if not path.is_file():
        raise ValueError(f"no {ROSTER_CSV} under {root}: collect maps the archive's files to the "
                         f"roster's students (columns {','.join(ROSTER_COLUMNS)})")
    settings = load_settings(root)

    def notebooks(name):
        return tuple(nbformat.read(p, as_version=4) for p in sorted((root / SOURCE / name).glob("*.ipynb")))

    expected = Expected(notebooks(assignment),
                        tuple((a, notebooks(a)) for a in source_assignments(root) if a != assignment),
                        settings.zone, settings.due(assignment))
    report = collect(archive, lms, assignment, root, read_roster(path), expected=expected)
    students = {c.student for c in report.collected}
    lines = [f"collected {len(report.collected)} notebook(s) of {len(students)} student(s) "
             f"into {SUBMITTED}/<student>/{assignment}/"]
    lines += [f"replaced {printable(student)}'s earlier submission, kept as {printable(where)}"
              for student, where in report.replaced]
    lines += [f"not matched to the roster: {printable(entry)}" for entry in report.unmatched]
    lines += [f"skipped {printable(entry)}: {why}" for entry, why in report.skipped]
    lines += [f"late mark: {line}" for line in report.disagreements]
    return lines
