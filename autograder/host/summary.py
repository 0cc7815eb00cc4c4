"""Progress bar, ``grades.csv`` and the end-of-run class summary."""

import csv
import fcntl
import os
import sys
from collections import Counter
from pathlib import Path
from datetime import timedelta
from time import monotonic

from ..core.course_files import report_page
from ..core.policy import duration_text
from ..core.results import LimitKind, Status
from ..core.untrusted import csv_safe, csv_text, printable

CSV_FIELDS = ["student", "assignment", "score", "max_score", "status", "needs_manual",
              "submitted_at", "late_by_hours", "late_penalty", "seconds", "failed_tests", "limits",
              "tampered", "deleted", "flags", "similar", "error", "message"]
SIMILAR_FLAG = "similar-to-classmate"
CLUSTERS_SHOWN = 10         # clusters of similar work the summary lists (largest first)
CLUSTER_NAMES = 12          # students it names per cluster (every pair is in grades.csv)


class Progress:
    """A one-line progress bar on stderr (a line per 10 % when not a terminal), which says
    first what it counts and, once a submission is done, about how long is left.

    Hand-written rather than tqdm or rich: every label is a student id that goes through
    :func:`~autograder.core.untrusted.printable` first, and a log (not a terminal) gets whole
    lines, one per 10 %, where tqdm writes carriage-return frames. The time left is the mean
    time per submission so far times those left; since the longest-expected are graded
    first, it errs long.
    """

    def __init__(self, total, enabled=True, width=30, what="submission(s)", workers=None):
        self.total, self.done, self.width = total, 0, width
        self.enabled = enabled and total > 0
        self.tty = sys.stderr.isatty()
        self.start = monotonic()
        self.last_decile = -1
        if self.enabled:
            on = f" on {workers} worker(s)" if workers else ""
            sys.stderr.write(f"grading {total} {what}{on}\n")
            sys.stderr.flush()

    def eta(self):
        """``about 2m left`` once a submission is done and others are left, else ``""``."""
        if not self.done or self.done >= self.total:
            return ""
        left = (monotonic() - self.start) / self.done * (self.total - self.done)
        return f"about {duration_text(timedelta(seconds=round(left)))} left"

    def update(self, label=""):
        self.done += 1
        if not self.enabled:
            return
        elapsed = monotonic() - self.start
        filled = self.width * self.done // self.total
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{elapsed:5.0f} s  {self.eta()}  {printable(label)}")
        if self.tty:
            sys.stderr.write("\r" + line[:100].ljust(100))
        elif 10 * self.done // self.total != self.last_decile:
            self.last_decile = 10 * self.done // self.total
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self):
        if self.enabled and self.tty:
            sys.stderr.write("\n")


def limits_hit(result):
    """Sorted limit kinds hit by a result ('timeout', 'hang', 'crash', 'output', ...)."""
    return [kind for kind in result.limits if kind in set(LimitKind)]


def failed_tests(result, tests):
    """Test cells (grade ids) of ``tests`` that did not get full marks; none for a submission
    whose grading failed (``error``: it was not graded, its earlier grade stands)."""
    if result.status == Status.ERROR:
        return []
    scores = {(nb.name, g.name): (g.auto_score, g.max_score)
              for nb in result.notebooks for g in nb.grades}
    return [gid for nb, gid in tests
            if result.status != Status.OK or (scores.get((nb, gid), (0, 1))[0] or 0) < scores.get((nb, gid), (0, 1))[1]]


def csv_row(assignment, result, tests):
    """The ``grades.csv`` row of one result of a run (its scores are set from the gradebook's
    standing by :func:`settle_row`)."""
    return dict(
        student=result.student, assignment=assignment,
        score=f"{result.score:g}", max_score=f"{result.max_score:g}",
        status=result.status, needs_manual=int(bool(result.needs_manual)),
        submitted_at=f"{result.timestamp:%Y-%m-%d %H:%M:%S}" if result.timestamp else "",
        late_by_hours="", late_penalty="",
        seconds=f"{result.seconds:.1f}",
        failed_tests=";".join(failed_tests(result, tests)),
        limits=";".join(limits_hit(result)),
        tampered=";".join(result.tampered), deleted=";".join(result.deleted),
        flags=";".join(result.flags), similar=";".join(result.similar),
        error=result.error or "" if result.status == Status.ERROR else "",
        message=result.message or "")


