"""Which backwards of backend "triton" run on the Gluon Hopper kernel (CPU, white-box: a fake
sm_90 device whose table section routes some cells): the plan picks it exactly in the routed
cells, falls back for the problems, devices and layouts it does not take, ``$ATTNKIT_GLUON=0``
turns it off, and a training call runs the plan made once for its problem; on an sm_90 GPU,
training through it against the oracle."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, HALF_DTYPES

import attnkit
import attnkit.triton.gluon as gluon
from attnkit.inputs import check_inputs
from attnkit.testing import assert_close_to_reference, compare_to_reference, make_tensor
from attnkit.triton import PlannedKernels, forget_plans
from attnkit.triton import plan as kernel_plan
from attnkit.triton.gluon import route
from attnkit.triton.gluon.config import packaged_section
from attnkit.triton.launch import attention_backward, launch_setup

#: A GPU's section: the backward routed at D=64 without a mask from N=4096, and at D=128 causal
#: from N=8192; the forward nowhere.
FAKE_SECTION = {
    "backward": {"d64-full": {"gluon_dq": False}, "d128-causal": {"dq_block_n": 128, "split_masked": True}},
    "routed": {"backward": {"d64-full": 4096, "d128-causal": 8192}},
}
ROUTED = {(64, False): 4096, (128, True): 8192}


@pytest.fixture
def sm90(monkeypatch):
    """The problems' device looks like an sm_90 GPU with the section ``sm90.section``."""

    class Device:
        section = FAKE_SECTION

    monkeypatch.delenv(route.ENV_SWITCH, raising=False)
    monkeypatch.setattr(route, "device_support", lambda device: None)
    monkeypatch.setattr(route, "device_section", lambda device: Device.section)
    forget_plans()
    yield Device
    forget_plans()


def _problem(b=4, n=8192, m=None, d=128, causal=True, dtype=torch.bfloat16, kv_heads=None, dv=None, **kw):
    """A validated problem from meta tensors (B * H * D = b * 2048): no memory, no device."""
    h = 2048 // d
    q = torch.empty(b, h, n, d, dtype=dtype, device="meta")
    k = torch.empty(b, kv_heads or h, m or n, d, dtype=dtype, device="meta")
    v = torch.empty(b, kv_heads or h, m or n, dv or d, dtype=dtype, device="meta")
    return check_inputs(q, k, v, causal, kw.pop("scale", None), **kw)


@pytest.mark.device_independent
@pytest.mark.parametrize("n", [2048, 4096, 8192, 16384])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_the_plan_runs_the_gluon_backward_exactly_in_the_routed_cells(sm90, d, causal, n):
    plan = kernel_plan.plan_kernels(_problem(b=2 if n == 16384 else 4, n=n, d=d, causal=causal))
    floor = ROUTED.get((d, causal))
    expected = "gluon" if floor is not None and n >= floor else "plain"
    assert plan.backward == expected, f"D={d} causal={causal} N={n}: {plan}"
    assert plan.forward == "plain", "the section routes no forward"


@pytest.mark.device_independent
def test_grouped_heads_run_the_gluon_backward_but_not_the_gluon_forward(sm90):
    sm90.section = {**FAKE_SECTION, "routed": {**FAKE_SECTION["routed"], "forward": {"d128-causal": 1}}}
    mha = kernel_plan.plan_kernels(_problem())
    gqa = kernel_plan.plan_kernels(_problem(kv_heads=4))
    assert mha == kernel_plan.KernelPlan(forward="gluon", backward="gluon")
    assert gqa == kernel_plan.KernelPlan(forward="plain", backward="gluon")


@pytest.mark.device_independent
@pytest.mark.parametrize(
    "change",
    [
        {"dtype": torch.float32},
        {"d": 96},
        {"dv": 64},
        {"window": (1024, 0)},
        {"scale": -0.1},
        {"b": 1, "n": 1024, "m": 8192},  # a routed cell, but N below its floor
        {"b": 1, "n": 8192, "m": 64},  # N past the floor, but too few scores (host-bound)
    ],
)
def test_problems_the_gluon_backward_does_not_take_keep_the_plain_one(sm90, change):
    problem = _problem(**change)
    assert kernel_plan.plan_kernels(problem).backward == "plain", problem.describe()


