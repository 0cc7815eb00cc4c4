"""The nbgrader gradebook, read and written in one place.

* :func:`read_scores`: a worker reads one submission's scores out of its scratch
  gradebook into :class:`~autograder.results.NotebookScores`;
* :func:`record`: the driver copies a :class:`~autograder.results.StudentResult`
  into the class gradebook (replacing earlier autograded scores, keeping manual
  ones, as nbgrader does) and returns the submission's total;
* :func:`open_gradebook`: a gradebook at any SQLAlchemy URL, with a one-line error
  for a URL that cannot be one (a missing folder, a file that is not a database).
"""

import warnings
from contextlib import contextmanager
from pathlib import Path

from .results import OK, CellScore, NotebookScores


class GradebookError(Exception):
    """A gradebook that cannot be opened; the message is one line for the instructor."""


def check_url(db_url):
    """Raise :class:`GradebookError` if ``db_url`` cannot be a gradebook, without creating one."""
    if db_url.startswith("sqlite:///"):
        path = Path(db_url[len("sqlite:///"):])
        if not path.parent.is_dir():
            raise GradebookError(f"--db: the folder {path.parent} does not exist")
        if path.exists():
            with open(path, "rb") as f:
                head = f.read(16)
            if head and head != b"SQLite format 3\x00":
                raise GradebookError(f"--db: {path} is not an SQLite database")


@contextmanager
def open_gradebook(db_url):
    """nbgrader's ``Gradebook`` at ``db_url`` (created if new), SQLAlchemy warnings silenced."""
    import sqlalchemy.exc
    from nbgrader.api import Gradebook

    from .nbgrader_config import prepare_nbgrader

    check_url(db_url)
    prepare_nbgrader()
    with warnings.catch_warnings():
        # nbgrader's update_or_create_submission trips harmless SQLAlchemy autoflush warnings
        warnings.simplefilter("ignore", sqlalchemy.exc.SAWarning)
        try:
            gb = Gradebook(db_url)
        except sqlalchemy.exc.SQLAlchemyError as error:
            raise GradebookError(f"--db: cannot open the gradebook ({type(error).__name__})") from None
        with gb:
            yield gb


def read_scores(db_url, assignment, student):
    """``(timestamp, [NotebookScores])`` of one submission, or ``(None, [])``."""
    from nbgrader.api import MissingEntry

    with open_gradebook(db_url) as gb:
        try:
            sub = gb.find_submission(assignment, student)
        except MissingEntry:
            return None, []
        return sub.timestamp, [
            NotebookScores(
                name=nb.name, late_penalty=nb.late_submission_penalty,
                grades=tuple(CellScore(g.name, g.auto_score, g.max_score) for g in nb.grades),
                comments=tuple((c.name, c.auto_comment) for c in nb.comments))
            for nb in sub.notebooks]


def record(db_url, assignment, result):
    """Copy ``result`` into the class gradebook; return ``(score, max_score, needs_manual)``.

    Autograded scores are replaced (a re-grade is idempotent: no duplicate rows);
    manual scores stay, and a cell that has one is marked for manual review again
    (nbgrader's own rule after an autograde). A submission that could not be
    graded (status other than ``ok``) scores 0 in every cell.
    """
    from nbgrader.api import MissingEntry

    with open_gradebook(db_url) as gb:
        gb.update_or_create_student(result.student)
        extra = {"timestamp": result.timestamp} if result.timestamp else {}
        sub = gb.update_or_create_submission(assignment, result.student, **extra)
        graded = {nb.name: nb for nb in result.notebooks}
        for notebook in sub.notebooks:
            data = graded.get(notebook.name)
            scores = {g.name: g.auto_score for g in data.grades} if data else {}
            if data:
                notebook.late_submission_penalty = data.late_penalty
            for grade in notebook.grades:
                auto = 0.0 if result.status != OK else scores.get(grade.name, 0.0)
                grade.auto_score = auto
                grade.needs_manual_grade = grade.manual_score is not None or auto is None
            comments = dict(data.comments) if data else {}
            for comment in notebook.comments:
                comment.auto_comment = comments.get(comment.name)
        gb.db.commit()
        try:
            sub = gb.find_submission(assignment, result.student)
        except MissingEntry:  # pragma: no cover - just created
            return 0.0, 0.0, False
        return sub.score, sub.max_score, bool(sub.needs_manual_grade)