def settle_row(row, standing=None, similar=None):
    """``row`` with the gradebook's ``standing`` (the score after the late penalty, the
    lateness: :class:`~autograder.core.gradebook.Standing`) and, when ``similar`` is given
    (a list, maybe empty), its classmate-similarity flag and descriptions."""
    if standing is not None:
        row.update(score=f"{standing.final:g}", max_score=f"{standing.max_score:g}",
                   needs_manual=str(int(standing.needs_manual)),
                   submitted_at=f"{standing.submitted_at:%Y-%m-%d %H:%M:%S}" if standing.submitted_at else "",
                   late_by_hours=f"{standing.late_by.total_seconds() / 3600:.1f}" if standing.late else "",
                   late_penalty=f"{standing.penalty:g}" if standing.penalty else "")
    if similar is not None:
        flags = [f for f in row["flags"].split(";") if f and f != SIMILAR_FLAG]
        row.update(flags=";".join(sorted(flags + ([SIMILAR_FLAG] if similar else []))),
                   similar=";".join(similar))
    return row


def write_csv(path, assignment, results=(), tests=(), standings=None, missing=(), similar=None):
    """Add/replace this run's rows in ``grades.csv``; settle every row of ``assignment``.

    Each row of ``assignment`` takes its score, ``max_score``, ``needs_manual`` and late
    columns from the gradebook's ``standings`` (``score`` after the late penalty, as every
    export shows it), so that every command that changes a score (``grade``, ``feedback``,
    ``export``, ``report``: manual grades, extensions, a new due date or policy) rewrites
    them; with ``similar`` (``{student: [description]}`` of the whole class), its flags
    and ``similar`` column. Rows of other assignments stay as they are; roster students in
    ``missing`` get a row with status ``missing``. The ``error`` column is empty unless
    grading the submission failed; ``message`` says which notebook was graded or why none.
    Runs of different assignments may finish at once (a PostgreSQL gradebook lets them run
    together): the read-modify-write holds a lock on ``.grades.csv.lock`` beside it and
    replaces the file whole, so neither loses the other's rows and no reader sees half a
    file. No cell can be a spreadsheet formula
    (:func:`~autograder.core.untrusted.csv_safe`; read back with ``csv_text``, so a
    rewrite adds no second apostrophe).
    """
    path = Path(path)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = {}
        if path.exists():
            with open(path, newline="") as f:
                for row in csv.DictReader(f):  # cells as they were before csv_safe
                    row = {k: csv_text(row.get(k) or "") for k in CSV_FIELDS}
                    rows[(row["assignment"], row["student"])] = row
        if not results and not missing and not any(a == assignment for a, _ in rows):
            return  # nothing of this assignment to settle: no file is made
        for result in results:
            rows[(assignment, result.student)] = csv_row(assignment, result, tests)
        for student in missing:
            rows.setdefault((assignment, student), {**dict.fromkeys(CSV_FIELDS, ""), "student": student,
                            "assignment": assignment, "score": "0", "status": Status.MISSING,
                            "message": "on the roster, no submission"})
        for (name, student), row in rows.items():
            if name == assignment:
                settle_row(row, (standings or {}).get(student),
                           None if similar is None else similar.get(student, []))
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            writer.writeheader()
            for key in sorted(rows):  # no cell a spreadsheet would evaluate
                writer.writerow({k: csv_safe(v) for k, v in rows[key].items()})
        os.replace(tmp, path)


