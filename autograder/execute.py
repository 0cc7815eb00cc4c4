"""Notebook execution that survives hostile submissions.

:class:`LimitedExecute` replaces nbgrader's ``Execute`` preprocessor during
autograding. Compared with stock nbgrader it adds

* a wall-clock budget for the whole notebook: each cell may use at most what is
  left of it, cells after it ran out are not run and get a ``NotebookTimeoutError``
  (so their tests score 0);
* an output cap per cell: past ``output_limit`` bytes the outputs are dropped, the
  kernel is interrupted and the cell gets an ``OutputLimitError`` (a flooding test
  cell scores 0; the grader's memory stays bounded);
* recovery instead of nbgrader's "Removing failed assignment": when a cell times
  out and the kernel does not answer an interrupt (it ignores SIGINT), or when the
  kernel dies (``os._exit``, segfault, memory cap), the kernel is killed with its
  whole process group, a fresh one is started, the cells that had already run are
  replayed silently, and grading goes on with the next cell. The failed cell
  scores 0 (a ``CellTimeoutError`` or ``DeadKernelError`` output).

Every such event is appended to :data:`EVENTS` for the grading summary.
"""

import asyncio
import os
import signal
from queue import Empty
from time import monotonic

from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
from nbclient.util import ensure_async, run_sync
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Float, Integer

from .kernel import kill_process_cgroup

# Limit events of the notebooks executed in this process since the caller last
# cleared the list: dicts with keys notebook, cell, grade_id, kind, detail.
EVENTS = []

PROBE_SECONDS = 2.0  # how long an interrupted kernel may take to answer again


def error_output(ename, evalue):
    """An nbformat error output, as a failing cell would have produced."""
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


def output_size(content):
    """Approximate size in bytes of one iopub output message's payload."""
    if "text" in content:
        return len(content["text"])
    return sum(len(str(value)) for value in content.get("data", {}).values())


