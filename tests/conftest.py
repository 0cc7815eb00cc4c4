"""Shared fixtures for the test suite.

* ``rng``: a seeded NumPy generator, so every test sees the same random data;
* ``devices``: the torch devices to test on (``"cpu"``, plus ``"cuda"`` when present);
* ``device``: one test per device (session-scoped, so hypothesis tests may use it);
* ``postgres``: a throwaway PostgreSQL server for a module; ``postgres(name)`` makes a
  fresh database on it and returns its URL (skipped with an install hint without one);
* a hypothesis profile with few examples and no deadline, to keep the suite fast;
* the longest test files first (:data:`LONGEST_FIRST`), so that under pytest-xdist
  (``make test``: ``--dist loadfile --no-loadscope-reorder``) no long file starts last
  and keeps one core busy after the other has run out of work.
"""

import os

# Triton decides at import time whether its kernels run compiled or under its CPU
# interpreter, and torch may import it early (torch._dynamo does). Without a GPU, ask
# for the interpreter before anything imports torch, so transformer_ref.triton's tests
# work whichever test module happens to import triton first.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import autograder  # noqa: E402,F401  (marks rfc3987_syntax absent: 1.4 s less per process)
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings

try:
    import torch

    DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
except ImportError:  # the NumPy-only parts of the suite still run
    DEVICES = ["cpu"]

settings.register_profile("course", max_examples=25, deadline=None, derandomize=True)
settings.load_profile("course")


@pytest.fixture
def rng():
    """A fresh ``numpy.random.default_rng(0)`` for each test."""
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def devices():
    """Every torch device available here."""
    return list(DEVICES)


@pytest.fixture(scope="session", params=DEVICES)
def device(request):
    """Each available torch device in turn."""
    return request.param


@pytest.fixture(scope="module")
def one_torch_thread():
    """For modules of tiny tensors: one intra-op thread beats several fighting for shared cores.

    Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server for this module; ``postgres(name)`` makes a fresh database's URL."""
    from tests.servers import POSTGRES_HINT, postgres_bin, postgres_server

    if postgres_bin() is None:
        pytest.skip(POSTGRES_HINT)
    psycopg = pytest.importorskip("psycopg", reason="psycopg missing: run `make venv`")
    with postgres_server("postgres_admin") as url:
        base = url.rsplit("/", 1)[0]

        def database(name):
            with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            return f"{base}/{name}"
        yield database


# The test files that take longest (wall, in a full `make test` on 2 cores), longest first:
# they are collected, and so handed to the pytest-xdist workers, before every other file,
# which keeps its own order. A file missing here only starts later.
LONGEST_FIRST = (
    "tests/grader/assignments/test_self_check.py",
    "tests/book/test_chapter_downloads.py",
    "tests/book/test_site_browser.py",
    "tests/grader/test_grading_e2e.py",
    "tests/grader/host/test_cluster.py",
    "tests/grader/test_host_faults.py",
    "tests/grader/host/test_term.py",
    "tests/grader/service/test_serve.py",
    "tests/grader/host/test_load.py",
    "tests/grader/assignments/test_assignment_07.py",
    "tests/grader/service/test_hub_e2e.py",
    "tests/grader/service/test_web.py",
    "tests/grader/judge/test_measurement_evasions.py",
    "tests/grader/judge/test_memory_judge.py",
    "tests/book/test_learner_env.py",  # after test_chapter_downloads, whose learner venv it reuses
    "tests/grader/test_formgrader_browser.py",
    "tests/grader/sandbox/test_sandbox_attacks.py",
    "tests/grader/assignments/test_assignment_grading.py",
    "tests/grader/sandbox/test_socket_folder.py",
    "tests/grader/judge/test_judged_crash.py",
    "tests/book/test_labs_browser.py",
    "tests/book/test_book.py",
)


def pytest_collection_modifyitems(session, config, items):
    """Put the items of the :data:`LONGEST_FIRST` files first, in that order (stable)."""
    root = config.rootpath
    missing = [name for name in LONGEST_FIRST if not (root / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names no file: {missing}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))
