"""Which forwards of backend "triton" run on the Gluon Hopper kernel: the support and routing
rules and the kernel plan on any machine, and on an sm_90 GPU the routed path against the
oracle (forward and backward) and the ``ATTNKIT_GLUON=0`` switch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import DEVICE, HALF_DTYPES

import attnkit
import attnkit.triton.gluon as gluon
from attnkit.inputs import check_inputs
from attnkit.testing import assert_close_to_reference, compare_to_reference, make_tensor
from attnkit.triton import TritonImplementation, forget_plans, planned_kernels
from attnkit.triton import plan as kernel_plan
from attnkit.triton.gluon import route, support
from attnkit.triton.gluon.config import packaged_section, routed_cells

#: The routed cells of the GPUs the kernel was measured on (their committed tables).
MEASURED = {key: routed_cells(packaged_section(key)) for key in ("nvidia-h100-80gb-hbm3", "nvidia-h200")}


def _problem(
    b=2, h=4, n=1024, m=1024, d=128, dv=None, causal=True, dtype=torch.bfloat16, kv_heads=None, **kw
):
    """A validated problem from meta tensors: no memory, no device."""
    q = torch.empty(b, h, n, d, dtype=dtype, device="meta")
    k = torch.empty(b, kv_heads or h, m, d, dtype=dtype, device="meta")
    v = torch.empty(b, kv_heads or h, m, dv or d, dtype=dtype, device="meta")
    return check_inputs(q, k, v, causal, kw.pop("scale", None), **kw)


@pytest.mark.device_independent
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("n", "m"), [(4096, 4096), (1000, 1000), (300, 700), (700, 300), (1, 257)])
@pytest.mark.parametrize("d", [64, 128])
def test_the_kernel_takes_what_its_launcher_takes(d, n, m, causal, dtype):
    problem = _problem(n=n, m=m, d=d, causal=causal, dtype=dtype)
    assert support.problem_support(problem) is None, problem.describe()


@pytest.mark.device_independent
@pytest.mark.parametrize("gpu", list(MEASURED))
@pytest.mark.parametrize(("d", "causal"), [(64, False), (64, True), (128, False), (128, True)])
def test_routed_cells_and_the_size_floor(gpu, d, causal):
    """Large problems of a routed cell go to the Gluon kernel; small ones (host-bound) and the
    cells where the plain kernel is faster do not."""
    cells = MEASURED[gpu]
    n = max(4096, cells.get((d, causal), 4096))
    large = _problem(b=4, h=2048 // d, n=n, m=n, d=d, causal=causal)
    assert route.preferred(large, cells) is ((d, causal) in cells)
    if cells.get((d, causal), 1) > 1:  # a cell routed from some N on
        shorter = _problem(b=64, h=2048 // d, n=cells[d, causal] - 1, m=4096, d=d, causal=causal)
        assert not route.preferred(shorter, cells), f"N below the cell's floor: {shorter.describe()}"
    scores = large.batch * large.q_heads * large.q_len * large.kv_len
    assert scores >= route.GLUON_MIN_SCORES
    small = _problem(b=1, h=8, n=128, m=128, d=d, causal=causal)
    assert not route.preferred(small, cells), small.describe()


@pytest.mark.device_independent
@pytest.mark.parametrize("gpu", list(MEASURED))
def test_the_large_d128_cells_are_routed(gpu):
    # The cells the Gluon kernel exists for: if this fails, the table lost them.
    for causal in (False, True):
        large = _problem(b=4, h=16, n=8192, m=8192, d=128, causal=causal)
        assert route.preferred(large, MEASURED[gpu]), f"{gpu}: {large.describe()}"


@pytest.mark.device_independent
def test_a_gpu_without_measured_cells_routes_nothing():
    assert routed_cells({}) == {}
    assert not route.preferred(_problem(b=4, h=16, n=8192, m=8192, d=128), {})


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"dtype": torch.float32}, "float16 or bfloat16"),
        ({"d": 96}, "D=96"),
        ({"d": 256}, "D=256"),
        ({"dv": 64}, "Dv=64"),
        ({"kv_heads": 1}, "grouped heads"),
        ({"kv_heads": 2}, "grouped heads"),
        ({"window": (128, 0)}, "sliding window"),
        ({"causal": False, "window": (64, 64)}, "sliding window"),
        ({"scale": -0.125}, "must be > 0"),
    ],
)
def test_the_kernel_declines_what_it_does_not_run(change, reason):
    reason_given = support.problem_support(_problem(**change))
    assert reason_given is not None and reason in reason_given, f"{change}: {reason_given!r}"


@pytest.mark.device_independent
def test_a_window_that_hides_nothing_is_no_window():
    # check_inputs normalises a window covering every key away: the kernel takes the problem.
    assert support.problem_support(_problem(n=512, m=512, window=(4096, -1))) is None


@pytest.mark.device_independent
def test_the_switch_turns_it_off_before_any_device_query(monkeypatch):
    monkeypatch.setenv(route.ENV_SWITCH, "0")
    assert route.switch(torch.device("cuda", 0)) == f"${route.ENV_SWITCH}=0"
    assert not route.routed(_problem(), "forward")


@pytest.mark.device_independent
def test_never_off_cuda(monkeypatch):
    monkeypatch.setenv(route.ENV_SWITCH, "1")
    problem = dataclasses.replace(_problem(), device=torch.device("cpu"))
    assert "runs on CUDA" in route.switch(problem.device)
    assert not route.routed(problem, "forward")


def _route_everything(monkeypatch):
    """Every supported problem's forward routed to the Gluon kernel, whatever the device."""
    rule = (("gluon", lambda p: support.problem_support(p) is None),)
    monkeypatch.setattr(kernel_plan, "FORWARD_KINDS", rule)


