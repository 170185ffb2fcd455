"""The Gluon Hopper forward: inputs it declines (everywhere), and on an sm_90 GPU its output
and log-sum-exp under the tolerance rule. The log-sum-exp is checked the way a training call
uses it: attnkit's Triton backward runs from the Gluon forward's (o, lse), and the gradients
must pass the rule too."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import DEVICE, HALF_DTYPES, sm90_ptxas_report

import attnkit.triton.gluon as gluon
from attnkit import UnsupportedProblemError
from attnkit.flash_autograd import flash_attention
from attnkit.inputs import check_inputs
from attnkit.testing import assert_close_to_reference, compare_to_reference, make_tensor
from attnkit.triton.gluon.config import forward_config, forward_configs, packaged_section

pytestmark = pytest.mark.skipif(
    gluon.forward is None, reason=f"attnkit.triton.gluon: {gluon.unavailable_reason()}"
)

_GPU_REASON = (
    gluon.unavailable_reason() if DEVICE.type == "cuda" else f"needs an sm_90 GPU; tests run on {DEVICE}"
)
needs_hopper = pytest.mark.skipif(_GPU_REASON is not None, reason=f"Gluon Hopper forward: {_GPU_REASON}")


def _shipped(d: int, causal: bool):
    """The config of a cell as shipped: this GPU's table on a GPU, else the H100's (where the
    kernel was first measured), for compiling ahead of time."""
    if DEVICE.type == "cuda":
        return forward_config(DEVICE, d, causal)
    return forward_configs(packaged_section("nvidia-h100-80gb-hbm3"))[d, causal]


_API_REASON = None
if gluon.forward is not None:
    import triton

    from attnkit.triton.gluon import schedule

    if not triton.__version__.startswith(gluon.GLUON_API_VERSION):
        _API_REASON = f"triton {triton.__version__}; the kernel targets {gluon.GLUON_API_VERSION}x"
    elif type(schedule.query_tile).__name__ == "InterpretedFunction":
        # tests/conftest.py sets TRITON_INTERPRET=1 on a machine without CUDA unless it is set.
        _API_REASON = "kernels built for the interpreter; set TRITON_INTERPRET=0 to compile for sm_90"


# Not device_independent, though it launches nothing: the CPU CI interprets the kernels (and its
# Triton need not be the one they target), so the GPU run is where they compile for sm_90.
@pytest.mark.skipif(_API_REASON is not None, reason=f"Gluon API: {_API_REASON}")
@pytest.mark.parametrize("variant", ["grid", "persistent", "3wg"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_compiles_for_sm90_to_what_it_is_meant_to_be(d, causal, variant, tmp_path):
    """Without a GPU: the kernel lowers for sm_90 to TMA copies, wgmma, mbarriers and register
    reallocation (the shipped config with the persistent grid off and on, and three consumer
    warpgroups), without register spills, except the persistent D=128 causal kernel, for which
    ptxas reports some (the config table keeps it off)."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from attnkit.triton.gluon.hopper_forward import _gluon_fwd_kernel

    changes = VARIANTS[variant] if variant != "grid" else {"persistent": False}
    cfg = dataclasses.replace(_shipped(d, causal), **changes)
    layouts = [
        gl.NVMMASharedLayout.get_default_for([rows, d], gl.bfloat16) for rows in (cfg.block_m, cfg.block_n)
    ]
    blocks = (cfg.block_m, cfg.block_n, cfg.block_n)
    signature = {
        name: f"tensordesc<bf16[{rows}, {d}],{layout!r}>"
        for name, rows, layout in zip(
            ("q_desc", "k_desc", "v_desc"), blocks, (layouts[0], layouts[1], layouts[1]), strict=True
        )
    }
    signature |= {"out_ptr": "*bf16", "lse_ptr": "*fp32", "q_len": "i32", "kv_len": "i32"}
    signature |= {"causal_offset": "i32", "n_bh": "i32", "qk_scale": "fp32"}
    constants = dict(
        HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CAUSAL=causal,
        OVERLAP=cfg.overlap, PINGPONG=cfg.pingpong, PERSISTENT=cfg.persistent, CONSUMERS=cfg.consumers,
        CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs,
    )  # fmt: skip
    signature |= dict.fromkeys(constants, "constexpr")
    kernel = triton.compile(
        GluonASTSource(_gluon_fwd_kernel, signature, constants),
        target=GPUTarget("cuda", 90, 128),
        options=dict(num_warps=4, maxnreg=cfg.maxnreg),
    )
    ptx = kernel.asm["ptx"]
    expected = {
        "wgmma.mma_async.sync.aligned.m64n": "warpgroup MMA",
        "cp.async.bulk.tensor.2d": "TMA copies",
        "mbarrier.try_wait.parity": "mbarrier waits",
        f"setmaxnreg.inc.sync.aligned.u32 \t{cfg.consumer_regs}": "consumers' registers raised",
        f"setmaxnreg.dec.sync.aligned.u32 \t{cfg.producer_regs}": "producer's registers lowered",
    }
    missing = [f"{what} ({pattern!r})" for pattern, what in expected.items() if pattern not in ptx]
    assert not missing, f"the sm_90 PTX lacks: {', '.join(missing)}"
    assert kernel.metadata.shared <= 227 * 1024, f"{kernel.metadata.shared} bytes of shared memory"
    report = sm90_ptxas_report(ptx, tmp_path)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", report)]
    if not (variant == "persistent" and causal and d == 128):
        assert spills == [0], f"ptxas spills {spills} bytes (D={d} causal={causal} {variant}: {cfg})"


