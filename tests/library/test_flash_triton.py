"""The Triton FlashAttention kernels (``transformer_ref.triton``), forward and backward.

Without a GPU the kernels run on CPU tensors under Triton's interpreter, which
executes every program instance in Python: the sizes here are small (a few
tiles of 16 x 16, so that T and S are ragged, several query tiles and KV heads
exist and causal tiles are skipped) and the module stays well under a minute.
References are independent of the code under test: the library's NumPy naive
attention in float64 (one full score matrix), ``torch.logsumexp`` of the full
float64 scores, float64 autograd through ``torch.nn.functional.
scaled_dot_product_attention`` with masks built here from index comparisons,
and F.scaled_dot_product_attention in the input dtype. The ``cuda`` tests run
the compiled kernels at real sizes when a GPU is present.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

# find_spec, not importorskip: importing triton here, before transformer_ref.triton has
# set TRITON_INTERPRET=1, would leave triton's own library compiled and the interpreter unusable
if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton backend not installed: pip install -r requirements-triton.lock", allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from transformer_ref import numpy as ref  # noqa: E402
from transformer_ref import triton as fref  # noqa: E402
from transformer_ref.triton import flash as triton_flash  # noqa: E402

if not torch.cuda.is_available() and not fref.INTERPRETED:
    pytest.fail("no GPU, and triton was imported before TRITON_INTERPRET=1 could be set (by an earlier test "
                "module?): run with TRITON_INTERPRET=1 in the environment", pytrace=False)

# slow: every test runs the kernels, on a CPU under Triton's interpreter: 1-3 s each, about 35 s in all (make test runs them; make test-fast does not)
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Largest error allowed, relative to the largest reference value of the same tensor
# (measured worst cases here: 6e-7, 6e-4, 8e-3): float32 products and sums; the half
# types also round P and dS to 11 and 8 significant bits before their products.
TOL = {torch.float32: 4e-6, torch.float16: 1.5e-3, torch.bfloat16: 2e-2}
# At T = 1024 .. 4096 on a GPU, longer sums and a different summation order: wider bounds.
CUDA_TOL = {torch.float32: 5e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2}
# (T, S, H, H_kv, D, Dv), tiles 16 x 16: T and S ragged, T < S, T > S, GQA groups of 2 and 3
SHAPES = [
    (37, 53, 4, 2, 24, 20),  # T < S, ragged, GQA 2, D != Dv, D not a power of two
    (45, 19, 3, 1, 16, 16),  # T > S: causal rows 0 .. 25 see no key; GQA 3 (multi-query)
    (32, 32, 2, 2, 32, 32),  # exact tiles, plain multi-head
]


def visible_keys(T, S):
    """Bool (T, S), written independently of the library: key j visible iff j <= i + S - T."""
    return torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T)


def make_inputs(T, S, H, H_kv, D, Dv, dtype, batch=(2,), seed=0):
    """q, k, v and an upstream gradient, rounded to ``dtype`` (so the references see the same numbers)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(*batch, H, T, D), (*batch, H_kv, S, D), (*batch, H_kv, S, Dv), (*batch, H, T, Dv)]
    return [torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) for shape in shapes]


def float64_reference(q, k, v, g, causal, with_numpy=True):
    """out, lse and (dq, dk, dv) of loss = sum(out * g), all float64 on q's device, K/V heads repeated for GQA.

    With ``with_numpy``, first returns a second float64 forward: the library's NumPy naive attention."""
    q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    T, S = q.shape[-2], k.shape[-2]
    rep = q.shape[-3] // k.shape[-3]
    kr, vr = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    mask = visible_keys(T, S).to(q.device) if causal else None
    out = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)
    (out * g.double()).sum().backward()
    scores = q.detach() @ kr.detach().transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        scores = scores.masked_fill(~mask, -torch.inf)
    result = (out.detach(), torch.logsumexp(scores, dim=-1), (q.grad, k.grad, v.grad))
    if not with_numpy:
        return result
    out_np = ref.scaled_dot_product_attention(*(x.detach().numpy() for x in (q, kr, vr)),
                                              mask.numpy() if causal else None)
    return (torch.from_numpy(out_np), *result)


