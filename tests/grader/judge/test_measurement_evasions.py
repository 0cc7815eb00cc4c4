"""Measurements the student cannot move: memory and SDPA, against families of evasions.

One class of 06-flash-attention is graded for real (sandboxed kernels, their cgroups read
from outside, as root). Every cheat is a ``flash_attention`` that computes the right values
with O(T * S) memory (so it keeps the value tests' points) while trying to hide that
memory from the check, which measures from a baseline taken before any of the student's
code ran in the measuring kernel, up to the reply's bytes:

* ballast freed inside the call: made by the solution cell, by a thread the cell
  started, on an attribute's first access, by importing a module the cell wrote (the
  measuring kernel imports only installed modules before the window);
* work deferred until the reply is encoded: a probe that the solution cell patches to
  compute only when the output is fetched; an object that looks like a torch tensor to
  the probe and computes in ``numpy()`` or in a ``dtype`` property (encoded inside the
  window, and decoded by the judge as the tensor it claims to be, which a NumPy task
  refuses, whatever the worker graded before);
* the T x S memory elsewhere: a thread, a forked child, ``multiprocessing``, a
  ``subprocess``, a file in ``/tmp``, an anonymous and a file-backed ``mmap``, the scores
  parked with ``O_DIRECT`` (no page cache) in the kernel's socket folder (read-only: only
  its charged ``/tmp`` is left).

The honest tiled solution keeps its memory points. SDPA fetched by computed names (the
private kernels and the JIT's handle included) is
recorded by the judge as ``calls-sdpa`` (runtime, not source patterns), also when the
student adds an audit hook to rewrite the count (refused); removing the hooks or silencing
the counter is ``probe-tampered``. Flags never change a score.
"""

import pytest

from autograder.sandbox.cgroups import meter_unavailable
from autograder.sandbox.launcher import unavailable_reason

from tests.grader.judge.classes import NAIVE, grade_students, replaced, solved

AID = "06-flash-attention"
MISSING = unavailable_reason()

pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]

SIGNATURE = "def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):"

# The T x S scores kept outside the Python heap: written and read in row blocks, so the
# process itself stays small while the buffer holds the whole matrix.
OUTSIDE = NAIVE + '''
def _scores_to(buf, q, k, causal):
    T, S = q.shape[-2], k.shape[-2]
    for i in range(0, T, 64):
        s = q[..., i:i + 64, :] @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
        if causal:
            rows = np.arange(i, min(i + 64, T))[:, None] + S - T
            s = np.where(np.arange(S)[None, :] <= rows, s, -np.inf)
        buf[..., i:i + 64, :] = s

def _attend_from(buf, v):
    out = np.empty(buf.shape[:-1] + v.shape[-1:])
    for i in range(0, buf.shape[-2], 64):
        s = np.array(buf[..., i:i + 64, :])
        m = s.max(axis=-1, keepdims=True)
        w = np.exp(s - np.where(np.isfinite(m), m, 0.0))
        out[..., i:i + 64, :] = (w @ v) / w.sum(axis=-1, keepdims=True)
    return out

def _shape(q, k):
    return q.shape[:-1] + k.shape[-2:-1]
'''

