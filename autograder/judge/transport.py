"""The judge's line to one sandboxed kernel: a probe request out, its decoded reply back.

:class:`KernelTransport` owns everything between the judge (:mod:`autograder.judge.verdict`,
which decides) and the student's kernel (where :mod:`autograder.kernel.probe` answers).

A judged cell is one *session*. The first request of a cell listens on a Unix socket in
the kernel's private folder (the folder of its connection file, which only this kernel's
sandbox mounts, read-only: the folder is the grader's, so the unlink, bind and chmod of the
socket by path act on what the worker made, never on a link the kernel put there) and sends one ``execute_request`` (:data:`SESSION`); the kernel connects,
takes the probe's source as the first frame, installs it afresh (once per judged cell: a
second session of the same cell, around a measured call's solution cells, keeps it) and
calls :func:`~autograder.kernel.probe.serve`. From then on each request is one
length-prefixed frame each way: no Jupyter message, no signature, no run of an IPython
cell. :meth:`KernelTransport.end_session` (after the cell's verdict, and before any other
code is sent to the kernel) sends the empty frame that ends ``serve`` and waits for that
``execute_request``'s reply, so the kernel is idle again. Once a request of a cell got no
reply, the line is out of step (a late reply would answer the next request): every further
request of that cell fails at once, without a word to the kernel.

Every wait is bounded by the time the request is given, and checks every
:data:`POLL_SECONDS` that the kernel is alive. A reply is at most
:data:`~autograder.kernel.probe.MAX_TEXT` bytes, decoded with the probe's codec (JSON, no
pickle), which bounds its values before it parses
(:func:`~autograder.kernel.probe.check_bounds`). The transport counts round trips and bytes, and remembers what the kernel did
when a request failed (:class:`Lost`), which tells the executor whether the kernel must
be interrupted or replaced. The judge holds a transport and never sees the executor; the
executor makes one per kernel it starts.
"""

import os
import socket
from enum import StrEnum
from queue import Empty
from time import monotonic, sleep

from nbclient.util import ensure_async, run_sync

from ..kernel import probe
from .verdict import JudgeError

PROBE_SOURCE = open(probe.__file__, encoding="utf-8").read()
# What each session's execute_request runs: connect to the judge, take the probe's source
# (the first frame; empty: keep the probe this cell installed), install it afresh as
# ``__grader__`` and serve. The source travels on the line, not in the request: IPython's
# input transformations over 17 kB of code cost the kernel 13 ms a cell.
SESSION = """\
def __grader_session(path):
    import socket, types
    line = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    line.connect(path)
    size = int.from_bytes(line.recv(8, socket.MSG_WAITALL), 'big')
    if size:
        probe = types.ModuleType('__grader__')
        probe.get_ipython = get_ipython
        source = line.recv(size, socket.MSG_WAITALL).decode('utf-8')
        exec(compile(source, '<grader probe>', 'exec'), probe.__dict__)
        get_ipython().user_ns['__grader__'] = probe
    get_ipython().user_ns['__grader__'].serve(line)
try:
    __grader_session({path!r})
finally:
    del __grader_session
"""
SOCKET_NAME = "judge"  # the judge's socket, in the kernel's private folder (short: sun_path)
POLL_SECONDS = 0.5     # how often a wait checks that the kernel is still alive
ACCEPT_SLICE = 0.05    # how often a wait for the kernel to connect checks the kernel's reply
END_SECONDS = 2.0      # how long the kernel may take to leave ``serve`` after the last frame
DEATH_SECONDS = 1.0    # how long a kernel that hung up may take to be seen gone (it died)


class Lost(StrEnum):
    """What the kernel did to a request that got no reply."""

    DIED = "died"        # its process is gone (a crash, ``os._exit``, the memory cap)
    TIMEOUT = "timeout"  # it did not answer in time (a hang, or a slow function)
    BROKEN = "broken"    # it broke the line (hung up, or sent what no probe sends)


