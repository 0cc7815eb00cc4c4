"""A sandboxed grading kernel for the tests that talk to one directly, without a worker.

* ``need_sandbox()``: skip the test (with the install hint) where bubblewrap is missing;
* ``await started()``: a :class:`~autograder.judge.kernel_manager.SandboxedKernelManager`'s
  kernel that has answered, and its client with channels started (``(km, kc)``); a kernel
  that never answers is stopped before the error is raised;
* ``with sandboxed_kernel() as (km, kc)``: the same from synchronous code, and the kernel
  stopped (``SIGKILL``, channels closed) when the block ends, however it ends.
"""

from contextlib import contextmanager

import pytest
from jupyter_client.utils import run_sync

from autograder.judge.kernel_manager import SandboxedKernelManager
from autograder.sandbox.launcher import unavailable_reason

READY_SECONDS = 60


def need_sandbox():
    """Skip where the sandbox cannot run here (its reason, and the package to install)."""
    if reason := unavailable_reason():
        pytest.skip(f"{reason}: the sandbox is needed (apt-get install bubblewrap)")


async def stop(km, kc):
    """Close ``kc``'s channels and kill ``km``'s kernel."""
    kc.stop_channels()
    await km.shutdown_kernel(now=True)


async def started():
    """A sandboxed kernel that has answered, and its client (channels started)."""
    km = SandboxedKernelManager(kernel_name="python3")
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=READY_SECONDS)
    except BaseException:
        await stop(km, kc)
        raise
    return km, kc


@contextmanager
def sandboxed_kernel():
    """``(km, kc)`` of a started sandboxed kernel, stopped when the block ends."""
    km, kc = run_sync(started)()
    try:
        yield km, kc
    finally:
        run_sync(stop)(km, kc)
