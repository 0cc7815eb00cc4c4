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
clears it) and a ``timestamp.txt``: the newest archive-entry time of their files (zip
times carry no zone: taken as UTC), as nbgrader's collection writes it; each file keeps
its entry time as its modification time, so grading takes the newest. Files that match
no roster student, and other files, are reported, not written.

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

from ..core.nbgrader_config import SUBMITTED
from ..core.untrusted import printable
from ..worker.intake import NOTEBOOK_BYTES, TIMESTAMP
from .roster import RosterEntry, read_roster

CHUNK = 1 << 20
NEW, OLD = "new", "old"  # the staging folder's parts: what is written, what it replaces


class Lms(StrEnum):
    """The learning management systems whose bulk downloads ``collect`` reads."""

    CANVAS = "canvas"
    MOODLE = "moodle"


LAYOUTS = {
    Lms.CANVAS: re.compile(r"^(?P<name>[^_/]+?)(?:_late)?_(?P<id>\d+)_\d+_(?P<file>[^/]+)$",
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
    """One file written: the roster student, its name in their folder, the archive entry."""

    student: str
    name: str
    entry: str
    time: datetime


@dataclass(frozen=True)
class CollectReport:
    """What ``collect`` did: files written, and archive entries not written (with why)."""

    collected: tuple[Collected, ...]
    unmatched: tuple[str, ...]               # notebooks that name no roster student
    skipped: tuple[tuple[str, str], ...]     # (entry, why) of the other entries not written


class ArchiveError(ValueError):
    """The archive cannot be collected: one line for the instructor; nothing was written."""


def collect(archive: Path, lms: Lms, assignment: str, root: Path,
            roster: list[RosterEntry], bounds: Bounds = Bounds()) -> CollectReport:
    """Collect ``archive`` (a bulk download of ``lms``) into ``root/submitted``; a report.

    ArchiveError, one line, for an archive that cannot be read or is hostile (nothing
    is written then).
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
                plan, unmatched, skipped = assign(infos, lms, assignment, roster)
            except ArchiveError as error:
                raise ArchiveError(f"{archive}: {error}") from None
            staging = Path(tempfile.mkdtemp(prefix=".collect-", dir=root))
            try:
                skipped += extract(zf, archive, plan, staging, bounds)
                kept = [c for c, _ in plan.values() if (staging / NEW / c.student / c.name).exists()]
                refused = install(staging, root / SUBMITTED, assignment, kept)
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
    return CollectReport(tuple(c for c in kept if c.student not in refused),
                         tuple(unmatched), tuple(skipped))


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


def assign(infos, lms, assignment, roster):
    """``(plan, unmatched, skipped)``: ``{(student, name): (Collected, ZipInfo)}`` of the
    newest entry for each file a roster student gets, and the entries that get none.

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
        found = Collected(student, safe_name(match["file"], assignment), entry, entry_time(info))
        key = (student, found.name)
        older = plan.get(key, (None, None))[0]
        if older is not None and older.time > found.time:
            skipped.append((entry, f"an older copy of {printable(older.entry)}"))
            continue
        if older is not None:
            skipped.append((older.entry, f"an older copy of {printable(entry)}"))
        plan[key] = (found, info)
    return plan, unmatched, skipped


def entry_time(info):
    """An entry's time (zip times carry no zone: UTC); ArchiveError naming the entry if it is no time."""
    try:
        return datetime(*info.date_time, tzinfo=timezone.utc)
    except ValueError as error:  # the header's fields are what the archive says: 13th month, 31 Feb
        raise ArchiveError(f"entry '{printable(info.filename)}' has no valid time "
                           f"({'-'.join(map(str, info.date_time[:3]))} "
                           f"{':'.join(map(str, info.date_time[3:]))}: {error})") from None


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
    ``timestamp.txt``; the set of students whose folder is a link or not a folder (not
    written into)."""
    refused = set()
    for student in sorted({c.student for c in kept}):
        folder = staging / NEW / student
        newest = max(c.time for c in kept if c.student == student)
        (folder / TIMESTAMP).write_text(newest.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
        home, target = submitted / student, submitted / student / assignment
        if any(p.is_symlink() or (p.exists() and not p.is_dir()) for p in (home, target)):
            refused.add(student)
            continue
        home.mkdir(parents=True, exist_ok=True)
        if target.exists():  # replaced whole, as zip_collect clears it; removed with staging
            (staging / OLD).mkdir(exist_ok=True)
            os.rename(target, staging / OLD / student)
        os.rename(folder, target)
    return refused


def collect_into_course(root: Path, assignment: str, lms: Lms, archive: Path) -> list[str]:
    """Collect ``archive`` with the course's ``roster.csv``; the report's lines for the terminal
    (student-controlled text escaped). ArchiveError or ValueError (one line) when the
    roster or the archive cannot be used."""
    from .driver import ROSTER

    path = Path(root) / ROSTER
    if not path.is_file():
        raise ValueError(f"no {ROSTER} under {root}: collect maps the archive's files to the "
                         "roster's students (columns student_id,name,email,lms_id)")
    report = collect(archive, lms, assignment, root, read_roster(path))
    students = {c.student for c in report.collected}
    lines = [f"collected {len(report.collected)} notebook(s) of {len(students)} student(s) "
             f"into {SUBMITTED}/<student>/{assignment}/"]
    lines += [f"not matched to the roster: {printable(entry)}" for entry in report.unmatched]
    lines += [f"skipped {printable(entry)}: {why}" for entry, why in report.skipped]
    return lines