def import_torch():
    """torch, imported when a reply holds a tensor: a tensor always arrives as a tensor,
    whatever this worker graded before (None where torch is not installed)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


class KernelTransport:
    """Requests to the probe in one kernel (``kc``, its client; ``km``, its manager, whose
    ``connection_file`` lies in the kernel's private folder).

    ``cell_timeout`` is only named in the message of a request that ran out of time. Timeouts
    are seconds of ``clock`` (:class:`autograder.judge.clock.ChargedClock`: a kernel that waits
    for a CPU the host gave to other work is not charged the wait); waits on sockets and
    channels are sliced, so each slice looks at the clock again.
    """

    def __init__(self, kc, km, cell_timeout, clock=monotonic):
        self.kc, self.km, self.cell_timeout = kc, km, cell_timeout
        self.clock = clock      # every timeout is measured on it (a ChargedClock when grading)
        self.path = os.path.join(os.path.dirname(km.connection_file), SOCKET_NAME)
        self.installed = False  # reset for each judged cell: the probe is installed afresh
        self.lost = None        # a Lost, once a request got no reply
        self.round_trips = 0
        self.bytes = 0          # sent and received, code and replies
        self._line = None       # the session's connected socket
        self._serving = None    # msg_id of the execute_request that runs ``serve``
        self._given = 0.0       # seconds the request being answered was given

    def new_cell(self):
        """Forget the last cell: the next session installs the probe afresh."""
        self.end_session()
        self.installed, self.lost = False, None

    def request(self, payload, timeout):
        """The probe's decoded reply to ``payload`` (a dict with ``op``, a
        :class:`~autograder.kernel.probe.Op`); JudgeError when the kernel does not answer in
        ``timeout`` seconds, :class:`~autograder.kernel.probe.ProbeError` when its answer is
        not an encoded value."""
        if self.lost is not None:
            raise JudgeError(f"your notebook's kernel was lost earlier in this test ({self.lost})")
        deadline, self._given = self.clock() + timeout, timeout
        if self._line is None:
            self._open(deadline)
        sent = probe.encode(payload).encode("ascii")
        try:
            self._line.sendall(probe.FRAME.pack(len(sent)) + sent)
        except OSError:
            self._broken()
        header = self._receive(probe.FRAME.size, deadline)
        (size,) = probe.FRAME.unpack(header)
        if size > probe.MAX_TEXT:
            self._broken()
        received = self._receive(size, deadline)
        self._count(sent, received)
        try:
            text = received.decode("ascii")
        except UnicodeDecodeError:
            text = None
        del received  # one copy of a large reply at a time
        return probe.decode(text, import_torch)

    def end_session(self):
        """End the cell's session: the empty frame that ends ``serve``, then its reply (a
        kernel that does not leave ``serve`` in :data:`END_SECONDS` is :attr:`Lost.TIMEOUT`:
        the executor interrupts it). Never raises: the cell's verdict is already decided."""
        line, self._line = self._line, None
        serving, self._serving = self._serving, None
        if line is None:
            return
        try:
            if self.lost is None:
                line.sendall(probe.FRAME.pack(0))
        except OSError:
            pass
        finally:
            line.close()
        if self.lost is None and serving is not None:
            try:
                self._wait_reply(serving, END_SECONDS)
            except JudgeError:
                pass  # self.lost says what happened

    def run_silently(self, code, timeout, check=True):
        """Run ``code`` in the kernel without output or history; JudgeError if it does not
        finish (or, with ``check``, if it raises)."""
        self.end_session()
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        reply = self._wait_reply(msg_id, timeout)
        self._count(code, "")
        if check and reply["content"].get("status") != "ok":
            raise JudgeError("your notebook's kernel refused the grader's code")
        return reply

    # -- a session ---------------------------------------------------------------------
    def _open(self, deadline):
        """Listen, send :data:`SESSION`, take the kernel's call, send the probe's source."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(self.path)
            os.chmod(self.path, 0o666)  # the kernel's user (nobody) connects; only its sandbox sees the folder
            listener.listen(1)
            code = SESSION.format(path=self.path)
            self._serving = self.kc.execute(code, silent=True, store_history=False)
            self._line = self._accept(listener, deadline)
        source = b"" if self.installed else PROBE_SOURCE.encode("utf-8")
        try:
            self._line.sendall(probe.FRAME.pack(len(source)) + source)
        except OSError:
            self._broken()
        self.installed = True
        self._count(code + source.decode("utf-8"), "")

    def _accept(self, listener, deadline):
        """The kernel's connection; JudgeError if it answers the code without connecting
        (it refused it), dies or runs out of time."""
        checked = monotonic()
        while (remaining := deadline - self.clock()) > 0:
            listener.settimeout(min(remaining, ACCEPT_SLICE))
            try:
                line, _ = listener.accept()
                line.settimeout(None)
                return line
            except TimeoutError:
                pass
            if self._reply_now(self._serving):
                self._serving = None
                raise JudgeError("your notebook's kernel refused the grader's code")
            if monotonic() - checked > POLL_SECONDS:
                checked = monotonic()
                self._check_alive()
        self._timed_out()

    def _receive(self, size, deadline):
        """``size`` bytes of the kernel's frame (a bytearray), within ``deadline``."""
        buf, got = bytearray(size), 0
        view = memoryview(buf)
        while got < size:
            remaining = deadline - self.clock()
            if remaining <= 0:
                self._timed_out()
            self._line.settimeout(min(remaining, POLL_SECONDS))
            try:
                n = self._line.recv_into(view[got:])
            except TimeoutError:
                self._check_alive()
                continue
            except OSError:
                n = 0
            if not n:  # hung up: a kernel that exits closes its end before it is gone
                self._check_alive(grace=DEATH_SECONDS)
                self._broken()
            got += n
        return buf

    def _check_alive(self, grace=0.0):
        """JudgeError (:attr:`Lost.DIED`) if the kernel is gone, or goes within ``grace`` s."""
        end = monotonic() + grace
        while self._alive():
            if monotonic() >= end:
                return
            sleep(0.02)
        self.lost = Lost.DIED
        raise JudgeError("your notebook's kernel died (a crash or the memory cap)")

    def _broken(self):
        self.lost = Lost.BROKEN
        raise JudgeError("your notebook's kernel broke off the grader's line")

    def _timed_out(self, seconds=None):
        self.lost = Lost.TIMEOUT
        raise JudgeError(f"your code did not finish in the {self._given if seconds is None else seconds:.0f} s "
                         f"this test had left of its cell's time limit ({self.cell_timeout:g} s per cell)")

    def _count(self, sent, received):
        self.round_trips += 1
        self.bytes += len(sent) + len(received)

    # -- Jupyter messages ------------------------------------------------------------------
    async def _async_alive(self):
        return await ensure_async(self.km.is_alive())

    async def _async_reply_now(self, msg_id):
        """True if the shell reply to ``msg_id`` has arrived (other replies are dropped)."""
        while True:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=0))
            except Empty:
                return False
            if msg["parent_header"].get("msg_id") == msg_id:
                return True

    async def _async_wait_reply(self, msg_id, timeout):
        """The shell reply to ``msg_id``; JudgeError when the kernel dies or time runs out."""
        deadline = self.clock() + timeout
        while (remaining := deadline - self.clock()) > 0:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(
                    timeout=min(remaining, POLL_SECONDS)))
            except Empty:
                if not await self._async_alive():
                    self.lost = Lost.DIED
                    raise JudgeError("your notebook's kernel died (a crash or the memory cap)") from None
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg
        self._timed_out(timeout)

    _alive = run_sync(_async_alive)
    _reply_now = run_sync(_async_reply_now)
    _wait_reply = run_sync(_async_wait_reply)
