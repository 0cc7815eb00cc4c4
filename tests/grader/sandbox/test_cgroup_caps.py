"""The caps a kernel's cgroup gets, written into a folder that stands for it (no cgroup made).

The knobs a controller offers are the files the folder holds: v1's ``pids.max`` and
``memory.limit_in_bytes``, v2's ``memory.max`` and ``memory.swap.max``. A cap is written
only where its knob exists, 0 means no cap, and the process joins through ``cgroup.procs``.
"""

import os

import pytest

from autograder.sandbox import cgroups

V1 = ("cgroup.procs", "pids.max", "memory.limit_in_bytes")
V2 = ("cgroup.procs", "pids.max", "memory.max", "memory.swap.max")


def knobs(tmp_path, names):
    for name in names:
        (tmp_path / name).write_text("untouched")
    return {name: (tmp_path / name) for name in names}


def read(files):
    return {name: path.read_text() for name, path in files.items()}


@pytest.mark.parametrize("names, expected", [
    (V1, {"pids.max": "64", "memory.limit_in_bytes": str(3 * 2**20)}),
    (V2, {"pids.max": "64", "memory.max": str(3 * 2**20), "memory.swap.max": "0"}),
], ids=["v1", "v2"])
def test_the_caps_go_where_their_knobs_are(tmp_path, names, expected):
    files = knobs(tmp_path, names)
    cgroups._join_and_cap(str(tmp_path), 64, 3 * 2**20)
    assert read(files) == {"cgroup.procs": str(os.getpid()), **expected}
    assert sorted(os.listdir(tmp_path)) == sorted(names)  # no knob is made up


def test_zero_means_no_cap(tmp_path):
    files = knobs(tmp_path, V2)
    cgroups._join_and_cap(str(tmp_path), 0, 0)
    assert read(files) == {"cgroup.procs": str(os.getpid()), "pids.max": "untouched",
                           "memory.max": "untouched", "memory.swap.max": "untouched"}
