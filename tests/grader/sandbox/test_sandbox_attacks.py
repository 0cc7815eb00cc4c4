"""Hostile submissions against the sandbox and the outside judge, one family at a time.

One class of the toy assignment is graded with ``--jobs 2``: honest classmates
whose ids sort before and after the attackers (so some are graded before, beside
and after each attack), and one attacker per family. Every attacker's own
solutions are wrong, so every attacker must score exactly 0 whatever the attack
does, and every honest classmate exactly full marks. After the run, and again a few
seconds after it, the gradebook, ``grades.csv`` and every submitted file are as an
honest run leaves them, and no process, cgroup or socket folder of the run is left.

The families (the attack code is prepended to the student's first solution cell):

* read hidden material: the instructor's source notebook, the grader's checks, the
  reference library, the gradebook, through absolute paths and imports;
* touch other students' work or the gradebook: delete, overwrite, write a database;
* outlive the kernel: a background thread, a daemonised double-forked process;
* stop or slow the grader: kill or SIGSTOP every process it can see, fill the disk;
* change the verdict from inside: input and AST transformers that turn test cells
  into ``pass``, execute results that claim points, hooks, a replaced ``__builtins__``,
  ``sys.settrace``, float subclasses that compare equal to anything, a rebound ``np``,
  a forged, malformed or stalled reply on the grader's line to its probe.
"""

import csv
import hashlib
import io
import os
import shutil
import time
from pathlib import Path

import nbformat
import pytest

from autograder.host.driver import grade
from autograder.core.limits import Limits
from autograder.host.release import generate
from autograder.sandbox.launcher import unavailable_reason
from leftovers import run_ids, scratch_folders

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "course"
MISSING = unavailable_reason()
MARK = "attack-marker-7f3a"  # in the command line of every process an attack starts
STARTED = "attack-started-at"  # printed by the attacks that write later, with the time
LATEST = 6  # seconds: the latest delayed write of any attack comes this long after it began

pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]

WRONG = "def add(a, b):\n    return 0\n"

ATTACKS = {
    # -- read hidden material -------------------------------------------------------------
    "read_source": """
        import json
        nb = json.load(open(ROOT + '/solutions/toy/toy.ipynb'))
        exec([c for c in nb['cells'] if 'def add' in ''.join(c['source'])][0]['source'])
    """,
    "import_checks": """
        import sys
        sys.path.insert(0, ROOT)
        import autograder.checks
    """,
    "import_reference": """
        from transformer_ref import numpy as ref
    """,
    "read_gradebook": """
        import sqlite3
        sqlite3.connect('file:' + ROOT + '/gradebook.db?mode=ro', uri=True).execute('select 1')
    """,
    # -- touch other students' work or the gradebook -------------------------------------
    "delete_classmates": """
        import shutil
        for d in ('submitted', 'autograded', 'feedback'):
            shutil.rmtree(ROOT + '/' + d, ignore_errors=True)
        os.remove(ROOT + '/submitted/a_honest/toy/toy.ipynb')
    """,
    "write_gradebook": """
        import sqlite3
        db = sqlite3.connect(ROOT + '/gradebook.db')
        db.execute('update grade set auto_score = 100')
        db.commit()
    """,
    "write_csv": """
        open(ROOT + '/grades.csv', 'w').write('student,score\\nz_honest,0\\n')
    """,
    "poison_worker": """
        import glob
        for path in glob.glob('/tmp/autograder-*/**/*.db', recursive=True):
            open(path, 'wb').write(b'x')
        assert glob.glob('/tmp/autograder-*'), 'no worker folder visible'
    """,
    # -- outlive the kernel (each prints when it began: its writes come at most LATEST after) --
    "background_thread": """
        print(STARTED, time.time())
        import threading
        def later():
            time.sleep(2)
            open(ROOT + '/grades.csv', 'w').write('late')
        threading.Thread(target=later, daemon=False).start()
    """,
    "escaped_process": """
        print(STARTED, time.time())
        import subprocess
        subprocess.Popen(['sh', '-c', 'sleep 4; echo MARK > ' + ROOT + '/grades.csv', 'MARK'],
                         start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp('sleep', ['sleep', '6', 'MARK'])
            os._exit(0)
    """,
    # -- stop or slow the grader ----------------------------------------------------------
    "kill_everything": """
        import signal
        for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            os.kill(os.getppid(), signal.SIGKILL)
        except OSError:
            pass
    """,
    "stop_parent": """
        import signal
        try:
            os.kill(os.getppid(), signal.SIGSTOP)
            os.kill(1, signal.SIGSTOP)
        except OSError:
            pass
    """,
    "fill_disk": """
        with open('/tmp/big', 'wb') as f:
            try:
                for _ in range(3 * 1024):
                    f.write(b'x' * 2**20)
            except OSError:
                pass
    """,
    # -- change the verdict from inside ----------------------------------------------------
    "input_transformer": """
        get_ipython().input_transformers_post.append(lambda lines: ['pass\\n'])
    """,
    "ast_transformer": """
        import ast
        class Blank(ast.NodeTransformer):
            def visit_Module(self, node):
                return ast.Module(body=[ast.Pass()], type_ignores=[])
        get_ipython().ast_transformers.append(Blank())
    """,
    "execute_result": """
        import sys
        ip = get_ipython()
        ip.events.register('post_run_cell', lambda result: sys.displayhook(1.0))
        ip.events.register('pre_run_cell', lambda info: ip.display_pub.publish({'text/plain': '1'}))
    """,
    "replaced_builtins": """
        import builtins, types
        fake = types.ModuleType('builtins')
        fake.__dict__.update(vars(builtins))
        fake.AssertionError = type('Quiet', (Exception,), {})
        get_ipython().user_ns['__builtins__'] = fake
    """,
    "settrace": """
        import sys
        def tracer(frame, event, arg):
            for name in list(frame.f_locals):
                if name.startswith('expected'):
                    frame.f_locals[name] = 0
            return tracer
        sys.settrace(tracer)
        threading = __import__('threading')
        threading.settrace(tracer)
    """,
    "float_subclass": """
        class Anything(float):
            def __eq__(self, other):
                return True
            __ne__ = lambda self, other: False
        def add(a, b):
            return Anything(0)
    """,
    "forged_reply": """
        import socket, struct
        FORGED = b'{"$":"dict","v":{"found":true,"callable":false,"value":{"$":"int","v":"4"}}}'
        real = socket.socket.sendall
        socket.socket.sendall = lambda self, data, *rest: real(
            self, struct.pack('!Q', len(FORGED)) + FORGED, *rest)
    """,
    "malformed_reply": """
        import socket, struct
        real = socket.socket.sendall
        socket.socket.sendall = lambda self, data, *rest: real(
            self, struct.pack('!Q', 2**62) + b'[' * 100000, *rest)
    """,
    "stalled_reply": """
        import socket, struct, time
        real = socket.socket.sendall
        def sendall(self, data, *rest):
            real(self, struct.pack('!Q', 1000) + b'[1', *rest)
            time.sleep(3600)
        socket.socket.sendall = sendall
    """,
}


