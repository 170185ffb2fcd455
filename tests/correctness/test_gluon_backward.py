"""The Gluon Hopper backward (:mod:`attnkit.triton.gluon`): problems it declines (everywhere), the
H200's routed cells, its lowering for sm_90 (without a GPU), and on an sm_90 GPU each stage
against the oracle under the tolerance rule (the dK/dV pass with the portable dQ pass, then both
Gluon passes), for MHA and GQA, ragged lengths and N != M, and bitwise-equal gradients across
runs. Which problems the Triton path runs on it: tests/correctness/test_gluon_backward_plan.py."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import DEVICE, HALF_DTYPES, sm90_ptxas_report

from attnkit import UnsupportedProblemError
from attnkit.inputs import check_inputs
from attnkit.testing import assert_close_to_reference, compare_to_reference
from attnkit.triton import gluon
from attnkit.triton.gluon import backward_launch
from attnkit.triton.gluon.backward_launch import REGISTERS
from attnkit.triton.gluon.config import BackwardConfig, backward_configs, packaged_section, routed_cells
from attnkit.triton.gluon.support import backward_problem_support

#: The configs of the cells the backward is routed in on the H200 (its committed table).
H200 = packaged_section("nvidia-h200")
ROUTED_CELLS = backward_configs(H200)

_GPU_REASON = (
    gluon.unavailable_reason() if DEVICE.type == "cuda" else f"needs an sm_90 GPU; tests run on {DEVICE}"
)
needs_hopper = pytest.mark.skipif(_GPU_REASON is not None, reason=f"Gluon Hopper backward: {_GPU_REASON}")


def _problem(hq=2, hk=2, n=128, m=128, d=64, dtype=torch.bfloat16, causal=False, scale=None, window=None):
    b = 1
    q = torch.empty(b, hq, n, d, dtype=dtype, device="meta")
    k = torch.empty(b, hk, m, d, dtype=dtype, device="meta")
    return check_inputs(q, k, k, causal, scale, window)


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dtype": torch.float32}, "float16 or bfloat16"),
        ({"d": 96}, "D=96"),
        ({"window": (8, 0)}, "sliding window"),
        ({"scale": -0.1}, "must be > 0"),
    ],
)
def test_support_rule_names_what_it_declines(change, message):
    reason = backward_problem_support(_problem(**change))
    assert reason is not None and message in reason


@pytest.mark.device_independent
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_support_rule_takes_gqa_and_either_mask(d, causal):
    assert backward_problem_support(_problem(hq=4, hk=2, d=d, causal=causal)) is None


@pytest.mark.device_independent
def test_the_h200_table_routes_the_measured_cells_with_their_configs():
    assert routed_cells(H200, "backward") == {(d, c): 4096 for d in (64, 128) for c in (False, True)}
    assert ROUTED_CELLS[128, False] == BackwardConfig(dq_block_n=128)
    assert ROUTED_CELLS[64, True] == BackwardConfig(gluon_dq=False)
    assert ROUTED_CELLS[128, True] == BackwardConfig(dq_block_n=128, split_masked=True)
    assert "nvidia-h200" in H200["provenance_of"]["backward"]["source"]


@pytest.mark.device_independent
def test_the_h100_table_routes_no_backward():
    # Not measured there: the H100 keeps the plain backward.
    h100 = packaged_section("nvidia-h100-80gb-hbm3")
    assert routed_cells(h100, "backward") == {} and backward_configs(h100) == {}


@pytest.mark.device_independent
def test_declines_a_cpu_problem_before_any_kernel():
    q, k, v, o, do = (torch.randn(1, 2, 64, 64, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.zeros(1, 2, 64)
    with pytest.raises(UnsupportedProblemError, match="sm_90"):
        backward_launch.backward(q, k, v, o, do, lse)


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("float32", "float16 or bfloat16"),
        ("transposed", "contiguous"),
        ("lse-float16", "lse: expected contiguous float32"),
    ],
)
def test_names_what_it_declines_before_the_device(change, message):
    """Problem and layout are checked (on any machine) before the device is asked."""
    dtype = torch.float32 if change == "float32" else torch.bfloat16
    q, k, v, o, do = (torch.randn(1, 2, 64, 64, dtype=dtype) for _ in range(5))
    if change == "transposed":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    lse = torch.zeros(1, 2, 64, dtype=torch.float16 if change == "lse-float16" else torch.float32)
    with pytest.raises(UnsupportedProblemError, match=message):
        backward_launch.backward(q, k, v, o, do, lse)


_API_REASON = None
if gluon.forward is None:
    _API_REASON = gluon.unavailable_reason()
else:
    import triton

    from attnkit.triton.gluon import hopper_backward

    if not triton.__version__.startswith(gluon.GLUON_API_VERSION):
        _API_REASON = f"triton {triton.__version__}; the kernel targets {gluon.GLUON_API_VERSION}x"
    elif type(hopper_backward._rows_range).__name__ == "InterpretedFunction":
        _API_REASON = "kernels built for the interpreter; set TRITON_INTERPRET=0 to compile for sm_90"


# Not device_independent, though it launches nothing: the CPU CI interprets the kernels (and its
# Triton need not be the one they target), so the GPU run is where they compile for sm_90.
@pytest.mark.skipif(_API_REASON is not None, reason=f"Gluon API: {_API_REASON}")
@pytest.mark.parametrize("kernel", ["dkdv", "dq"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_compiles_for_sm90_to_wgmma_and_tma(d, causal, kernel, tmp_path):
    """Without a GPU: each pass of each routed config lowers for sm_90 to TMA copies, wgmma,
    mbarriers and register reallocation; the dQ pass and the dK/dV pass at D = 64 without spills."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from attnkit.triton.gluon.hopper_backward import _gluon_bwd_dkdv_kernel, _gluon_bwd_dq_kernel

    cfg = ROUTED_CELLS[(d, causal)]
    fn = _gluon_bwd_dkdv_kernel if kernel == "dkdv" else _gluon_bwd_dq_kernel
    rows_q, rows_k = (cfg.block_m, cfg.block_n) if kernel == "dkdv" else (cfg.dq_block_m, cfg.dq_block_n)
    consumer_regs, producer_regs, maxnreg = REGISTERS[2]
    layouts = [gl.NVMMASharedLayout.get_default_for([rows, d], gl.bfloat16) for rows in (rows_q, rows_k)]
    signature = {}
    for name in fn.arg_names:
        if name in ("q_desc", "do_desc"):
            signature[name] = f"tensordesc<bf16[{rows_q}, {d}],{layouts[0]!r}>"
        elif name in ("k_desc", "v_desc"):
            signature[name] = f"tensordesc<bf16[{rows_k}, {d}],{layouts[1]!r}>"
        elif name in ("lse_ptr", "delta_ptr"):
            signature[name] = "*fp32"
        elif name.endswith("_ptr"):
            signature[name] = "*bf16"
        elif name in ("qk_scale", "scale"):
            signature[name] = "fp32"
        elif not name.isupper():
            signature[name] = "i32"
    constants = dict(
        HEAD_DIM=d, BLOCK_M=rows_q, BLOCK_N=rows_k, STAGES=cfg.stages if kernel == "dkdv" else cfg.dq_stages,
        CAUSAL=causal, CONSUMERS=2, CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs,
    )  # fmt: skip
    if kernel == "dkdv":
        constants["SPLIT_MASKED"] = cfg.split_masked
    signature |= dict.fromkeys(constants, "constexpr")
    compiled = triton.compile(
        GluonASTSource(fn, signature, constants),
        target=GPUTarget("cuda", 90, 128),
        options=dict(num_warps=4, maxnreg=maxnreg),
    )
    ptx = compiled.asm["ptx"]
    expected = {
        "wgmma.mma_async.sync.aligned.m64n": "warpgroup MMA",
        "cp.async.bulk.tensor.2d": "TMA copies",
        "mbarrier.try_wait.parity": "mbarrier waits",
        f"setmaxnreg.inc.sync.aligned.u32 \t{consumer_regs}": "consumers' registers raised",
        f"setmaxnreg.dec.sync.aligned.u32 \t{producer_regs}": "producer's registers lowered",
    }
    missing = [f"{what} ({pattern!r})" for pattern, what in expected.items() if pattern not in ptx]
    assert not missing, f"the sm_90 PTX lacks: {', '.join(missing)}"
    assert compiled.metadata.shared <= 227 * 1024, f"{compiled.metadata.shared} bytes of shared memory"
    report = sm90_ptxas_report(ptx, tmp_path)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", report)]
    if kernel == "dq" or d == 64:
        # The D = 128 dK/dV pass spills a little at 64 query rows (ptxas); its timing is what
        # ROUTED_CELLS weighs.
        assert spills == [0], f"ptxas spills {spills} bytes ({kernel}, D={d}, causal={causal})"


