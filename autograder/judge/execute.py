"""Notebook execution that survives hostile submissions, and judges them from outside.

:class:`LimitedExecute` replaces nbgrader's ``Execute`` preprocessor during
autograding (in the driver's workers and, through the course's
``nbgrader_config.py``, in stock ``nbgrader autograde`` and the formgrader).
Every kernel it starts runs in the OS sandbox
(:class:`~autograder.judge.kernel_manager.SandboxedKernelManager`), and every graded
test cell is scored by the outside judge (:mod:`autograder.judge.verdict`): the kernel
runs only the cell's visible lines, the worker runs the whole test with trusted
libraries and asks the kernel only for the outputs of the student's functions.
Compared with stock nbgrader it also adds

* a time budget for the whole notebook: each cell may use at most what is
  left of it, cells after it ran out are not run and get a ``NotebookTimeoutError``
  (so their tests score 0). Every limit is charged time
  (:class:`~autograder.judge.clock.ChargedClock`): the seconds a kernel waited for a CPU
  that the host gave to other work are not counted;
* an output cap per cell: past ``output_limit`` bytes the outputs are dropped, the
  kernel is interrupted and the cell gets an ``OutputLimitError`` (a flooding test
  cell scores 0; the grader's memory stays bounded);
* recovery instead of nbgrader's "Removing failed assignment": when a cell times
  out and the kernel does not answer an interrupt (it ignores SIGINT), or when the
  kernel dies (``os._exit``, segfault, memory cap), the kernel is killed with its
  whole process group, a fresh one is started, the cells that had already run are
  replayed silently, and grading goes on with the next cell. The failed cell
  scores 0 (a ``CellTimeoutError`` or ``DeadKernelError`` output);
* a kernel killed from outside (:func:`killed_from_outside`: the host, not the student)
  costs nothing: the notebook is executed again from the start, once.

Every such event is recorded in the executed notebook's metadata
(``metadata.autograder.events``, see :func:`events`), for the grading summary.
"""

import ast
import asyncio
import copy
from queue import Empty
from time import sleep

from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
from nbclient.util import ensure_async, run_sync
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Bool, Float, Integer

from ..core.cells import grade_id, is_setup_cell, is_test_cell, visible_source
from ..core.limits import Limits, Retries
from ..core.results import LimitKind
from ..kernel.probe import Op
from ..sandbox.cgroups import MemoryMeter, MeterUnavailable, memory_events
from . import verdict as judge
from .clock import ChargedClock
from .kernel_manager import SandboxedKernelManager
from .transport import KernelTransport, Lost

EVENTS_KEY = "autograder"  # notebook metadata key of the executor's records


def events(nb):
    """The limit events recorded in an executed notebook: dicts with keys
    notebook, cell, grade_id, kind, detail."""
    return list(nb.metadata.get(EVENTS_KEY, {}).get("events", []))

NO_OP_REPLY_SECONDS = 2.0  # how long a kernel (just interrupted) may take to answer a no-op
REPLY_SLICE = 0.5    # a wait for a reply looks at the charged clock (and the kernel) this often


class GradingHostFault(BaseException):
    """The grading host cannot grade this notebook (no kernel starts, memory cannot be
    measured): never the student's grade. The worker records the student as ``error``,
    keeping the earlier grade (:func:`autograder.worker.pipeline.grade_student`); a
    ``BaseException``, for the reason :class:`KernelStartError` gives."""


class KilledFromOutside(GradingHostFault):
    """A grading kernel was SIGKILLed below its memory cap: not by its own doing (a host's
    OOM killer, another process that killed kernel cgroups). :meth:`LimitedExecute.preprocess`
    executes the notebook once more from the start; a ``GradingHostFault`` in any other
    caller (the student is recorded ``error``, the earlier grade stays)."""


class KernelStartError(GradingHostFault):
    """No grading kernel could start: a fault of the grading host, never of the student.

    Raised after ``LimitedExecute.kernel_start_tries`` tries (the run's
    :class:`~autograder.core.limits.Retries`: the sandbox cannot run, a broken
    virtualenv, socket paths, the host's memory): a fresh kernel holds nothing of the
    student, so the student cannot be the cause. A ``BaseException``, as ``KeyboardInterrupt``
    is: nbgrader's converters turn every ``Exception`` of a notebook into a generic failure
    ("Removing failed assignment"), and this one must reach the worker as itself, which
    records the student as ``error``, keeping the earlier grade
    (:func:`autograder.worker.pipeline.grade_student`).
    """


