"""Bottom-right causal N < M as a non-causal prefix and a causal square, merged by their
log-sum-exp (:mod:`attnkit.sdpa.split_causal`): ``sdpa-cudnn``'s path without a mask.

The split, the merge and the backward (each part's kernel backward handed the merged output and
log-sum-exp) are kernel-agnostic, so the CPU tests run them on PyTorch's CPU flash kernel against
the float64 oracle; the cuDNN calls themselves are checked on meta tensors (PyTorch's shape
functions bind the arguments to the ops' schemas), and on a GPU end to end.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DEVICE, RecordOps
from hypothesis import given
from hypothesis import strategies as st

import attnkit
from attnkit import UnsupportedProblemError, attention
from attnkit.inputs import check_inputs
from attnkit.sdpa import semantics
from attnkit.sdpa.semantics import cudnn_gets_mask
from attnkit.sdpa.split_causal import CPU_FLASH, CUDNN, merge, split_causal_attention, splits
from attnkit.testing import assert_close_to_reference, compare_to_reference
from attnkit.testing.edge_cases import CUDNN_MASKED_FLOAT16
from attnkit.testing.strategies import AttentionCase, lengths, problems


def _split(q_len, kv_len, **overrides) -> AttentionCase:
    base = dict(batch=2, q_heads=4, kv_heads=2, q_len=q_len, kv_len=kv_len, head_dim=32, causal=True)
    return AttentionCase.make(**{**base, **overrides})  # Dv = D: the CPU flash kernel takes no other


@st.composite
def split_causal_problems(draw, *, max_len: int = 160, max_dim: int = 128):
    """Causal problems the mask-free cuDNN split takes (:func:`attnkit.sdpa_split_causal.splits`:
    1 < N and M - N >= 2), otherwise drawn as :func:`~attnkit.testing.strategies.problems` (GQA,
    dtypes, layouts, magnitudes), with Dv = D (the CPU flash kernel, the split's CPU twin, takes
    no other) and a positive scale (zero, negative and tiny scales are translated before any
    kernel runs: :mod:`attnkit.sdpa`)."""
    case = draw(problems(max_len=max_len, max_dim=max_dim))
    kv_len = draw(lengths(max_len).filter(lambda m: m >= 4))
    # N = 2 (the smallest square), M - N = 2 (the smallest prefix), and anything between.
    q_len = draw(st.one_of(st.just(2), st.just(kv_len - 2), st.integers(2, kv_len - 2)))
    head_dim = case.problem.head_dim
    scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0).map(lambda s: s / math.sqrt(head_dim))))
    return case.replace(causal=True, q_len=q_len, kv_len=kv_len, value_dim=head_dim, scale=scale)


#: Shapes at the split's edges: the smallest square (N = 2) and prefix (M - N = 2), prefixes and
#: squares that divide by nothing, MQA, odd head dims, every dtype the CPU kernel takes.
SPLIT_EDGES = {
    "n2-smallest": _split(2, 4),
    "n2-long-prefix-gqa": _split(2, 97, q_heads=6, kv_heads=2, dtype=torch.bfloat16),
    "prefix-2": _split(17, 19, dtype=torch.float16),
    "prefix-129": _split(15, 144, q_heads=4, kv_heads=1, head_dim=40),
    "head-dim-3-float64": _split(33, 101, head_dim=3, dtype=torch.float64),
    "head-dim-59-strided": _split(29, 67, head_dim=59, q_layout="bnhd", kv_layout="strided"),
    "large-logits-bf16": _split(16, 300, magnitude="large", dtype=torch.bfloat16),
    "outliers-expanded-fp16": _split(
        7, 61, magnitude="outliers", kv_layout="expanded", q_layout="expanded", dtype=torch.float16
    ),
    "scale-above-one": _split(9, 40, scale=0.9, head_dim=16),
}


def _check_split_on_cpu(problem: AttentionCase) -> None:
    q, k, v, grad_out = problem.tensors("cpu")

    def run(a, b, c):
        return split_causal_attention(CPU_FLASH, a, b, c, check_inputs(a, b, c, True, problem.scale))

    checks = compare_to_reference(run, q, k, v, causal=True, scale=problem.scale, grad_out=grad_out)
    assert_close_to_reference(f"the split on the CPU flash kernel, {problem}", checks)


@pytest.mark.device_independent
@pytest.mark.parametrize("edge", list(SPLIT_EDGES))
def test_split_matches_reference_at_its_edges(edge):
    _check_split_on_cpu(SPLIT_EDGES[edge])


@pytest.mark.device_independent
@given(problem=split_causal_problems())
def test_split_matches_reference(problem):
    """Output and dq, dk, dv of the merged parts against the oracle, under the one tolerance rule."""
    _check_split_on_cpu(problem)


def _kernel_key_lengths(calls, op: str) -> list[int]:
    """The key length each call of ``op`` was handed (its operands are (.., S, D): key third)."""
    return [args[2][-2] if "backward" in op else args[1][-2] for name, args, _ in calls if name == op]


@pytest.mark.device_independent
def test_the_split_runs_two_calls_and_forms_no_n_by_m_tensor():
    """Forward and backward: one call on the M - N prefix keys, one on the last N, and nothing
    of the visibility matrix's (N, M) shape anywhere."""
    q_len, kv_len = 5, 23
    q, k, v, grad_out = _split(q_len, kv_len).tensors("cpu")
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    recorder = RecordOps()
    with recorder:
        out = split_causal_attention(CPU_FLASH, q, k, v, check_inputs(q, k, v, True, None))
        torch.autograd.grad(out, (q, k, v), grad_out)
    forward = "aten._scaled_dot_product_flash_attention_for_cpu.default"
    backward = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
    for op in (forward, backward):
        lengths = _kernel_key_lengths(recorder.calls, op)
        assert lengths == [kv_len - q_len, q_len], f"{op} was handed key lengths {lengths}"
    for op, args, results in recorder.calls:
        for shape in args + results:
            assert tuple(shape[-2:]) != (q_len, kv_len), f"{op} formed an (N, M) tensor {shape}"


