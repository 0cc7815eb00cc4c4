"""The course's folders and files: every name and on-disk format the grader reads or writes.

This module is their one owner (as nbgrader's ``coursedir`` is nbgrader's); every other
module imports a name from here instead of writing the literal. Paths are relative to the
course root:

* ``solutions/<assignment>/`` (:data:`SOURCE`): source notebooks, with solutions and hidden
  tests; ``release/<assignment>/`` (:data:`RELEASE`): the generated student version;
* ``submitted/<student>/<assignment>/`` (:data:`SUBMITTED`): what was collected, with
  nbgrader's :data:`TIMESTAMP` (in :data:`autograder.core.times.NBGRADER_TIME`) and
  :data:`SECRET`;
* ``autograded/<student>/<assignment>/`` (:data:`AUTOGRADED`), with the driver's
  :data:`STAMP`; ``feedback/<student>/<assignment>/<notebook>.html`` (:data:`FEEDBACK`);
* :data:`GRADEBOOK` (unless another database URL is given), :data:`GRADES_CSV`,
  :data:`ROSTER_CSV`, :data:`LOGS`, :data:`LOCK`, :data:`REPORT_SECRET` in the root;
  ``reports/<assignment>.html`` (:func:`report_page`).
"""

from pathlib import Path

SOURCE = "solutions"
RELEASE = "release"
SUBMITTED = "submitted"
AUTOGRADED = "autograded"
FEEDBACK = "feedback"
GRADEBOOK = "gradebook.db"  # the SQLite gradebook of a course, or of a worker's scratch course
# the driver's stamp beside each autograded submission (digest, run id, seconds): the grader's
# own bookkeeping, never copied on by nbgrader (so never into feedback/, which
# ``nbgrader release_feedback`` hands to the student)
STAMP = ".autograder.json"
# files of a submission folder written by collection (nbgrader's, or ``collect``), not by the student
TIMESTAMP = "timestamp.txt"
SECRET = "submission_secret.txt"  # nbgrader's exchange: names the feedback it releases
GRADES_CSV = "grades.csv"          # the class's grades, written by ``grade``
ROSTER_CSV = "roster.csv"          # the class list, read by ``grade``, ``collect``, ``report``
GRADEBOOK_EXPORT_CSV = "gradebook_export.csv"  # ``export``'s default output
LOCK = ".autograder.lock"          # held by the one command that grades the course
LOGS = "logs"                      # logs/<assignment>/<student>.log of failed gradings
REPORTS = "reports"                # ``report``'s default folder
REPORT_SECRET = ".report-secret"   # the course's key of the report's pseudonyms


def report_page(root, assignment):
    """Where ``report`` writes ``assignment``'s page by default (the summary of ``grade`` names it)."""
    return Path(root) / REPORTS / f"{assignment}.html"
