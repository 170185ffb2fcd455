"""The toy kernel: attention over chunks of queries, in plain PyTorch (autograd gives the
backward). It follows attnkit's contract: bottom-right causal masking, the sliding window,
GQA, zeros for rows that see no key, scores and softmax in float32 (float64 for float64)."""

from __future__ import annotations

import torch

#: Queries per chunk: the score matrix held at once is (B, Hq, CHUNK, M).
CHUNK = 64


def supports(problem) -> str | None:
    """The kernel declines head dims above 128 (a stand-in for a real kernel's limits)."""
    if max(problem.head_dim, problem.value_dim) > 128:
        return f"head dims above 128 are not supported (D={problem.head_dim}, Dv={problem.value_dim})"
    return None


def toy_attention(q, k, v, *, causal, scale, window):
    """q (B, Hq, N, D), k (B, Hkv, M, D), v (B, Hkv, M, Dv) -> (B, Hq, N, Dv) in q's dtype.

    ``window`` is None or (left, right) with -1 for an unbounded side; query i sees key j iff
    ``i + M - N - left <= j <= i + M - N + right``, and with ``causal`` also ``j <= i + M - N``.
    """
    n, m = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    k = k.repeat_interleave(group, dim=1).to(acc)
    v = v.repeat_interleave(group, dim=1).to(acc)
    keys = torch.arange(m, device=q.device)
    chunks = []
    for start in range(0, n, CHUNK):
        rows = torch.arange(start, min(start + CHUNK, n), device=q.device)[:, None]
        diagonal = rows + (m - n)  # bottom-right alignment: the last query sees the last key
        visible = torch.ones(rows.shape[0], m, dtype=torch.bool, device=q.device)
        if causal:
            visible &= keys <= diagonal
        if window is not None:
            left, right = window
            if left >= 0:
                visible &= keys >= diagonal - left
            if right >= 0:
                visible &= keys <= diagonal + right
        scores = (q[:, :, start : start + CHUNK].to(acc) @ k.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~visible, float("-inf"))
        # A row that sees no key: max -inf; 0 instead keeps exp() at exactly 0 and the row at 0.
        row_max = scores.amax(-1, keepdim=True).detach()
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        weights = torch.exp(scores - row_max)
        total = weights.sum(-1, keepdim=True)
        weights = weights / torch.where(total == 0, torch.ones_like(total), total)
        chunks.append(weights @ v)
    return torch.cat(chunks, dim=2).to(q.dtype)
