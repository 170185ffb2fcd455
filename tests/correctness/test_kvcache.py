"""attention_with_kvcache: every path against the float64 oracle on contiguous and paged caches
(ragged lengths with 0, shuffled and shared blocks, GQA/MQA, append, causal per sequence), and
every bad input rejected before any compute (the cache is left untouched)."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE
from hypothesis import example, given

from attnkit import UnsupportedProblemError, attention_with_kvcache
from attnkit.testing import assert_close_to_reference, compare_to_reference
from attnkit.testing.decode_strategies import CacheCase, cache_cases

_SHARED = CacheCase(
    batch=3, q_heads=4, kv_heads=2, q_len=2, head_dim=16, value_dim=16, seqlens=(5, 0, 9), new_len=0,
    capacity=12, block_size=4, table=((3, 1, 2), (0, 0, 2), (2, 2, 1)), num_blocks=4, causal=True,
    dtype=torch.bfloat16, seed=1,
)  # fmt: skip
_APPEND = CacheCase(
    batch=2, q_heads=3, kv_heads=1, q_len=3, head_dim=32, value_dim=16, seqlens=(0, 6), new_len=3,
    capacity=9, block_size=0, table=(), num_blocks=0, causal=True, dtype=torch.float16, seed=2,
)  # fmt: skip
_PAGED_APPEND = CacheCase(
    batch=2, q_heads=2, kv_heads=2, q_len=1, head_dim=16, value_dim=16, seqlens=(3, 0), new_len=1,
    capacity=8, block_size=4, table=((4, 1), (0, 3)), num_blocks=5, causal=False, dtype=torch.float32, seed=3,
)  # fmt: skip

#: Head dims the Triton path pads (rows of 118 and 74 bytes): it takes the gathered route.
_ODD_HEAD_DIM = CacheCase(
    batch=2, q_heads=2, kv_heads=1, q_len=2, head_dim=59, value_dim=37, seqlens=(4, 7), new_len=2,
    capacity=12, block_size=4, table=((2, 0, 5), (1, 3, 4)), num_blocks=6, causal=True, dtype=torch.float16,
    seed=4,
)  # fmt: skip


def _appended(case: CacheCase, k_cache, v_cache, k, v, table):
    """The cache after the append, written one key at a time (independently of the library)."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    for b, start in enumerate(case.seqlens):
        for t in range(case.new_len):
            pos = start + t
            if case.paged:
                page, row = int(table[b, pos // case.block_size]), pos % case.block_size
            else:
                page, row = b, pos
            k_cache[page, :, row], v_cache[page, :, row] = k[b, :, t], v[b, :, t]
    return k_cache, v_cache


def _sequence(case: CacheCase, cache, table, b: int) -> torch.Tensor:
    """Sequence b's keys (or values) as (1, Hkv, L_b, X), gathered one row at a time."""
    rows = []
    for j in range(case.lengths[b]):
        if case.paged:
            rows.append(cache[int(table[b, j // case.block_size]), :, j % case.block_size])
        else:
            rows.append(cache[b, :, j])
    return torch.stack(rows, dim=1).unsqueeze(0)


def check_cache_backend(backend: str, case: CacheCase) -> None:
    q, k_cache, v_cache, seqlens, k, v, table = case.tensors(DEVICE)
    expected_k, expected_v = (
        (k_cache, v_cache) if k is None else _appended(case, k_cache, v_cache, k, v, table)
    )
    try:
        with torch.no_grad():
            out = attention_with_kvcache(
                q, k_cache, v_cache, seqlens, k=k, v=v, block_table=table, causal=case.causal, backend=backend
            )
    except UnsupportedProblemError as err:
        assert backend in str(err), f"rejection of {backend} does not name it: {err}"
        return
    if k is not None:
        assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v), (
            "append wrote wrong slots"
        )
    for b, length in enumerate(case.lengths):
        if length == 0:
            assert torch.equal(out[b], torch.zeros_like(out[b])), f"sequence {b} has no key but output != 0"
            continue
        keys, values = _sequence(case, k_cache, table, b), _sequence(case, v_cache, table, b)
        checks = compare_to_reference(
            lambda *_, b=b: out[b : b + 1], q[b : b + 1], keys, values, causal=case.causal, scale=None
        )
        assert_close_to_reference(f"backend {backend!r}, sequence {b} (L={length}) of {case}", checks)


@given(case=cache_cases())
@example(case=_SHARED)
@example(case=_APPEND)
@example(case=_PAGED_APPEND)
@example(case=_ODD_HEAD_DIM)
def test_kvcache_matches_reference(backend, case):
    check_cache_backend(backend, case)


def _valid():
    q = torch.randn(2, 4, 1, 16)
    return dict(
        q=q,
        k_cache=torch.randn(2, 2, 8, 16),
        v_cache=torch.randn(2, 2, 8, 16),
        cache_seqlens=torch.tensor([3, 8]),
    )


def _paged():
    args = _valid()
    args.update(k_cache=torch.randn(5, 2, 4, 16), v_cache=torch.randn(5, 2, 4, 16))
    args["block_table"] = torch.tensor([[0, 1], [2, 4]], dtype=torch.int32)
    return args


BAD = {
    "length beyond capacity": (dict(cache_seqlens=torch.tensor([3, 9])), "exceeds the cache capacity 8"),
    "append beyond capacity": (
        dict(cache_seqlens=torch.tensor([3, 8]), k=torch.randn(2, 2, 1, 16), v=torch.randn(2, 2, 1, 16)),
        "exceeds the cache capacity 8",
    ),
    "negative length": (dict(cache_seqlens=torch.tensor([-1, 2])), "lengths >= 0"),
    "float lengths": (
        dict(cache_seqlens=torch.tensor([1.0, 2.0])),
        "cache_seqlens: expected a 1-D int32/int64",
    ),
    "lengths per sequence": (
        dict(cache_seqlens=torch.tensor([1, 2, 3])),
        "cache_seqlens: expected shape (2,)",
    ),
    "cache dtype": (dict(k_cache=torch.randn(2, 2, 8, 16, dtype=torch.float64)), "k_cache: dtype"),
    "cache batch": (
        dict(k_cache=torch.randn(3, 2, 8, 16), v_cache=torch.randn(3, 2, 8, 16)),
        "k_cache: expected batch 2",
    ),
    "v cache shape": (dict(v_cache=torch.randn(2, 2, 7, 16)), "v_cache: expected shape (2, 2, 8, 16)"),
    "head dim": (dict(k_cache=torch.randn(2, 2, 8, 32), v_cache=torch.randn(2, 2, 8, 32)), "head_dim 32"),
    "gqa": (dict(k_cache=torch.randn(2, 3, 8, 16), v_cache=torch.randn(2, 3, 8, 16)), "Hq % Hkv"),
    "k without v": (dict(k=torch.randn(2, 2, 1, 16)), "give both"),
    "new k shape": (
        dict(k=torch.randn(2, 1, 1, 16), v=torch.randn(2, 1, 1, 16)),
        "k: expected shape (2, 2, 1, 16)",
    ),
    "requires grad": (dict(q=torch.randn(2, 4, 1, 16, requires_grad=True)), "forward only"),
    "bad causal": (dict(causal=1), "causal: expected a bool"),
}
BAD_PAGED = {
    "block id past the pool": (dict(block_table=torch.tensor([[0, 1], [2, 5]], dtype=torch.int32)), "[0, 5)"),
    "negative block id": (
        dict(
            block_table=torch.tensor([[0, -1], [2, 4]], dtype=torch.int32), cache_seqlens=torch.tensor([5, 8])
        ),
        "[0, 5)",
    ),
    "pool block size mismatch": (
        dict(v_cache=torch.randn(5, 2, 8, 16)),
        "v_cache: expected shape (5, 2, 4, 16)",
    ),
    "table rows": (
        dict(block_table=torch.tensor([[0, 1]], dtype=torch.int32)),
        "block_table: expected 2 rows",
    ),
    "table dtype": (
        dict(block_table=torch.tensor([[0.0, 1.0], [2.0, 4.0]])),
        "block_table: expected a 2-D int32",
    ),
    "paged length beyond capacity": (
        dict(cache_seqlens=torch.tensor([3, 9])),
        "exceeds the cache capacity 8",
    ),
}


@pytest.mark.device_independent
@pytest.mark.parametrize(("overrides", "message"), BAD.values(), ids=list(BAD))
def test_bad_input_raises_before_any_compute(overrides, message):
    args = {**_valid(), **overrides}
    before = (args["k_cache"].clone(), args["v_cache"].clone())
    with pytest.raises((TypeError, ValueError), match=_escape(message)):
        attention_with_kvcache(**args, backend="naive")
    assert torch.equal(args["k_cache"], before[0]) and torch.equal(args["v_cache"], before[1])


@pytest.mark.device_independent
@pytest.mark.parametrize(("overrides", "message"), BAD_PAGED.values(), ids=list(BAD_PAGED))
def test_bad_paged_input_raises_before_any_compute(overrides, message):
    args = {**_paged(), **overrides}
    with pytest.raises((TypeError, ValueError), match=_escape(message)):
        attention_with_kvcache(**args, backend="naive")


@pytest.mark.device_independent
def test_unused_table_entries_are_ignored():
    """Entries past a sequence's last block (padding, e.g. -1) are never read nor checked."""
    args = _paged()
    args["cache_seqlens"] = torch.tensor([3, 4])
    args["block_table"] = torch.tensor([[0, -1], [2, 99]], dtype=torch.int32)
    with torch.no_grad():
        out = attention_with_kvcache(**args, backend="naive")
    assert out.shape == (2, 4, 1, 16)


def _escape(message: str) -> str:
    import re

    return re.escape(message)