@pytest.mark.skipif(
    attnkit.unavailable_reason("triton", DEVICE) is not None,
    reason=f"triton on {DEVICE}: {attnkit.unavailable_reason('triton', DEVICE)}",
)
@pytest.mark.parametrize(
    ("dtype", "value_dim", "lse_column", "transposed"),
    [(torch.bfloat16, 128, True, False), (torch.float16, 40, False, True), (torch.float32, 3, True, True)],
)
def test_the_merge_kernel_matches_the_merge_in_pytorch_ops(dtype, value_dim, lse_column, transposed):
    """cuDNN's merge (one Triton kernel) against the PyTorch ops the CPU split tests check: any
    strides (a (B, N, H, D) layout viewed as (B, H, N, D)), either log-sum-exp shape, log-sum-exps
    far apart (one part dominating) and close, each output laid out as its first input."""
    from attnkit.triton.decode import merge_pair

    gen = torch.Generator().manual_seed(0)
    batch, heads, q_len = 2, 3, 5

    def part(scale):
        shape = (batch, q_len, heads, value_dim) if transposed else (batch, heads, q_len, value_dim)
        o = torch.randn(shape, generator=gen).to(dtype)
        o = o.transpose(1, 2) if transposed else o
        lse = torch.randn(batch, heads, q_len, generator=gen) * scale
        return o.to(DEVICE), (lse.unsqueeze(-1) if lse_column else lse).to(DEVICE)

    (o1, lse1), (o2, lse2) = part(1.0), part(30.0)
    out, lse = merge_pair(o1, lse1, o2, lse2)
    want_out, want_lse = merge(o1, lse1, o2, lse2)
    assert out.dtype == dtype and out.stride() == o1.stride() and lse.shape == lse1.shape
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-5)
    # Both round a float32 value once; they may differ by one step of the dtype.
    torch.testing.assert_close(out, want_out, rtol=torch.finfo(dtype).eps, atol=torch.finfo(dtype).eps)


@pytest.mark.device_independent
@pytest.mark.parametrize(("kv_heads", "with_grad"), [(2, True), (4, True), (1, False)])
def test_the_cudnn_calls_match_their_schemas(kv_heads, with_grad):
    """cuDNN's private ops on meta tensors: the arguments bind to the schemas of this PyTorch,
    and the output and (through autograd) each gradient have their operand's shape, the key
    gradients with Hkv heads."""
    shapes = [(2, 4, 6, 64), (2, kv_heads, 50, 64), (2, kv_heads, 50, 64)]
    q, k, v = (torch.empty(s, device="meta", dtype=torch.bfloat16, requires_grad=with_grad) for s in shapes)
    out = split_causal_attention(CUDNN, q, k, v, check_inputs(q, k, v, True, None))
    assert out.shape == q.shape and out.dtype == q.dtype, f"out {out.shape} {out.dtype}"
    if with_grad:
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        assert [g.shape for g in grads] == [x.shape for x in (q, k, v)], f"gradients {grads}"


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("q_len", "kv_len", "window", "split", "masked"),
    [
        (16, 300, None, True, False),
        (2, 4, None, True, False),
        (63, 64, None, False, True),  # a one-key prefix, which cuDNN declines: the mask
        (1, 64, None, False, False),  # one row: non-causal, no mask
        (64, 64, None, False, False),  # square: cuDNN's own causal mode
        (70, 64, None, False, False),  # N > M: the last M rows, square
        (16, 300, (8, -1), False, True),  # a window is a mask
    ],
)
def test_which_causal_problems_hand_cudnn_a_mask(q_len, kv_len, window, split, masked):
    """The split's domain and the float16 backward guard's (``_cudnn_gets_mask``) agree: with the
    split, causal N < M gives cuDNN no mask."""
    q = torch.empty(1, 2, q_len, 16, device="meta")
    k = torch.empty(1, 2, kv_len, 16, device="meta")
    problem = check_inputs(q, k, k, True, None, window)
    assert splits(problem) == split, f"splits({problem.describe()}) != {split}"
    assert cudnn_gets_mask(problem) == masked, f"cudnn_gets_mask({problem.describe()}) != {masked}"


