"""The Triton path's padded head dims (:mod:`attnkit.triton.padding`): which dims are padded to
what, that the support check no longer declines them on CUDA, and that padded problems return
the oracle's output and gradients with the caller's scale.

The padding rule does not depend on the device, so the CPU interpreter runs the same padded
kernels a GPU does; shapes stay small there. ``test_padded_head_dims_match_reference_on_gpu``
runs larger shapes on a CUDA GPU only.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import DEVICE

import attnkit
from attnkit import attention
from attnkit.inputs import check_inputs
from attnkit.testing import assert_close_to_reference, compare_to_reference
from attnkit.testing.strategies import AttentionCase

_UNAVAILABLE = (
    "triton is not installed"
    if "triton" not in attnkit.backend_names()
    else attnkit.unavailable_reason("triton", DEVICE)
)
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"triton on {DEVICE}: {_UNAVAILABLE}")

from attnkit.triton import TritonImplementation, prepare, triton_problem_support  # noqa: E402
from attnkit.triton.config import padded_dim  # noqa: E402
from attnkit.triton.decode import use_split_kv  # noqa: E402
from attnkit.triton.padding import padded_attention, padded_dims, padded_problem  # noqa: E402

_16BIT = (torch.float16, torch.bfloat16)


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("dtype", "dims", "expected"),
    [
        (torch.float16, (59, 59), (64, 64)),  # 118-byte rows -> 128
        (torch.bfloat16, (111, 111), (112, 112)),  # 222 -> 224
        (torch.float16, (3, 3), (8, 8)),
        (torch.float16, (59, 37), (64, 40)),  # Dv rounded to 8; its tile (64) is D's
        (torch.float16, (40, 24), (40, 40)),  # Dv tile 32 < D tile 64: Dv widened to 33 -> 40
        (torch.bfloat16, (111, 17), (112, 72)),  # D tile 128: Dv must exceed 64
        (torch.float16, (255, 1), (256, 136)),
        (torch.bfloat16, (24, 40), (24, 40)),  # a wider value tile is left alone
        (torch.float16, (64, 64), (64, 64)),
        (torch.float16, (256, 256), (256, 256)),
        (torch.float32, (59, 59), (60, 60)),  # float32: 4 elements make 16 bytes
        (torch.float32, (3, 17), (4, 20)),
        (torch.float32, (40, 24), (40, 24)),  # float32's narrower value tile ran right
    ],
    ids=str,
)
def test_padded_dims_pick_whole_16_byte_rows(dtype, dims, expected):
    assert padded_dims(*dims, dtype) == expected, f"{dtype} D, Dv = {dims}"


@pytest.mark.device_independent
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_padded_dims_keep_every_rule_for_every_dim_up_to_256(dtype):
    """For every D, Dv in 1..256: rows of whole 16 bytes, no wider than needed, D's tile
    unchanged (the kernels' config family stays the problem's), no width above 256, and a
    16-bit value tile no narrower than the key tile."""
    step = 16 // dtype.itemsize
    failures = []
    for head_dim in range(1, 257):
        for value_dim in range(1, 257):
            head, value = padded_dims(head_dim, value_dim, dtype)
            widened = dtype in _16BIT and padded_dim(-(-value_dim // step) * step) < padded_dim(head_dim)
            wrong = {
                "row bytes": (head * dtype.itemsize % 16, value * dtype.itemsize % 16) != (0, 0),
                "D padded too far": not head_dim <= head < head_dim + step,
                "Dv padded too far": not widened and not value_dim <= value < value_dim + step,
                "D's tile changed": padded_dim(head) != padded_dim(head_dim),
                "above 256": max(head, value) > 256,
                "narrower value tile": dtype in _16BIT and padded_dim(value) < padded_dim(head),
                "Dv wider than D's tile needs": widened and padded_dim(value - step) == padded_dim(head),
            }
            failures += [
                f"D={head_dim} Dv={value_dim} -> {head, value}: {k}" for k, bad in wrong.items() if bad
            ]
    assert not failures, f"{len(failures)} violations, first: {failures[:5]}"


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("dtype", "head_dim", "value_dim"),
    [
        (torch.float16, 59, 59),
        (torch.bfloat16, 111, 111),
        (torch.bfloat16, 111, 17),
        (torch.float16, 3, 3),
        (torch.float16, 40, 24),
        (torch.float32, 59, 37),
    ],
    ids=str,
)
def test_cuda_support_check_takes_head_dims_it_pads(dtype, head_dim, value_dim):
    """The support check (pure: it runs on any machine) for CUDA problems that used to be
    declined: rows that are not whole 16-byte vectors, and a 16-bit value tile narrower than the
    key tile. Head dims above 256 stay declined."""
    q = torch.empty(1, 2, 7, head_dim, device="meta", dtype=dtype)
    v = torch.empty(1, 2, 7, value_dim, device="meta", dtype=dtype)
    problem = dataclasses.replace(check_inputs(q, q, v, True, None), device=torch.device("cuda"))
    assert triton_problem_support(problem) is None, f"D={head_dim} Dv={value_dim} {dtype} declined"
    wide = torch.empty(1, 2, 7, 264, device="meta", dtype=dtype)
    wide_problem = dataclasses.replace(check_inputs(wide, wide, v, True, None), device=torch.device("cuda"))
    reason = triton_problem_support(wide_problem)
    assert reason is not None and "head_dim 264 exceeds 256" in reason, reason


#: Padded problems, small enough for the interpreter: D and Dv not whole 16-byte rows, a Dv
#: widened to D's tile, causal or not, GQA, N != M, a window, a transposed layout.
CASES = {
    "d59-fp16-causal-gqa": AttentionCase.make(
        q_heads=4, kv_heads=2, q_len=29, kv_len=37, head_dim=59, causal=True, dtype=torch.float16
    ),
    "d59-fp16-full": AttentionCase.make(q_len=33, kv_len=21, head_dim=59, dtype=torch.float16),
    "d111-bf16-causal": AttentionCase.make(
        q_len=19, kv_len=35, head_dim=111, causal=True, dtype=torch.bfloat16, kv_layout="bnhd"
    ),
    "d111-bf16-full-gqa": AttentionCase.make(
        q_heads=3, kv_heads=1, q_len=23, kv_len=23, head_dim=111, dtype=torch.bfloat16
    ),
    "d59-dv37-fp16-window": AttentionCase.make(
        q_heads=2,
        kv_heads=1,
        q_len=40,
        kv_len=40,
        head_dim=59,
        value_dim=37,
        causal=True,
        window=(9, -1),
        dtype=torch.float16,
    ),
    "d111-dv17-bf16-full": AttentionCase.make(
        q_len=17, kv_len=30, head_dim=111, value_dim=17, dtype=torch.bfloat16, q_layout="strided"
    ),
    "d40-dv24-fp16-causal": AttentionCase.make(
        q_len=21, kv_len=33, head_dim=40, value_dim=24, causal=True, dtype=torch.float16
    ),
    # Padded to D = Dv = 64, a head dim the split-KV forward takes: the decode path.
    "d59-fp16-decode": AttentionCase.make(
        q_heads=4, kv_heads=1, q_len=1, kv_len=600, head_dim=59, causal=True, dtype=torch.float16
    ),
    "d3-fp32-window": AttentionCase.make(
        q_len=20, kv_len=26, head_dim=3, value_dim=17, window=(4, 2), dtype=torch.float32
    ),
}


def _check_against_oracle(label: str, case: AttentionCase, gradients: bool = True) -> None:
    """The Triton path on ``case`` (a padded problem) against the oracle under the tolerance
    rule: output and dq, dk, dv, or (``gradients`` False) the output of a call without them."""
    q, k, v, grad_out = case.tensors(DEVICE)
    assert padded_problem(dataclasses.replace(case.problem, device=q.device)) is not None, (
        f"{label}: {case} is not padded, so it tests nothing here"
    )

    def run(a, b, c):
        return attention(a, b, c, **case.kwargs, backend="triton")

    checks = compare_to_reference(run, q, k, v, grad_out=grad_out if gradients else None, **case.kwargs)
    assert_close_to_reference(f"triton {label}: {case}", checks)


@pytest.mark.parametrize("name", list(CASES))
def test_padded_head_dims_match_reference(name):
    """Output and dq, dk, dv (shaped like the caller's q, k, v) against the oracle."""
    _check_against_oracle(name, CASES[name])


@pytest.mark.skipif(
    torch.device(DEVICE).type == "cuda" and torch.cuda.get_device_capability(DEVICE)[0] != 9,
    reason="TMA descriptors need a Hopper GPU or the interpreter",
)
@pytest.mark.parametrize("name", ["d111-dv17-bf16-full", "d59-dv37-fp16-window"])
def test_padded_head_dims_through_tma_descriptors_match_reference(name):
    """The kernels reading their streamed tensors through TMA descriptors (on Hopper, long
    problems do) on padded operands: the descriptors' blocks are the padded tiles."""
    case = CASES[name]
    q, k, v, grad_out = case.tensors(DEVICE)
    problem = check_inputs(q, k, v, **case.kwargs)
    padded = padded_problem(problem)

    def run(a, b, c):
        return padded_attention(TritonImplementation(tma=True), a, b, c, problem, padded)

    checks = compare_to_reference(run, q, k, v, grad_out=grad_out, **case.kwargs)
    assert_close_to_reference(f"triton via TMA {name}: {case}", checks)


def test_padded_head_dims_under_torch_compile_match_reference():
    """Under torch.compile the pad and the cut are traced ops around the attnkit op, which runs
    the padded problem: fullgraph, forward and backward against the oracle."""
    case = CASES["d59-dv37-fp16-window"]
    q, k, v, grad_out = case.tensors(DEVICE)
    compiled = torch.compile(
        lambda a, b, c: attention(a, b, c, **case.kwargs, backend="triton"),
        fullgraph=True,
        backend="aot_eager",
    )
    checks = compare_to_reference(compiled, q, k, v, grad_out=grad_out, **case.kwargs)
    assert_close_to_reference(f"triton compiled: {case}", checks)


def test_a_padded_decode_runs_split_kv():
    """The decode case is one the split-KV forward takes once padded (so the cases above cover
    it), and a call without gradients matches the oracle through it."""
    case = CASES["d59-fp16-decode"]
    padded = padded_problem(dataclasses.replace(case.problem, device=torch.device(DEVICE)))
    assert use_split_kv(padded), f"{padded.describe()} does not run split-KV"
    _check_against_oracle("d59-fp16-decode, no gradients", case, gradients=False)


@pytest.mark.parametrize("name", ["d59-fp16-causal-gqa", "d111-dv17-bf16-full"])
def test_a_padded_call_without_gradients_matches_the_forward_of_one_with_them(name):
    """A call no backward follows runs the prepared forward-only launch on the padded operands:
    bit for bit the forward of a call with gradients, shaped (B, Hq, N, Dv)."""
    case = CASES[name]
    q, k, v, _ = case.tensors(DEVICE)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    with_gradients = attention(*leaves, **case.kwargs, backend="triton").detach()
    with torch.no_grad():
        without = attention(q, k, v, **case.kwargs, backend="triton")
    assert without.shape == (*q.shape[:3], v.shape[-1]), f"output shape {tuple(without.shape)}"
    assert torch.equal(without, with_gradients), (
        f"differs by {(without.float() - with_gradients.float()).abs().max()} ({case})"
    )


def test_padded_problem_keeps_the_callers_default_scale():
    """The default scale is 1/sqrt(D) of the caller's D (59), not of the padded 64: the padded
    problem carries it, and a call with scale=None equals one with 1/sqrt(59), bit for bit,
    and not one with 1/sqrt(64)."""
    case = CASES["d59-fp16-full"]
    q, k, v, _ = case.tensors(DEVICE)
    problem = check_inputs(q, k, v, False, None)
    padded = padded_problem(problem)
    assert padded.head_dim == 64 and padded.scale == problem.scale == 1 / math.sqrt(59), padded
    default = attention(q, k, v, backend="triton")
    assert torch.equal(default, attention(q, k, v, scale=1 / math.sqrt(59), backend="triton")), (
        "scale=None differs from scale=1/sqrt(59)"
    )
    padded_scale = attention(q, k, v, scale=1 / math.sqrt(64), backend="triton")
    gap = (default.float() - padded_scale.float()).abs().max().item()
    assert gap > 1e-2, f"scale=None is within {gap:.2e} of scale=1/sqrt(64): the padded D's scale"


def test_padded_problems_have_no_native_program():
    """A native program would launch on the caller's unpadded operands: a padded problem's
    prepared run describes none and stays in Python; an unpadded one keeps its native forward."""
    q = torch.empty(1, 2, 16, 59, dtype=torch.float16, device=DEVICE)
    assert prepare(check_inputs(q, q, q, True, None)).native_forward is None
    whole = torch.empty(1, 2, 16, 64, dtype=torch.float16, device=DEVICE)
    assert prepare(check_inputs(whole, whole, whole, True, None)).native_forward is not None


#: Larger shapes for the GPU, where rows that are not whole 16-byte vectors failed: lengths that
#: divide no tile, GQA, N != M; a long one with enough score pairs for TMA descriptors on Hopper
#: (launch.TMA_MIN_SCORES); and a decode shape (split-KV where D and Dv pad to 64).
_GPU_SHAPES = {
    "prefill": dict(batch=2, q_heads=8, kv_heads=2, q_len=300, kv_len=517),
    "long": dict(batch=1, q_heads=8, kv_heads=4, q_len=1537, kv_len=1537),
    "decode": dict(batch=2, q_heads=8, kv_heads=2, q_len=1, kv_len=4100),
}
_GPU_DIMS = {"D59": (59, 59), "D111": (111, 111), "D59-Dv37": (59, 37), "D111-Dv17": (111, 17)}


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.device(DEVICE).type != "cuda", reason="GPU-sized shapes; the CPU runs the small cases above"
)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("dims", list(_GPU_DIMS))
@pytest.mark.parametrize("shape", list(_GPU_SHAPES))
def test_padded_head_dims_match_reference_on_gpu(shape, dims, dtype, causal):
    """Forward and backward against the oracle, then two calls without gradients (the first
    binds the forward-only launch, the second reuses it), each against the oracle."""
    head_dim, value_dim = _GPU_DIMS[dims]
    fields = dict(_GPU_SHAPES[shape], head_dim=head_dim, value_dim=value_dim, causal=causal, dtype=dtype)
    case = AttentionCase.make(**fields)
    _check_against_oracle(f"{shape} {dims}", case)
    for call in range(2):
        _check_against_oracle(f"{shape} {dims}, no gradients, call {call}", case, gradients=False)