MEMORY_CHEATS = {
    "ballast-cell": NAIVE + f'''
_BALLAST = [np.ones((1024, 1024)) for _ in range(6)]  # 48 MiB, freed to make room
{SIGNATURE}
    _BALLAST.clear()
    return _full(q, k, v, causal)
''',
    "ballast-thread": NAIVE + f'''
import threading, time
_BALLAST, _READY = [], threading.Event()
def _fill():
    time.sleep(0.2)
    _BALLAST.extend(np.ones((1024, 1024)) for _ in range(6))
    _READY.set()
threading.Thread(target=_fill, daemon=True).start()
{SIGNATURE}
    _READY.wait(10)
    _BALLAST.clear()
    return _full(q, k, v, causal)
''',
    "ballast-attribute": NAIVE + f'''
class _Pool:
    def __getattr__(self, name):  # the ballast appears on the first access of .room
        self.room = [np.ones((1024, 1024)) for _ in range(6)]
        return self.room
_POOL = _Pool()
_POOL.room
{SIGNATURE}
    _POOL.room.clear()
    return _full(q, k, v, causal)
''',
    "ballast-import": NAIVE + f'''
import sys
with open("/tmp/_ballast.py", "w") as _f:
    _f.write("import numpy as np\\nROOM = [np.ones((1024, 1024)) for _ in range(6)]\\n")
sys.path.insert(0, "/tmp")
import _ballast
{SIGNATURE}
    _ballast.ROOM.clear()
    return _full(q, k, v, causal)
''',
    "lazy-numpy": NAIVE + f'''
class Tensor:  # a "torch tensor" to the probe: the work happens when the reply is encoded
    __module__ = "torch"
    dtype = "torch.float64"
    def __init__(self, *args):
        self.args = args
    def detach(self):
        return self
    def cpu(self):
        return self
    def numpy(self):
        return _full(*self.args)
{SIGNATURE}
    return Tensor(q, k, v, causal)
''',
    "lazy-property": NAIVE + f'''
class Tensor:
    __module__ = "torch"
    def __init__(self, *args):
        self.args, self.result = args, None
    @property
    def dtype(self):  # evaluated by the encoder, after the call returned
        self.result = _full(*self.args)
        return "torch.float64"
    def detach(self):
        return self
    def cpu(self):
        return self
    def numpy(self):
        return self.result if self.result is not None else _full(*self.args)
{SIGNATURE}
    return Tensor(q, k, v, causal)
''',
    "probe-patched": NAIVE + f'''
{SIGNATURE}
    return _full(q, k, v, causal)

_g = get_ipython().user_ns.get("__grader__")
if _g is not None:  # the measuring kernel: the call does nothing, the fetch computes
    _handle = _g.handle
    def _deferred(text, _g=_g, _handle=_handle):
        request = _g.decode(text)
        if request.get("op") == "call_staged":
            _g._KEPT["later"] = _g._KEPT.pop("staged")
            return _g.encode({{"done": True}})
        if request.get("op") == "fetch" and "later" in _g._KEPT:
            args, kwargs = _g._KEPT.pop("later")
            return _g.encode({{"value": flash_attention(*args, **kwargs), "sdpa": [0, True]}})
        return _handle(text)
    _g.handle = _deferred
''',
    "thread": NAIVE + f'''
import threading
{SIGNATURE}
    out = []
    worker = threading.Thread(target=lambda: out.append(_full(q, k, v, causal)))
    worker.start()
    worker.join()
    return out[0]
''',
    "fork": NAIVE + f'''
import os
{SIGNATURE}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        with os.fdopen(w, "wb") as f:
            f.write(_full(q, k, v, causal).tobytes())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return np.frombuffer(data).reshape(q.shape[:-1] + v.shape[-1:]).copy()
''',
    "multiprocessing": NAIVE + f'''
import multiprocessing
def _child(conn, q, k, v, causal):
    conn.send(_full(q, k, v, causal))
{SIGNATURE}
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, q, k, v, causal))
    child.start()
    out = receive.recv()
    child.join()
    return out
''',
    "subprocess": NAIVE + f'''
import subprocess, sys
_CHILD = "import sys\\nimport numpy as np\\n" + {NAIVE!r} + """
q, k, v = (np.load(f"/tmp/in{{i}}.npy") for i in range(3))
np.save("/tmp/out.npy", _full(q, k, v, sys.argv[1] == "1"))
"""
{SIGNATURE}
    for i, a in enumerate((q, k, v)):
        np.save(f"/tmp/in{{i}}.npy", a)
    subprocess.run([sys.executable, "-c", _CHILD, "1" if causal else "0"], check=True)
    return np.load("/tmp/out.npy")
''',
    "tmp-file": OUTSIDE + f'''
{SIGNATURE}
    buf = np.memmap("/tmp/scores", dtype=np.float64, mode="w+", shape=_shape(q, k))
    _scores_to(buf, q, k, causal)
    return _attend_from(buf, v)
''',
    "mmap-anonymous": OUTSIDE + f'''
import mmap
{SIGNATURE}
    shape = _shape(q, k)
    region = mmap.mmap(-1, 8 * int(np.prod(shape)))
    buf = np.frombuffer(region, dtype=np.float64).reshape(shape)
    _scores_to(buf, q, k, causal)
    return _attend_from(buf, v)
''',
    "mmap-file": OUTSIDE + f'''
import mmap
{SIGNATURE}
    shape = _shape(q, k)
    with open("/tmp/scores.bin", "w+b") as f:
        f.truncate(8 * int(np.prod(shape)))
        region = mmap.mmap(f.fileno(), 0)
    buf = np.frombuffer(region, dtype=np.float64).reshape(shape)
    _scores_to(buf, q, k, causal)
    return _attend_from(buf, v)
''',
    # the scores parked with O_DIRECT (no page cache) in the kernel's socket folder, which the
    # sandbox mounts read-only: only its own /tmp is left, whose pages are charged
    "odirect-parked": OUTSIDE + f'''
import mmap, os
from ipykernel.connect import get_connection_file

def _parked_file():
    for folder in (os.path.dirname(get_connection_file()), "/tmp"):
        for flags in (os.O_DIRECT, 0):
            try:
                return os.open(folder + "/parked", os.O_RDWR | os.O_CREAT | os.O_TRUNC | flags, 0o600)
            except OSError:
                continue
    raise OSError("nowhere to park the scores")

class _Parked:  # buf[..., i:i + 64, :] read back from the file, one aligned block at a time
    def __init__(self, fd, shape, stride):
        self.fd, self.shape, self.stride = fd, shape, stride
        self.block = mmap.mmap(-1, stride)
    def __getitem__(self, key):
        rows = key[1]
        n = rows.start // 64
        os.preadv(self.fd, [self.block], n * self.stride)
        height = min(64, self.shape[-2] - rows.start)
        count = int(np.prod(self.shape[:-2])) * height * self.shape[-1]
        return np.frombuffer(self.block, dtype=np.float64, count=count).reshape(
            self.shape[:-2] + (height, self.shape[-1]))

{SIGNATURE}
    shape = _shape(q, k)
    T, S = shape[-2], shape[-1]
    fd = _parked_file()
    stride = -(-(int(np.prod(shape[:-2])) * 64 * S * 8) // 4096) * 4096
    block = mmap.mmap(-1, stride)
    try:
        for i in range(0, T, 64):
            s = q[..., i:i + 64, :] @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
            if causal:
                rows = np.arange(i, min(i + 64, T))[:, None] + S - T
                s = np.where(np.arange(S)[None, :] <= rows, s, -np.inf)
            np.frombuffer(block, dtype=np.float64, count=s.size)[:] = s.ravel()
            os.pwritev(fd, [block], (i // 64) * stride)
        return _attend_from(_Parked(fd, shape, stride), v)
    finally:
        os.close(fd)
''',
}

