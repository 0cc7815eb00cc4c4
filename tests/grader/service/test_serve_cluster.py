"""``serve --scheduler --db postgresql://``: the service for more than one grading host.

A real Dask cluster (one single-threaded worker) and a real PostgreSQL server on 127.0.0.1
(``tests/servers.py``). Two students hand in twice each through the exchange; the second
attempt of a student is a new Dask task (a finished attempt's result is never handed back
for the next one), the last attempt counts, and the PostgreSQL gradebook holds it.
"""

import pytest

from autograder.sandbox.launcher import unavailable_reason
from autograder.service.journal import DONE
from tests.grader.service.serving import AID, attempts, hand_in, make_course, serving, wait_for
from tests.grader.test_grading_e2e import Class
from tests.servers import dask_cluster, postgres_bin, postgres_server

SANDBOX_MISSING = unavailable_reason()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SANDBOX_MISSING is not None, reason=str(SANDBOX_MISSING)),
              pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL not installed")]


def test_serve_on_a_dask_cluster_into_postgresql(tmp_path):
    import nbformat
    from nbgrader.api import Gradebook

    root, exchange = make_course(tmp_path)
    source = nbformat.read(root / "solutions" / AID / f"{AID}.ipynb", as_version=4)
    klass = Class(source, nbformat.read(root / "release" / AID / f"{AID}.ipynb", as_version=4))
    first_part = [klass.parts[0][0]]
    one = sum(points for _, points in klass.parts[0][1])
    for student in ("ann", "ben"):
        hand_in(exchange, student, klass.notebook(solved=[]))
    hand_in(exchange, "ann", klass.notebook())
    hand_in(exchange, "ben", klass.notebook(solved=first_part))
    state, log = tmp_path / "state", tmp_path / "serve.log"
    with postgres_server() as db_url, dask_cluster(workers=1, log_dir=tmp_path / "dask") as (address, _):
        with serving(root, exchange, state, log, "--scheduler", address, "--db", db_url) as process:
            wait_for(lambda: sum(a.state == DONE for a in attempts(state)) == 4, "4 attempts graded",
                     process, log, timeout=600)
        with Gradebook(db_url) as gb:
            scores = {s.student_id: s.score for s in gb.assignment_submissions(AID)}
    rows = attempts(state)
    assert [(a.student, a.score) for a in sorted(rows, key=lambda a: a.id)] == [
        ("ann", 0), ("ben", 0), ("ann", klass.total), ("ben", one)]
    assert scores == {"ann": klass.total, "ben": one}
    assert not (root / "gradebook.db").exists()  # everything went to PostgreSQL
