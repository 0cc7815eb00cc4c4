"""Check my work: the grader's own test cells, run on a learner's functions in their kernel.

A student version's check cell (``check("p1")``) runs every test cell of that part, hidden
tests included where the course ships them, exactly as the grader does: the test cell's code
and the checks of :mod:`autograder.checks` run in a trusted namespace
(:class:`autograder.judge.verdict.LocalNamespace`) whose missing names are the learner's, and
:func:`autograder.judge.verdict.judge_source` gives the verdict and
:func:`~autograder.judge.verdict.verdict_message` its message. Only the way in differs: the
grader reaches the student's functions in a sandboxed kernel through the probe, the self-check
calls them in this process. Nothing here decides a verdict of its own.

What it adds around the verdicts, as notes the grader does not print:

* a failed test cell whose functions call a function of an earlier part that fails its own
  tests names it ("your `ntk_inv_freq` calls your `rope_inv_freq`, which fails Part 1: fix
  Part 1 first");
* a learner's name that is, or uses, the reference library ``transformer_ref`` is flagged,
  with the points it would cost when graded (the library cannot be imported there), the
  moment a cell brings it in (:meth:`SelfCheck.watch`) and in every check;
* a memory test is judged on its result only and left unchecked (no points here): memory has
  one meter, the sandbox kernel's, which measures it when graded; a slow test cell says how
  long it took against the grader's limit;
* a written answer, once written, is shown beside the course's model answer where the course
  ships it (self-study), or is left to the human grader.

The bank (``bank/<assignment>.json``, made by :func:`autograder.host.release.selfcheck_bank`)
holds each part's test cells (``full``: the judged source with the hidden tests; ``visible``:
only what the student version shows), the names of the functions each part defines, the
grader's time limit per test cell and, where the course reveals them, the model answers.
"""

import contextlib
import io
import json
import time
import types
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..judge.verdict import LocalNamespace, judge_source, verdict_message

REFERENCE = "transformer_ref"
UNANSWERED = "YOUR ANSWER HERE"


@dataclass
class CellResult:
    """The verdict on one test cell, as the grader would give it, with the self-check's notes."""

    grade_id: str
    points: float
    max_points: float
    ename: str | None = None  # None: passed
    message: str | None = None
    notes: list = field(default_factory=list)
    seconds: float = 0.0
    unchecked: bool = False  # not decided here: hidden tests not shipped (``visible``), or memory

    @property
    def passed(self):
        return self.ename is None


def load_bank(assignment):
    """The bank of ``assignment`` shipped with this package; None if there is none."""
    try:
        text = resources.files(__package__).joinpath("bank", f"{assignment}.json").read_text()
    except (FileNotFoundError, OSError):
        return None
    return json.loads(text)


def code_names(source_or_code):
    """Every global name a piece of code (source text or a code object) refers to."""
    code = compile(source_or_code, "<names>", "exec") if isinstance(source_or_code, str) else source_or_code
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def is_reference(value):
    """A module, function or class of the reference library itself."""
    name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
    return isinstance(name, str) and (name == REFERENCE or name.startswith(REFERENCE + "."))


def callees(fn, seen=None):
    """The learner's functions that ``fn`` calls, directly or through others (by global name)."""
    seen = set() if seen is None else seen
    found = {}
    for name in code_names(fn.__code__):
        value = fn.__globals__.get(name)
        if isinstance(value, types.FunctionType) and value is not fn and name not in seen:
            seen.add(name)
            found[name] = value
            found.update(callees(value, seen))
    return found