# SDPA by names that no source pattern matches (PyTorch computes; the output is NumPy)
TORCH_SDPA = '''
import importlib
import numpy as np

def _sdpa_with(fetch):
    def flash_attention(q, k, v, causal=False, block_q=64, block_k=64):
        torch = importlib.import_module("to" + "rch")
        tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
        T, S = q.shape[-2], k.shape[-2]
        mask = None
        if causal:
            mask = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + S - T
            if not bool(mask.any(-1).all()):
                raise ValueError("a row with no keys")
        return fetch(torch)(tq, tk, tv, attn_mask=mask).numpy()
    return flash_attention
'''
NAME = "'scaled_dot_' + 'product_attention'"
SDPA_CHEATS = {
    "sdpa-getattr": TORCH_SDPA + f"flash_attention = _sdpa_with(lambda t: getattr("
                                 f"importlib.import_module('torch.nn.functional'), {NAME}))\n",
    "sdpa-vars": TORCH_SDPA + f"flash_attention = _sdpa_with(lambda t: vars(t.nn.functional)[{NAME}])\n",
    "sdpa-aten": TORCH_SDPA + f"flash_attention = _sdpa_with(lambda t: getattr(t.ops.aten, {NAME}))\n",
    # the private kernels, by names built at run time, and the JIT's handle on the operator
    "sdpa-private-math": TORCH_SDPA + '''
def _math(t):  # the math kernel takes an additive mask
    kernel = getattr(t, "_scaled_dot_" + "product_attention_math")
    def call(q, k, v, attn_mask=None):
        if attn_mask is not None:
            attn_mask = t.zeros(attn_mask.shape, dtype=q.dtype).masked_fill(~attn_mask, float("-inf"))
        return kernel(q, k, v, attn_mask=attn_mask)[0]
    return call
flash_attention = _sdpa_with(_math)
''',
    "sdpa-jit": TORCH_SDPA + f"flash_attention = _sdpa_with(lambda t: t._C._jit_get_operation("
                             f"'aten::' + {NAME})[0])\n",
    "sdpa-unhooked": TORCH_SDPA + f'''
def _original(t):  # the wrapper's closure holds the real function: put it back
    wrapper = vars(t.nn.functional)[{NAME}]
    cells = getattr(wrapper, "__closure__", None) or ()  # None: put back by an earlier call
    real = ([c.cell_contents for c in cells if callable(c.cell_contents)] or [wrapper])[0]
    setattr(t.nn.functional, {NAME}, real)
    return real
flash_attention = _sdpa_with(_original)
''',
    "sdpa-silenced": TORCH_SDPA + f'''
import sys
sys.audit = lambda *args: None  # the probe's question goes unanswered
flash_attention = _sdpa_with(lambda t: getattr(t.nn.functional, {NAME}))
''',
    "sdpa-forged": TORCH_SDPA + f'''
import sys
def _answer(event, args):  # a later hook that rewrites the count to 0
    if event == "autograder.sdpa":
        args[0][:] = [(0, True)]
sys.addaudithook(_answer)
flash_attention = _sdpa_with(lambda t: getattr(t.nn.functional, {NAME}))
''',
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if meter_unavailable():
        pytest.skip(f"memory cannot be measured here: {meter_unavailable()}")
    honest = solved(AID)
    students = {"honest": honest}
    students.update({name: replaced(honest, p2_solution=code)
                     for name, code in {**MEMORY_CHEATS, **SDPA_CHEATS}.items()})
    from autograder.core.limits import Limits

    return grade_students(tmp_path_factory.mktemp("evasions"), AID, students, jobs=2,
                       limits=Limits(cell_timeout=120))


def test_the_honest_tiled_solution_keeps_every_point(graded):
    results, cells = graded
    assert all(c.score > 0 for c in cells["honest"].values()), cells["honest"]
    assert cells["honest"]["p2_hidden_memory"].score == 1.0
    assert cells["honest"]["p3_hidden_memory"].score == 1.0
    assert not {"calls-sdpa", "probe-tampered", "mentions-sdpa"} & set(results["honest"].flags)


LAZY = ("lazy-numpy", "lazy-property")  # "tensors": the judge decodes them as tensors


@pytest.mark.parametrize("cheat", [c for c in MEMORY_CHEATS if c not in LAZY])
def test_memory_hidden_from_the_check_is_counted(graded, cheat):
    results, cells = graded
    assert cells[cheat]["p2_hidden"].score == 3.0, cells[cheat]["p2_hidden"]  # right values ...
    memory = cells[cheat]["p2_hidden_memory"]
    assert memory.score == 0.0  # ... with the T x S matrix, counted
    assert "allocated" in memory.message and "at peak" in memory.message, memory.message


@pytest.mark.parametrize("cheat", LAZY)
def test_a_lazy_tensor_earns_nothing_whatever_the_worker_graded_before(graded, cheat):
    """Its work is done inside the window (the output is encoded there); and a reply tagged
    as a tensor always arrives as a torch tensor, which a NumPy task refuses."""
    results, cells = graded
    assert cells[cheat]["p2_hidden_memory"].score == 0.0
    assert cells[cheat]["p2_hidden"].score == 0.0
    assert "must return a NumPy array, got Tensor" in cells[cheat]["p2_hidden"].message


TAMPERED = ("sdpa-unhooked", "sdpa-silenced")  # sdpa-forged: its hook is refused, the call counted


@pytest.mark.parametrize("cheat", [c for c in SDPA_CHEATS if c not in TAMPERED])
def test_sdpa_by_a_computed_name_is_recorded_at_run_time(graded, cheat):
    results, cells = graded
    assert cells[cheat]["p2_hidden"].score == 3.0  # flags never change a score
    assert "calls-sdpa" in results[cheat].flags
    assert "mentions-sdpa" not in results[cheat].flags  # no source pattern saw it
    assert "probe-tampered" not in results[cheat].flags


@pytest.mark.parametrize("cheat", TAMPERED)
def test_removing_the_sdpa_hook_is_seen(graded, cheat):
    results, cells = graded
    assert cells[cheat]["p2_hidden"].score == 3.0
    assert "probe-tampered" in results[cheat].flags
