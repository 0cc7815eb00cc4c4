"""What a grading run may leave on the machine: kernel cgroups and the grader's folders.

Not a test module. Other runs on the same machine leave theirs too, so tests compare
:func:`scratch_folders` before and after a run, and are marked ``serial``: ``make test`` runs
them alone, after the tests it runs in parallel, whose runs would show up here meanwhile.
"""

from pathlib import Path

from autograder.sandbox.cgroups import kernel_cgroups


def scratch_folders():
    """Kernel cgroups and the grader's folders in /tmp (``kernel-*``, ``autograder-*``)."""
    found = {str(p) for pattern in ("kernel-*", "autograder-*") for p in Path("/tmp").glob(pattern)}
    return found | {f"cgroup {name}" for name in kernel_cgroups()}
