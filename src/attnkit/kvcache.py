"""Attention over a KV cache, contiguous or paged (in the style of FlashAttention-2's
``flash_attn_with_kvcache``): decoding and chunked prefill, forward only.

Layouts (attnkit's (batch, heads, seq, dim) order):

* contiguous: ``k_cache`` (B, Hkv, Mmax, D), ``v_cache`` (B, Hkv, Mmax, Dv); sequence b's keys are
  rows ``[0, L_b)``.
* paged: ``k_cache`` (num_blocks, Hkv, block_size, D), ``v_cache`` (num_blocks, Hkv, block_size,
  Dv) pools and ``block_table`` (B, max_blocks) int32; key j of sequence b is row
  ``j % block_size`` of block ``block_table[b, j // block_size]``. Blocks may be shared between
  sequences and appear in any order; table entries past a sequence's last block are ignored.

The backend is chosen as :func:`attnkit.attention` chooses it (:func:`attnkit.api.choose_backend`:
``auto`` reads the same measured table). A backend that reads a cache in place declares it on
the registry (``cache_forward``: attnkit's Triton path runs its split-KV kernel, through the block
table when paged); every other path, and a problem its ``cache_forward`` leaves, takes the
gathered route: each sequence's keys gathered into a contiguous (1, Hkv, L_b, D) tensor and run
through :func:`attnkit.attention` with that backend.
"""

from __future__ import annotations

import torch

from attnkit.api import attention, choose_backend
from attnkit.errors import UnsupportedProblemError
from attnkit.kvcache_inputs import CacheProblem, check_cache_inputs
from attnkit.registry import get_backend


def attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor | int,
    *,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    window: None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Attention of new queries over a KV cache, optionally appending new keys/values first.

    Args:
        q: (B, Hq, N, D) queries (N = 1 for decoding, N > 1 for a prefill chunk or
            speculative tokens).
        k_cache, v_cache: contiguous (B, Hkv, Mmax, D) / (B, Hkv, Mmax, Dv), or paged pools
            (num_blocks, Hkv, block_size, D) / (num_blocks, Hkv, block_size, Dv) with
            ``block_table``. ``Hq % Hkv == 0`` (GQA; ``Hkv == 1`` is MQA).
        cache_seqlens: (B,) integer tensor (or one int for all): keys already in the cache.
        k, v: optional (B, Hkv, N_new, D) / (B, Hkv, N_new, Dv), written into the cache at
            positions ``cache_seqlens[b] ..`` before attending (the cache is modified in place;
            ``cache_seqlens`` is not: the caller adds N_new to it before the next call).
        block_table: (B, max_blocks) int32/int64 block ids into the pools (paged cache).
        causal: bottom-right per sequence: with ``L_b = cache_seqlens[b] + N_new`` keys, query i
            sees key j iff ``j <= i + L_b - N``. A row that sees no key (e.g. ``L_b = 0``)
            outputs zeros.
        scale: default ``1 / sqrt(D)``.
        window: must be None: a sliding window over a KV cache (per-sequence lengths, paged
            blocks) is not supported; anything else raises UnsupportedProblemError before any
            compute. :func:`attnkit.attention` takes windows on contiguous keys.
        backend: ``"auto"`` (the path :func:`attnkit.attention` would try first for this problem
            in an inference call) or a name of :func:`attnkit.available_backends`.

    Returns:
        (B, Hq, N, Dv) in q's dtype. Forward only: inputs must not require grad.

    Raises:
        TypeError / ValueError before any compute on bad input (lengths beyond the capacity,
        negative lengths, block ids out of range, mismatched pools, dtype/device/shape
        mismatches); BackendUnavailableError / UnsupportedProblemError as
        :func:`attnkit.attention` does.
    """
    if window is not None:
        raise UnsupportedProblemError(
            f"window: attention_with_kvcache takes no sliding window (expected None, got {window!r}); "
            "attnkit.attention(q, k, v, window=...) takes one on contiguous keys"
        )
    cache = check_cache_inputs(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal, scale)
    name = choose_backend(backend, cache.problem)
    if k is not None:
        _append(cache, k_cache, v_cache, k, v, block_table)
    read_in_place = get_backend(name).cache_forward
    if read_in_place is not None:
        out = read_in_place(q, k_cache, v_cache, cache, block_table)
        if out is not None:
            return out
    return _gathered_attention(name, cache, q, k_cache, v_cache, block_table)


def _append(cache: CacheProblem, k_cache, v_cache, k, v, block_table) -> None:
    """Write k, v (B, Hkv, N_new, D|Dv) at positions cache_seqlens[b] + [0, N_new)."""
    positions = cache.seqlens.to(k.device)[:, None] + torch.arange(k.shape[2], device=k.device)
    if block_table is None:
        rows = torch.arange(k.shape[0], device=k.device)[:, None].expand_as(positions)
        k_cache[rows, :, positions] = k.transpose(1, 2).to(k_cache.dtype)
        v_cache[rows, :, positions] = v.transpose(1, 2).to(v_cache.dtype)
        return
    block_size = k_cache.shape[2]
    pages = torch.gather(block_table.long(), 1, positions // block_size)
    k_cache[pages, :, positions % block_size] = k.transpose(1, 2)
    v_cache[pages, :, positions % block_size] = v.transpose(1, 2)


def sequence_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor | None, batch: int, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence ``batch``'s first ``length`` keys and values, contiguous: (1, Hkv, length, D|Dv)."""
    if block_table is None:
        return k_cache[batch : batch + 1, :, :length], v_cache[batch : batch + 1, :, :length]
    block_size = k_cache.shape[2]
    blocks = block_table[batch, : -(-length // block_size)].long()

    def gather(pool: torch.Tensor) -> torch.Tensor:
        # (n_blocks, Hkv, block_size, X) -> (Hkv, n_blocks * block_size, X), cut to the length.
        pages = pool[blocks].transpose(0, 1).reshape(pool.shape[1], -1, pool.shape[3])
        return pages[:, :length].unsqueeze(0)

    return gather(k_cache), gather(v_cache)


def _gathered_attention(name, cache: CacheProblem, q, k_cache, v_cache, block_table) -> torch.Tensor:
    """The reference route: per sequence, gather its keys, then :func:`attnkit.attention`."""
    p = cache.problem
    out = q.new_zeros(p.batch, p.q_heads, p.q_len, p.value_dim)
    for b, length in enumerate(cache.lengths.tolist()):
        if length == 0:
            continue  # no key: every row is zero
        k_b, v_b = sequence_kv(k_cache, v_cache, block_table, b, length)
        out[b : b + 1] = attention(q[b : b + 1], k_b, v_b, causal=p.causal, scale=p.scale, backend=name)
    return out
