"""attention is a torch.compile-ready op on every backend.

* ``torch.compile(fullgraph=True)`` traces forward and backward with no graph break, and the
  compiled results pass the tolerance rule against the oracle; where compilation runs the same
  kernels as eager mode (the ``attnkit::flash_forward`` op: tiled, triton) they are bitwise
  equal to eager.
* ``torch.library.opcheck`` passes for the op (schema, fake implementation, autograd).
* On a GPU: CUDA-graph capture and replay (``torch.cuda.make_graphed_callables``, forward and
  backward) and ``mode="reduce-overhead"`` match the oracle too.

On the CPU the compile tests use the ``aot_eager`` compiler backend: it traces exactly what
Inductor would (dynamo, then AOT autograd's joint graph) but skips Inductor's C++ code
generation, which takes minutes on a 2-core CI machine; one Inductor case keeps that path honest.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import DEVICE

import attnkit
from attnkit import attention
from attnkit.registry import get_backend
from attnkit.testing import assert_close_to_reference, compare_to_reference, make_tensor, run_with_grads

ON_GPU = DEVICE.type == "cuda"
_COMPILER = "inductor" if ON_GPU else "aot_eager"
#: Paths behind the torch.library op: compiled, they run the eager kernels, so bitwise equal.
_OP_PATHS = {"tiled", "triton"}


def _problem(dtype=None, n=24, m=24, d=16, kv_heads=2):
    dtype = dtype or (torch.bfloat16 if ON_GPU else torch.float32)
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (
        make_tensor(shape, dtype=dtype, device=DEVICE, generator=gen)
        for shape in ((2, 4, n, d), (2, kv_heads, m, d), (2, kv_heads, m, d), (2, 4, n, d))
    )
    return q, k, v, grad_out


def _skip_if_eager_declines(backend, q, k, v, window=None):
    """A forced SDPA kernel may decline a problem (e.g. GQA) in eager mode too: not a compile
    matter. Compiled, the refusal would surface as PyTorch's own error, so it is checked here."""
    try:
        attention(q, k, v, causal=True, window=window, backend=backend)
    except attnkit.UnsupportedProblemError as err:
        pytest.skip(f"{backend} declines the problem in eager mode: {err}")


def _fn(backend, causal=True, window=None):
    return lambda q, k, v: attention(q, k, v, causal=causal, window=window, backend=backend)


@pytest.mark.parametrize("window", [None, (6, -1)], ids=["no-window", "window"])
def test_fullgraph_compile_forward_and_backward(backend, window):
    torch._dynamo.reset()
    q, k, v, grad_out = _problem(n=24, m=40)
    _skip_if_eager_declines(backend, q, k, v, window)
    compiled = torch.compile(_fn(backend, window=window), fullgraph=True, backend=_COMPILER)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checks = compare_to_reference(
            compiled, q, k, v, causal=True, scale=None, grad_out=grad_out, window=window
        )
    # Tracing attnkit's code warns about nothing of attnkit's (e.g. a memo Dynamo cannot keep).
    ours = [str(w.message).splitlines()[0] for w in caught if "Dynamo detected" in str(w.message)]
    assert ours == [], f"{backend} under torch.compile: {ours}"
    assert_close_to_reference(
        f"{backend} under torch.compile({_COMPILER}, fullgraph=True), window {window}", checks
    )
    if backend in _OP_PATHS:
        eager = run_with_grads(_fn(backend, window=window), q, k, v, grad_out)
        traced = run_with_grads(compiled, q, k, v, grad_out)
        for name, expected in eager.items():
            diff = (traced[name].float() - expected.float()).abs().max().item()
            assert torch.equal(traced[name], expected), (
                f"{backend} compiled {name} differs from eager by {diff}"
            )


@pytest.mark.device_independent
@pytest.mark.skipif(ON_GPU, reason="the GPU run compiles every backend with Inductor already")
def test_inductor_compiles_the_op_on_cpu():
    torch._dynamo.reset()
    q, k, v, grad_out = _problem(n=8, m=8)
    compiled = torch.compile(_fn("tiled", causal=False), fullgraph=True)
    checks = compare_to_reference(compiled, q, k, v, causal=False, scale=None, grad_out=grad_out)
    assert_close_to_reference("tiled under torch.compile(inductor) on the CPU", checks)


def _op_paths():
    params = []
    for name in ("tiled", "triton"):
        reason = (
            attnkit.unavailable_reason(name, DEVICE) if name in attnkit.backend_names() else "not installed"
        )
        if reason is None and get_backend(name).is_interpreted(DEVICE):
            reason = "opcheck runs the op ~10 times: too slow through the Triton interpreter"
        marks = [pytest.mark.skip(reason=f"{name} on {DEVICE}: {reason}")] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("path", _op_paths())