def run_triton(q, k, v, g, causal, **kw):
    """out, lse and (dq, dk, dv) from the Triton kernels."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out, lse = fref.flash_attention(q, k, v, causal=causal, return_lse=True, **kw)
    (out.float() * g.float()).sum().backward()
    return out, lse, (q.grad, k.grad, v.grad)


def assert_near(name, got, want, tol):
    """max |got - want| <= tol * max |want| (and no NaN anywhere)."""
    got, want = got.double(), want.double()
    assert not torch.isnan(got).any(), f"{name}: NaN"
    bound = tol * max(want.abs().max().item(), 1.0)
    err = (got - want).abs().max().item()
    assert err <= bound, f"{name}: max error {err:.3g} > {bound:.3g}"


# ---------------------------------------------------------------- interpreter (CPU)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}-S{}-H{}-Hkv{}".format(*s[:4]))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_forward_lse_and_gradients_match_float64(dtype, causal, shape):
    T, S, H, H_kv, D, Dv = shape
    q, k, v, g = make_inputs(*shape, dtype, seed=T * S)
    out, lse, grads = run_triton(q, k, v, g, causal, block_q=16, block_k=16)
    out_np, out64, lse64, grads64 = float64_reference(q, k, v, g, causal)
    assert out.dtype == dtype and out.shape == (2, H, T, Dv)
    assert lse.dtype == torch.float32 and lse.shape == (2, H, T)
    tol = TOL[dtype]
    assert_near("out vs NumPy", out, out_np, tol)
    assert_near("out vs F.sdpa float64", out, out64, tol)
    seen = torch.isfinite(lse64)
    assert torch.equal(torch.isfinite(lse), seen)  # -inf exactly where a row sees no key
    assert_near("lse", lse[seen], lse64[seen], 2e-6)  # float32 statistics for every dtype
    for name, got, want, x in zip(("dq", "dk", "dv"), grads, grads64, (q, k, v)):
        assert got.dtype == dtype and got.shape == x.shape, name
        assert_near(name, got, want, tol)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_matches_torch_sdpa_in_the_same_dtype(dtype, causal):
    # GQA through F.scaled_dot_product_attention's own enable_gqa (no repeat here either)
    q, k, v, g = make_inputs(29, 29, 4, 2, 16, 16, dtype, batch=(1,), seed=7)
    out, _, grads = run_triton(q, k, v, g, causal, block_q=16, block_k=16)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    want = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)
    (want.float() * g.float()).sum().backward()
    assert_near("out", out, want.detach(), 2 * TOL[dtype])
    for name, got, leaf in zip(("dq", "dk", "dv"), grads, leaves):
        assert_near(name, got, leaf.grad, 2 * TOL[dtype])


def test_default_tiles_ragged_and_leading_batch_dims():
    # 100 = 64 + 36 with the default 64 x 64 tiles; two leading batch dims; a transposed
    # (non-contiguous) q; float32
    T, S = 100, 70
    q, k, v, g = make_inputs(T, S, 2, 1, 16, 16, torch.float32, batch=(1, 2), seed=3)
    q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not q.is_contiguous()
    out, lse, grads = run_triton(q, k, v, g, True)
    out_np, _, lse64, grads64 = float64_reference(q, k, v, g, True)
    assert out.shape == (1, 2, 2, T, 16)
    assert_near("out", out, out_np, TOL[torch.float32])
    assert_near("lse", lse[..., T - S:], lse64[..., T - S:], 2e-6)
    for name, got, want in zip(("dq", "dk", "dv"), grads, grads64):
        assert_near(name, got, want, TOL[torch.float32])


def test_fully_masked_rows_are_zero_not_nan():
    # causal with T > S: queries 0 .. T - S - 1 sit before the first key and see nothing
    T, S = 40, 12
    q, k, v, g = make_inputs(T, S, 2, 2, 16, 16, torch.float32, batch=(1,), seed=5)
    out, lse, (dq, dk, dv) = run_triton(q, k, v, g, True, block_q=16, block_k=16)
    assert torch.equal(out[..., : T - S, :], torch.zeros_like(out[..., : T - S, :]))
    assert torch.isneginf(lse[..., : T - S]).all() and torch.isfinite(lse[..., T - S :]).all()
    assert (out[..., T - S :, :].abs().sum(-1) > 0).all()  # the rows that see keys are not zero
    assert torch.equal(dq[..., : T - S, :], torch.zeros_like(dq[..., : T - S, :]))
    for grad in (dq, dk, dv):
        assert torch.isfinite(grad).all()


def test_gradient_through_lse():
    # d(sum lse)/dq and /dk against float64 autograd of torch.logsumexp (dv is zero)
    q, k, v, _ = make_inputs(21, 33, 2, 1, 16, 16, torch.float32, batch=(1,), seed=11)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    _, lse = fref.flash_attention(*leaves, causal=True, block_q=16, block_k=16, return_lse=True)
    lse.sum().backward()
    q64, k64 = (x.double().requires_grad_() for x in (q, k))
    scores = (q64 @ k64.repeat_interleave(2, dim=-3).transpose(-1, -2)) / 4.0
    torch.logsumexp(scores.masked_fill(~visible_keys(21, 33), -torch.inf), dim=-1).sum().backward()
    assert_near("dq", leaves[0].grad, q64.grad, TOL[torch.float32])
    assert_near("dk", leaves[1].grad, k64.grad, TOL[torch.float32])
    assert torch.equal(leaves[2].grad, torch.zeros_like(v))


def test_scale_and_mixed_dtypes():
    # explicit scale; float16 q with float32 k, v promotes to float32
    q, k, v, _ = make_inputs(17, 17, 1, 1, 16, 16, torch.float32, batch=(1,), seed=13)
    out = fref.flash_attention(q.half(), k, v, scale=0.3, block_q=16, block_k=16)
    assert out.dtype == torch.float32
    want = ref.scaled_dot_product_attention(q.half().double().numpy(), k.double().numpy(), v.double().numpy(),
                                            scale=0.3)
    assert_near("out", out, torch.from_numpy(want), TOL[torch.float32])


def test_integer_input_computes_in_float32_like_the_torch_backend():
    # bad input and dtype rules are shared with the torch backend (tests/library/test_api_surface.py)
    gen = torch.Generator().manual_seed(17)
    q, k, v = (torch.randint(-3, 4, (1, 2, 19, 16), generator=gen) for _ in range(3))
    out = fref.flash_attention(q, k, v, causal=True, block_q=16, block_k=16)
    assert out.dtype == torch.float32
    want = ref.scaled_dot_product_attention(q.double().numpy(), k.double().numpy(), v.double().numpy(),
                                            visible_keys(19, 19).numpy())
    assert_near("out", out, torch.from_numpy(want), TOL[torch.float32])


def test_cpu_tensors_without_the_interpreter_raise_a_clear_error(monkeypatch):
    monkeypatch.setattr(triton_flash, "INTERPRETED", False)  # as if the kernels had been compiled
    q, k, v, _ = make_inputs(8, 8, 1, 1, 16, 16, torch.float32, batch=(1,))
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        fref.flash_attention(q, k, v)


def test_interpreter_is_chosen_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the kernels are compiled unless TRITON_INTERPRET=1 was set")
    assert fref.INTERPRETED and os.environ.get("TRITON_INTERPRET") == "1"


def test_triton_imported_first_without_the_interpreter_gives_the_clear_error():
    # a fresh interpreter in which triton is imported before transformer_ref.triton, TRITON_INTERPRET unset
    code = (
        "import triton, torch\n"
        "from transformer_ref import triton as fref\n"
        "assert not fref.INTERPRETED\n"
        "try:\n"
        "    fref.flash_attention(*(torch.randn(1, 1, 16, 16) for _ in range(3)))\n"
        "except RuntimeError as error:\n"
        "    print('RuntimeError:', error)\n"
    )
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "RuntimeError:" in result.stdout and "TRITON_INTERPRET=1" in result.stdout


def test_library_works_without_triton_and_says_how_to_install_it():
    # a fresh interpreter in which `import triton` fails, as in the learner's environment
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "import transformer_ref\n"
        "from transformer_ref import numpy as ref, torch as tref\n"
        "q = torch.randn(1, 2, 5, 4)\n"
        "assert tref.flash_attention(q, q, q).shape == (1, 2, 5, 4)\n"
        "try:\n"
        "    import transformer_ref.triton\n"
        "except ImportError as error:\n"
        "    print('ImportError:', error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ImportError:" in result.stdout and "pip install -r requirements-triton.lock" in result.stdout


# ---------------------------------------------------------------- compiled (CUDA)

cuda = pytest.mark.skipif(not torch.cuda.is_available() or fref.INTERPRETED,
                          reason="needs a CUDA device and compiled (not interpreted) kernels")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("T", [1024, 4096])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_cuda_real_sizes_match_float64(dtype, causal, D, T):
    # default tiles, GQA 2, against float64 (the math backend of SDPA) on the GPU
    q, k, v, g = (x.cuda() for x in make_inputs(T, T, 4, 2, D, D, dtype, batch=(1,), seed=T + D))
    out, lse, grads = run_triton(q, k, v, g, causal)
    out64, lse64, grads64 = float64_reference(q, k, v, g, causal, with_numpy=False)
    assert_near("out", out, out64, CUDA_TOL[dtype])
    assert_near("lse", lse, lse64, 1e-5)
    for name, got, want in zip(("dq", "dk", "dv"), grads, grads64):
        assert_near(name, got, want, CUDA_TOL[dtype])


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("T,S", [(1000, 3000), (3000, 1000)])
def test_cuda_causal_t_not_s_ragged(T, S):
    # bottom-right causal with T != S, lengths not multiples of the tile, fully masked rows when T > S
    q, k, v, g = (x.cuda() for x in make_inputs(T, S, 4, 1, 64, 64, torch.float16, batch=(1,), seed=T))
    out, lse, grads = run_triton(q, k, v, g, True)
    out64, lse64, grads64 = float64_reference(q, k, v, g, True, with_numpy=False)
    assert_near("out", out, out64, CUDA_TOL[torch.float16])
    assert torch.equal(torch.isfinite(lse), torch.isfinite(lse64))
    for name, got, want in zip(("dq", "dk", "dv"), grads, grads64):
        assert_near(name, got, want, CUDA_TOL[torch.float16])