# Run in a measuring kernel before its window opens, on the names imported_modules found:
# each is imported only if it and every package above it resolve to the interpreter's own
# (read-only) standard library or site-packages, so only trusted code runs there; a name
# that resolves elsewhere (a file the student wrote) is left to the window.
WARM_IMPORTS = """
def _warm(names):
    import importlib, importlib.util, os, sysconfig
    roots = tuple(os.path.join(os.path.realpath(p), "") for p in {{sysconfig.get_path(k) for k in
                  ("stdlib", "platstdlib", "purelib", "platlib")}} if p)
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            try:
                spec = importlib.util.find_spec(".".join(parts[:i]))
                origin = spec and spec.origin
                if origin not in ("built-in", "frozen") and not (
                        origin and os.path.realpath(origin).startswith(roots)):
                    break
                importlib.import_module(".".join(parts[:i]))
            except Exception:
                break
_warm({names!r})
del _warm
"""


def imported_modules(sources):
    """The absolute module names that ``import`` statements anywhere in ``sources`` name,
    sorted (a cell that does not parse as Python, even without its magics, names none)."""
    names = set()
    for source in sources:
        code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                         for line in source.splitlines())
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
    return sorted(names)


def flags(nb):
    """The flags the judge raised while calling the student's code (``calls-sdpa``,
    ``probe-tampered``), sorted; the cells of each are in the notebook's metadata."""
    return sorted(nb.metadata.get(EVENTS_KEY, {}).get("flags", {}))


def error_output(ename, evalue):
    """An nbformat error output, as a failing cell would have produced."""
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


def output_size(content):
    """Approximate size in bytes of one iopub output message's payload."""
    if "text" in content:
        return len(content["text"])
    return sum(len(str(value)) for value in content.get("data", {}).values())


class SpareKernel:
    """One started, never-used kernel per process, ready for the next notebook.

    A grading worker runs notebook after notebook: while one is graded, the next
    kernel starts (it is a separate process, so its start-up overlaps the grading),
    and nothing of any student has entered it when it is taken. Only the driver's
    workers keep a spare (``LimitedExecute.spare_kernel``): :meth:`take` hands it out (or
    None), :meth:`hold` makes a kernel the spare (discarding one held before), :meth:`discard`
    kills it.

    No kernel is started for nothing: the worker's preflight kernel is the first spare
    (:func:`autograder.worker.pipeline.preflight`), and a kernel taken launches the next
    spare only while :attr:`wanted`, which the worker sets for each student from what the
    driver said: whether more students wait in the run's queue. So a worker that grades N
    notebooks starts N kernels, N + 1 if the queue's last student went to another worker
    (and one more for each memory check and each kernel replaced, which all grade).
    """

    km = None
    wanted = True  # another notebook follows the one being graded (the worker's last: False)

    @classmethod
    def take(cls):
        km, cls.km = cls.km, None
        return km

    @classmethod
    def hold(cls, km):
        cls.discard()
        cls.km = km

    @classmethod
    def discard(cls):
        km, cls.km = cls.km, None
        if km is not None:
            _shut(km)


def killed_from_outside(km):
    """Why the dead kernel of ``km`` was killed by the host, or None when its death is the
    student's doing.

    The host's: the sandbox's own monitor (bubblewrap, outside the kernel's PID namespace and
    user, which no student code can signal) was SIGKILLed, or an OOM killer killed a process of
    the kernel's cgroup while the cgroup had never reached its memory cap (the host's memory
    ran out) — both with the cgroup below its cap. The student's: an exit of its own
    (``os._exit``, a segfault, a signal it sent itself), or any death once its cgroup has
    been at its memory cap.
    """
    process = getattr(getattr(km, "provisioner", None), "process", None)
    status = process.poll() if process is not None else None
    events = memory_events(getattr(km, "cgroup", None))
    if status is None or (events is not None and events[0]):
        return None
    if status == -9:
        return "the kernel's sandbox was killed (SIGKILL) from outside"
    if status == 128 + 9 and events is not None and events[1] > 0:
        return "the host's OOM killer killed the kernel below its memory cap"
    return None


