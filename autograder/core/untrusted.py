"""Text a student controls, made inert for where the instructor reads it.

A student chooses their notebook's file names, its contents and, through an LMS download,
often their own id. Whatever the grader writes from them is data:

* :func:`csv_safe`: a spreadsheet cell that cannot be a formula under any import a spreadsheet
  offers. OWASP's *CSV Injection* guidance: a cell that starts with ``=``, ``+``, ``-``, ``@``,
  a tab or a carriage return is evaluated by Excel, LibreOffice and Google Sheets
  (``=HYPERLINK(...)``, ``=cmd|...``), so such a text gets a leading ``'``; numbers (``-0.5``
  included) stay numbers. The file is written with commas, but the instructor's spreadsheet
  may import it with semicolons or tabs as separators, or with spaces trimmed: then
  ``x;=1+1``, ``x<tab>=1+1`` and `` =1+1`` start a field with a formula. So every place where a
  field can start under any of them (the cell's start, after ``,``, ``;``, a tab or a line
  break, past spaces and quotes) is guarded the same way: ``x;=1+1`` is written ``x;'=1+1``.
  Quoting and embedded quotes are left to :mod:`csv` as usual. :func:`csv_text` reads such a
  cell back.
* :func:`printable`: one line for the terminal, with every control character (C0, DEL, C1:
  escape sequences that move the cursor, rewrite the title or the clipboard), every
  bidirectional override (which reorders what the reader sees) and every byte of a
  file name that is not UTF-8 written as a visible escape; :class:`PrintableFormatter` does
  the same for log records.
"""

import logging
import re

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# one field as a spreadsheet's import splits a row (a field may start after a comma, semicolon,
# tab or line break): what leads it (spaces a trimming import drops, quotes), its text
_FIELD = re.compile(r'(?P<lead>[ "]*)(?P<body>[^,;\t\r\n]*)(?P<sep>[,;\t\r\n]?)')

# C0 and DEL, C1, the bidi embeddings, overrides and isolates, line and paragraph separators,
# and lone surrogates (os.fsdecode's stand-ins for bytes that are not UTF-8).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069"
                          "\u2028\u2029\ud800-\udfff]")


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return text.strip() == text and text.lower().lstrip("+-") not in ("inf", "infinity", "nan")


def _is_formula(body):
    return body.startswith(FORMULA_STARTS[:4]) and not _is_number(body.strip())


def _fields(text, edit):
    """``text`` with ``edit(body)`` applied to the text of every field any import could cut."""
    out, pos = [], 0
    while pos < len(text):
        match = _FIELD.match(text, pos)
        out.append(match["lead"] + edit(match["body"]) + match["sep"])
        pos = match.end()
    return "".join(out)


def csv_safe(value):
    """``value`` as a CSV cell that a spreadsheet shows and never evaluates, however imported.

    Numbers and numeric strings pass unchanged; any other text that starts with a formula
    character gets a leading apostrophe (``"=1+1"`` -> ``"'=1+1"``), which spreadsheets take
    as "this is text" and do not show; so does every part of it that a semicolon, tab or
    trimming import would make a field of its own (``"x;=1+1"`` -> ``"x;'=1+1"``).
    """
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = str(value)
    if _is_number(text):
        return text
    if text.startswith(FORMULA_STARTS):
        text = "'" + text
    return _fields(text, lambda body: "'" + body if _is_formula(body) else body)


def csv_text(cell):
    """The text that :func:`csv_safe` wrote as ``cell`` (its apostrophes taken off again).

    For a file that is read back and written again (``grades.csv`` keeps the rows of other
    runs): ``csv_safe(csv_text(cell)) == cell`` for every cell ``csv_safe`` wrote, so a
    neutralised cell does not grow another apostrophe on each rewrite.
    """
    text = str(cell)
    if _is_number(text):
        return text
    text = _fields(text, lambda body: body[1:] if body.startswith("'") and _is_formula(body[1:]) else body)
    if text.startswith("'") and text[1:].startswith(FORMULA_STARTS[4:]):
        text = text[1:]  # a tab or a carriage return first: only the cell's start was guarded
    return text


def _escape(match):
    char = match.group()
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a file name that is not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text):
    """``text`` with every control, bidi and undecodable character escaped (``\\x1b``).

    The result is one line (newlines are escaped too) that a terminal shows as written.
    """
    return _UNPRINTABLE.sub(_escape, str(text))


class PrintableFormatter(logging.Formatter):
    """A log formatter for the terminal: each line of a record through :func:`printable`.

    Log messages name students, files and what a notebook raised; a traceback keeps its lines.
    """

    def format(self, record):
        return "\n".join(printable(line) for line in super().format(record).splitlines())