@pytest.mark.device_independent
def test_the_plan_is_made_once_per_problem_and_carried_by_the_prepared_run(monkeypatch):
    """The registry's prepared run carries the plan its kernels run; a training call of the same
    problem reuses it instead of deciding again."""
    _route_everything(monkeypatch)
    decided = []
    real = kernel_plan.plan_kernels

    def counting(problem):
        decided.append(problem)
        return real(problem)

    monkeypatch.setattr("attnkit.triton.router.plan_kernels", counting)
    forget_plans()
    try:
        problem = _problem(n=128, m=128)
        from attnkit.triton import prepare

        prepared = prepare(problem)
        assert prepared.plan == kernel_plan.KernelPlan(forward="gluon", backward="plain")
        assert prepared.native_forward is None, "a Gluon forward has no native program"
        assert planned_kernels(problem).plan is prepared.plan
        assert planned_kernels(problem) is planned_kernels(problem)
        assert decided == [problem], f"decided {len(decided)} times"
    finally:
        forget_plans()


def test_a_run_with_an_explicit_config_never_routes(monkeypatch):
    """A tuner's run (explicit config or TMA choice) times the plain kernels whatever the plan
    of the problem says."""
    _route_everything(monkeypatch)
    called = []
    monkeypatch.setattr("attnkit.triton.router.planned_kernels", lambda problem: called.append(problem))
    from attnkit.triton.config import get_config

    gen = torch.Generator().manual_seed(0)
    kw = {"dtype": torch.float32, "device": DEVICE, "generator": gen}
    q, k, v = (make_tensor((1, 2, 40, 64), **kw) for _ in range(3))
    problem = check_inputs(q, k, v, False, None)
    config = get_config(problem.device, problem.dtype, problem.head_dim, problem.value_dim, problem.causal)
    for impl in (TritonImplementation(config), TritonImplementation(tma=False)):
        impl.forward(q, k, v, problem)
    assert not called, "an explicit config asked for the problem's plan"


@pytest.mark.device_independent
@pytest.mark.parametrize(
    "kinds",
    [{"forward": "gluon"}, {"forward": "split_kv"}, {"backward": "plain"}, {}],
)
def test_a_plan_names_known_kinds(kinds):
    assert kernel_plan.KernelPlan(**kinds)


@pytest.mark.device_independent
@pytest.mark.parametrize("kinds", [{"forward": "cudnn"}, {"backward": "gluon-soon"}])
def test_a_plan_rejects_an_unknown_kind(kinds):
    with pytest.raises(ValueError, match="expected one of"):
        kernel_plan.KernelPlan(**kinds)


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("layout", "expected"),
    [("contiguous", True), ("transposed", False), ("misaligned", False), ("sliced", False)],
)
def test_the_layout_rule(layout, expected):
    q = torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16)
    if layout == "transposed":  # (B, N, H, D) memory seen as (B, H, N, D)
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "misaligned":  # contiguous, base 2 bytes past an aligned address
        q = torch.zeros(1 + q.numel(), dtype=torch.bfloat16)[1:].view(q.shape)
    elif layout == "sliced":
        q = torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16)[..., :64]
    assert support.layout_ok(q, q, q) is expected, layout


_GPU_REASON = (
    gluon.unavailable_reason() if DEVICE.type == "cuda" else f"needs an sm_90 GPU; tests run on {DEVICE}"
)
needs_hopper = pytest.mark.skipif(_GPU_REASON is not None, reason=f"Gluon Hopper forward: {_GPU_REASON}")