class _GluonBackward(torch.autograd.Function):
    """The portable forward, then :func:`backward_launch.backward` with ``config``."""

    @staticmethod
    def forward(ctx, q, k, v, causal, config):
        from attnkit.triton.launch import attention_forward, launch_setup

        out, lse = attention_forward(q, k, v, launch_setup(check_inputs(q, k, v, causal, None)))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.config = causal, config
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grads = backward_launch.backward(
            q, k, v, out, grad_out.contiguous(), lse, causal=ctx.causal, config=ctx.config
        )
        return (*grads, None, None)


STAGES = {
    "dkdv": BackwardConfig(gluon_dq=False),
    "dkdv+dq": BackwardConfig(),
    "dkdv+dq-n128": BackwardConfig(dq_block_n=128),
    "3wg": BackwardConfig(block_m=32, consumers=3, dq_consumers=3),
    "split-masked": BackwardConfig(dq_block_n=128, split_masked=True),
}


@needs_hopper
@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize(
    ("b", "hq", "hk", "n", "m"),
    [(1, 4, 4, 1000, 1000), (2, 4, 2, 777, 777), (1, 2, 2, 300, 517), (1, 2, 1, 517, 300), (1, 2, 2, 64, 1)],
    ids=["mha", "gqa", "n<m", "n>m-mqa", "one-key"],
)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_gradients_pass_the_tolerance_rule(d, causal, dtype, b, hq, hk, n, m, stage):
    if stage == "3wg" and d != 64:
        pytest.skip("three consumer warpgroups fit D = 64 only")
    gen = torch.Generator(device=DEVICE).manual_seed(n * 7 + m)
    q = torch.randn(b, hq, n, d, dtype=dtype, device=DEVICE, generator=gen)
    k = torch.randn(b, hk, m, d, dtype=dtype, device=DEVICE, generator=gen)
    v = torch.randn(b, hk, m, d, dtype=dtype, device=DEVICE, generator=gen)
    grad_out = torch.randn(b, hq, n, d, dtype=dtype, device=DEVICE, generator=gen)
    config = STAGES[stage]
    checks = compare_to_reference(
        lambda a, b_, c: _GluonBackward.apply(a, b_, c, causal, config),
        q, k, v, causal=causal, scale=None, grad_out=grad_out,
    )  # fmt: skip
    assert_close_to_reference(f"gluon backward {stage} D={d} causal={causal} {dtype}", checks)


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_gradients_are_bitwise_repeatable(d, causal):
    from attnkit.triton.launch import attention_forward, launch_setup

    gen = torch.Generator(device=DEVICE).manual_seed(1)
    bf16 = torch.bfloat16
    q, grad_out = (torch.randn(2, 8, 2048, d, dtype=bf16, device=DEVICE, generator=gen) for _ in range(2))
    k, v = (torch.randn(2, 4, 2048, d, dtype=bf16, device=DEVICE, generator=gen) for _ in range(2))
    out, lse = attention_forward(q, k, v, launch_setup(check_inputs(q, k, v, causal, None)))
    config = dataclasses.replace(BackwardConfig(), dq_block_n=128)
    first = backward_launch.backward(q, k, v, out, grad_out, lse, causal=causal, config=config)
    second = backward_launch.backward(q, k, v, out, grad_out, lse, causal=causal, config=config)
    for name, a, b in zip(("dq", "dk", "dv"), first, second, strict=True):
        assert torch.equal(a, b), f"{name} differs between two runs"
        assert math.isfinite(a.float().abs().max().item()), f"{name} is not finite"