@pytest.mark.device_independent
def test_the_switch_turns_it_off(sm90, monkeypatch):
    assert kernel_plan.plan_kernels(_problem()).backward == "gluon"
    monkeypatch.setenv(route.ENV_SWITCH, "0")
    assert kernel_plan.plan_kernels(_problem()).backward == "plain"


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("gpu", "routes"), [("nvidia-h200", True), ("nvidia-h100-80gb-hbm3", False), (None, False)]
)
def test_each_gpu_routes_what_its_table_measured(sm90, gpu, routes):
    """The H200's table routes the backward from N=4096; the H100's has no backward cells (not
    measured there) and a GPU without a table routes nothing."""
    sm90.section = packaged_section(gpu) if gpu else {}
    for d in (64, 128):
        for causal in (False, True):
            plan = kernel_plan.plan_kernels(_problem(n=8192, d=d, causal=causal))
            assert (plan.backward == "gluon") is routes, f"{gpu} D={d} causal={causal}: {plan}"


@pytest.mark.device_independent
def test_never_off_cuda(monkeypatch):
    monkeypatch.delenv(route.ENV_SWITCH, raising=False)
    monkeypatch.setattr(route, "device_section", lambda device: FAKE_SECTION)
    assert not route.routed(_problem(), "backward"), "a meta (non-CUDA) device routed the backward"


@pytest.fixture
def every_backward(monkeypatch):
    """Every problem's backward planned on the Gluon kernel, which records its calls and runs
    the plain backward (the CPU cannot run the Gluon kernel): the wiring, not the kernel."""
    monkeypatch.setattr(kernel_plan, "BACKWARD_KINDS", (("gluon", lambda problem: True),))
    calls = []

    def recording(grad_out, q, k, v, out, lse, problem):
        calls.append(problem)
        return attention_backward(grad_out, q, k, v, out, lse, launch_setup(problem))

    monkeypatch.setattr("attnkit.triton.router.gluon_backward", recording)
    forget_plans()
    attnkit.api._forget_plans()
    yield calls
    forget_plans()
    attnkit.api._forget_plans()


def _tensors(layout: str):
    """q, k, v, the plain forward's out and lse, and grad_out, one of them in ``layout``."""
    from attnkit.triton.launch import attention_forward

    gen = torch.Generator().manual_seed(0)
    kw = {"dtype": torch.float32, "device": DEVICE, "generator": gen}
    q, k, v, grad_out = (make_tensor((1, 2, 32, 16), **kw) for _ in range(4))
    out, lse = attention_forward(q, k, v, launch_setup(check_inputs(q, k, v, False, None)))
    if layout == "grad_out transposed":
        grad_out = grad_out.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "grad_out expanded":  # what out.sum().backward() hands the backward
        grad_out = torch.ones(1, 1, 1, 1, dtype=q.dtype, device=DEVICE).expand(q.shape)
    elif layout == "q misaligned":
        q = torch.zeros(1 + q.numel(), dtype=q.dtype, device=DEVICE)[1:].view(q.shape).copy_(q)
    elif layout == "lse sliced":
        lse = torch.zeros(1, 2, 64, dtype=lse.dtype, device=DEVICE)[..., ::2].copy_(lse)
    return q, k, v, out, grad_out, lse


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("layout", "runs_gluon"),
    [
        ("contiguous", True),
        ("grad_out transposed", False),
        ("grad_out expanded", False),
        ("q misaligned", False),
        ("lse sliced", False),
    ],
)
def test_a_layout_the_kernel_does_not_read_runs_the_plain_backward(every_backward, layout, runs_gluon):
    q, k, v, out, grad_out, lse = _tensors(layout)
    problem = check_inputs(q, k, v, False, None)
    planned = PlannedKernels(problem)
    assert planned.plan.backward == "gluon"
    grads = planned.backward(grad_out, q, k, v, out, lse, problem)
    assert (len(every_backward) == 1) is runs_gluon, f"{layout}: {len(every_backward)} Gluon calls"
    assert [tuple(g.shape) for g in grads] == [tuple(q.shape), tuple(k.shape), tuple(v.shape)]


@pytest.mark.device_independent
def test_training_calls_run_the_planned_gluon_backward_without_planning_again(every_backward, monkeypatch):
    decided = []
    real = kernel_plan.plan_kernels
    monkeypatch.setattr("attnkit.triton.router.plan_kernels", lambda p: decided.append(p) or real(p))
    gen = torch.Generator().manual_seed(0)
    kw = {"dtype": torch.float32, "device": DEVICE, "generator": gen}
    q, k, v = (make_tensor((1, 2, 24, 16), **kw).requires_grad_() for _ in range(3))
    grad_out = make_tensor((1, 2, 24, 16), **kw)
    for _ in range(2):
        attnkit.attention(q, k, v, causal=True, backend="triton").backward(grad_out)
    assert len(decided) == 1, f"planned {len(decided)} times"
    assert len(every_backward) == 2, f"{len(every_backward)} of 2 backwards ran on the Gluon kernel"


