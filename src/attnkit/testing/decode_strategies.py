"""Hypothesis strategies for inference shapes: decode and chunked prefill (few queries, more
keys) as :class:`~attnkit.testing.strategies.AttentionCase`, and KV caches (contiguous or paged,
ragged lengths with 0 included, shuffled and shared blocks, GQA/MQA, optional append)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from attnkit.testing import LAYOUTS
from attnkit.testing.strategies import AttentionCase


@st.composite
def decode_problems(draw, *, max_kv_len: int = 80, dtypes=(torch.float16, torch.bfloat16, torch.float32)):
    """N in 1..16 (decode, speculative, a prefill chunk) and M >= N: the N < M shapes of inference.
    One draw in four has 512..560 keys, so that the Triton path's split-KV forward (which
    needs 512 keys, two splits, on any GPU) runs too; else M <= ``max_kv_len``."""
    kv_heads = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 4]))
    q_len = draw(st.sampled_from([1, 1, 2, 3, 5, 16]))
    long_cache = draw(st.integers(0, 3)) == 0
    kv_len = draw(st.integers(512, 560) if long_cache else st.integers(q_len, max(q_len, max_kv_len)))
    head_dim = draw(st.sampled_from([16, 32, 40]))
    return AttentionCase.make(
        batch=draw(st.integers(1, 2)),
        q_heads=kv_heads * group,
        kv_heads=kv_heads,
        q_len=q_len,
        kv_len=kv_len,
        head_dim=head_dim,
        value_dim=draw(st.sampled_from([head_dim, 16])),
        causal=draw(st.booleans()),
        dtype=draw(st.sampled_from(dtypes)),
        scale=draw(st.sampled_from([None, None, 0.0, -0.3])),
        q_layout=draw(st.sampled_from(LAYOUTS)),
        kv_layout=draw(st.sampled_from(("contiguous", "bnhd", "strided"))),
        magnitude=draw(st.sampled_from(("unit", "large"))),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@dataclass(frozen=True)
class CacheCase:
    """A drawn KV-cache call; :meth:`tensors` builds it deterministically from ``seed``."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    head_dim: int
    value_dim: int
    seqlens: tuple[int, ...]  # keys in the cache before the append
    new_len: int  # keys appended (0: none)
    capacity: int  # Mmax (contiguous) or max_blocks * block_size (paged)
    block_size: int  # 0: contiguous cache
    table: tuple[tuple[int, ...], ...]  # paged: (B, max_blocks) block ids
    num_blocks: int
    causal: bool
    dtype: torch.dtype
    seed: int

    @property
    def paged(self) -> bool:
        return self.block_size > 0

    @property
    def lengths(self) -> list[int]:
        return [n + self.new_len for n in self.seqlens]

    def tensors(self, device):
        """q, k_cache, v_cache, cache_seqlens, k, v (None without append), block_table (or None)."""
        gen = torch.Generator().manual_seed(self.seed)

        def rand(*shape):
            return torch.randn(*shape, generator=gen).to(device=device, dtype=self.dtype)

        rows, slots = (self.num_blocks, self.block_size) if self.paged else (self.batch, self.capacity)
        q = rand(self.batch, self.q_heads, self.q_len, self.head_dim)
        k_cache = rand(rows, self.kv_heads, slots, self.head_dim)
        v_cache = rand(rows, self.kv_heads, slots, self.value_dim)
        k = v = None
        if self.new_len:
            k = rand(self.batch, self.kv_heads, self.new_len, self.head_dim)
            v = rand(self.batch, self.kv_heads, self.new_len, self.value_dim)
        table = torch.tensor(self.table, dtype=torch.int32, device=device) if self.paged else None
        seqlens = torch.tensor(self.seqlens, dtype=torch.int32, device=device)
        return q, k_cache, v_cache, seqlens, k, v, table


@st.composite
def cache_cases(draw, *, max_capacity: int = 40, dtypes=(torch.float16, torch.bfloat16, torch.float32)):
    """Contiguous or paged caches; ragged lengths (0 included); paged tables shuffled, with blocks
    shared between sequences when nothing is appended (an append into a shared block would
    make the result depend on the order of the writes)."""
    kv_heads = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 3]))
    batch = draw(st.integers(1, 3))
    q_len = draw(st.sampled_from([1, 1, 2, 4]))
    new_len = draw(st.sampled_from([0, 0, q_len]))
    block_size = draw(st.sampled_from([0, 0, 1, 4, 16, 32]))
    if block_size:
        max_blocks = draw(st.integers(1, max(1, max_capacity // block_size)))
        capacity = max_blocks * block_size
    else:
        capacity = draw(st.integers(1, max_capacity))
    capacity = max(capacity, new_len)
    if block_size:
        max_blocks = -(-capacity // block_size)
        capacity = max_blocks * block_size
    seqlens = tuple(draw(st.integers(0, capacity - new_len)) for _ in range(batch))
    table, num_blocks = (), 0
    if block_size:
        if new_len or draw(st.booleans()):  # shuffled, every block owned by one sequence
            num_blocks = batch * max_blocks + draw(st.integers(0, 3))
            ids = draw(st.permutations(range(num_blocks)))[: batch * max_blocks]
            table = tuple(tuple(ids[b * max_blocks : (b + 1) * max_blocks]) for b in range(batch))
        else:  # blocks shared between sequences and repeated within one
            num_blocks = draw(st.integers(1, 6))
            row = st.lists(st.integers(0, num_blocks - 1), min_size=max_blocks, max_size=max_blocks)
            table = tuple(tuple(draw(row)) for _ in range(batch))
    head_dim = draw(st.sampled_from([16, 32]))
    return CacheCase(
        batch=batch,
        q_heads=kv_heads * group,
        kv_heads=kv_heads,
        q_len=q_len,
        head_dim=head_dim,
        value_dim=draw(st.sampled_from([head_dim, 16])),
        seqlens=seqlens,
        new_len=new_len,
        capacity=capacity,
        block_size=block_size,
        table=table,
        num_blocks=num_blocks,
        causal=draw(st.booleans()),
        dtype=draw(st.sampled_from(dtypes)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