class SelfCheck:
    """``check("p1")``: run a part's test cells as the grader does and print the verdicts.

    ``assignment`` names the bank to load (or pass ``bank``); ``user_ns`` is the learner's
    namespace (default: the running IPython's, else ``__main__``'s); ``notebook`` the saved
    notebook the written answers are read from (default: the kernel's session file, else
    ``<assignment>.ipynb`` in the working folder).
    """

    def __init__(self, assignment, *, bank=None, user_ns=None, notebook=None, out=print, watch=True):
        self.assignment = assignment
        self.bank = bank if bank is not None else load_bank(assignment)
        if self.bank is None:
            raise LookupError(f"the installed self-check has no checks for {assignment}")
        self.user_ns = user_ns if user_ns is not None else _user_namespace()
        self.notebook, self.out = notebook, out
        self.parts = {p["id"]: p for p in self.bank["parts"]}
        self._flagged = frozenset()
        if watch:
            self.watch()

    # -- the verdicts ---------------------------------------------------------------------
    def run(self, part):
        """``[CellResult]`` of every test cell of ``part``, in notebook order."""
        return self._run(part, {})

    def _run(self, part, cache):
        if part in cache:
            return cache[part]
        spec = self._part(part)
        results = []
        namespace = LocalNamespace(self.user_ns)
        setup = self.bank.get("setup", "")
        quiet = contextlib.redirect_stdout(io.StringIO())  # as in the grader, prints are not shown
        if setup:
            with quiet:
                judge_source(setup, "setup", namespace)  # trusted code, as the judge runs it first
        for test in spec["tests"]:
            namespace.log.clear()
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                failure = judge_source(test["source"], test["grade_id"], namespace)
            seconds = time.perf_counter() - start
            result = CellResult(test["grade_id"], 0.0 if failure else float(test["points"]),
                                float(test["points"]), seconds=seconds)
            if failure is not None:
                result.ename, result.message = verdict_message(failure)
            elif test.get("hidden"):  # visible mode: this cell's hidden tests did not ship
                result.points, result.unchecked = 0.0, True
                result.notes.append("its visible lines pass; its hidden tests run only when "
                                    "your notebook is graded")
            elif any(entry[0] == "memory" for entry in namespace.log):  # not measured here
                result.points, result.unchecked = 0.0, True
            result.notes += self._measured(namespace.log, seconds)
            results.append(result)
        cache[part] = results
        for result, test in zip(results, spec["tests"]):
            if not result.passed:
                result.notes += self._blame(part, test["source"], cache)
        return results

    def _part(self, part):
        if part not in self.parts:
            raise KeyError(f"no part {part!r} in {self.assignment} (parts: {', '.join(self.parts)})")
        return self.parts[part]

    def _blame(self, part, source, cache):
        """Notes for a failed test cell: the earlier parts' failing functions its functions call."""
        order = list(self.parts)
        notes = []
        for name in sorted(code_names(source)):
            fn = self.user_ns.get(name)
            if not isinstance(fn, types.FunctionType):
                continue
            for callee in [name, *callees(fn)]:
                owner = self._owner(callee)
                if owner is None or order.index(owner) >= order.index(part):
                    continue
                if any(not r.passed for r in self._run(owner, cache)):
                    title = self.parts[owner]["number"]
                    who = "this test" if callee == name else f"your `{name}`"
                    notes.append(f"{who} calls your `{callee}`, which fails {title}: "
                                 f"fix {title} first")
        return list(dict.fromkeys(notes))

    def _owner(self, function):
        return next((p["id"] for p in self.bank["parts"] if function in p["functions"]), None)

    def _measured(self, log, seconds):
        notes = [f"its result is checked here; the memory of your `{name}` is measured only when "
                 f"graded, in the sandbox (the kernel's whole memory during the call)"
                 for name in dict.fromkeys(entry[1] for entry in log if entry[0] == "memory")]
        limit = self.bank.get("cell_timeout")
        if limit and seconds > 0.25 * limit:
            notes.append(f"this test cell took {seconds:.1f} s here; the grader allows {limit:g} s "
                         f"per test cell, measured in the sandbox on the grading machine")
        return notes

    # -- the reference library ------------------------------------------------------------
    def reference_uses(self):
        """``{learner's name: how it involves transformer_ref}`` (empty when it does not)."""
        direct = {name for name, value in list(self.user_ns.items())
                  if not name.startswith("_") and is_reference(value)}
        uses = {name: "is transformer_ref's" for name in direct}
        for name, value in list(self.user_ns.items()):
            if isinstance(value, types.FunctionType) and not name.startswith("_") and name not in direct:
                chain = {name: value, **callees(value)}
                if any(n in direct or is_reference(value.__globals__.get(n))
                       for fn in chain.values() for n in code_names(fn.__code__)):
                    uses[name] = "uses transformer_ref"
        return uses

    def reference_cost(self, uses):
        """``(points at stake, autograded points)``: the test cells that call a name in ``uses``."""
        at_stake = total = 0.0
        for part in self.bank["parts"]:
            for test in part["tests"]:
                total += test["points"]
                if code_names(test["source"]) & set(uses):
                    at_stake += test["points"]
        return at_stake, total

    def reference_warning(self):
        """The warning to show while the learner's code involves transformer_ref, else None."""
        uses = self.reference_uses()
        if not uses:
            return None
        at_stake, total = self.reference_cost(uses)
        names = ", ".join(f"`{n}` ({how})" for n, how in sorted(uses.items()))
        return (f"WARNING: your notebook uses the reference library transformer_ref: {names}. "
                f"It cannot be imported when your notebook is graded: the cell that imports it "
                f"fails there, and every test that calls these names scores 0: "
                f"{at_stake:g} of {total:g} autograded points. Write the code yourself.")

    def watch(self):
        """Flag transformer_ref after every cell the learner runs (IPython's ``post_run_cell``),
        and now."""
        self._flag_reference()
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return
        old = getattr(shell, "_selfcheck_watch", None)
        if old is not None:
            try:
                shell.events.unregister("post_run_cell", old)
            except ValueError:
                pass
        shell._selfcheck_watch = lambda *args: self._flag_reference()
        shell.events.register("post_run_cell", shell._selfcheck_watch)

    def _flag_reference(self):
        uses = frozenset(self.reference_uses())
        if uses and uses != self._flagged:
            self.out(self.reference_warning())
        self._flagged = uses

    # -- written answers --------------------------------------------------------------------
    def written(self, part):
        """Lines about the part's written answers: written or not, and the model answer."""
        lines = []
        for answer in self._part(part).get("written", []):
            text = self._answer_text(answer["grade_id"])
            head = f"{answer['grade_id']} (written, {answer['points']:g} points, graded by hand)"
            if text is None:
                lines.append(f"{head}: save the notebook, then run this check again "
                             f"(the check reads your answer from the saved file)")
            elif not text.strip() or text.strip() == UNANSWERED:
                lines.append(f"{head}: not written yet")
            elif answer.get("model_answer"):
                lines.append(f"{head}: you wrote {len(text.split())} words. "
                             f"The course's model answer, to compare with yours:\n"
                             + answer["model_answer"])
            else:
                lines.append(f"{head}: you wrote {len(text.split())} words; in this course the "
                             f"model answer is not shown before grading")
        return lines

    def _answer_text(self, grade_id):
        path = self._notebook_path()
        if path is None:
            return None
        try:
            cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        except (OSError, ValueError):
            return None
        for cell in cells:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
                source = cell.get("source", "")
                return "".join(source) if isinstance(source, list) else str(source)
        return None

    def _notebook_path(self):
        import os

        candidates = [self.notebook, self.user_ns.get("__session__"),
                      os.environ.get("JPY_SESSION_NAME"), f"{self.assignment}.ipynb"]
        for candidate in candidates:
            if candidate and str(candidate).endswith(".ipynb") and Path(candidate).is_file():
                return Path(candidate)
        return None

    # -- what a check cell prints -------------------------------------------------------------
    def __call__(self, part):
        """Run ``part``'s checks and print one line per test cell (and its notes)."""
        spec = self._part(part)
        results = self.run(part)
        earned = sum(r.points for r in results)
        possible = sum(r.max_points for r in results)
        scope = "its tests, hidden ones included" if self.bank.get("mode") == "full" else "its visible tests"
        lines = [f"{spec['title']}: {earned:g} of {possible:g} points ({scope}, as the grader runs them)"
                 if results else f"{spec['title']}: a written answer, graded by hand"]
        for r in results:
            mark = "PASS" if r.passed and not r.unchecked else "FAIL" if not r.passed else "SEEN"
            line = f"  {mark} {r.grade_id}: {r.points:g}/{r.max_points:g}"
            if not r.passed:
                line += f" - {r.ename}: {r.message}"
            lines.append(line)
            lines += [f"      note: {note}" for note in r.notes]
        lines += ["  " + line for line in self.written(part)]
        warning = self.reference_warning()
        if warning:
            lines.append("  " + warning)
        self.out("\n".join(lines))
        return None


def _user_namespace():
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            return shell.user_ns
    except ImportError:
        pass
    import __main__

    return vars(__main__)

