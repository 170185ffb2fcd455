"""The Triton path takes any batch * q_heads the hardware can: every kernel runs on one grid
axis of (row blocks x batch x heads) programs, which CUDA allows up to 2**31 - 1."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DEVICE

import attnkit
from attnkit.inputs import check_inputs
from attnkit.testing import assert_close_to_reference, compare_to_reference, make_tensor

pytest.importorskip("triton", reason="the launch grid belongs to the Triton path")

from attnkit.triton import MAX_PROGRAMS, triton_problem_support
from attnkit.triton.launch import launch_setup


def _meta_problem(batch, heads, n, d=16):
    q = torch.empty(batch, heads, n, d, device="meta", dtype=torch.bfloat16)
    return check_inputs(q, q, q, True, None)


@pytest.mark.device_independent
def test_batch_times_heads_beyond_65535_is_one_axis_of_programs():
    problem = _meta_problem(8200, 16, 100)  # B * H = 131200 > 65535, the old axis-1 limit
    assert triton_problem_support(problem) is None
    setup = launch_setup(problem)
    cfg = setup.config
    expected = {
        "fwd": math.ceil(100 / cfg.fwd.block_m) * 8200 * 16,
        "dkdv": math.ceil(100 / cfg.dkdv.block_n) * 8200 * 16,
        "dq": math.ceil(100 / cfg.dq.block_m) * 8200 * 16,
    }
    got = {"fwd": setup.fwd_grid, "dkdv": setup.dkdv_grid, "dq": setup.dq_grid}
    assert got == {name: (count,) for name, count in expected.items()}, f"grids {got}, expected {expected}"


@pytest.mark.device_independent
def test_more_programs_than_the_grid_axis_holds_is_rejected_before_launch():
    problem = _meta_problem(2**16, 2**10, 2**10)  # 64 blocks of 16 rows x 2**26 heads = 2**32 programs
    reason = triton_problem_support(problem)
    assert reason is not None and str(MAX_PROGRAMS) in reason, reason


@pytest.mark.skipif(DEVICE.type != "cuda", reason="65536+ programs take minutes in the Triton interpreter")
@pytest.mark.skipif(
    "triton" not in attnkit.available_backends(DEVICE), reason="the Triton backend is unavailable here"
)
def test_batch_times_heads_beyond_65535_on_gpu():
    gen = torch.Generator().manual_seed(0)
    shape = (4100, 16, 16, 16)  # B * H = 65600
    q, k, v, grad_out = (
        make_tensor(shape, dtype=torch.bfloat16, device=DEVICE, generator=gen) for _ in range(4)
    )
    checks = compare_to_reference(
        lambda a, b, c: attnkit.attention(a, b, c, causal=True, backend="triton"),
        q, k, v, causal=True, scale=None, grad_out=grad_out,
    )  # fmt: skip
    assert_close_to_reference("triton with B * Hq = 65600", checks)
