"""``python -m autograder report``: what the class got wrong, per assignment and per term.

Writes, into ``reports/`` under the course root (or ``--to DIR``):

* ``<assignment>.html``: the score distribution before and after manual grades and late
  penalties; the pass rate of every test cell, by part, with the concept each part tests;
  each test cell's most common failure messages (numbers and ids normalised), with links to
  example feedback pages; which parts fail together more than chance says; grading times,
  limits hit, flags, late submissions and the roster students who are missing;
* ``index.html``: the term: a student-by-assignment heatmap (missing and late marked),
  each assignment's mean, median and completion, and the students whose scores fall
  (the early warning);
* beside each page, ``<page>.<figure>.csv`` for each figure and table, and ``<page>.json``
  with all of them (CSV cells through :func:`~autograder.core.untrusted.csv_safe`).

Numbers come from :mod:`autograder.host.report_data` (the gradebook, streamed, and the run
records), pages from :mod:`autograder.host.report_page`. ``anonymize`` replaces every student
id by its pseudonym (:class:`~autograder.host.report_data.Pseudonyms`) in every file, drops
names and the links to feedback pages (their paths hold the id), and replaces ids quoted in
failure messages. Files are written owner-readable only (grades are private).
"""

import json
import multiprocessing
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..core.course_files import REPORTS
from ..core.untrusted import csv_safe
from . import report_data as data
from . import report_page as ui
from .exports import write_csv_atomically
from .report_page import Section, Table, esc, href

INDEX = "index.html"
TOP_MESSAGES = 5          # failure messages per test cell on the page (all in the CSV)
HTML_ROWS = 500           # rows of a long table on the page (all in the CSV)
LABELLED_ROWS = 40        # the heatmap names its rows up to this many students
FALLING_LINES = 8         # students drawn in the early-warning figure


@dataclass(frozen=True)
class Written:
    """What one ``report`` wrote: the pages, in order, and the folder."""

    folder: Path
    pages: tuple[Path, ...]


def pct(x, top):
    return 100.0 * x / top if top else 0.0


def num(x, digits=1):
    return "" if x is None else f"{x:.{digits}f}"


class Output:
    """The report folder: pages and their data files, each written whole, mode 0600."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    def csv(self, name, header, rows):
        write_csv_atomically(self.folder / name,
                             [header] + [[csv_safe(c) for c in row] for row in rows])
        return name

    def text(self, name, content):
        path = self.folder / name
        tmp = path.with_name(f".{name}.part")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        os.replace(tmp, path)
        return path


# -- one assignment -------------------------------------------------------------------------
def assignment_page(stats, out, who, root, anonymize):
    """Write ``<assignment>.html`` and its data; return the page's path."""
    aid, top = stats.assignment, stats.max_score
    figures = {}
    sections = [scores_section(stats, out, figures),
                tests_section(stats, out, figures),
                messages_section(stats, out, figures, who, root, anonymize),
                together_section(stats, out, figures),
                time_section(stats, out, figures, who),
                flags_section(stats, out, figures, who, root, anonymize),
                late_section(stats, out, figures, who),
                roster_section(stats, out, figures, who)]
    mean_auto, median_auto = data.summary_numbers(stats.auto)
    mean_final, median_final = data.summary_numbers(stats.final)
    intro = (f"<p>{stats.n_submissions} submission(s) from {stats.n_students} student(s) in the "
             f"gradebook; maximum {top:g} points; due {esc(stats.duedate or 'no due date')} UTC. "
             f"Autograded mean {num(mean_auto, 2)}, median {num(median_auto, 2)}; final (manual "
             f"grades and late penalties included) mean {num(mean_final, 2)}, median "
             f"{num(median_final, 2)}. {stats.needs_manual} submission(s) still need manual "
             "grading.</p>")
    nav = ('<nav aria-label="Report"><ul><li><a href="index.html">The term</a></li>'
           + "".join(f'<li><a href="#{s.anchor}">{esc(s.title)}</a></li>' for s in sections)
           + "</ul></nav>")
    out.text(f"{aid}.json", json.dumps({"assignment": aid, "max_score": top, **figures},
                                       indent=1, default=str))
    return out.text(f"{aid}.html", ui.page(f"{aid}: what the class got wrong", intro, sections, nav))


