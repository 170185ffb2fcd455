"""Inference shapes (N < M): decode and chunked prefill on every path against the float64
oracle, forward alone and with gradients; the split-KV kernel with many splits, dense and
paged; the dispatch rules; and that the SDPA paths run N < M at the cost of the N x M problem
(no kernel is handed more than N query rows, no M x M score matrix is formed)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import DEVICE, SDPA_PATHS, RecordOps
from hypothesis import example, given
from hypothesis import strategies as st

import attnkit
from attnkit import UnsupportedProblemError, attention, attention_with_kvcache
from attnkit.inputs import check_inputs
from attnkit.testing import assert_close_to_reference, compare_to_reference
from attnkit.testing.decode_strategies import CacheCase, cache_cases, decode_problems
from attnkit.testing.strategies import AttentionCase

_DECODE_GQA = AttentionCase.make(
    batch=2, q_heads=8, kv_heads=2, q_len=1, kv_len=70, head_dim=32, causal=True, dtype=torch.bfloat16, seed=5
)
_CHUNK = _DECODE_GQA.replace(q_len=5, kv_len=77, dtype=torch.float16, kv_layout="bnhd", seed=6)
_SPEC = _DECODE_GQA.replace(q_len=16, kv_len=40, q_heads=2, kv_heads=1, dtype=torch.float32, seed=7)
#: Long enough for the Triton path's split-KV forward (use_split_kv), on the CPU interpreter too.
_LONG_DECODE = _DECODE_GQA.replace(kv_len=530, seed=8)


def _check(backend: str, problem: AttentionCase, with_grad: bool) -> None:
    q, k, v, grad_out = problem.tensors(DEVICE)

    def run(a, b, c):
        return attention(a, b, c, **problem.kwargs, backend=backend)

    try:
        checks = compare_to_reference(
            run, q, k, v, **problem.kwargs, grad_out=grad_out if with_grad else None
        )
    except UnsupportedProblemError as err:
        assert backend in str(err), f"rejection of {backend} does not name it: {err}"
        return
    assert_close_to_reference(
        f"backend {backend!r} ({'fwd+bwd' if with_grad else 'fwd'}) on {problem}", checks
    )


@pytest.mark.parametrize("with_grad", [False, True], ids=["fwd", "fwd+bwd"])
@given(problem=decode_problems())
@example(problem=_DECODE_GQA)
@example(problem=_CHUNK)
@example(problem=_SPEC)
@example(problem=_LONG_DECODE)
def test_decode_shapes_match_reference(backend, with_grad, problem):
    _check(backend, problem, with_grad)


_triton_reason = (
    "triton is not installed"
    if "triton" not in attnkit.backend_names()
    else attnkit.unavailable_reason("triton", DEVICE)
)
needs_triton = pytest.mark.skipif(_triton_reason is not None, reason=f"triton on {DEVICE}: {_triton_reason}")


#: Pages holding whole 16-key blocks (one table read per block), one or two blocks per page,
#: shuffled, lengths ending mid-page.
_WHOLE_BLOCK_PAGES = CacheCase(
    batch=2, q_heads=4, kv_heads=2, q_len=2, head_dim=16, value_dim=16, seqlens=(45, 17), new_len=0,
    capacity=48, block_size=16, table=((4, 0, 2), (5, 1, 3)), num_blocks=6, causal=True,
    dtype=torch.float16, seed=11,
)  # fmt: skip
_TWO_BLOCKS_PER_PAGE = dataclasses.replace(
    _WHOLE_BLOCK_PAGES, seqlens=(60, 33), capacity=64, block_size=32, table=((3, 0), (1, 2)), num_blocks=4
)


@needs_triton
@given(case=cache_cases(), splits=st.integers(1, 5))
@example(case=_WHOLE_BLOCK_PAGES, splits=2)
@example(case=_TWO_BLOCKS_PER_PAGE, splits=3)
def test_split_kernel_many_splits_dense_and_paged(case: CacheCase, splits: int):
    """The split-KV kernel with 16-key blocks, so that tiny caches still cut into several
    splits (some empty), read in place, dense or through the block table, with ragged lengths."""
    from attnkit.triton.decode import DecodeConfig, decode_forward

    q, k_cache, v_cache, seqlens, _, _, table = case.tensors(DEVICE)
    problem = dataclasses.replace(
        check_inputs(
            q,
            k_cache[:1, :, :1].expand(case.batch, -1, 1, -1),
            v_cache[:1, :, :1].expand(case.batch, -1, 1, -1),
            case.causal,
            None,
        ),
        kv_len=case.capacity,
    )
    out, lse = decode_forward(
        q,
        k_cache,
        v_cache,
        problem,
        seqlens=seqlens,
        block_table=table,
        num_splits=splits,
        config=DecodeConfig(block_n=16),
    )
    for b, length in enumerate(case.seqlens):
        if length == 0:
            assert torch.equal(out[b], torch.zeros_like(out[b])), f"sequence {b} has no key but output != 0"
            assert torch.isinf(lse[b]).all() and (lse[b] > 0).all(), "a row with no key must store lse = +inf"
            continue
        if case.paged:
            pages = [int(table[b, j // case.block_size]) for j in range(length)]
            rows = [j % case.block_size for j in range(length)]
            keys = torch.stack([k_cache[p, :, r] for p, r in zip(pages, rows, strict=True)], 1)[None]
            values = torch.stack([v_cache[p, :, r] for p, r in zip(pages, rows, strict=True)], 1)[None]
        else:
            keys, values = k_cache[b : b + 1, :, :length], v_cache[b : b + 1, :, :length]
        checks = compare_to_reference(
            lambda *_, b=b: out[b : b + 1], q[b : b + 1], keys, values, causal=case.causal, scale=None
        )
        assert_close_to_reference(f"split-KV, {splits} splits, sequence {b} of {case}", checks)


@needs_triton
@pytest.mark.parametrize(
    "problem",
    [_DECODE_GQA.replace(kv_len=530), _CHUNK.replace(kv_len=520)],
    ids=["decode-gqa", "chunk-bnhd"],
)
def test_split_kv_without_gradients_matches_the_forward_with_them(problem):
    """A call no backward follows runs the split-KV forward without the log-sum-exp
    (decode_forward_only; from the second call of a layout on, bound launches on the GPU):
    every call's output is decode_forward's, bit for bit, and a fresh tensor."""
    from attnkit.triton.decode import decode_forward, decode_forward_only, use_split_kv

    q, k, v, _ = problem.tensors(DEVICE)
    checked = check_inputs(q, k, v, problem.problem.causal, problem.scale)
    assert use_split_kv(checked), f"{problem} does not run split-KV: the test would check nothing"
    expected, _ = decode_forward(q, k, v, checked)
    outputs = [decode_forward_only(q, k, v, checked) for _ in range(3)]
    with torch.no_grad():
        outputs.append(attention(q, k, v, **problem.kwargs, backend="triton"))
    for call, out in enumerate(outputs):
        assert torch.equal(out, expected), f"call {call}: max {(out.float() - expected.float()).abs().max()}"
    assert len({out.data_ptr() for out in outputs[:3]}) == 3, "outputs share memory across calls"


@pytest.mark.device_independent
@needs_triton
@pytest.mark.parametrize(
    ("q_len", "kv_len", "group", "expected"),
    [
        (1, 4096, 4, True),
        (16, 16384, 4, True),
        (1, 512, 1, True),
        (1, 511, 4, False),  # one split at most: the regular forward, one launch
        (16, 32, 4, False),
        (128, 8192, 4, False),
    ],
)
def test_split_kv_dispatch_rule(q_len, kv_len, group, expected):
    """Few query rows per kv head against many keys run split-KV; long query blocks, and caches
    too short for a second split, do not."""
    from attnkit.triton.decode import use_split_kv

    q = torch.empty(8, 8 * group, q_len, 128, device="meta")
    k = torch.empty(8, 8, kv_len, 128, device="meta")
    problem = dataclasses.replace(check_inputs(q, k, k, True, None), device=torch.device("cpu"))
    assert use_split_kv(problem) == expected, f"use_split_kv({problem.describe()}) != {expected}"


#: Names of the attention kernels' ops (forward and backward) as the dispatcher sees them; the
#: math kernel decomposes into matmuls and softmax and has none.
_KERNEL_OPS = ("scaled_dot_product", "efficient_attention", "flash_attention", "cudnn_attention")


def _query_rows(op: str, shape: tuple[int, ...]) -> int:
    """Rows of an attention kernel's first operand (queries, or the output's gradient): the
    efficient kernel's own ops (``aten._efficient_attention_*``) take (B, N, H, D), the SDPA
    ops (``aten._scaled_dot_product_*``) (B, H, N, D)."""
    return shape[1] if op.startswith("aten._efficient_attention") else shape[-2]


def _operands(batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype):
    gen = torch.Generator().manual_seed(q_len * 1000 + kv_len)
    kv_shape = (batch, kv_heads, kv_len, head_dim)
    shapes = [(batch, q_heads, q_len, head_dim), kv_shape, kv_shape]
    return [torch.randn(s, generator=gen).to(device=DEVICE, dtype=dtype).requires_grad_() for s in shapes]


def _dtype_for(name: str) -> torch.dtype:
    return torch.float32 if DEVICE.type == "cpu" or name == "sdpa-math" else torch.bfloat16


@pytest.mark.parametrize("name", SDPA_PATHS)
@pytest.mark.parametrize("q_len", [1, 3, 16])
def test_n_below_m_runs_without_the_square_detour(name, q_len):
    reason = attnkit.unavailable_reason(name, DEVICE)
    if reason:
        pytest.skip(reason)
    kv_len = 1024
    # Hq == Hkv: the efficient kernel takes no query-head groups.
    q, k, v = _operands(1, 2, 2, q_len, kv_len, 64, _dtype_for(name))
    recorder = RecordOps()
    with recorder:
        out = attnkit.attention(q, k, v, causal=True, backend=name)
        out.backward(torch.ones_like(out))
    kernel_calls = [(op, args) for op, args, _ in recorder.calls if any(part in op for part in _KERNEL_OPS)]
    if name != "sdpa-math":
        assert kernel_calls, f"{name}: no attention kernel op was recorded: {sorted(set(recorder.ops))}"
    for op, args in kernel_calls:
        rows = _query_rows(op, args[0])
        assert rows <= q_len, f"{name}: {op} was handed {rows} query rows for N={q_len}, M={kv_len}"
    for op, args, results in recorder.calls:
        for shape in args + results:
            assert not (len(shape) >= 2 and shape[-1] >= kv_len and shape[-2] >= kv_len), (
                f"{name}: {op} formed an M x M tensor {shape} for N={q_len}, M={kv_len}"
            )


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("kernel", "kv_heads", "head_dim", "with_grad"),
    [
        ("_flash", 2, 64, True),  # GQA: the kernel reads kv head h // G itself
        ("_flash", 2, 60, True),  # padded to 64 for the kernel, cut back to 60
        ("_efficient", 4, 64, False),
    ],
)
def test_the_bottom_right_kernel_calls_match_their_schemas(kernel, kv_heads, head_dim, with_grad):
    """The private ops' calls, on meta tensors (PyTorch's shape functions; the kernels
    themselves are CUDA-only): the arguments bind to the schema and the output (and, through
    autograd, each gradient) has its operand's shape."""
    from attnkit.sdpa import lower_right

    shapes = [(2, 4, 3, head_dim), (2, kv_heads, 50, head_dim), (2, kv_heads, 50, head_dim)]
    q, k, v = (torch.empty(s, device="meta", dtype=torch.bfloat16, requires_grad=with_grad) for s in shapes)
    out = getattr(lower_right, kernel)(q, k, v, check_inputs(q, k, v, True, None))
    assert out.shape == q.shape and out.dtype == q.dtype, f"{kernel}: out {out.shape} {out.dtype}"
    if with_grad:
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        assert [g.shape for g in grads] == [x.shape for x in (q, k, v)], f"{kernel}: {grads}"


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the kernels' own bottom-right modes are CUDA kernels")
@pytest.mark.parametrize(
    ("name", "dtype", "kv_heads"),
    [
        ("sdpa-flash", torch.float32, 2),  # flash takes fp16 / bf16 only
        ("sdpa-efficient", torch.bfloat16, 1),  # no query-head groups
    ],
)
def test_a_forced_kernel_that_declines_n_below_m_says_why(name, dtype, kv_heads):
    q, k, v = _operands(1, 2, kv_heads, 4, 256, 64, dtype)
    with pytest.raises(UnsupportedProblemError, match=rf"'{name}'.*bottom-right causal, N < M"):
        attnkit.attention(q, k, v, causal=True, backend=name)