def test_opcheck(path):
    q, k, v, _ = _problem(n=12, m=20)
    for x in (q, k, v):
        x.requires_grad_(True)
    torch.library.opcheck(torch.ops.attnkit.flash_forward.default, (q, k, v, True, 0.25, path))
    # With a window: (left, right) as two ints, -1 for an unbounded side.
    torch.library.opcheck(torch.ops.attnkit.flash_forward.default, (q, k, v, False, 0.25, path, 5, 2))


gpu_only = pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a CUDA device")


#: (N, M) of the graph tests: a square problem, and one query against many keys, which the
#: Triton path runs split-KV (two kernels, the second a programmatic dependent launch on Hopper).
_GRAPH_SHAPES = {"square": (64, 64), "decode": (1, 700)}


@gpu_only
@pytest.mark.usefixtures("no_dead_cuda_graphs")
@pytest.mark.parametrize("shape", list(_GRAPH_SHAPES.values()), ids=list(_GRAPH_SHAPES))
def test_cuda_graph_capture_and_replay(backend, shape):
    n, m = shape
    q, k, v, grad_out = _problem(n=n, m=m, d=64, kv_heads=4)
    _skip_if_eager_declines(backend, q, k, v)
    sample = tuple(x.detach().requires_grad_(True) for x in (q, k, v))
    graphed = torch.cuda.make_graphed_callables(_fn(backend), sample)
    checks = compare_to_reference(graphed, q, k, v, causal=True, scale=None, grad_out=grad_out)
    assert_close_to_reference(f"{backend} replayed from a CUDA graph", checks)


@gpu_only
@pytest.mark.usefixtures("no_dead_cuda_graphs")
def test_compile_reduce_overhead(backend):
    torch._dynamo.reset()
    q, k, v, grad_out = _problem(n=64, m=64, d=64, kv_heads=4)
    _skip_if_eager_declines(backend, q, k, v)
    compiled = torch.compile(_fn(backend), fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # warm-up runs, then the recorded graph replays
        checks = compare_to_reference(compiled, q, k, v, causal=True, scale=None, grad_out=grad_out)
    assert_close_to_reference(f"{backend} under torch.compile(mode='reduce-overhead')", checks)


def test_dynamic_shapes_compile_once_and_match_eager():
    torch._dynamo.reset()
    compiled = torch.compile(_fn("tiled"), fullgraph=True, dynamic=True, backend=_COMPILER)
    for n, m in ((8, 8), (12, 20)):
        q, k, v, grad_out = _problem(n=n, m=m)
        eager = run_with_grads(_fn("tiled"), q, k, v, grad_out)
        traced = run_with_grads(compiled, q, k, v, grad_out)
        for name, expected in eager.items():
            diff = (traced[name].float() - expected.float()).abs().max().item()
            assert torch.equal(traced[name], expected), f"N={n} M={m}: compiled {name} differs by {diff}"


@pytest.fixture
def flex_counted_with_eager_dynamo(monkeypatch):
    """The flex backend run outside torch.compile, its compilations made with Dynamo's ``eager``
    backend (what Dynamo specialises on does not depend on the backend, and nothing is generated),
    Dynamo told to fail where it would fall back to running a frame uncompiled."""
    from attnkit import flex

    monkeypatch.setenv(flex.CPU_OPT_IN, "1")
    monkeypatch.setattr(attnkit.api, "_PLANNED", {})
    monkeypatch.setattr(attnkit.api, "_compiled_memo", None)
    monkeypatch.setattr(flex, "COMPILE_BACKEND", "eager")
    flex._compiled.cache_clear()
    try:
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            yield
    finally:
        flex._compiled.cache_clear()  # later tests compile with Inductor again


@pytest.mark.usefixtures("flex_counted_with_eager_dynamo")
def test_flex_runs_compiled_whatever_problems_a_process_sees_before():
    """Past Dynamo's recompile limit a frame runs uncompiled: FlexAttention's unfused reference,
    which materialises the scores and cannot be captured in a CUDA graph. A process (a test worker,
    a server with several models) that calls flex with more problem classes than the limit (dtype,
    head counts, head dims, scale, mask) still runs every one compiled."""
    classes = [
        (dtype, q_heads, d, scale, window)
        for dtype in (torch.float32, torch.bfloat16)
        for q_heads in (2, 4)
        for d in (16, 32)
        for scale in (None, 0.3)
        for window in (None, (3, 0))
    ]
    assert len(classes) > torch._dynamo.config.recompile_limit
    gen = torch.Generator().manual_seed(0)
    for dtype, q_heads, d, scale, window in classes:
        # N and M vary within a class (at least 128 queries: CUDA's flex declines GQA below)
        for n, m in ((128, 128), (130, 200), (160, 140)):
            q = make_tensor((1, q_heads, n, d), dtype=dtype, device=DEVICE, generator=gen)
            k, v = (make_tensor((1, 2, m, d), dtype=dtype, device=DEVICE, generator=gen) for _ in range(2))
            with torch.no_grad():
                # Raises FailOnRecompileLimitHit where the frame would run uncompiled
                attention(q, k, v, causal=True, scale=scale, window=window, backend="flex")