def isolation(settings):
    """One line on how the kernels were isolated, and why any limit is off."""
    from ..sandbox.launcher import cgroup_version

    if not settings.sandboxed:
        return "NOT sandboxed: trusted notebooks only"
    import os

    if os.geteuid() != 0:
        return ("sandboxed (bubblewrap, own user namespace); processes and memory NOT capped "
                "by cgroups (needs root)")
    version = cgroup_version()
    caps = (f"cgroup v{version}: at most {settings.limits.max_tasks} tasks" if version
            else "processes NOT capped (no usable cgroup)")
    return f"sandboxed (bubblewrap, user nobody, no network; {caps})"


def roll_call(p, policy, skipped, standings, roster):
    """The summary's lines about who was not graded now, or late: skipped, missing, not on
    the roster, late under ``policy`` (``p``: print one line)."""
    if skipped:
        p(f"Unchanged since last graded (skipped; --force re-grades them): {len(skipped)}")
    if roster and roster.missing:
        p(f"On the roster, no submission (missing): {len(roster.missing)}: "
          f"{', '.join(map(printable, roster.missing))}")
    if roster and roster.not_on_roster:
        p(f"Submitted, not on the roster: {len(roster.not_on_roster)}: "
          f"{', '.join(map(printable, roster.not_on_roster))}")
    late = {s: v for s, v in (standings or {}).items() if v.late}
    if late:
        p(f"Late ({policy}): {len(late)}")
        for student, v in sorted(late.items()):
            p(f"  {printable(student)}: {v.late_by.total_seconds() / 3600:.1f} h late, -{v.penalty:g} points")


def unusual_choice(result, assignment):
    """Whether graded ``result``'s notebook was not simply ``<assignment>.ipynb`` handed in
    alone (intake's message says more: another name, the newest of several, re-seated code,
    other files handed in)."""
    return result.status == Status.OK and result.message != f"graded '{assignment}.ipynb'"