@needs_triton
@pytest.mark.skipif(DEVICE.type != "cuda", reason="a long cache is too slow for the CPU interpreter")
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("q_len", [1, 4])
def test_split_kv_long_cache_default_config(q_len, paged):
    """The default split policy on a long ragged cache (several splits per sequence), D 128, bf16."""
    gen = torch.Generator().manual_seed(q_len)
    lengths, block_size, capacity = [5000, 3001], 256, 5120
    q = torch.randn(2, 8, q_len, 128, generator=gen).to(DEVICE, torch.bfloat16)
    k_cache, v_cache = (
        torch.randn(2, 2, capacity, 128, generator=gen).to(DEVICE, torch.bfloat16) for _ in "kv"
    )
    table = None
    if paged:  # the same keys, blocks shuffled through a pool
        per_seq = capacity // block_size
        perm = torch.randperm(2 * per_seq, generator=gen).to(DEVICE)
        table = perm.reshape(2, per_seq).to(torch.int32)
        blocks = [
            x.reshape(2, 2, per_seq, block_size, 128).transpose(1, 2).reshape(-1, 2, block_size, 128)
            for x in (k_cache, v_cache)
        ]
        pools = [torch.empty_like(b) for b in blocks]
        for pool, b in zip(pools, blocks, strict=True):
            pool[perm] = b
    seqlens = torch.tensor(lengths, device=DEVICE)
    with torch.no_grad():
        cache = (pools[0], pools[1]) if paged else (k_cache, v_cache)
        out = attention_with_kvcache(q, *cache, seqlens, block_table=table, causal=True, backend="triton")
    for b, length in enumerate(lengths):
        keys, values = k_cache[b : b + 1, :, :length], v_cache[b : b + 1, :, :length]
        checks = compare_to_reference(
            lambda *_, b=b: out[b : b + 1], q[b : b + 1], keys, values, causal=True, scale=None
        )
        assert_close_to_reference(
            f"split-KV default config, {'paged' if paged else 'contiguous'}, L={length}", checks
        )