def _shut(km):
    """Shut a kernel manager's kernel down now, whatever state it is in."""
    try:
        run_sync(km.shutdown_kernel)(now=True)
    except Exception:  # noqa: BLE001 - a kernel that is already gone
        if hasattr(km, "kill_everything"):
            km.kill_everything()


def said_by(verdict, output):
    """Whether the kernel's error ``output`` says nothing the ``verdict`` (an error output) does
    not: the visible lines failed in the kernel as the whole cell failed in the judge (the same
    error, its message within the verdict's), so the student reads the message once."""
    if output.get("output_type") != "error":
        return False
    ename, evalue = output.get("ename", ""), output.get("evalue", "")
    if not evalue:
        return ename == verdict.ename
    return f"{ename}: {evalue}" in f"{verdict.ename}: {verdict.evalue}"


class LimitedExecute(Execute):
    """nbgrader's ``Execute`` in the sandbox, with the outside judge, deadlines, caps and recovery."""

    notebook_timeout = Float(Limits.notebook_timeout,
                             help="Wall-clock seconds for the whole notebook.").tag(config=True)
    output_limit = Integer(Limits.output_limit, help="Bytes of output kept per cell.").tag(config=True)
    spare_kernel = Bool(False, help="Start the next notebook's kernel while this one is graded "
                                    "(for processes that grade one notebook after another).").tag(config=True)
    kernel_start_tries = Integer(Retries.kernel_start_tries, min=1,
                                 help="Tries to start a kernel before it is the host's fault "
                                      "(autograder.core.limits.Retries).").tag(config=True)
    kernel_start_pause = Float(Retries.kernel_start_pause, min=0.0,
                               help="Seconds between two tries to start a kernel.").tag(config=True)

    def __init__(self, **kw):
        super().__init__(**kw)
        if self.kernel_manager_class is None or self.kernel_manager_class.__name__ == "AsyncKernelManager":
            self.kernel_manager_class = SandboxedKernelManager
        self._clock, self._retry = ChargedClock(), False  # preprocess makes its own

    def preprocess(self, nb, resources=None, km=None):
        """Execute and judge ``nb``; a notebook whose kernel was killed from outside
        (:class:`KilledFromOutside`) is executed once more from the start, and a second such
        death is the host's fault (:class:`GradingHostFault`): never the student's grade."""
        pristine = copy.deepcopy(nb)
        try:
            return self._execute(nb, resources, km, retry=True)
        except KilledFromOutside as first:
            self.log.warning("a grading kernel was killed from outside (%s): the notebook is "
                             "executed again", first)
            nb, resources = self._execute(pristine, resources, km, retry=False)
            nb.metadata.setdefault(EVENTS_KEY, {})["executed_again"] = str(first)
            return nb, resources

    def _execute(self, nb, resources, km, retry):
        NotebookClient.__init__(self, nb, km)  # reset the client state, as nbconvert does
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        self.shutdown_kernel = "immediate"
        self._retry = retry
        self._notebook = (resources or {}).get("nbgrader", {}).get("notebook", "")
        self._clock = ChargedClock()  # every limit of this notebook is measured on it
        self._deadline = self._clock() + self.notebook_timeout
        self._cell_timeout = self.timeout
        self._cell_start, self._cell_msg_id = 0.0, None
        self._channel = judge.Channel(None, self._deadline, self.measure_call,
                                      clock=self._clock)  # see _judge
        self._namespace = judge.RemoteNamespace(self._channel)
        done = self._done = []  # indices of code cells that ran; replayed into a fresh kernel
        self._start()  # or KernelStartError, the host's fault: no cell of the student is scored
        try:
            for index, cell in enumerate(self.nb.cells):
                if cell.cell_type != "code" or not cell.source.strip():
                    continue
                remaining = self._deadline - self._clock()
                if is_setup_cell(cell):  # trusted code: the judge runs it too
                    self._judge(cell)
                if remaining < 1:
                    self._fail(cell, index, LimitKind.NOTEBOOK_TIMEOUT, "NotebookTimeoutError",
                               f"not run: the notebook used up its {self.notebook_timeout:g} s")
                    continue
                if is_test_cell(cell):
                    self._run_test_cell(cell, index, remaining, done)
                elif self._run_cell(cell, index, remaining):
                    done.append(index)
                else:
                    self._restart(done)
        finally:
            self._stop()
        self.set_widgets_metadata()
        return self.nb, self.resources

    # -- one cell -----------------------------------------------------------------
    def _run_cell(self, cell, index, remaining):
        """Execute one cell; return False when the kernel must be replaced."""
        self._cell_timeout = min(self.timeout, remaining)
        self._cell_bytes, self._flooded, self._timed_out = 0, False, False
        self._cell_start = self._clock()
        try:
            self.execute_cell(cell, index, store_history=True)
        except DeadKernelError:
            self._check_killed_from_outside(self.km)
            self._fail(cell, index, LimitKind.CRASH, "DeadKernelError",
                       "the kernel died (os._exit, a crash, or the memory cap)")
            return False
        if self._flooded:
            self._fail(cell, index, LimitKind.OUTPUT, "OutputLimitError",
                       f"the cell printed more than {self.output_limit} bytes; the rest was dropped")
        if self._timed_out:
            by_deadline = self._cell_timeout < self.timeout
            limit = (f"the notebook's time limit ({self.notebook_timeout:g} s in all) ran out"
                     if by_deadline else f"the cell ran past its time limit ({self.timeout:g} s per cell)")
            self._fail(cell, index, LimitKind.NOTEBOOK_TIMEOUT if by_deadline else LimitKind.TIMEOUT,
                       "CellTimeoutError", f"{limit} and was interrupted")
            if not self._responsive():
                self._event(cell, index, LimitKind.HANG, "the kernel ignored the interrupt; restarted")
                return False
        return True

    def _run_test_cell(self, cell, index, remaining, done):
        """Visible lines in the kernel, then the verdict from the judge; False if the kernel is lost."""
        start, source = self._clock(), cell.source
        alive = True
        visible = visible_source(source)
        if visible.strip():
            cell.source = visible  # hidden tests never enter the student's kernel
            try:
                ok = self._run_cell(cell, index, remaining)
            finally:
                cell.source = source
            if ok:
                done.append(index)
            else:
                alive = self._restart(done)
        kernel_outputs = [o for o in cell.outputs if o.get("ename") not in ("OutputLimitError",)]
        failure = None
        if not alive:
            failure = judge.JudgeError("your notebook's kernel could not be restarted")
        else:
            left = min(self.timeout - (self._clock() - start), self._deadline - self._clock())
            self._channel.deadline = self._clock() + max(left, 0.0)
            self._channel.flags.clear()
            transport = self._transport
            failure = self._judge(cell)
            if isinstance(failure, GradingHostFault):  # the judge hands every failure back
                raise failure
            if isinstance(failure, judge.HostError):  # e.g. memory cannot be measured here
                raise GradingHostFault(str(failure))
            self._flag(cell, self._channel.flags)
            # a check may turn the judge's error into its own verdict: what happened to the
            # kernel while it was judged (transport.lost) decides, so the next cells get a live one
            if transport.lost == Lost.DIED:
                self._check_killed_from_outside(self.km)
                self._event(cell, index, LimitKind.CRASH,
                            "the kernel died while the grader called your code; restarted")
                alive = self._restart(done)
            elif (transport.lost or isinstance(failure, judge.JudgeError)) \
                    and not self._responsive(interrupt=True):
                self._event(cell, index, LimitKind.HANG, f"while judged: {failure}; restarted")
                alive = self._restart(done)
        verdict = [judge.verdict_output(failure)] if failure else []
        cell.outputs = [judge.plain_output(o) for o in kernel_outputs
                        if not (verdict and said_by(verdict[0], o))] + verdict
        flooded = [o for o in cell.outputs if o.get("output_type") == "error"]
        if self._flooded and not flooded:
            cell.outputs.append(error_output("OutputLimitError",
                                             f"the cell printed more than {self.output_limit} bytes"))
        return alive

    def _judge(self, cell):
        """The judge's verdict on ``cell`` (None: passed), asking the kernel that runs now
        (:meth:`_start` makes a transport for each kernel): a new cell for the transport,
        and the kernel is idle again after it."""
        self._channel.transport = self._transport
        self._transport.new_cell()
        try:
            return judge.judge_cell(cell, self._namespace)
        finally:
            self._transport.end_session()

    def measure_call(self, name, args, kwargs, timeout):
        """``(output, peak bytes)`` of ``name(*args, **kwargs)`` in a fresh sandboxed kernel.

        Before the window, only trusted code runs in the fresh kernel: the set-up cells
        that ran, the installed modules that the student's code imports
        (:func:`imported_modules`, imported by :data:`WARM_IMPORTS` only where they resolve
        to the read-only standard library or site-packages), and the decoding of the
        inputs (kept by the probe). Then the window opens
        (:class:`autograder.sandbox.cgroups.MemoryMeter`, read from outside the sandbox)
        before any of the student's code has run in this kernel. Inside it: the student's
        code cells that ran in their kernel (solution cells and cells they inserted, in
        notebook order, each within the per-cell and the notebook's time limits, not the test's), the call (with
        the test's ``timeout``), and the encoding of its output to the bytes of the reply.
        The figure is the peak of everything the kernel was charged for inside the window:
        a workspace allocated in advance, memory freed inside the call to make room,
        threads, child processes, files in ``/tmp`` and memory-mapped files, work deferred
        until the output is encoded. A host whose cgroups cannot measure that fails the
        check with a :class:`judge.HostError`.
        """
        km, kc = self._fresh_kernel()
        transport = KernelTransport(kc, km, self.timeout, clock=self._clock)
        meter = MemoryMeter(km.cgroup)
        channel = judge.Channel(transport, self._clock() + timeout, clock=self._clock)
        self._clock.watch(km.cgroup)
        try:
            # the cells that ran in the student's kernel (a cell that crashed it is not replayed)
            ran = [self.nb.cells[i] for i in self._done]
            student = [c for c in ran if not is_setup_cell(c) and not is_test_cell(c)]
            for cell in (c for c in ran if is_setup_cell(c)):
                transport.run_silently(cell.source, self._replay_time(), check=False)
            modules = imported_modules(c.source for c in student)
            if modules:
                transport.run_silently(WARM_IMPORTS.format(names=modules), self._replay_time(),
                                       check=False)
            channel.deadline = self._clock() + timeout
            channel.request(op=Op.STAGE, args=list(args), kwargs=kwargs)
            meter.start()
            for cell in student:  # their own time (the notebook's), not the test's
                transport.run_silently(cell.source, self._replay_time(), check=False)
            channel.deadline = self._clock() + timeout
            channel.request(op=Op.CALL_STAGED, name=name)
            out = channel.request(op=Op.FETCH)["value"]
            peak = meter.peak()
        except MeterUnavailable as error:
            raise judge.HostError(f"memory cannot be measured on this grading host: {error}") from None
        except judge.JudgeError:
            if transport.lost == Lost.DIED:
                self._check_killed_from_outside(km)
            raise
        finally:
            meter.close()
            self._channel.flags.update(channel.flags)
            self._clock.forget(km.cgroup)
            run_sync(km.shutdown_kernel)(now=True)
        return out, peak

    def _replay_time(self):
        """Seconds one replayed cell may take: the per-cell limit, within the notebook's."""
        return max(0.0, min(self.timeout, self._deadline - self._clock()))

    def _launch(self):
        """A kernel manager whose kernel process has been launched (not yet waited for).

        A launch that fails half-way (its process started, its sockets not connected) kills
        what it started before it raises.
        """
        if not self.kernel_name:  # as nbclient's create_kernel_manager does
            self.kernel_name = self.nb.metadata.get("kernelspec", {}).get("name") or "python3"
        km = self.kernel_manager_class(kernel_name=self.kernel_name, config=self.config)
        try:
            run_sync(km.start_kernel)(extra_arguments=self.extra_arguments)
        except Exception:
            _shut(km)
            raise
        return km

    def _launched(self):
        """The spare kernel if there is a live one, else a new one; then launch the next spare
        if another notebook will want it (:attr:`SpareKernel.wanted`; a spare that cannot launch is
        left out: the next notebook launches its own)."""
        km = SpareKernel.take() if self.spare_kernel else None
        if km is None or not run_sync(km.is_alive)():
            if km is not None:
                _shut(km)  # a dead spare
            km = self._launch()
        if self.spare_kernel and SpareKernel.wanted:
            try:
                SpareKernel.hold(self._launch())
            except Exception as error:  # noqa: BLE001 - this notebook's kernel is up
                self.log.warning("spare kernel: %s", error)
        return km

    def _fresh_kernel(self):
        """A second kernel (spare or new) and its client, for a measurement; tried as
        :meth:`_start` tries (KernelStartError when none comes up)."""
        def start():
            km = self._launched()
            try:
                kc = km.client()
                kc.start_channels()
                run_sync(kc.wait_for_ready)(timeout=self.startup_timeout)
            except Exception:
                _shut(km)
                raise
            return km, kc

        return self._tried(start)

    def _tried(self, start):
        """``start()``, tried :attr:`kernel_start_tries` times, :attr:`kernel_start_pause`
        seconds apart; KernelStartError after that."""
        tries = self.kernel_start_tries
        for attempt in range(1, tries + 1):
            try:
                return start()
            except Exception as error:  # noqa: BLE001 - whatever stops a kernel: try again
                reason = f"{type(error).__name__}: {error}".splitlines()[0][:300]
                self.log.error("grading kernel failed to start (try %d of %d): %s",
                               attempt, tries, reason)
            if attempt < tries:
                sleep(self.kernel_start_pause)
        raise KernelStartError(f"no grading kernel could start ({tries} tries): {reason}")

    def _get_timeout(self, cell):
        return self._cell_timeout if cell is not None else self.timeout

    async def _async_poll_for_reply(self, msg_id, cell, timeout, *tasks):
        self._cell_msg_id = msg_id
        return await super()._async_poll_for_reply(msg_id, cell, timeout, *tasks)

    async def _async_handle_timeout(self, timeout, cell=None):
        """The cell's wall seconds are up: its reply if it comes before the cell has been
        charged its limit (:class:`~autograder.judge.clock.ChargedClock`: on a loaded host the
        wall clock runs ahead of it); else the cell timed out."""
        while (left := self._cell_start + self._cell_timeout - self._clock()) > 0:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=min(left, REPLY_SLICE)))
            except Empty:
                await self._async_check_alive()  # DeadKernelError: the caller's to judge
                continue
            if msg["parent_header"].get("msg_id") == self._cell_msg_id:
                return msg
        self._timed_out = True
        return await super()._async_handle_timeout(timeout, cell)

    def _check_killed_from_outside(self, km):
        """Raise :class:`KilledFromOutside` if the dead kernel of ``km`` was killed from
        outside (:func:`killed_from_outside`) and this notebook has not been executed again
        yet; on that second execution, such a death is :class:`GradingHostFault`."""
        reason = killed_from_outside(km)
        if reason is None:
            return
        if self._retry:
            raise KilledFromOutside(reason)
        raise GradingHostFault(f"{reason}, twice: this host kills grading kernels")

    def output(self, outs, msg, display_id, cell_index):
        """Keep a cell's outputs up to ``output_limit`` bytes, the same whatever the timing.

        A kernel sends its stdout and stderr in pieces whose sizes depend on how fast it ran
        (ipykernel batches writes by time), so the cap and the kept text are counted on the
        text, not on the messages: a stream message that crosses the cap keeps the text up to
        it, and consecutive pieces of one stream are one output. Past the cap the kernel is
        interrupted and the rest is dropped; other outputs (displays) are kept whole or not
        at all. An error is kept until the cap is crossed; after it, how the cell ends (the
        interrupt, or the memory the kernel's unsent output took) depends on the host's speed,
        so the cell's one error is the ``OutputLimitError`` :meth:`_run_cell` records (and
        :meth:`on_cell_executed` does not add the reply's back)."""
        if msg["msg_type"] == "error" and self._flooded:
            return None
        if msg["msg_type"] != "error":
            room = self.output_limit - self._cell_bytes
            self._cell_bytes += output_size(msg["content"])
            if self._cell_bytes > self.output_limit:
                if not self._flooded:
                    self._flooded = True
                    asyncio.ensure_future(ensure_async(self.km.interrupt_kernel()))
                if msg["msg_type"] != "stream" or room <= 0:
                    return None
                msg = {**msg, "content": {**msg["content"], "text": msg["content"]["text"][:room]}}
        out = super().output(outs, msg, display_id, cell_index)
        if out is not None and out.output_type == "stream" and len(outs) > 1 and outs[-1] is out:
            before = outs[-2]
            if before.get("output_type") == "stream" and before.get("name") == out.name:
                before.text += out.text
                outs.pop()
                return before
        return out

    def on_cell_executed(self, **kwargs):
        """nbgrader's hook adds the execute reply's error when no output of the cell names it;
        a flooded cell's errors were dropped on purpose (:meth:`output`), so it adds none."""
        if not self._flooded:
            super().on_cell_executed(**kwargs)

    def _fail(self, cell, index, kind, ename, evalue):
        cell.outputs.append(error_output(ename, evalue))
        self._event(cell, index, kind, evalue)

    def _flag(self, cell, names):
        """Record ``names`` (flags of the judged calls of ``cell``) in the notebook's metadata."""
        record = self.nb.metadata.setdefault(EVENTS_KEY, {}).setdefault("flags", {})
        for name in sorted(names):
            cells = record.setdefault(name, [])
            if grade_id(cell) not in cells:
                cells.append(grade_id(cell))

    def _event(self, cell, index, kind, detail):
        record = self.nb.metadata.setdefault(EVENTS_KEY, {}).setdefault("events", [])
        record.append(dict(notebook=self._notebook, cell=index, grade_id=grade_id(cell),
                           kind=kind, detail=detail))

    # -- kernel life cycle ----------------------------------------------------------
    def _start(self):
        """Start a kernel and its client; True once it answers.

        Every wait is bounded (``startup_timeout``; a kernel whose process dies is given up
        at once). A kernel that does not come up is tried again; after
        :attr:`kernel_start_tries` tries :class:`KernelStartError` ends the notebook: the
        host's fault, which must not become the student's scores.
        """
        def start():
            try:
                self.km = self._launched()
                self.start_new_kernel_client()
                info = self._reply(self.kc.kernel_info(), self.startup_timeout)
                if info is None:
                    raise RuntimeError(f"no kernel_info reply in {self.startup_timeout} s")
            except Exception:
                self._stop()
                raise
            self._transport = KernelTransport(self.kc, self.km, self.timeout, clock=self._clock)
            self._clock.watch(self.km.cgroup)
            self.nb.metadata["language_info"] = info["content"]["language_info"]
            return True

        return self._tried(start)

    def hand_over(self):
        """The kernel manager of the kernel :meth:`_start` started, this client's channels
        closed, for another executor to take (the preflight's kernel, which has run nothing
        but ``kernel_info``, becomes the first notebook's: :class:`SpareKernel`); this executor
        forgets it."""
        km, kc = self.km, self.kc
        self.km, self.kc = None, None
        if kc is not None:
            kc.stop_channels()
        return km

    def _stop(self):
        """Kill the kernel and everything it started; forget the client."""
        if self.km is not None:
            self._clock.forget(self.km.cgroup)
            try:
                self._cleanup_kernel()
            except Exception as error:
                self.log.warning("kernel cleanup: %s", error)
            if hasattr(self.km, "kill_everything"):
                self.km.kill_everything()
        self.km, self.kc = None, None

    def _restart(self, done):
        """Replace the kernel and silently re-run the cells in ``done``; True (a kernel that
        cannot start raises :class:`KernelStartError`)."""
        self._stop()
        self._start()
        for index in done:
            remaining = self._deadline - self._clock()
            source = self.nb.cells[index].source
            if is_test_cell(self.nb.cells[index]):
                source = visible_source(source)
            msg_id = self.kc.execute(source, silent=True, store_history=False, stop_on_error=False)
            if remaining < 1 or self._reply(msg_id, min(self.timeout, remaining)) is None:
                self._event(self.nb.cells[index], index, LimitKind.REPLAY,
                            "replaying earlier cells into a fresh kernel failed")
                self._stop()
                return self._start()
        return True

    def _responsive(self, interrupt=False):
        """True if the kernel answers a no-op soon (after an interrupt, if asked)."""
        try:
            if interrupt:
                run_sync(self.km.interrupt_kernel)()
        except Exception:
            pass
        try:
            msg_id = self.kc.execute("", silent=True, store_history=False)
            return self._reply(msg_id, NO_OP_REPLY_SECONDS) is not None
        except Exception:
            return False

    async def _async_reply(self, msg_id, timeout):
        """The shell reply to ``msg_id``, or None after ``timeout`` seconds (of the charged
        clock, looked at every :data:`REPLY_SLICE` s) or once the kernel has died."""
        deadline = self._clock() + timeout
        while (remaining := deadline - self._clock()) > 0:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(
                    timeout=min(remaining, REPLY_SLICE)))
            except Empty:
                if not await ensure_async(self.km.is_alive()):
                    return None
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg
        return None

    _reply = run_sync(_async_reply)
