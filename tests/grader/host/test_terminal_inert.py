"""Student-controlled text reaches the instructor's terminal escaped.

Student ids, file names and messages holding terminal escape sequences (``ESC ] 0 ;`` sets
the window title, ``ESC [ 2 J`` clears the screen), a bare carriage return (which
overwrites the line already shown), bidirectional overrides (which reorder what is read)
and bytes that are not UTF-8 go through the progress bar, the class summary and the
``roster`` and ``export`` commands; what is printed must hold none of them, only their visible escapes.
"""

import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.core.gradebook import open_gradebook
from autograder.core.results import LimitEvent, LimitKind, Status, StudentResult
from autograder.host.roster import RosterReport
from autograder.host.summary import Progress, print_summary
from autograder.core.grading_run import Settings

REPO = Path(__file__).resolve().parents[3]
HOSTILE = ["\x1b]0;pwned title\x07ada", "bob\x1b[2J\x1b[H", "cyd\rOK all good", "eve\u202egnp.exe",
           os.fsdecode(b"zed\xff\xfe")]
# what the terminal must never get: C0 but newline, DEL, C1, bidi controls, lone surrogates
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def test_progress_bar_label_is_escaped(capsys):
    bar = Progress(len(HOSTILE))  # not a terminal here: one line per 10 %, each with its label
    for student in HOSTILE:
        bar.update(student)
    bar.close()
    err = capsys.readouterr().err
    assert not RAW.search(err), repr(err)
    for escaped in ("\\x1b]0;pwned title\\x07ada", "bob\\x1b[2J", "cyd\\x0dOK", "eve\\u202egnp", "zed\\xff\\xfe"):
        assert escaped in err, (escaped, err)


def test_progress_says_what_it_counts_and_then_the_time_left(capsys):
    """First what is counted; after the first of 4 (40 s), 3 x 40 s = 2m left; none at the end."""
    bar = Progress(4, workers=2)
    bar.start -= 40  # as if the first submission took 40 s
    bar.update("ada")
    for student in ("bob", "cyd", "eve"):
        bar.update(student)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "grading 4 submission(s) on 2 worker(s)", lines
    assert re.search(r"about 2m(\ds)? left", lines[1]) and "ada" in lines[1], lines  # 2m, and a slow host's second
    assert "left" not in lines[-1] and "4/4" in lines[-1], lines


def test_summary_escapes_ids_file_names_and_messages(tmp_path):
    results = [StudentResult(student=s, status=Status.OK if i % 2 else Status.UNREADABLE, seconds=float(i),
                             message=f"graded '{s}.ipynb'", flags=[f"flag{s}"], tampered=[s],
                             events=[LimitEvent(kind=LimitKind.TIMEOUT, cell=1, grade_id=s, notebook="toy", detail="")])
               for i, s in enumerate(HOSTILE)]
    results.append(StudentResult(student="err\x1b[31m", status=Status.ERROR, error="boom\x1b]52;c;AAAA\x07"))
    out = io.StringIO()
    settings = Settings(root=str(tmp_path), assignment="toy", template_db="", release_dir="", workdir="")
    print_summary("toy", results, [("toy", "test\x1b[2J")], 12.0, 2, settings, out=out,
           roster=RosterReport("toy", ("miss\u202eing",), ("\x1b[5mnot-on-roster",)))
    text = out.getvalue()
    assert not RAW.search(text), repr(RAW.search(text))
    for escaped in ("\\x1b]0;pwned title\\x07ada", "bob\\x1b[2J\\x1b[H", "cyd\\x0dOK all good",
                    "eve\\u202egnp.exe", "zed\\xff\\xfe", "boom\\x1b]52;c;AAAA\\x07", "miss\\u202eing",
                    "test\\x1b[2J"):
        assert escaped in text, escaped


@pytest.mark.slow  # two runs of the command line
def test_roster_command_escapes_what_it_lists(tmp_path):
    db = tmp_path / "gradebook.db"
    with open_gradebook(f"sqlite:///{db}") as gb:
        gb.add_assignment("toy")
    (tmp_path / "solutions" / "toy").mkdir(parents=True)
    (tmp_path / "solutions" / "toy" / "toy.ipynb").write_bytes(
        (REPO / "tests" / "fixtures" / "course" / "solutions" / "toy" / "toy.ipynb").read_bytes())
    (tmp_path / "roster.csv").write_text("student_id,name,email,lms_id\n\x1b]0;pwned\x07ada,Ada,,\n"
                                        "bob\u202e,Bob,,\n")
    done = subprocess.run([sys.executable, "-m", "autograder", "roster", "--root", str(tmp_path),
                           "--check", "toy"], capture_output=True, text=True, cwd=REPO, timeout=300,
                          errors="surrogateescape")
    assert done.returncode == 0, done.stderr
    assert not RAW.search(done.stdout) and "\\x1b]0;pwned\\x07ada" in done.stdout and "bob\\u202e" in done.stdout
    # Moodle's import needs every student's email: the command names those without one, escaped
    done = subprocess.run([sys.executable, "-m", "autograder", "export", "--lms", "moodle", "--root", str(tmp_path),
                           "--to", "moodle.csv"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert not RAW.search(done.stderr) and "\\x1b]0;pwned\\x07ada" in done.stderr, done.stderr
    (tmp_path / "roster.csv").write_text("name\x1b[2J,email\nAda,a@b\n")
    done = subprocess.run([sys.executable, "-m", "autograder", "roster", "--root", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 1 and "\n" == done.stderr[-1:] and done.stderr.count("\n") == 1
    assert not RAW.search(done.stderr) and "name\\x1b[2j" in done.stderr  # the header is read lower-cased


def test_log_records_are_escaped_line_by_line():
    from autograder.core.untrusted import PrintableFormatter

    record = logging.LogRecord("autograder", logging.WARNING, __file__, 1,
                               "grading %s failed:\n%s", ("eve\x1b]0;x\x07", "Trace\u202eback"), None)
    text = PrintableFormatter("%(levelname)s %(message)s").format(record)
    assert text == "WARNING grading eve\\x1b]0;x\\x07 failed:\nTrace\\u202eback"