@pytest.mark.device_independent
def test_the_gluon_backward_keeps_the_determinism_promise(every_backward):
    """Under torch.use_deterministic_algorithms(True) the Triton path (whose backward is Gluon or
    plain, both without atomics) stays a candidate and runs the planned backward."""
    from attnkit.registry import get_backend

    assert get_backend("triton").is_deterministic(DEVICE), (
        f"triton does not declare deterministic on {DEVICE}"
    )
    gen = torch.Generator().manual_seed(1)
    kw = {"dtype": torch.float32, "device": DEVICE, "generator": gen}
    q, k, v = (make_tensor((1, 2, 24, 16), **kw).requires_grad_() for _ in range(3))
    grad_out = make_tensor((1, 2, 24, 16), **kw)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        attnkit.attention(q, k, v, causal=False, backend="triton").backward(grad_out)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert every_backward, "the planned Gluon backward did not run under deterministic algorithms"


_GPU_REASON = (
    gluon.unavailable_reason() if DEVICE.type == "cuda" else f"needs an sm_90 GPU; tests run on {DEVICE}"
)
needs_hopper = pytest.mark.skipif(_GPU_REASON is not None, reason=f"Gluon Hopper backward: {_GPU_REASON}")


@pytest.fixture
def gluon_backward_calls(monkeypatch):
    """Counts the backwards that run on the Gluon kernel; every supported problem routed to it
    (all cells, no size floor: small and ragged shapes then check the wiring)."""
    monkeypatch.delenv(route.ENV_SWITCH, raising=False)
    monkeypatch.setattr(route, "GLUON_MIN_SCORES", 0)
    every_cell = {(d, c): 1 for d in (64, 128) for c in (False, True)}
    monkeypatch.setattr(route, "routed_cells", lambda *_: every_cell)
    calls = []
    real = route.gluon_backward

    def counting(grad_out, q, k, v, out, lse, problem):
        calls.append(problem)
        return real(grad_out, q, k, v, out, lse, problem)

    monkeypatch.setattr("attnkit.triton.router.gluon_backward", counting)
    forget_plans()
    attnkit.api._forget_plans()
    yield calls
    forget_plans()
    attnkit.api._forget_plans()


@needs_hopper
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize(
    ("b", "h", "hk", "n", "m", "d", "causal"),
    [
        (2, 4, 4, 1000, 1000, 128, True),
        (2, 4, 2, 1000, 1000, 64, False),
        (1, 4, 1, 300, 700, 64, True),
        (1, 2, 2, 700, 300, 128, True),
        (1, 2, 2, 2048, 2048, 128, False),
    ],
)
def test_backend_triton_trains_through_the_gluon_backward_and_matches_the_oracle(
    gluon_backward_calls, b, h, hk, n, m, d, causal, dtype
):
    gen = torch.Generator().manual_seed(0)
    q = make_tensor((b, h, n, d), dtype=dtype, device=DEVICE, generator=gen)
    k, v = (make_tensor((b, hk, m, d), dtype=dtype, device=DEVICE, generator=gen) for _ in range(2))
    grad_out = make_tensor((b, h, n, d), dtype=dtype, device=DEVICE, generator=gen)

    def run(q_, k_, v_):
        return attnkit.attention(q_, k_, v_, causal=causal, backend="triton")

    checks = compare_to_reference(run, q, k, v, causal=causal, scale=None, grad_out=grad_out)
    assert_close_to_reference(
        f"triton (Gluon backward) B={b} H={h}/{hk} N={n} M={m} D={d} causal={causal} {dtype}", checks
    )
    assert gluon_backward_calls, "the backward did not run on the Gluon kernel"


@needs_hopper
def test_the_switch_off_trains_through_the_plain_backward(gluon_backward_calls, monkeypatch):
    monkeypatch.setenv(route.ENV_SWITCH, "0")
    forget_plans()
    attnkit.api._forget_plans()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        make_tensor((1, 2, 512, 128), dtype=torch.bfloat16, device=DEVICE, generator=gen).requires_grad_()
        for _ in range(3)
    )
    attnkit.attention(q, k, v, backend="triton").backward(torch.ones_like(q))
    assert not gluon_backward_calls, f"${route.ENV_SWITCH}=0 still ran the Gluon backward"
