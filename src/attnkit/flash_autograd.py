"""The one ``autograd.Function`` shared by every FlashAttention-style path (tiled, triton).

A path supplies a forward that returns the output and the per-row log-sum-exp, and a backward
that recomputes the scores from them. Only O and the log-sum-exp are saved, which keeps the
memory of training O(N) instead of O(N^2).

Three ways in, chosen per call by :func:`flash_attention`, all running the same forward and
backward:

* eager, no gradient needed: the forward alone (no autograd node, no saved tensors), or the
  caller's ``forward_only`` when it has one that skips the log-sum-exp (the Triton path's
  prepared run);
* eager with autograd: :class:`_FlashAttentionFunction`. Dispatching the torch.library op
  instead costs host time on every call: measured on the CPU with the Triton launches stubbed
  out (B=1 H=8 N=128 D=64 bf16), 18 us per call through this class against 52 us through the
  op, and 11 us against 26 us with no gradient; ``python -m attnkit_tools.pages.per_call`` measures it on a
  GPU (row ``triton-op``);
* under torch.compile: the ``attnkit::flash_forward`` op (:mod:`attnkit.ops`), which the
  compiler treats as one opaque node with a fake implementation and a registered backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from attnkit.inputs import AttentionProblem, records_backward

#: Paths reachable through the torch.library op, by name: a factory of their default-config
#: implementation. Filled by the path modules (tiled, triton) when they are imported.
PATHS: dict[str, Callable[[], FlashImplementation]] = {}


class FlashImplementation(Protocol):
    """Forward and backward of an online-softmax attention path.

    ``op_name`` is the key of :data:`PATHS` when the instance runs the path's default config
    (then torch.compile can reach it through the op), else None.

    ``lse`` has shape (B, Hq, N) and holds, per query row, ``log(sum_j exp(scale * q.k_j))``
    over the visible keys (natural log, accumulator dtype), or ``+inf`` for a row that sees no
    key: recomputing ``exp(s - lse)`` then gives exactly 0, so such rows get zero gradient.
    """

    op_name: str | None

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
    forward_only: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Run ``impl`` with autograd support; returns (B, Hq, N, Dv) in q's dtype.
    ``forward_only(q, k, v)``: ``impl``'s output for a call no backward follows, used in place
    of ``impl.forward`` there."""
    if torch.compiler.is_compiling() and impl.op_name is not None:
        window_left, window_right = problem.window or (-1, -1)
        return torch.ops.attnkit.flash_forward(
            q, k, v, problem.causal, problem.scale, impl.op_name, window_left, window_right
        )[0]
    if records_backward(q, k, v):
        return _FlashAttentionFunction.apply(q, k, v, problem, impl)
    if forward_only is not None:
        return forward_only(q, k, v)
    return impl.forward(q, k, v, problem)[0]