class LimitedExecute(Execute):
    """nbgrader's ``Execute`` with a notebook deadline, an output cap and kernel recovery."""

    notebook_timeout = Float(600.0, help="Wall-clock seconds for the whole notebook.").tag(config=True)
    output_limit = Integer(200_000, help="Bytes of output kept per cell.").tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        NotebookClient.__init__(self, nb, km)  # reset the client state, as nbconvert does
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        self.shutdown_kernel = "immediate"
        self._notebook = (resources or {}).get("nbgrader", {}).get("notebook", "")
        self._deadline = monotonic() + self.notebook_timeout
        self._cell_timeout = self.timeout
        self._kernel_pid = None
        done = []  # indices of code cells that ran; replayed into a fresh kernel
        alive = self._start()
        try:
            for index, cell in enumerate(self.nb.cells):
                if cell.cell_type != "code" or not cell.source.strip():
                    continue
                if not alive:
                    self._fail(cell, index, "kernel_start", "KernelStartError",
                               "the grading kernel could not be started")
                    continue
                remaining = self._deadline - monotonic()
                if remaining < 1:
                    self._fail(cell, index, "notebook_timeout", "NotebookTimeoutError",
                               f"not run: the notebook used up its {self.notebook_timeout:g} s")
                    continue
                if self._run_cell(cell, index, remaining):
                    done.append(index)
                else:
                    alive = self._restart(done)
        finally:
            self._stop()
        self.set_widgets_metadata()
        return self.nb, self.resources

    # -- one cell -----------------------------------------------------------------
    def _run_cell(self, cell, index, remaining):
        """Execute one cell; return False when the kernel must be replaced."""
        self._cell_timeout = min(self.timeout, remaining)
        self._cell_bytes, self._flooded, self._timed_out = 0, False, False
        try:
            self.execute_cell(cell, index, store_history=True)
        except DeadKernelError:
            self._fail(cell, index, "crash", "DeadKernelError",
                       "the kernel died (os._exit, a crash, or the memory cap)")
            return False
        if self._flooded:
            self._fail(cell, index, "output", "OutputLimitError",
                       f"the cell printed more than {self.output_limit} bytes; the rest was dropped")
        if self._timed_out:
            by_deadline = self._cell_timeout < self.timeout
            self._event(cell, index, "notebook_timeout" if by_deadline else "timeout",
                        f"no reply within {self._cell_timeout:.0f} s")
            if not self._responsive():
                self._event(cell, index, "hang", "the kernel ignored the interrupt; restarted")
                return False
        return True

    def _get_timeout(self, cell):
        return self._cell_timeout if cell is not None else self.timeout

    async def _async_handle_timeout(self, timeout, cell=None):
        self._timed_out = True
        return await super()._async_handle_timeout(timeout, cell)

    def output(self, outs, msg, display_id, cell_index):
        if msg["msg_type"] != "error":
            self._cell_bytes += output_size(msg["content"])
            if self._cell_bytes > self.output_limit:
                if not self._flooded:
                    self._flooded = True
                    asyncio.ensure_future(ensure_async(self.km.interrupt_kernel()))
                return None
        return super().output(outs, msg, display_id, cell_index)

    def _fail(self, cell, index, kind, ename, evalue):
        cell.outputs.append(error_output(ename, evalue))
        self._event(cell, index, kind, evalue)

    def _event(self, cell, index, kind, detail):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        EVENTS.append(dict(notebook=self._notebook, cell=index, grade_id=grade_id,
                           kind=kind, detail=detail))

    # -- kernel life cycle ----------------------------------------------------------
    def _start(self):
        """Start a kernel and its client; return False if it does not come up."""
        try:
            self.km = self.create_kernel_manager()
            self.start_new_kernel()
            self._kernel_pid = getattr(self.km.provisioner, "pid", None)
            self.start_new_kernel_client()
            info = self._reply(self.kc.kernel_info(), self.startup_timeout)
            if info is None:
                raise RuntimeError("no kernel_info reply")
            self.nb.metadata["language_info"] = info["content"]["language_info"]
            return True
        except Exception as error:  # a kernel that cannot start must not stop the class
            self.log.error("grading kernel failed to start: %s", error)
            self._stop()
            return False

    def _stop(self):
        """Kill the kernel and everything it forked; forget the client."""
        if self.km is not None:
            try:
                self._cleanup_kernel()
            except Exception as error:
                self.log.warning("kernel cleanup: %s", error)
        if self._kernel_pid:
            try:
                os.killpg(self._kernel_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            kill_process_cgroup(self._kernel_pid)
            piddir = os.environ.get("AUTOGRADER_PIDDIR")
            if piddir:
                try:
                    os.remove(os.path.join(piddir, str(self._kernel_pid)))
                except FileNotFoundError:
                    pass
        self.km, self.kc, self._kernel_pid = None, None, None

    def _restart(self, done):
        """Replace the kernel and silently re-run the cells in ``done``."""
        self._stop()
        if not self._start():
            return False
        for index in done:
            remaining = self._deadline - monotonic()
            msg_id = self.kc.execute(self.nb.cells[index].source, silent=True,
                                     store_history=False, stop_on_error=False)
            if remaining < 1 or self._reply(msg_id, min(self.timeout, remaining)) is None:
                self._event(self.nb.cells[index], index, "replay",
                            "replaying earlier cells into a fresh kernel failed")
                self._stop()
                return self._start()
        return True

    def _responsive(self):
        """True if the kernel answers a no-op soon after an interrupt."""
        try:
            msg_id = self.kc.execute("", silent=True, store_history=False)
            return self._reply(msg_id, PROBE_SECONDS) is not None
        except Exception:
            return False

    async def _async_reply(self, msg_id, timeout):
        """The shell reply to ``msg_id``, or None after ``timeout`` seconds."""
        deadline = monotonic() + timeout
        while (remaining := deadline - monotonic()) > 0:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=remaining))
            except Empty:
                return None
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg
        return None

    _reply = run_sync(_async_reply)