@pytest.fixture
def gluon_calls(monkeypatch):
    """Counts the forwards that run on the Gluon kernel; every supported problem routed to it
    (all cells, no size floor: small and ragged shapes then check the wiring); fresh setups and
    plans before and after."""
    monkeypatch.setattr(route, "GLUON_MIN_SCORES", 0)
    every_cell = {(d, c): 1 for d in (64, 128) for c in (False, True)}
    monkeypatch.setattr(route, "routed_cells", lambda *_: every_cell)
    calls = []
    real = route.gluon_forward

    def counting(q, k, v, problem):
        calls.append(problem)
        return real(q, k, v, problem)

    monkeypatch.setattr("attnkit.triton.router.gluon_forward", counting)
    # Plans and attention()'s prepared runs made by earlier tests hold the routing of then.
    forget_plans()
    attnkit.api._forget_plans()
    yield calls
    forget_plans()
    attnkit.api._forget_plans()


@needs_hopper
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize(
    ("b", "h", "n", "m", "d", "causal"),
    [
        (2, 3, 1000, 1000, 128, True),
        (2, 3, 1000, 1000, 64, False),
        (1, 2, 300, 700, 64, True),
        (1, 2, 700, 300, 128, True),
        (1, 2, 2048, 2048, 128, False),
        (1, 2, 2048, 2048, 64, True),
    ],
)
def test_backend_triton_runs_the_gluon_forward_and_matches_the_oracle(
    gluon_calls, b, h, n, m, d, causal, dtype
):
    gen = torch.Generator().manual_seed(0)
    q = make_tensor((b, h, n, d), dtype=dtype, device=DEVICE, generator=gen)
    k, v = (make_tensor((b, h, m, d), dtype=dtype, device=DEVICE, generator=gen) for _ in range(2))
    grad_out = make_tensor((b, h, n, d), dtype=dtype, device=DEVICE, generator=gen)

    def run(q_, k_, v_):
        return attnkit.attention(q_, k_, v_, causal=causal, backend="triton")

    checks = compare_to_reference(run, q, k, v, causal=causal, scale=None, grad_out=grad_out)
    assert_close_to_reference(
        f"triton (Gluon forward) B={b} H={h} N={n} M={m} D={d} causal={causal} {dtype}", checks
    )
    assert gluon_calls, "the forward did not run on the Gluon kernel"
    with torch.no_grad():
        before = len(gluon_calls)
        out = run(q, k, v)
    assert len(gluon_calls) > before, "the inference forward did not run on the Gluon kernel"
    reference = compare_to_reference(lambda *_: out, q, k, v, causal=causal, scale=None)
    assert_close_to_reference(f"triton (Gluon forward, no grad) B={b} N={n} D={d} causal={causal}", reference)


@needs_hopper
def test_a_layout_the_kernel_does_not_read_runs_the_plain_forward(gluon_calls):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        make_tensor((1, 256, 2, 64), dtype=torch.bfloat16, device=DEVICE, generator=gen).transpose(1, 2)
        for _ in range(3)
    )
    problem = check_inputs(q, k, v, True, None)
    out, _lse = TritonImplementation().forward(q, k, v, problem)
    assert not gluon_calls, "a (B, N, H, D) layout reached the Gluon kernel"
    checks = compare_to_reference(lambda *_: out, q, k, v, causal=True, scale=None)
    assert_close_to_reference("plain forward, (B, N, H, D) layout", checks)


@needs_hopper
def test_the_switch_off_runs_the_plain_forward(gluon_calls, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        make_tensor((1, 2, 512, 128), dtype=torch.bfloat16, device=DEVICE, generator=gen) for _ in range(3)
    )
    problem = check_inputs(q, k, v, False, None)
    TritonImplementation().forward(q, k, v, problem)
    assert len(gluon_calls) == 1, "with the switch on, the forward should run on the Gluon kernel"
    monkeypatch.setenv(route.ENV_SWITCH, "0")
    forget_plans()
    out, _lse = TritonImplementation().forward(q, k, v, problem)
    assert len(gluon_calls) == 1, f"${route.ENV_SWITCH}=0 still ran the Gluon kernel"
    assert planned_kernels(problem).plan.forward == "plain"
    checks = compare_to_reference(lambda *_: out, q, k, v, causal=False, scale=None)
    assert_close_to_reference("plain forward with the Gluon switch off", checks)


def test_training_calls_run_the_plan_made_when_the_problem_was_prepared(monkeypatch):
    """attention() with gradients, twice: the kernels are planned once, on the first call."""
    decided = []
    real = kernel_plan.plan_kernels
    monkeypatch.setattr(
        "attnkit.triton.router.plan_kernels", lambda problem: decided.append(problem) or real(problem)
    )
    forget_plans()
    attnkit.api._forget_plans()
    try:
        gen = torch.Generator().manual_seed(0)
        kw = {"dtype": torch.float32, "device": DEVICE, "generator": gen}
        q, k, v = (make_tensor((1, 2, 24, 16), **kw).requires_grad_() for _ in range(3))
        for _ in range(2):
            attnkit.attention(q, k, v, causal=True, backend="triton").sum().backward()
        assert len(decided) == 1, f"planned {len(decided)} times"
    finally:
        forget_plans()
        attnkit.api._forget_plans()
