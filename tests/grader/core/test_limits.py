"""The run's limits and the sandbox's part of them, as the launcher receives it.

``Limits`` holds every default; ``Limits.sandbox()`` is the :class:`SandboxLimits` record
that crosses into the launcher's process as JSON in ``AUTOGRADER_LIMITS``. The record
comes back exactly as it went, and anything else in that variable is refused with one line.
"""

import json

import pytest

from autograder.core.limits import Limits
from autograder.sandbox.limits import ENV, SandboxLimits


def test_the_defaults_reach_the_sandbox_with_the_cpu_cap_resolved():
    # the documented defaults (autograder/README.md, "Limits"), written out here
    assert Limits().sandbox() == SandboxLimits(memory_mb=4096, max_tasks=128, disk_mb=256,
                                               cpu_seconds=600 + 60)
    assert Limits(cpu_seconds=7, notebook_timeout=10).sandbox().cpu_seconds == 7
    assert Limits(notebook_timeout=90.5).sandbox().cpu_seconds == 150


def test_the_record_crosses_the_environment_and_comes_back_equal():
    limits = Limits(memory_mb=1536, max_tasks=32, disk_mb=64, notebook_timeout=90)
    environ = limits.environment()
    assert list(environ) == [ENV] == ["AUTOGRADER_LIMITS"]
    assert json.loads(environ[ENV]) == {"memory_mb": 1536, "max_tasks": 32, "disk_mb": 64,
                                        "cpu_seconds": 150}
    assert SandboxLimits.from_environment(environ) == limits.sandbox()
    assert SandboxLimits.from_environment({}) is None


@pytest.mark.parametrize("text, message", [
    ("", "is not JSON"),
    ("[1, 2", "is not JSON"),
    ("[64, 128, 256, 660]", "must hold exactly"),
    ('{"memory_mb": 1, "max_tasks": 1, "disk_mb": 1}', "must hold exactly"),
    ('{"memory_mb": 1, "max_tasks": 1, "disk_mb": 1, "cpu_seconds": 1, "cell_timeout": 3}',
     "must hold exactly"),
    ('{"memory_mb": 1.5, "max_tasks": 1, "disk_mb": 1, "cpu_seconds": 1}', "memory_mb must be"),
    ('{"memory_mb": 1, "max_tasks": true, "disk_mb": 1, "cpu_seconds": 1}', "max_tasks must be"),
    ('{"memory_mb": 1, "max_tasks": 1, "disk_mb": -1, "cpu_seconds": "9"}',
     "disk_mb, cpu_seconds must be"),
])
def test_anything_but_the_record_is_refused_in_one_line(text, message):
    with pytest.raises(ValueError, match=message) as error:
        SandboxLimits.from_json(text)
    assert "\n" not in str(error.value)


def test_the_record_is_frozen():
    with pytest.raises(AttributeError):
        Limits().sandbox().memory_mb = 1


# -- how hard the host tries: Retries ----------------------------------------------------------
def test_retries_default_to_the_documented_values_and_read_the_environment():
    from autograder.core.limits import RETRIES_ENV, Retries

    assert RETRIES_ENV == "AUTOGRADER_RETRIES"
    assert Retries.from_environment({}) == Retries(kernel_start_tries=3, kernel_start_pause=1.0)
    assert Retries.from_environment({RETRIES_ENV: " "}) == Retries()
    fastest = Retries.from_environment({RETRIES_ENV: "kernel_start_tries=1, kernel_start_pause=0"})
    assert fastest == Retries(kernel_start_tries=1, kernel_start_pause=0.0)
    assert Retries.parse("kernel_start_pause=0.25") == Retries(3, 0.25)


@pytest.mark.parametrize("text, message", [
    ("tries=1", "'tries=1' is not one of kernel_start_tries=VALUE, kernel_start_pause=VALUE"),
    ("kernel_start_tries", "is not one of"),
    ("kernel_start_tries=0", "kernel_start_tries=0: a whole number >= 1"),
    ("kernel_start_tries=2.5", "kernel_start_tries='2.5' is not a number"),
    ("kernel_start_pause=-1", "kernel_start_pause=-1.0: seconds from 0 to 60"),
    ("kernel_start_pause=1e9", "seconds from 0 to 60"),
])
def test_malformed_retries_are_one_line_naming_the_setting(text, message):
    from autograder.core.limits import Retries

    with pytest.raises(ValueError) as error:
        Retries.parse(text)
    assert str(error.value).startswith("AUTOGRADER_RETRIES: ") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_the_grader_applies_the_runs_retries_to_every_kernel_it_starts(tmp_path):
    """The run's settings reach the executor's configuration, which ``_tried`` reads."""
    from autograder.core.limits import Retries
    from autograder.judge.execute import KernelStartError, LimitedExecute
    from autograder.core.grading_run import Settings
    from autograder.worker.pipeline import autograde_config

    settings = Settings(root=str(tmp_path), assignment="toy", template_db="", release_dir="",
                        workdir=str(tmp_path), retries=Retries(kernel_start_tries=2, kernel_start_pause=0))
    executor = LimitedExecute(config=autograde_config(settings, "sqlite://", "s", tmp_path))
    assert (executor.kernel_start_tries, executor.kernel_start_pause) == (2, 0.0)
    tried = []

    def start():
        tried.append(1)
        raise OSError("no bwrap")

    with pytest.raises(KernelStartError, match=r"\(2 tries\): OSError: no bwrap"):
        executor._tried(start)
    assert len(tried) == 2