_HAS_CUDNN = torch.cuda.is_available() and torch.backends.cudnn.is_available()
needs_cudnn = pytest.mark.skipif(not _HAS_CUDNN, reason="needs CUDA and cuDNN")

#: N < M causal on cuDNN: a decode-like block against a long cache, N = 2, odd lengths with GQA,
#: and the problem whose masked float16 backward returned NaN dq (D = 16, |q| ~ 30), made causal
#: with 32 queries against its 64 keys: the split, with no mask, must give finite, accurate dq.
CUDNN_CASES = {
    "n16-m4100-gqa-d128": _split(16, 4100, batch=2, q_heads=8, kv_heads=2, head_dim=128),
    "n2-m67-d64": _split(2, 67, q_heads=4, kv_heads=4, head_dim=64),
    "n37-m1000-gqa-bnhd": _split(37, 1000, q_heads=6, kv_heads=2, head_dim=64, q_layout="bnhd"),
    "large-logits-d16": CUDNN_MASKED_FLOAT16.replace(causal=True, window=None, q_len=32, kv_len=64),
}


@pytest.mark.gpu
@needs_cudnn
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", list(CUDNN_CASES))
def test_cudnn_n_below_m_causal_matches_reference(case, dtype):
    problem = CUDNN_CASES[case].replace(dtype=dtype)
    q, k, v, grad_out = problem.tensors("cuda")

    def run(a, b, c):
        return attention(a, b, c, causal=True, scale=problem.scale, backend="sdpa-cudnn")

    checks = compare_to_reference(run, q, k, v, causal=True, scale=problem.scale, grad_out=grad_out)
    assert_close_to_reference(f"sdpa-cudnn on {problem}", checks)


@pytest.mark.gpu
@needs_cudnn
def test_cudnn_n_below_m_causal_builds_no_mask(monkeypatch):
    """Forward and backward run cuDNN's own ops twice each (prefix, square), and the visibility
    matrix is never built."""

    def no_mask(*args, **kwargs):
        raise AssertionError("sdpa-cudnn built the visibility mask for causal N < M")

    monkeypatch.setattr(semantics, "visibility", no_mask)
    q_len, kv_len = 16, 300
    q, k, v, grad_out = _split(q_len, kv_len, dtype=torch.bfloat16, head_dim=64).tensors("cuda")
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    recorder = RecordOps()
    with recorder:
        out = attention(q, k, v, causal=True, backend="sdpa-cudnn")
        torch.autograd.grad(out, (q, k, v), grad_out)
    for op in (
        "aten._scaled_dot_product_cudnn_attention.default",
        "aten._scaled_dot_product_cudnn_attention_backward.default",
    ):
        lengths = _kernel_key_lengths(recorder.calls, op)
        assert lengths == [kv_len - q_len, q_len], f"{op} was handed key lengths {lengths}"


@pytest.mark.gpu
@needs_cudnn
def test_cudnn_declines_the_split_before_any_compute():
    """A head dim that is not a multiple of 8 (cuDNN's rule): declined with PyTorch's reason
    before any kernel runs (the parts are views of k and v; no kernel is dispatched)."""
    q, k, v, _ = _split(8, 40, dtype=torch.bfloat16, head_dim=20).tensors("cuda")
    recorder = RecordOps()
    with (
        recorder,
        pytest.raises(UnsupportedProblemError, match=r"'sdpa-cudnn'.*N < M, run as a split.*head_dim"),
    ):
        attention(q, k, v, causal=True, backend="sdpa-cudnn")
    # Slicing the parts, and the public entry's kernel choice asked for PyTorch's reasons.
    ran = {op for op in recorder.ops if op != "aten.slice.Tensor" and "sdp_choice" not in op}
    assert not ran, f"ops ran before the error: {recorder.ops}"
