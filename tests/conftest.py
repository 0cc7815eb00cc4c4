"""Shared fixtures for the test suite.

* ``rng``: a seeded NumPy generator, so every test sees the same random data;
* ``devices``: the torch devices to test on (``"cpu"``, plus ``"cuda"`` when present);
* ``device``: one test per device (session-scoped, so hypothesis tests may use it);
* ``postgres``: a throwaway PostgreSQL server for a module; ``postgres(name)`` makes a
  fresh database on it and returns its URL (skipped with an install hint without one);
* a hypothesis profile with few examples and no deadline, to keep the suite fast.
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
