"""The scale tier's pieces: the blocked oracle equals the unblocked one, a block of rows sees
exactly its rows' keys, boundary problems straddle the switch they declare (triton's as its own
router decides), and a bad declaration is refused naming what is wrong."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attnkit.testing.blocked_oracle as blocked
from attnkit import DispatchBoundary, register_backend, unregister_backend
from attnkit.reference import visibility
from attnkit.registry import get_backend
from attnkit.testing import compare_to_reference
from attnkit.testing.scale import CPU_LIMITS, GPU_LIMITS, boundary_cases, ladder, ladder_lengths, tier
from attnkit.testing.strategies import AttentionCase

CASES = {
    "causal-gqa-n<m": AttentionCase.make(batch=2, q_heads=4, kv_heads=2, q_len=37, kv_len=53, head_dim=24,
                                         value_dim=40, causal=True, dtype=torch.bfloat16, seed=3),
    "window-n>m": AttentionCase.make(q_heads=3, q_len=70, kv_len=33, head_dim=16, causal=True, window=(5, 2),
                                     dtype=torch.float16, seed=4),
    "left-window-fp32": AttentionCase.make(batch=2, q_len=9, kv_len=90, head_dim=16, window=(50, -1), seed=5),
}  # fmt: skip


@pytest.mark.device_independent
@pytest.mark.parametrize("name", list(CASES))
def test_a_block_of_rows_sees_exactly_its_rows_keys(name):
    p = dataclasses.replace(CASES[name].problem, device=torch.device("cpu"))
    whole = visibility(p, torch.device("cpu"))
    for start, stop in ((0, 1), (3, min(11, p.q_len)), (p.q_len - 5, p.q_len)):
        block = blocked.rows_problem(p, p.batch, start, stop)
        assert torch.equal(visibility(block, torch.device("cpu")), whole[start:stop]), (start, stop)


@pytest.mark.device_independent
@pytest.mark.parametrize("name", list(CASES))
def test_the_rule_judges_the_same_in_blocks_as_in_one(name, monkeypatch):
    case = CASES[name]
    q, k, v, grad_out = case.tensors("cpu")

    def kernel(a, b, c):
        from attnkit import attention

        return attention(a, b, c, **case.kwargs, backend="tiled")

    whole = compare_to_reference(kernel, q, k, v, grad_out=grad_out, **case.kwargs)
    monkeypatch.setitem(blocked.BLOCK_SCORES, "cpu", 200)  # several batch slices and row blocks
    assert len(list(blocked.blocks(dataclasses.replace(case.problem, device=torch.device("cpu"))))) > 3
    parts = compare_to_reference(kernel, q, k, v, grad_out=grad_out, **case.kwargs)
    for one, split in zip(whole, parts, strict=True):
        assert one.quantity == split.quantity
        assert split.error == pytest.approx(one.error, rel=1e-9)  # float64 sums in another order
        # The yardstick differs by float32 summation order only.
        assert split.baseline_error == pytest.approx(one.baseline_error, rel=0.25, abs=1e-6), one.quantity
        assert split.bound == pytest.approx(one.bound, rel=0.25), one.quantity


@pytest.mark.device_independent
def test_the_cpu_ladder_reaches_1024_causal_and_the_gpu_ladder_16k():
    assert ladder_lengths(CPU_LIMITS.max_len, CPU_LIMITS.ladder_steps)[-1] == 1024
    assert any(c.problem.causal and c.problem.q_len == c.problem.kv_len == 1024 for c in ladder(CPU_LIMITS))
    gpu = tier(GPU_LIMITS)
    assert max(c.problem.q_len for c in gpu) == 16384
    assert max(c.problem.kv_len for c in gpu) >= 2**17
    assert max(c.problem.batch * c.problem.q_heads for c in gpu) > 65535
    assert {c.problem.head_dim for c in gpu} >= {3, 17, 59, 111, 256}


@pytest.mark.device_independent
def test_boundary_problems_straddle_the_declared_value():
    scores = DispatchBoundary("s", "scores", 2**20, {"q_len": 1000, "q_heads": 2})
    sizes = [
        c.problem.batch * c.problem.q_heads * c.problem.q_len * c.problem.kv_len
        for c in boundary_cases(scores)
    ]
    assert sizes[0] < 2**20 <= sizes[1] < sizes[2]
    rows = DispatchBoundary("n", "q_len", 17, {"kv_len": 300, "window": (4, 0), "causal": True})
    below, at, above = boundary_cases(rows)
    assert (below.problem.q_len, at.problem.q_len, above.problem.q_len) == (16, 17, 18)
    assert at.window == (4, 0) and at.problem.kv_len == 300


def _triton_path(problem) -> str:
    """The kernel the Triton path's own rules pick for ``problem`` on a GPU whose table routes
    every packaged Gluon cell (the device check left out: the CPU runs no Gluon kernel)."""
    from attnkit.triton.decode import use_split_kv
    from attnkit.triton.gluon.route import preferred
    from attnkit.triton.gluon.support import PASS_SUPPORT
    from attnkit.triton.launch import TMA_MIN_SCORES
    from attnkit.triton.plan import packaged_routed_cells

    if use_split_kv(problem):
        return "split-kv"
    cells = packaged_routed_cells()
    for pass_name, support in PASS_SUPPORT.items():
        routed = {(dim, causal): n for (name, dim, causal), n in cells.items() if name == pass_name}
        if support(problem) is None and preferred(problem, routed):
            return f"gluon {pass_name}"
    scores = problem.batch * problem.q_heads * problem.q_len * problem.kv_len
    return "plain, TMA" if scores >= TMA_MIN_SCORES else "plain"


def test_each_triton_boundary_is_where_its_router_switches():
    """The problems below and at each declared boundary take different kernels, as triton's own
    routing predicates decide (on the CPU: the split-KV rule counts one SM)."""
    boundaries = get_backend("triton").dispatch_boundaries
    assert len(boundaries) >= 6
    for boundary in boundaries:
        below, at, _ = (
            dataclasses.replace(c.problem, device=torch.device("cpu")) for c in boundary_cases(boundary)
        )
        assert _triton_path(below) != _triton_path(at), (boundary.name, _triton_path(below))


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "x", "axis": "rows", "at": 5}, "axis must be one of"),
        ({"name": "x", "axis": "q_len", "at": 1}, "at must be an int >= 2"),
        ({"name": "x", "axis": "q_len", "at": 8, "problem": {"heads": 2}}, "unknown fields ['heads']"),
        ({"name": "", "axis": "q_len", "at": 8}, "non-empty str"),
    ],
)
def test_a_bad_boundary_is_refused_naming_what_is_wrong(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message.replace("[", r"\[").replace("]", r"\]")):
        DispatchBoundary(**kwargs)


@pytest.mark.device_independent
def test_register_backend_takes_only_boundaries():
    def fn(q, k, v, *, causal, scale, window):
        return q

    with pytest.raises(TypeError, match=r"dispatch_boundaries must hold attnkit\.DispatchBoundary"):
        register_backend("bad-boundaries", fn, dispatch_boundaries=[("q_len", 5)])
    backend = register_backend("good-boundaries", fn, dispatch_boundaries=[DispatchBoundary("x", "q_len", 8)])
    try:
        assert backend.dispatch_boundaries[0].at == 8
    finally:
        unregister_backend("good-boundaries")
