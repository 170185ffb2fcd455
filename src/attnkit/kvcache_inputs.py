"""Validation of :func:`attnkit.attention_with_kvcache`'s arguments, done before any compute.

Shape and type checks come first; then one host read of a few reductions checks the values:
lengths non-negative and within the cache, and every block id a sequence uses inside the pool.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from attnkit.inputs import AttentionProblem, _check_tensor, check_inputs, records_backward

_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class CacheProblem:
    """A checked KV-cache call. ``problem.kv_len`` is the cache capacity per sequence (Mmax, or
    max_blocks x block_size); ``seqlens`` (B,) int64 are the keys before the append and
    ``lengths`` (B,) int64 after it, both on the cache's device."""

    problem: AttentionProblem
    seqlens: torch.Tensor
    lengths: torch.Tensor
    paged: bool


def _same_kind(name: str, x: torch.Tensor, q: torch.Tensor) -> None:
    if x.dtype != q.dtype:
        raise TypeError(f"{name}: dtype {x.dtype} differs from q's dtype {q.dtype}")
    if x.device != q.device:
        raise ValueError(f"{name}: device {x.device} differs from q's device {q.device}")


def _index_tensor(name: str, x: object, dims: int, q: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != dims or x.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name}: expected a {dims}-D int32/int64 tensor, got {x.dim()}-D {x.dtype}")
    if x.device != q.device:
        raise ValueError(f"{name}: device {x.device} differs from q's device {q.device}")
    return x


def _check_shape(name: str, x: torch.Tensor, expected: tuple, meaning: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)} ({meaning}), got {tuple(x.shape)}")


def check_cache_inputs(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal, scale) -> CacheProblem:
    """Check every argument of :func:`attnkit.attention_with_kvcache`; raise before any compute."""
    q, k_cache, v_cache = (
        _check_tensor(n, x) for n, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache))
    )
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        _same_kind(name, x, q)
    batch, q_heads, _, head_dim = q.shape
    rows, kv_heads, slots, cache_dim = k_cache.shape
    value_dim = v_cache.shape[3]
    paged = block_table is not None
    what = "(num_blocks, Hkv, block_size, D) pool" if paged else "(B, Hkv, Mmax, D) cache"
    if cache_dim != head_dim:
        raise ValueError(f"k_cache: head_dim {cache_dim} differs from q's D={head_dim}")
    _check_shape("v_cache", v_cache, (rows, kv_heads, slots, value_dim), f"matching k_cache's {what}")
    if kv_heads == 0 or q_heads % kv_heads != 0:
        raise ValueError(
            f"q has {q_heads} heads, not a multiple of the cache's {kv_heads} (GQA needs Hq % Hkv == 0)"
        )
    if paged:
        block_table = _index_tensor("block_table", block_table, 2, q)
        if block_table.shape[0] != batch:
            raise ValueError(
                f"block_table: expected {batch} rows (one per sequence), got {block_table.shape[0]}"
            )
        capacity = block_table.shape[1] * slots
    else:
        if rows != batch:
            raise ValueError(f"k_cache: expected batch {batch} (q's) in dim 0 of the {what}, got {rows}")
        capacity = slots
    new_len = 0
    if (k is None) != (v is None):
        raise ValueError("k, v: give both new keys and new values, or neither")
    if k is not None:
        for name, x, dim in (("k", k, head_dim), ("v", v, value_dim)):
            _same_kind(name, _check_tensor(name, x), q)
            _check_shape(name, x, (batch, kv_heads, x.shape[2], dim), "(B, Hkv, N_new, D|Dv)")
        if k.shape[2] != v.shape[2]:
            raise ValueError(f"k, v: new lengths differ: k has {k.shape[2]}, v has {v.shape[2]}")
        new_len = k.shape[2]
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, (int, torch.Tensor)):
        raise TypeError(
            f"cache_seqlens: expected a (B,) int tensor or an int, got {type(cache_seqlens).__name__}"
        )
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int64, device=q.device)
    _check_shape(
        "cache_seqlens", _index_tensor("cache_seqlens", cache_seqlens, 1, q), (batch,), "one per sequence"
    )
    if records_backward(q, k_cache, v_cache, k, v):
        raise ValueError(
            "attention_with_kvcache is forward only: inputs require grad (run under torch.no_grad())"
        )
    # The problem as attention() sees it, with the capacity as key length (checks causal, scale).
    view = k_cache[:1, :, :1].expand(batch, kv_heads, 1, head_dim)
    problem = check_inputs(q, view, v_cache[:1, :, :1].expand(batch, kv_heads, 1, value_dim), causal, scale)
    problem = dataclasses.replace(problem, kv_len=capacity)
    seqlens = cache_seqlens.long()
    lengths = seqlens + new_len
    _check_values(seqlens, lengths, capacity, block_table, slots, rows)
    return CacheProblem(problem, seqlens, lengths, paged)


def _check_values(seqlens, lengths, capacity, block_table, block_size, num_blocks) -> None:
    """One host read: lengths in [0, capacity], used block ids in [0, num_blocks)."""
    stats = [seqlens.min(), lengths.max()]
    if block_table is not None:
        table = torch.cat([block_table.long(), block_table.new_zeros(block_table.shape[0], 1)], dim=1)
        used = torch.arange(table.shape[1], device=seqlens.device)[None, :] < (
            (lengths[:, None] + block_size - 1) // block_size
        )
        # Unused entries (padding past a sequence's last block) read as 0 for the min, -1 for the max.
        stats += [torch.where(used, table, 0).min(), torch.where(used, table, -1).max()]
    values = torch.stack(stats).tolist()
    if values[0] < 0:
        raise ValueError(f"cache_seqlens: expected lengths >= 0, got {seqlens.tolist()}")
    if values[1] > capacity:
        raise ValueError(
            f"cache_seqlens (+ new keys): length {values[1]} exceeds the cache capacity {capacity} "
            f"(lengths after the append: {lengths.tolist()})"
        )
    if block_table is not None and (values[2] < 0 or values[3] >= num_blocks):
        raise ValueError(
            f"block_table: block ids used by the sequences must lie in [0, {num_blocks}) (the pool's "
            f"num_blocks), got ids in [{values[2]}, {values[3]}]"
        )
