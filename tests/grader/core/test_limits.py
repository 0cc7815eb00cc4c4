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
