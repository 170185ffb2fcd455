"""Attention over a KV cache, contiguous or paged (in the style of FlashAttention-2's
``flash_attn_with_kvcache``): decoding and chunked prefill, forward only.

Layouts (attnkit's (batch, heads, seq, dim) order):

* contiguous: ``k_cache`` (B, Hkv, Mmax, D), ``v_cache`` (B, Hkv, Mmax, Dv); sequence b's keys are
  rows ``[0, L_b)``.
* paged: ``k_cache`` (num_blocks, Hkv, block_size, D), ``v_cache`` (num_blocks, Hkv, block_size,
  Dv) pools and ``block_table`` (B, max_blocks) int32; key j of sequence b is row
  ``j % block_size`` of block ``block_table[b, j // block_size]``. Blocks may be shared between
  sequences and appear in any order; table entries past a sequence's last block are ignored.

The Triton path reads the cache in place with the split-KV kernel (through the block table
when paged). The other paths are references: each sequence's keys are gathered into a
contiguous (1, Hkv, L_b, D) tensor and run through :func:`attnkit.attention` with that backend.
"""

from __future__ import annotations

import torch

from attnkit.api import AUTO_ORDER, attention
from attnkit.errors import BackendUnavailableError, UnsupportedProblemError
from attnkit.inputs import AttentionProblem
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
            positions ``cache_seqlens[b] ..`` before attending (the cache is modified in place).
        block_table: (B, max_blocks) int32/int64 block ids into the pools (paged cache).
        causal: bottom-right per sequence: with ``L_b = cache_seqlens[b] + N_new`` keys, query i
            sees key j iff ``j <= i + L_b - N``. A row that sees no key (e.g. ``L_b = 0``)
            outputs zeros.
        scale: default ``1 / sqrt(D)``.
        window: must be None: a sliding window over a KV cache (per-sequence lengths, paged
            blocks) is not supported; anything else raises UnsupportedProblemError before any
            compute. :func:`attnkit.attention` takes windows on contiguous keys.
        backend: ``"auto"`` (:data:`attnkit.AUTO_ORDER`'s first usable path) or a name of
            :func:`attnkit.available_backends`.

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
    name = _pick_backend(backend, cache.problem)
    if k is not None:
        _append(cache, k_cache, v_cache, k, v, block_table)
    if name == "triton":
        # Imported here: the triton package is optional, and "triton" is only picked when present.
        from attnkit.triton.decode import decode_config, decode_forward
        from attnkit.triton.padding import padded_problem

        # Head dims the kernels need padded (attnkit.triton.padding) would mean copying the whole
        # cache on every call: those take the gathered route, which pads each sequence's keys.
        rows = cache.problem.group_size * cache.problem.q_len
        if padded_problem(cache.problem) is None and rows <= decode_config(block_table is not None).max_rows:
            seqlens = cache.lengths.to(device=q.device, dtype=torch.int32)
            table = None if block_table is None else block_table.to(torch.int32)
            return decode_forward(q, k_cache, v_cache, cache.problem, seqlens=seqlens, block_table=table)[0]
    return _gathered_attention(name, cache, q, k_cache, v_cache, block_table)


def _pick_backend(backend: str, problem: AttentionProblem) -> str:
    """The backend that will run, checked for device and problem support before any compute."""
    if backend == "auto":
        rejections = []
        for name in AUTO_ORDER:
            try:
                candidate = get_backend(name)
            except ValueError:
                continue
            reason = candidate.device_support(problem.device) or candidate.problem_support(problem)
            if reason is None:
                return name
            rejections.append(f"{name}: {reason}")
        raise UnsupportedProblemError(f"no backend supports {problem.describe()}: " + " | ".join(rejections))
    chosen = get_backend(backend)
    reason = chosen.device_support(problem.device)
    if reason is not None:
        raise BackendUnavailableError(f"backend {backend!r} is unavailable: {reason}")
    reason = chosen.problem_support(problem)
    if reason is not None:
        raise UnsupportedProblemError(f"backend {backend!r} does not support {problem.describe()}: {reason}")
    return backend


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
