"""The one ``autograd.Function`` shared by every FlashAttention-style path (tiled, triton).

A path supplies a forward that returns the output and the per-row log-sum-exp, and a backward
that recomputes the scores from them. Only O and the log-sum-exp are saved, which keeps the
memory of training O(N) instead of O(N^2).
"""

from __future__ import annotations

from typing import Protocol

import torch

from attnkit.inputs import AttentionProblem


class FlashImplementation(Protocol):
    """Forward and backward of an online-softmax attention path.

    ``lse`` has shape (B, Hq, N) and holds, per query row, ``log(sum_j exp(scale * q.k_j))``
    over the visible keys (natural log, accumulator dtype), or ``+inf`` for a row that sees no
    key: recomputing ``exp(s - lse)`` then gives exactly 0, so such rows get zero gradient.
    """

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward(
        self,
        grad_out: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        problem: AttentionProblem,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


class _FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, problem, impl):
        out, lse = impl.forward(q, k, v, problem)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.problem = problem
        ctx.impl = impl
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.impl.backward(grad_out, q, k, v, out, lse, ctx.problem)
        return dq, dk, dv, None, None


def flash_attention(
    impl: FlashImplementation,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: AttentionProblem,
) -> torch.Tensor:
    """Run ``impl`` with autograd support; returns (B, Hq, N, Dv) in q's dtype."""
    return _FlashAttentionFunction.apply(q, k, v, problem, impl)
