"""The judge's line to one sandboxed kernel: a probe request out, its decoded reply back.

:class:`KernelTransport` owns everything between the judge (:mod:`autograder.judge.verdict`,
which decides) and the student's kernel (where :mod:`autograder.kernel.probe` answers): it
installs the probe's source (in the first request after :attr:`KernelTransport.installed`
was reset, the same round trip), sends each request as an IPython ``user_expressions``
entry, waits for the reply within the time it is given, reads the expression's value with
``ast.literal_eval`` (never ``eval``, at most :data:`~autograder.kernel.probe.MAX_TEXT`) and
decodes it with the probe's codec (no pickle). It counts round trips and bytes, and
remembers what the kernel did when a request failed (:class:`Lost`), which tells the
executor whether the kernel must be replaced. The judge holds a transport and never sees
the executor; the executor makes one per kernel it starts.
"""

import ast
from enum import StrEnum
from queue import Empty
from time import monotonic

from nbclient.util import ensure_async, run_sync

from ..kernel import probe
from .verdict import JudgeError

PROBE_SOURCE = open(probe.__file__, encoding="utf-8").read()
INSTALL_PROBE = (
    "import types as __grader_types\n"
    "__grader__ = __grader_types.ModuleType('__grader__')\n"
    "__grader__.get_ipython = get_ipython\n"
    f"exec(compile({PROBE_SOURCE!r}, '<grader probe>', 'exec'), __grader__.__dict__)\n"
    "del __grader_types\n"
)
POLL_SECONDS = 0.5  # how often a wait for a reply checks that the kernel is still alive


class Lost(StrEnum):
    """What the kernel did to a request that got no reply."""

    DIED = "died"        # its process is gone (a crash, ``os._exit``, the memory cap)
    TIMEOUT = "timeout"  # it did not answer in time (a hang, or a slow function)


def import_torch():
    """torch, imported when a reply holds a tensor: a tensor always arrives as a tensor,
    whatever this worker graded before (None where torch is not installed)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


class KernelTransport:
    """Requests to the probe in one kernel (``kc``, its client; ``km``, its manager).

    ``cell_timeout`` is only named in the message of a request that ran out of time.
    """

    def __init__(self, kc, km, cell_timeout):
        self.kc, self.km, self.cell_timeout = kc, km, cell_timeout
        self.installed = False  # reset for each judged cell: the probe is installed afresh
        self.lost = None        # a Lost, once a request got no reply
        self.round_trips = 0
        self.bytes = 0          # sent and received, code and replies

    def request(self, payload, timeout):
        """The probe's decoded reply to ``payload`` (a dict with ``op``, a
        :class:`~autograder.kernel.probe.Op`); JudgeError when the kernel does not answer in
        ``timeout`` seconds, :class:`~autograder.kernel.probe.ProbeError` when its answer is
        not an encoded value."""
        expression = f"__grader__.handle({probe.encode(payload)!r})"
        install = "" if self.installed else INSTALL_PROBE
        text = self.evaluate(expression, timeout, code=install)
        self.installed = True
        return probe.decode(text, import_torch)

    def run_silently(self, code, timeout, check=True):
        """Run ``code`` in the kernel without output or history; JudgeError if it does not
        finish (or, with ``check``, if it raises)."""
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        reply = self._wait_reply(msg_id, timeout)
        self._count(code, "")
        if check and reply["content"].get("status") != "ok":
            raise JudgeError("your notebook's kernel refused the grader's code")
        return reply

    def evaluate(self, expression, timeout, code=""):
        """The string that ``expression`` evaluates to in the kernel, after ``code`` has run
        there (one round trip; JudgeError as :meth:`run_silently` if ``code`` raises)."""
        msg_id = self.kc.execute(code, silent=True, store_history=False,
                                 user_expressions={"r": expression})
        reply = self._wait_reply(msg_id, timeout)
        if code and reply["content"].get("status") != "ok":
            raise JudgeError("your notebook's kernel refused the grader's code")
        result = reply["content"].get("user_expressions", {}).get("r", {})
        if result.get("status") != "ok":
            raise JudgeError("the grader could not call your code "
                             f"({result.get('ename', 'no answer')})")
        text = result.get("data", {}).get("text/plain", "")
        self._count(code + expression, text)
        try:
            value = ast.literal_eval(text) if len(text) < probe.MAX_TEXT else None
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            value = None
        if not isinstance(value, str):
            raise JudgeError("your notebook's kernel answered the grader with nonsense")
        return value

    def _count(self, sent, received):
        self.round_trips += 1
        self.bytes += len(sent) + len(received)

    async def _async_wait_reply(self, msg_id, timeout):
        """The shell reply to ``msg_id``; JudgeError when the kernel dies or time runs out."""
        deadline = monotonic() + timeout
        while (remaining := deadline - monotonic()) > 0:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(
                    timeout=min(remaining, POLL_SECONDS)))
            except Empty:
                if not await ensure_async(self.km.is_alive()):
                    self.lost = Lost.DIED
                    raise JudgeError("your notebook's kernel died (a crash or the memory cap)") from None
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg
        self.lost = Lost.TIMEOUT
        raise JudgeError(f"your code did not finish in the {timeout:.0f} s this test had "
                         f"left of its cell's time limit ({self.cell_timeout:g} s per cell)")

    _wait_reply = run_sync(_async_wait_reply)
