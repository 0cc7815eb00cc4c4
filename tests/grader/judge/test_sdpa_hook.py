"""The kernel's boot hook counts SDPA by every name, and notices being removed.

A fresh Python process (no sandbox needed) runs :func:`autograder.kernel.boot.install` as the
kernel's command does, imports PyTorch, and calls ``scaled_dot_product_attention`` by the names
a student could compute; the count the probe reads (:func:`autograder.kernel.probe._sdpa_count`)
must go up by one for each inside a judged call's window (the private kernels and the JIT's
handle through the dispatcher mode, which is on the stack only then), cost microseconds,
and say ``intact`` until a wrapper is removed or the mode popped;
an audit hook added later (which could rewrite the answer) is refused. The sandboxed, end-to-end version is in
``test_measurement_evasions.py``.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[3]

SCRIPT = r'''
import importlib, json, sys, time, timeit
sys.path.insert(0, sys.argv[1])
from autograder.kernel import boot, probe
boot.install()
seen = [probe._sdpa_count()]
F = importlib.import_module("torch.nn" + ".functional")
torch = sys.modules["torch"]
q = torch.randn(2, 5, 4)
name = "scaled_dot_" + "product_attention"
calls = [lambda: getattr(F, name)(q, q, q),          # a computed name, same statement as the import
         lambda: vars(F)[name](q, q, q),
         lambda: getattr(torch.ops.aten, name)(q, q, q),
         lambda: getattr(torch.ops.aten, name).default(q, q, q),
         lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q[None], q[None], q[None]),
         lambda: torch._C._nn.scaled_dot_product_attention(q, q, q),
         lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q),
         # private kernels and the JIT's handle, by names built at run time (the dispatcher mode)
         lambda: getattr(torch, "_scaled_dot_product_" + "attention_math")(q, q, q),
         lambda: getattr(torch, "_scaled_dot_product_" + "flash_attention_for_cpu")(q[None], q[None], q[None]),
         lambda: torch._C._jit_get_operation("aten::" + name)[0](q, q, q),
         lambda: torch._C._jit_get_operation("aten::_" + name + "_math")[0](q, q, q)]
outside = probe._sdpa_count()
getattr(torch, "_scaled_dot_product_" + "attention_math")(q, q, q)  # outside a judged call
seen.append(probe._sdpa_count())  # ... not counted: the mode is not on the stack
probe._sdpa_count("open")  # a judged call's window, as the probe opens it
for call in calls:
    call()
    seen.append(probe._sdpa_count())
wrapper = vars(F)[name]
real = [c.cell_contents for c in wrapper.__closure__ if callable(c.cell_contents)][0]
best = {real: [], wrapper: []}  # the fastest of 40 rounds of 50 calls each: load only slows
for _ in range(40):
    for f in best:
        start = time.perf_counter()
        for _ in range(50):
            f(q, q, q)
        best[f].append((time.perf_counter() - start) / 50)
plain, counted = min(best[real]), min(best[wrapper])
setattr(F, name, real)
seen.append(probe._sdpa_count())
setattr(F, name, wrapper)
seen.append(probe._sdpa_count())
sys.addaudithook(lambda event, args: None)
seen.append(probe._sdpa_count())
seen.append(probe._sdpa_count("close"))  # the window closed: the mode leaves the stack
plain_outside = min(timeit.repeat(lambda: q + 0, number=200, repeat=20)) / 200
probe._sdpa_count("open")
plain_inside = min(timeit.repeat(lambda: q + 0, number=200, repeat=20)) / 200
seen.append(len(torch.overrides._get_current_function_mode_stack()))
torch._C._pop_torch_function_stack()  # the dispatcher mode taken off the stack
seen.append(probe._sdpa_count("close"))
seen.append(len(torch.overrides._get_current_function_mode_stack()))
print(json.dumps({"seen": seen, "overhead_us": (counted - plain) * 1e6,
                  "op_outside_us": plain_outside * 1e6, "op_inside_us": plain_inside * 1e6}))
'''


@pytest.mark.slow
def test_every_name_counts_and_removal_is_seen():
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    seen = report["seen"]
    assert seen[0] == [0, True] and seen[1] == [0, True]  # a private kernel outside a window
    assert seen[2:13] == [[i, True] for i in range(1, 12)]  # one more for each of the 11 names
    # the 2 x 40 x 50 timed calls counted: the original dug out of the wrapper's closure too
    assert seen[13] == [4011, False]  # a wrapper taken out
    assert seen[14] == [4011, True]   # ... and put back
    assert seen[15] == [4011, True]   # another audit hook, which could rewrite it, is refused
    assert seen[16] == [4011, True]   # the window closed
    assert seen[17] == 1              # inside a window the mode is on the stack
    assert seen[18] == [4011, False]  # ... popped there: seen at the close
    assert seen[19] == 0              # and nothing is left on the stack
    # a PyTorch call outside a judged call pays nothing for the mode
    print(f"\nper op: {report['op_outside_us']:.1f} us outside a window, "
          f"{report['op_inside_us']:.1f} us inside")
    assert report["overhead_us"] < 50, report  # microseconds per call, on a loaded machine