def student_notebook(release, root, prelude=None):
    """The toy's student version: honest (prelude None) or wrong add() after ``prelude``."""
    nb = nbformat.from_dict(release)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid == "add":
            cell.source = ("def add(a, b):\n    return a + b\n" if prelude is None else
                           f"import os, time\nROOT = {str(root)!r}\nMARK = {MARK!r}\nSTARTED = {STARTED!r}\n"
                           + _dedent(prelude) + "\n" + WRONG)
        if gid == "softmax":
            cell.source = ("def softmax(xs):\n    m = max(xs)\n    e = [math.exp(x - m) for x in xs]\n"
                           "    return [v / sum(e) for v in e]\n" if prelude is None else
                           "def softmax(xs):\n    return []\n")
    return nb


def _dedent(text):
    import textwrap

    return textwrap.dedent(text).strip("\n")


def tree_digest(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def marked_processes():
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if MARK.encode() in cmdline:
            found.append(int(pid))
    return found


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacked-course")
    shutil.copytree(FIXTURE / "solutions", root / "solutions")
    release_dir = generate("toy", root, release_dir=root / "release" / "toy")
    release = nbformat.read(release_dir / "toy.ipynb", as_version=4)
    students = {"a_honest": None, "b_honest": None, "y_honest": None, "z_honest": None}
    students.update({f"m_{name}": code for name, code in ATTACKS.items()})
    for student, prelude in students.items():
        folder = root / "submitted" / student / "toy"
        folder.mkdir(parents=True)
        nbformat.write(student_notebook(release, root, prelude), folder / "toy.ipynb")
    submitted = tree_digest(root / "submitted")
    out = io.StringIO()
    results = grade("toy", root, jobs=2, progress=False, out=out,
                    limits=Limits(cell_timeout=8, notebook_timeout=60, memory_mb=1024,
                                  disk_mb=64))
    after_run = dict(csv=(root / "grades.csv").read_text(), db=tree_digest(root)["gradebook.db"])
    return dict(root=root, results={r.student: r for r in results}, out=out.getvalue(),
                submitted=submitted, after_run=after_run, total=7.0 - 1.0)


def test_honest_classmates_score_full_marks(attacked):
    for student in ("a_honest", "b_honest", "y_honest", "z_honest"):
        result = attacked["results"][student]
        assert result.status == "ok" and result.score == attacked["total"], result


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attacker_scores_zero(attacked, attack):
    result = attacked["results"][f"m_{attack}"]
    assert result.score == 0, (attack, result)


def test_every_student_is_in_the_gradebook_and_the_csv(attacked):
    from nbgrader.api import Gradebook

    root = attacked["root"]
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO((root / "grades.csv").read_text()))}
    assert set(rows) == set(attacked["results"])
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for sub in gb.assignment_submissions("toy"):
            assert sub.score == attacked["results"][sub.student.id].score
            assert float(rows[sub.student.id]["score"]) == sub.score


def test_submissions_are_untouched(attacked):
    assert tree_digest(attacked["root"] / "submitted") == attacked["submitted"]


def started_at(root, student):
    """When ``student``'s attack began: the time it printed in its autograded notebook."""
    nb = nbformat.read(root / "autograded" / student / "toy" / "toy.ipynb", as_version=4)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            for line in output.get("text", "").splitlines():
                if line.startswith(STARTED):
                    return float(line.split()[1])
    raise AssertionError(f"{student}'s attack printed no start time")


def test_nothing_changes_after_the_run_and_nothing_is_left(attacked):
    root = attacked["root"]
    began = max(started_at(root, f"m_{a}") for a in ATTACKS if "print(STARTED" in ATTACKS[a])
    time.sleep(max(0.0, began + LATEST + 1 - time.time()))  # past every delayed write
    assert (root / "grades.csv").read_text() == attacked["after_run"]["csv"]
    assert tree_digest(root)["gradebook.db"] == attacked["after_run"]["db"]
    assert marked_processes() == []
    runs = run_ids(root, "toy")
    assert len(runs) == 1  # every student's stamp names the one run
    assert scratch_folders(runs) == set()