def scores_section(stats, out, figures):
    aid, top = stats.assignment, stats.max_score
    bins = 10
    edges = [100.0 * k / bins for k in range(bins + 1)]

    def counts(values):
        c = [0] * bins
        for v in values:
            c[min(bins - 1, int(pct(v, top) // (100 / bins)))] += 1
        return c
    auto, final = counts(stats.auto), counts(stats.final)
    rows = [[f"{edges[k]:g}-{edges[k + 1]:g}%", auto[k], final[k]] for k in range(bins)]
    name = out.csv(f"{aid}.scores.csv", ["range", "autograded", "final"], rows)
    figures["scores"] = [dict(zip(("range", "autograded", "final"), r)) for r in rows]
    anchor = "scores"
    svg = ui.histograms([("autograded", ui.ACCENT, auto), ("final", ui.SECOND, final)], edges,
                        "% of the maximum", ui.figure_id(anchor))
    return Section("Score distribution", anchor,
                   "Autograded: the judge's points only. Final: manual grades over the automatic "
                   "ones, extra credit added, the late penalty taken off (never below 0).",
                   svg, [Table("Students per score range", ["range", "autograded", "final"],
                               [[esc(r[0]), r[1], r[2]] for r in rows])], [name])


def tests_section(stats, out, figures):
    aid, n = stats.assignment, stats.n_submissions
    rows = []
    for part in stats.parts:
        for nb, cell in part.tests:
            passed = stats.test_passes.get((nb, cell), 0)
            rows.append([part.name, part.concept, cell, passed, n, round(pct(passed, n), 1)])
    header = ["part", "concept", "test cell", "passed", "of", "% passed"]
    name = out.csv(f"{aid}.tests.csv", header, rows)
    figures["tests"] = [dict(zip(header, r)) for r in rows]
    anchor = "tests"
    svg = ui.bars([r[5] for r in rows], [f"{r[0].replace('Part ', 'P')} {r[2]}" for r in rows],
                  "% of submissions passed", ui.figure_id(anchor), limit=100)
    return Section("Test cells by part", anchor,
                   "A test cell passes with full marks from the judge. Each part tests the concept "
                   "its heading in the source notebook names.", svg,
                   [Table("Pass rate of each test cell", header,
                          [[esc(r[0]), f"<code>{esc(r[1].strip('`'))}</code>" if r[1] else "", esc(r[2]),
                            r[3], r[4], r[5]] for r in rows])], [name])


def messages_section(stats, out, figures, who, root, anonymize):
    aid = stats.assignment
    part = {cell: p.name for p in stats.parts for _, cell in p.tests}
    header = ["test cell", "part", "message (normalised)", "students", "examples"]
    rows = [[g.cell, part.get(g.cell, ""), who.scrub(g.message), g.count,
             " ".join(who(s) for s in g.examples)] for g in stats.messages]
    name = out.csv(f"{aid}.messages.csv", header, rows)
    figures["messages"] = [dict(zip(header, r)) for r in rows]
    shown, per_cell = [], {}
    for g, row in zip(stats.messages, rows):
        per_cell[g.cell] = per_cell.get(g.cell, 0) + 1
        if per_cell[g.cell] > TOP_MESSAGES:
            continue
        if anonymize:
            examples = esc(row[4])
        else:
            examples = ", ".join(example_link(root, s, aid) for s in g.examples)
        shown.append([esc(row[0]), esc(row[1]), f"<code>{esc(row[2])}</code>", row[3], examples])
    return Section(
        "What went wrong", "messages",
        "The mistakes the checks recognised (each student once, whichever test cells it "
        "failed), then the most common other failure messages of each test cell (up to "
        f"{TOP_MESSAGES} here, all in the CSV), grouped after normalising: numbers become #, "
        "memory addresses 0x#, quoted paths '/…' (array literals and shapes are kept, they show "
        "a layout), so the same mistake with other values counts once. A notebook that gave no "
        "message at all is one row."
        + (" Student ids are pseudonyms; links to feedback pages are left out." if anonymize
           else " Examples link to the students' feedback pages."),
        "", [Table("Failure messages, most common first", header, shown)], [name])


def example_link(root, student, aid):
    pages = data.feedback_pages(root, student, aid)
    if not pages:
        return esc(student)
    return f'<a href="{href("..", *pages[0].split("/"))}">{esc(student)}</a>'


def together_section(stats, out, figures):
    aid = stats.assignment
    header = ["part", "other part", "both failed", "first only", "second only", "neither",
              "phi", "lift", "p (Fisher, one-sided)", "more than chance"]
    rows = [[p.first, p.second, p.both, p.first_only, p.second_only, p.neither,
             round(p.phi, 3), round(p.lift, 2), f"{p.p_value:.3g}", "yes" if p.significant else "no"]
            for p in stats.pairs]
    name = out.csv(f"{aid}.together.csv", header, rows)
    figures["together"] = [dict(zip(header, r)) for r in rows]
    names = [p.name for p in stats.parts if p.tests]
    anchor = "together"
    svg = ui.phi_matrix(names, stats.pairs, ui.figure_id(anchor)) if len(names) > 1 else ""
    m = max(1, len(stats.pairs))
    return Section(
        "Parts failed together", anchor,
        "A part fails when any of its test cells does. Two parts fail together more than chance "
        f"says when Fisher's exact test (one-sided) gives p &lt; {data.ALPHA:g}/{m} (Bonferroni "
        f"over the {m} pairs) and the phi coefficient is positive; lift is P(both) / "
        "(P(first) P(second)). With a small class nothing may pass the test: the counts still "
        "show.", svg,
        [Table("Pairs of parts, strongest first", header,
               [[esc(c) for c in r] for r in rows])], [name])


def time_section(stats, out, figures, who):
    aid = stats.assignment
    values = [s for _, s in stats.seconds]
    header = ["student", "seconds"]
    rows = [[who(s), round(t, 1)] for s, t in stats.seconds]
    name = out.csv(f"{aid}.seconds.csv", header, rows)
    figures["seconds"] = [dict(zip(header, r)) for r in rows]
    anchor = "time"
    svg, tables = "", []
    if values:
        top = max(values) or 1.0
        edges = [top * k / 10 for k in range(11)]
        counts = [0] * 10
        for v in values:
            counts[min(9, int(10 * v / top))] += 1
        svg = ui.histograms([("submissions", ui.ACCENT, counts)], edges, "seconds",
                            ui.figure_id(anchor))
        q = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
        tables.append(Table("Grading time (seconds)", ["statistic", "seconds"], [
            ["submissions", len(values)], ["median", num(statistics.median(values))],
            ["90th percentile", num(q[8])], ["slowest", num(max(values))]]))
        tables.append(Table("Slowest submissions", header,
                            [[esc(r[0]), r[1]] for r in rows[:5]]))
    return Section("Grading time", anchor,
                   "From the stamp grade keeps beside each autograded submission.", svg, tables, [name])


def flags_section(stats, out, figures, who, root, anonymize):
    aid = stats.assignment
    rows = sorted([who(s), "limit", v, s] for s, v in stats.limits) + \
        sorted([who(s), "flag", v, s] for s, v in stats.flags) + \
        sorted([who(a), "similar", f"{fn} ~ {who(b)} ({share}%)", a] for a, b, fn, share in stats.similar)
    header = ["student", "kind", "what"]
    name = out.csv(f"{aid}.flags.csv", header, [r[:3] for r in rows])
    figures["flags"] = [dict(zip(header, r)) for r in rows]
    statuses = sorted(stats.statuses.items())
    return Section(
        "Limits hit and flags", "flags",
        "From grades.csv: the limits each submission hit (timeout, crash, output ...), the "
        "suspicious-code flags, and each pair of classmates whose functions look copied (the "
        "function and the share of its lines they have in common; check those by hand).",
        "", [Table("Limits and flags (students linked to their feedback pages)", header,
                   [[esc(r[0]) if anonymize else example_link(root, r[3], aid), esc(r[1]), esc(r[2])]
                    for r in rows[:HTML_ROWS]],
                   note=f"{len(rows) - HTML_ROWS} more in the CSV" if len(rows) > HTML_ROWS else ""),
             Table("Outcome of the last run (grades.csv)", ["status", "submissions"],
                   [[esc(k or "(none)"), v] for k, v in statuses])], [name])


def late_section(stats, out, figures, who):
    aid = stats.assignment
    rows = sorted([[who(s), round(h, 1), p] for s, h, p in stats.late], key=lambda r: (-r[1], r[0]))
    header = ["student", "hours late", "penalty"]
    name = out.csv(f"{aid}.late.csv", header, rows)
    figures["late"] = [dict(zip(header, r)) for r in rows]
    return Section("Late submissions", "late",
                   "From the gradebook: submission time past the due date (extensions included) "
                   "and the penalty recorded.", "",
                   [Table(f"{len(rows)} late submission(s)", header,
                          [[esc(c) for c in r] for r in rows[:HTML_ROWS]])], [name])


def roster_section(stats, out, figures, who):
    aid = stats.assignment
    rows = sorted([who(s), "missing"] for s in stats.missing) + \
        sorted([who(s), "not on the roster"] for s in stats.not_on_roster)
    header = ["student", "what"]
    name = out.csv(f"{aid}.roster.csv", header, rows)
    figures["roster"] = [dict(zip(header, r)) for r in rows]
    return Section("Missing students", "roster",
                   "Students of roster.csv with no submission in the gradebook, and submissions "
                   "from students not on it.", "",
                   [Table(f"{len(stats.missing)} missing, {len(stats.not_on_roster)} not on the "
                          "roster", header, [[esc(c) for c in r] for r in rows[:HTML_ROWS]])],
                   [name])


# -- the term -----------------------------------------------------------------------------------
def term_page(term, out, who, pages, anonymize):
    """Write ``index.html`` (the term) and its data; return its path."""
    figures = {}  # section id -> its rows, written as index.json
    sections = [matrix_section(term, out, who, anonymize, figures),
                assignments_section(term, out, pages, figures),
                warnings_section(term, out, who, figures)]
    out.text("index.json", json.dumps(figures, indent=1, default=str))
    nav = ('<nav aria-label="Assignments"><ul>'
           + "".join(f'<li><a href="{href(p.name)}">{esc(p.stem)}</a></li>' for p in pages)
           + "</ul></nav>")
    intro = (f"<p>{len(term.matrix)} student(s), {len(term.assignments)} assignment(s) in the "
             "gradebook." + (" Student ids are pseudonyms." if anonymize else "") + "</p>")
    return out.text(INDEX, ui.page("The term: every student, every assignment", intro, sections, nav))


def matrix_section(term, out, who, anonymize, figures):
    """Every student x every assignment, best mean first: heatmap, table, CSV."""
    n = len(term.assignments)
    names = {s: ("" if anonymize else name) for s, name in term.students}

    def mean_of(row):
        return sum(c.percent or 0.0 for c in row) / n if n else 0.0
    order = sorted(term.matrix.items(), key=lambda kv: (-mean_of(kv[1]), who(kv[0])))
    header = ["student", "name"] + term.assignments
    rows = [[who(s), names.get(s, "")] + [cell_text(c) for c in row] for s, row in order]
    matrix_csv = out.csv("index.matrix.csv", header, rows)
    figures["matrix"] = [dict(zip(header, r)) for r in rows]
    labelled = len(order) <= LABELLED_ROWS
    svg = ui.heatmap([row for _, row in order], term.assignments, ui.figure_id("matrix"),
                     labels=[who(s) for s, _ in order] if labelled else None) if order and n else ""
    return Section(
        "Every student, every assignment", "matrix",
        "Percent of each assignment's maximum after manual grades and late penalties, best mean "
        "first; <em>missing</em> = no submission (grey), <em>late</em> = handed in after the due "
        "date and its grace period (a dot; the dots are drawn up to 200 students, the table always marks them).",
        svg, [Table("Scores in percent", [esc(h) for h in header],
                    [[esc(c) for c in r] for r in rows[:HTML_ROWS]],
                    note=(f"The first {HTML_ROWS} of {len(rows)} students; all in "
                          f"{matrix_csv}." if len(rows) > HTML_ROWS else ""))], [matrix_csv])


def assignments_section(term, out, pages, figures):
    """Each assignment's completion, mean and median: figure, table (linking its page), CSV."""
    per = []
    for j, a in enumerate(term.assignments):
        values = [row[j].percent for row in term.matrix.values() if row[j].percent is not None]
        mean, median = data.summary_numbers(values)
        per.append([a, len(values), len(term.matrix), round(pct(len(values), len(term.matrix)), 1),
                    None if mean is None else round(mean, 1), None if median is None else round(median, 1)])
    header = ["assignment", "handed in", "students", "completion %", "mean %", "median %"]
    per_csv = out.csv("index.assignments.csv", header, per)
    figures["assignments"] = [dict(zip(header, r)) for r in per]
    svg = ui.assignment_means(term.assignments, [r[4] for r in per], [r[5] for r in per],
                              [r[3] for r in per], ui.figure_id("assignments")) if per else ""
    linked = {p.stem for p in pages}
    rows = [[f'<a href="{href(r[0] + ".html")}">{esc(r[0])}</a>' if r[0] in linked else esc(r[0])]
            + [esc("" if c is None else c) for c in r[1:]] for r in per]
    return Section("Assignments", "assignments",
                   "Mean and median over the submissions handed in; completion over the "
                   "gradebook's students.", svg,
                   [Table("Each assignment", header, rows)], [per_csv])


def warnings_section(term, out, who, figures):
    """Students whose percentages fall across the term (``term.warnings``): figure, table, CSV."""
    header = ["student", "slope (points/assignment)"] + term.assignments
    rows = [[who(s), round(slope, 1)] + [round(v, 1) for v in values]
            for s, slope, values in term.warnings]
    warn_csv = out.csv("index.warnings.csv", header, rows)
    figures["warnings"] = [dict(zip(header, r)) for r in rows]
    started = len(term.warnings[0][2]) if term.warnings else 0
    svg = ui.trajectories([(r[0], r[2:]) for r in rows[:FALLING_LINES]],
                          term.assignments[:started], ui.figure_id("warnings")) if rows else ""
    return Section(
        "Early warning: falling across the term", "warnings",
        f"The rule: over the assignments someone has handed in so far (at least "
        f"{data.WARNING_MIN_ASSIGNMENTS}), a missing one counted as 0 %, the least-squares slope "
        f"of the student's percentages is {data.WARNING_SLOPE:g} points per assignment or "
        f"steeper. Steepest first; the figure draws the first {FALLING_LINES}.", svg,
        [Table(f"{len(rows)} student(s) falling", [esc(h) for h in header],
               [[esc(c) for c in r] for r in rows[:HTML_ROWS]])], [warn_csv])


def cell_text(cell):
    if cell.percent is None:
        return "missing"
    return f"{cell.percent:.0f}" + (" late" if cell.late else "")


# -- the command ----------------------------------------------------------------------------------
def write_report(root, db_url, assignment=None, to=None, anonymize=False):
    """Write the report of ``assignment`` (default: every assignment) and of the term.

    Returns :class:`Written`. ``ValueError`` with one line for an unknown assignment or a
    folder that cannot be written; :class:`~autograder.core.gradebook.GradebookError` for a
    gradebook that cannot be opened.
    """
    root = Path(root).resolve()
    folder = Path(to) if to else root / REPORTS
    folder = folder if folder.is_absolute() else root / folder
    try:
        out = Output(folder)
    except OSError as error:
        raise ValueError(f"--to: cannot write the report into {folder} ({error.strerror})") from None
    who = data.Pseudonyms(root, anonymize)
    term = data.term_stats(db_url)
    if assignment is not None and assignment not in term.assignments:
        raise ValueError(f"no assignment {assignment!r} in the gradebook "
                         f"({', '.join(term.assignments) or 'none'}): grade it first")
    if anonymize:  # every id known before any text is written, so scrub() replaces them all
        for student, _ in term.students:
            who(student)
        for student in data.roster_ids(root) or ():
            who(student)
    aids = [assignment] if assignment else term.assignments
    names = [folder / f"{aid}.html" for aid in aids]
    existing = sorted({p.stem: p for p in names + [p for p in folder.glob("*.html")
                                                   if p.name != INDEX]}.values())
    jobs = min(len(aids), len(os.sched_getaffinity(0)))
    if jobs < 2:
        pages = [one_page(root, db_url, aid, folder, who, anonymize) for aid in aids]
        index = term_page(term, out, who, existing, anonymize)
        return Written(folder, (*pages, index))
    # The pages are independent: one process per core, the term page here meanwhile (every
    # child opens the gradebook afresh: core.gradebook drops a parent's engines at a fork).
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(one_page, root, db_url, aid, folder, who, anonymize) for aid in aids]
        index = term_page(term, out, who, existing, anonymize)
        pages = [f.result() for f in futures]
    return Written(folder, (*pages, index))


def one_page(root, db_url, aid, folder, who, anonymize):
    """Read one assignment and write its page; returns the page's path (runs in a worker)."""
    return assignment_page(data.assignment_stats(root, db_url, aid), Output(folder), who, root,
                           anonymize)