def _qkv(b=1, h=2, n=128, m=128, d=64, dtype=torch.bfloat16, device=DEVICE):
    return (torch.randn(b, h, rows, d, dtype=dtype, device=device) for rows in (n, m, m))


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"dtype": torch.float32}, UnsupportedProblemError, "float16 or bfloat16"),
        ({"d": 96}, UnsupportedProblemError, "D=96"),
        ({"kv_heads": 1}, UnsupportedProblemError, "no GQA"),
        ({"transpose": True}, UnsupportedProblemError, "contiguous"),
        ({"scale": -0.1}, UnsupportedProblemError, "scale must be"),
        ({"scale": math.nan}, UnsupportedProblemError, "scale must be"),
        ({"causal": 1}, TypeError, "causal"),
        ({"shape": (2, 128, 64)}, ValueError, "4-D"),
    ],
)
def test_declines_before_any_kernel(change, error, message):
    q, k, v = _qkv(d=change.get("d", 64), dtype=change.get("dtype", torch.bfloat16), device="cpu")
    if "kv_heads" in change:
        k, v = k[:, :1].contiguous(), v[:, :1].contiguous()
    if change.get("transpose"):
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    if "shape" in change:
        q = q.reshape(change["shape"])
    with pytest.raises(error, match=message):
        gluon.forward(q, k, v, change.get("causal", False), change.get("scale", 0.125))


@pytest.mark.device_independent
def test_declines_the_cpu():
    with pytest.raises(UnsupportedProblemError, match="runs on CUDA"):
        gluon.forward(*_qkv(device="cpu"), causal=False, scale=0.125)


class _GluonForwardTritonBackward:
    """The Gluon forward under attnkit's shared autograd function, with the Triton backward."""

    op_name = None

    def __init__(self, config):
        from attnkit.triton import TritonImplementation

        self.triton = TritonImplementation()
        self.config = config

    def forward(self, q, k, v, problem):
        return gluon.forward(q, k, v, problem.causal, problem.scale, config=self.config)

    def backward(self, grad_out, q, k, v, out, lse, problem):
        return self.triton.backward(grad_out, q, k, v, out, lse, problem)


#: The shipped configs, and the options a config may switch on (each runs other code).
#: Two consumer warpgroups on the 12-warp register budget (the persistent grid is built on it).
TWO_WARPGROUPS = {"consumers": 2, "consumer_regs": 240, "producer_regs": 24, "maxnreg": 168}
VARIANTS = {
    "shipped": {},
    "pingpong": {**TWO_WARPGROUPS, "pingpong": True},
    "persistent": {**TWO_WARPGROUPS, "persistent": True},
    # Three consumer warpgroups (a 192-row tile): 16 warps, 3 x 160 + 32 registers.
    "3wg": {
        "consumers": 3,
        "block_n": 64,
        "stages": 4,
        "pingpong": False,
        "persistent": False,
        "consumer_regs": 160,
        "producer_regs": 32,
        "maxnreg": 128,
    },
}


@needs_hopper
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize(
    ("b", "h", "n", "m", "d", "causal", "magnitude"),
    [
        (1, 2, 128, 128, 64, False, "unit"),
        (2, 3, 1000, 1000, 128, True, "unit"),  # ragged: the last tiles run past the rows
        (2, 3, 1000, 1000, 64, False, "unit"),
        (1, 2, 300, 700, 128, True, "unit"),  # M > N: bottom-right diagonal
        (1, 2, 700, 300, 64, True, "unit"),  # N > M: the first 400 rows see no key
        (1, 2, 1, 257, 128, False, "unit"),
        (1, 1, 4099, 4099, 128, True, "unit"),
        (1, 2, 512, 512, 128, True, "large"),  # large logits: a missing max-shift overflows
        (1, 2, 512, 640, 64, False, "outliers"),
    ],
)
def test_matches_the_oracle_with_the_triton_backward(b, h, n, m, d, causal, magnitude, dtype, variant):
    gen = torch.Generator().manual_seed(0)
    shape_q, shape_kv = (b, h, n, d), (b, h, m, d)
    q = make_tensor(shape_q, dtype=dtype, device=DEVICE, generator=gen, magnitude=magnitude)
    k, v = (make_tensor(shape_kv, dtype=dtype, device=DEVICE, generator=gen) for _ in range(2))
    grad_out = make_tensor(shape_q, dtype=dtype, device=DEVICE, generator=gen)
    scale = 1.0 / math.sqrt(d)
    impl = _GluonForwardTritonBackward(dataclasses.replace(_shipped(d, causal), **VARIANTS[variant]))

    def run(q_, k_, v_):
        return flash_attention(impl, q_, k_, v_, check_inputs(q_, k_, v_, causal, scale))

    checks = compare_to_reference(run, q, k, v, causal=causal, scale=scale, grad_out=grad_out)
    assert_close_to_reference(
        f"gluon {variant} B={b} H={h} N={n} M={m} D={d} causal={causal} {dtype}", checks
    )


@needs_hopper
def test_lse_is_natural_log_with_inf_for_rows_that_see_nothing():
    torch.manual_seed(0)
    q, k, v = _qkv(n=300, m=100, d=64)
    _, lse = gluon.forward(q, k, v, True, 0.125)
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.125
    rows, cols = torch.arange(300, device=DEVICE)[:, None], torch.arange(100, device=DEVICE)[None, :]
    expected = s.masked_fill(cols > rows - 200, -math.inf).logsumexp(-1)
    expected = torch.where(torch.isneginf(expected), math.inf, expected)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 300)
    assert torch.isinf(lse[..., :200]).all(), "rows before the diagonal must store +inf"
    err = (lse[..., 200:].double() - expected[..., 200:]).abs().max().item()
    assert err <= 1e-4, f"log-sum-exp differs from the float64 one by {err:.2e} (natural log expected)"