def similar_clusters(pairs):
    """The connected groups of students that ``pairs`` (``[(student, other, function,
    share)]``, share in 0..1) link, largest first: ``[(students, functions)]``, ``students``
    sorted, ``functions`` ``[(function, pairs, highest share)]`` by pairs then name. Two
    students are in one cluster when a chain of similar pairs joins them (union-find)."""
    parent = {}

    def root(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for a, b, _, _ in pairs:
        parent[root(a)] = root(b)
    members, links = {}, {}
    for student in parent:
        members.setdefault(root(student), []).append(student)
    for a, _, function, share in pairs:
        count, top = links.setdefault(root(a), {}).get(function, (0, 0.0))
        links[root(a)][function] = (count + 1, max(top, share))
    clusters = [(sorted(people), sorted(((f, n, top) for f, (n, top) in links[r].items()),
                                        key=lambda x: (-x[1], x[0])))
                for r, people in members.items()]
    return sorted(clusters, key=lambda c: (-len(c[0]), c[0]))


def cluster_line(students, functions):
    """One cluster as a summary line: its students (the first :data:`CLUSTER_NAMES`) and the
    functions that link them."""
    names = ", ".join(map(printable, students[:CLUSTER_NAMES]))
    if len(students) > CLUSTER_NAMES:
        names += f" and {len(students) - CLUSTER_NAMES} more"
    linked = ", ".join(f"{printable(f)} ({n} pair{'s' * (n > 1)}, up to {top:.0%})" if n > 1
                       else f"{printable(f)} ({top:.0%})" for f, n, top in functions)
    return f"{len(students)} students: {names}: {linked}"


def print_summary(assignment, results, tests, seconds, jobs, settings, out=None, skipped=(),
           standings=None, roster=None, similar=None):
    """Print the class summary; scores are the gradebook's ``standings`` (after the penalty).

    Its lists name only what needs a look: limits hit, edited or deleted test cells, flags,
    code like the reference, unusual notebook choices, unreadable notebooks, errors, and the
    clusters of similar work among the class's ``similar`` pairs (:func:`similar_clusters`;
    ``None``: each result's own ``similar`` descriptions, this run's only)."""
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out)  # noqa: E731
    n = len(results)
    lim = settings.limits
    p(f"\nGraded {n} submission(s) of {assignment} in {seconds:.1f} s with {jobs} job(s)"
      f" (cell {lim.cell_timeout} s, notebook {lim.notebook_timeout:g} s,"
      f" memory {lim.memory_mb} MiB, output {lim.output_limit} B/cell, scratch {lim.disk_mb} MiB;"
      f" {isolation(settings)}).")
    roll_call(p, settings.course.policy(assignment), skipped, standings, roster)
    if not n:
        return
    final = {s: v.final for s, v in (standings or {}).items()}
    scores = [final.get(r.student, r.score) for r in results]
    p(f"Score: mean {sum(scores) / n:.2f}, min {min(scores):g}, max {max(scores):g}"
      f" of {max(r.max_score for r in results):g}")
    p(f"What the class got wrong, with plots: python -m autograder report {assignment}"
      f" (writes {report_page(settings.root, assignment)})")
    waiting = {r.student: len(r.manual_cells()) for r in results if r.manual_cells()}
    if waiting:
        p(f"Written answers to grade by hand: {sum(waiting.values())} of {len(waiting)} student(s). "
          f"Open the formgrader (JupyterLab started at {printable(settings.root)}), then run: "
          f"python -m autograder feedback {assignment}")
    failures = Counter(t for r in results for t in failed_tests(r, tests))
    judged = sum(r.status != Status.ERROR for r in results)  # an error was not graded at all
    if tests:
        p("Tests passed:")
        width = max(len(printable(gid)) for _, gid in tests)
        for _, gid in tests:
            p(f"  {printable(gid):<{width}}  {judged - failures[gid]:>4}/{judged}")
    slow = sorted(results, key=lambda r: -r.seconds)[:5]
    p("Slowest: " + ", ".join(f"{printable(r.student)} {r.seconds:.1f} s" for r in slow))
    sections = [
        ("Hit a limit", lambda r: ", ".join(
            f"{e.kind} in {e.grade_id or 'cell ' + str(e.cell)}" for e in r.events
            if e.kind in set(LimitKind))),
        ("Edited test cells (restored)", lambda r: ", ".join(r.tampered)),
        ("Deleted test cells (restored)", lambda r: ", ".join(r.deleted)),
        ("Suspicious code", lambda r: ", ".join(r.flags)),
        ("Resembles the reference (check by hand)", lambda r: "; ".join(r.resemblances)),
        ("Similar to a classmate (check by hand)",
         (lambda r: "; ".join(r.similar)) if similar is None else None),
        ("Unusual notebook choices (check by hand)", lambda r: r.message if unusual_choice(r, assignment) else ""),
        ("Missing or unreadable notebooks (scored 0)", lambda r: r.message if r.status in (Status.MISSING, Status.UNREADABLE) else ""),
        ("Errors (not graded: the earlier grade, if any, is kept; worker logs in logs/)", lambda r: r.error or "" if r.status == Status.ERROR else ""),
    ]
    for title, describe in sections:
        if describe is None:
            print_clusters(p, similar_clusters(similar))
            continue
        lines = [(r.student, describe(r)) for r in results if describe(r)]
        if lines:
            p(f"{title}: {len(lines)}")
            for student, text in lines:  # ids, file names, messages: the student's text
                p(f"  {printable(student)}: {printable(text)}")


def print_clusters(p, clusters):
    """The summary's clusters of similar work (``p``: print one line), nothing if none."""
    if not clusters:
        return
    people = sum(len(students) for students, _ in clusters)
    p(f"Similar to a classmate (check by hand; each pair in grades.csv's similar column): "
      f"{len(clusters)} cluster(s) of {people} students")
    for students, functions in clusters[:CLUSTERS_SHOWN]:
        p(f"  {cluster_line(students, functions)}")
    if len(clusters) > CLUSTERS_SHOWN:
        p(f"  and {len(clusters) - CLUSTERS_SHOWN} more cluster(s)")
