"""Code that looks copied: from the reference library, or between students.

A detector, not a judge: it flags for a human and never changes a score. Each
function a student wrote is reduced to its *shape*, the token sequence with
comments and strings dropped and every local name replaced by ``N`` (keywords,
operators, numbers and attribute names such as ``.swapaxes`` are kept), so that
renaming variables does not hide a copy. Two functions resemble each other when
most of the student's 12-token windows (shingles) occur in the other one.

* :func:`resembles_reference`: a student function against every function of
  ``transformer_ref`` (the public source a student could paste);
* :func:`similar_pairs`: students of one class against each other, through an
  inverted index of shingles (linear in the class's code, not quadratic);
* :func:`fingerprints` and :func:`pairs_with`: the same on what is kept of each graded
  submission (its functions' shingles, hashed: no code), so that the driver compares
  every newly graded student with the whole class, graded in any run, in one pass over
  what is kept (:func:`autograder.core.gradebook.keep_similarity` keeps both).
"""

import ast
import functools
import hashlib
import io
import keyword
import tokenize
from collections import Counter, defaultdict
from itertools import chain
from dataclasses import dataclass
from pathlib import Path

SHINGLE = 12         # tokens per window
MIN_SHINGLES = 20    # shorter functions (a line or two) are too generic to compare
REFERENCE_SHARE = 0.8  # share of the student's windows found in one reference function
CLASS_SHARE = 0.9      # ... found in another student's function of the same name


@dataclass(frozen=True)
class Resemblance:
    """``function`` (lines ``lines`` of the student's cell) looks like ``source``."""

    function: str
    source: str
    share: float
    lines: tuple

    def describe(self):
        span = f"lines {self.lines[0]}-{self.lines[-1]}" if self.lines else "no lines"
        return f"{self.function} ~ {self.source} ({self.share:.0%} of its code, {span})"


def shape(source):
    """[(token, line)] of ``source``: names that are not attributes or keywords become ``N``."""
    out, previous = [], None
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.STRING, tokenize.ENDMARKER}
    for tok in tokens:
        if tok.type in skip:
            continue
        text = tok.string
        if tok.type == tokenize.NAME and not keyword.iskeyword(text) and previous != ".":
            text = "N"
        out.append((text, tok.start[0]))
        previous = tok.string
    return out


def shingles(tokens):
    """{window: first line} of the token windows of ``tokens``.

    A window is its tokens joined by NUL (no token of valid Python holds one): a string
    keeps its hash, so matching a student's windows against every reference function
    hashes each window once, not once per function.
    """
    found = {}
    for i in range(len(tokens) - SHINGLE + 1):
        window = "\0".join(t for t, _ in tokens[i:i + SHINGLE])
        found.setdefault(window, tokens[i][1])
    return found


def functions(source):
    """[(name, source of the function, first line)] of the top-level functions in ``source``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [(node.name, ast.get_source_segment(source, node) or "", node.lineno)
            for node in tree.body if isinstance(node, ast.FunctionDef)]


@functools.lru_cache(maxsize=None)
def reference_index():
    """[(``module:function``, shingle set)] for every function of ``transformer_ref``."""
    import importlib.util

    spec = importlib.util.find_spec("transformer_ref")
    if spec is None or not spec.submodule_search_locations:
        return ()
    base = Path(list(spec.submodule_search_locations)[0])
    index = []
    for path in sorted(base.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found = set(shingles(shape(ast.get_source_segment(text, node) or "")))
                if found:
                    index.append((f"transformer_ref/{path.relative_to(base)}:{node.name}",
                                  frozenset(found)))
    return tuple(index)


def resembles_reference(source):
    """[:class:`Resemblance`] of the functions in a student's cell ``source`` that look copied."""
    found = []
    for name, code, first in functions(source):
        mine = shingles(shape(code))
        if len(mine) < MIN_SHINGLES:
            continue
        share, best, theirs = max(((len(theirs.intersection(mine)) / len(mine), where, theirs)
                                   for where, theirs in reference_index()), default=(0.0, "", ()))
        if share >= REFERENCE_SHARE:
            lines = sorted({first - 1 + line for w, line in mine.items() if w in theirs})
            found.append(Resemblance(name, best, share, tuple(lines)))
    return found


def fingerprint(code):
    """The hashed shingles of one function's ``code`` (64-bit ints), or None when it is too
    short to compare (fewer than :data:`MIN_SHINGLES` windows)."""
    mine = shingles(shape(code))
    if len(mine) < MIN_SHINGLES:
        return None
    return frozenset(int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "big")
                     for w in mine)


def fingerprints(functions_):
    """``{function name: fingerprint}`` of a student's ``{name: source}``, short ones left out."""
    found = {name: fingerprint(code) for name, code in functions_.items()}
    return {name: prints for name, prints in found.items() if prints}


def pairs_with(new, kept):
    """Pairs of students, one of them in ``new``, whose functions of the same name look copied.

    ``new`` maps student -> {function name: fingerprint} (:func:`fingerprints`); ``kept``
    yields ``(student, function name, fingerprint)`` for the whole class, read once (rows of
    ``new``'s students may be among them: they are skipped). Returns
    ``[(student, other, function, share)]``, ``student < other``, with ``share >=
    CLASS_SHARE`` in both directions. An inverted index of the new students' windows only,
    so a run of a few late submissions costs one pass over the class, not a new index of it.
    """
    index = defaultdict(list)      # hashed window -> [(new student, function name)]
    for student, functions_ in new.items():
        for name, mine in functions_.items():
            for w in mine:
                index[w].append((student, name))
    pairs = {}
    rows = [(s, n, p) for s, f in new.items() for n, p in f.items()]  # new against new, once
    for other, name, theirs in chain(rows, (row for row in kept if row[0] not in new)):
        counts = Counter(hit for w in theirs if w in index for hit in index[w]
                         if hit[1] == name and hit[0] != other)
        for (student, _), common in counts.items():
            mine = new[student][name]
            if common / len(mine) >= CLASS_SHARE and common / len(theirs) >= CLASS_SHARE:
                a, b = sorted((student, other))
                pairs[a, b, name] = min(common / len(mine), common / len(theirs))
    return sorted((a, b, name, share) for (a, b, name), share in pairs.items())


def similar_pairs(solutions):
    """:func:`pairs_with` of students' sources, all of them new: ``solutions`` maps student ->
    {function name: source}."""
    return pairs_with({student: fingerprints(f) for student, f in solutions.items()}, ())
