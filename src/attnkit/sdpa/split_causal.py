"""Bottom-right causal attention with 1 < N < M on a kernel whose causal mode is top-left only
(cuDNN), without a mask: the keys are split where the causal edge begins.

Query row i sees key j iff ``j <= i + P`` with ``P = M - N``, so

* the prefix keys [0, P) are seen by every row: a non-causal call on ``k[:, :, :P]``;
* the last N keys form an N x N square in which row i sees square key t iff ``t <= i``:
  exactly the kernel's own top-left ``is_causal`` (a causal call on ``k[:, :, P:]``).

Each call returns its output and per-row log-sum-exp (natural log, of the scaled scores). Every
row sees at least one key of each part (P >= 1, and the square's diagonal), so both are finite,
and the parts merge exactly:

    lse = logaddexp(lse1, lse2),    out = o1 * exp(lse1 - lse) + o2 * exp(lse2 - lse)

in the log-sum-exp's dtype (float32; float64 for float64 inputs), rounded once to the input
dtype. The merged output, its gradient and log-sum-exp reach the kernel's backward in the
shapes and strides its own forward would have made: PyTorch builds cuDNN's backward plan from
the strides of O and dO but caches it under q, k and v's alone, and the plan reads the
log-sum-exp with fixed strides (cuDNN's: (B, H, N, 1) float32 per torch 2.13's shape function,
(B, H, N) in older PyTorch sources, heads innermost under ``TORCH_CUDNN_SDPA_AVOID_RECOMPILE``;
PyTorch's CPU flash kernel: (B, H, N), heads innermost).

Backward (:class:`_SplitCausalFunction`). A FlashAttention-style backward recomputes the weights
as ``exp(scale * q.k - lse)`` and the row term ``delta = rowsum(dO * O)`` from the output and
log-sum-exp it is handed. Handed the *merged* O and lse, each part's backward therefore computes
exactly that part's share of the whole problem's gradient (ring attention's merge, run
backwards): dq is the sum of the parts' dq (computed in float32 for 16-bit inputs, rounded
once), dk and dv are the parts' key gradients side by side along the keys. Query-head groups
(GQA) need nothing here: both kernels read kv head ``h // G`` themselves and return key
gradients summed over the group.

A kernel enters as a :class:`BlockKernel`: its forward (returning out and log-sum-exp) and its
backward (taking them). :data:`CUDNN` runs on the GPU (:mod:`attnkit.sdpa.lower_right` admits the
inputs first); :data:`CPU_FLASH`, PyTorch's CPU flash kernel, runs the same split, merge and
backward on the CPU, which is how they are tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit.inputs import AttentionProblem, records_backward

try:
    from attnkit.triton.decode import merge_pair
except ImportError:  # triton is optional: without it cuDNN's merge runs as PyTorch ops
    merge_pair = None

#: The fewest keys a part may have: cuDNN declines a key length of 1 ("cudnn SDPA does not
#: support key/value sequence length 1", torch 2.13), so M - N = 1 has no prefix it takes.
MIN_PART_KEYS = 2


@dataclass(frozen=True)
class BlockKernel:
    """One attention kernel as the split calls it, on a block of keys (any strides).

    ``forward(q, k, v, causal, scale) -> (out, lse, state)``: q (B, Hq, N, D), k (B, Hkv, S, D),
    v (B, Hkv, S, Dv); ``causal`` is top-left; out (B, Hq, N, Dv) in q's dtype; lse per row, in
    the kernel's own shape and layout; ``state``: what its backward needs besides.

    ``backward(grad_out, q, k, v, out, lse, causal, scale, state) -> (dq, dk, dv)``, with the
    shapes of q, k and v (dk, dv summed over the query-head group).
    """

    forward: Callable[..., tuple[torch.Tensor, torch.Tensor, tuple]]
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    #: ``merge(o1, lse1, o2, lse2) -> (out, lse)``, laid out as o1 and lse1: :func:`merge`, or
    #: the same in one kernel.
    merge: Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _cudnn_forward(q, k, v, causal: bool, scale: float):
    # Schema (torch 2.13; test_split_causal.py binds it on meta tensors): (query, key, value,
    # attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask, *, scale) ->
    # (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset,
    # debug_attn_mask). compute_log_sumexp: the merge needs it even without gradients.
    cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = cudnn(
        q, k, v, None, True, 0.0, causal, False, scale=scale
    )
    return out, lse, (cum_q, cum_k, max_q, max_k, seed, offset)


def _cudnn_backward(grad_out, q, k, v, out, lse, causal: bool, scale: float, state):
    # The forward's bookkeeping goes back as it came, as PyTorch's own autograd passes it
    # (cum_seq_*: None for dense inputs). attn_bias is a plain ``Tensor`` in the schema: None
    # binds to an undefined tensor, which the kernel reads as "no bias".
    cum_q, cum_k, max_q, max_k, seed, offset = state
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        grad_out, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal, scale=scale
    )


def _cpu_flash_forward(q, k, v, causal: bool, scale: float):
    # Takes Dv == D only; lse (B, H, N), float32 (float64 for float64 inputs).
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out, lse, ()


def _cpu_flash_backward(grad_out, q, k, v, out, lse, causal: bool, scale: float, state):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, q, k, v, out, lse, 0.0, causal, scale=scale
    )


def merge(o1, lse1, o2, lse2) -> tuple[torch.Tensor, torch.Tensor]:
    """The two parts' results merged (module docstring), in PyTorch ops: ~8 launches, which on
    the GPU cost more than the square's own kernel when N is small (hence :data:`CUDNN`'s one
    kernel)."""
    lse = torch.logaddexp(lse1, lse2, out=torch.empty_like(lse1))
    # o (in q's dtype) times a weight in lse's dtype computes in lse's dtype; one rounding at the end.
    merged = (o1 * _column(lse1 - lse).exp_()).addcmul_(o2, _column(lse2 - lse).exp_())
    return torch.empty_like(o1).copy_(merged), lse


#: cuDNN's SDPA kernel (CUDA), through PyTorch's private ops; the merge in one Triton kernel
#: (on the H100 at B4 Hq32 Hkv8 N16 M16384, torch 2.11: 6.8 us against 31 us for the PyTorch
#: ops, profiled).
CUDNN = BlockKernel(_cudnn_forward, _cudnn_backward, merge_pair or merge)
#: PyTorch's CPU flash kernel: the split's CPU twin, for tests.
CPU_FLASH = BlockKernel(_cpu_flash_forward, _cpu_flash_backward, merge)


def splits(problem: AttentionProblem) -> bool:
    """Whether :func:`split_causal_attention` computes ``problem``: causal without a window,
    1 < N < M, and a prefix of at least :data:`MIN_PART_KEYS` keys (the square has N >= 2)."""
    return (
        problem.causal
        and not problem.has_window
        and problem.q_len > 1
        and problem.causal_offset >= MIN_PART_KEYS
    )


def split_causal_attention(
    kernel: BlockKernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem
) -> torch.Tensor:
    """Bottom-right causal attention on ``kernel`` as a prefix and a square (module docstring),
    with autograd. q: (B, Hq, N, D), k: (B, Hkv, M, D), v: (B, Hkv, M, Dv), as the kernel takes
    them (layout, dtype, scale); returns (B, Hq, N, Dv). ``problem`` must satisfy :func:`splits`."""
    prefix = problem.causal_offset
    if records_backward(q, k, v):
        return _SplitCausalFunction.apply(q, k, v, kernel, prefix, problem.scale)
    return _forward(kernel, q, k, v, prefix, problem.scale)[0]


def _column(lse: torch.Tensor) -> torch.Tensor:
    """``lse`` as (B, H, N, 1), to weight (B, H, N, Dv) outputs: a view, whatever its layout."""
    return lse if lse.dim() == 4 else lse.unsqueeze(-1)


def _forward(kernel: BlockKernel, q, k, v, prefix: int, scale: float):
    """(out, merged lse, the parts' states)."""
    o1, lse1, state1 = kernel.forward(q, k[:, :, :prefix], v[:, :, :prefix], False, scale)
    o2, lse2, state2 = kernel.forward(q, k[:, :, prefix:], v[:, :, prefix:], True, scale)
    # Merged into tensors laid out as the kernel's own (module docstring: its backward's plan).
    out, lse = kernel.merge(o1, lse1, o2, lse2)
    return out, lse, (state1, state2)


class _SplitCausalFunction(torch.autograd.Function):
    """Forward: the two calls and the merge. Backward: each part's kernel backward, handed the
    merged output and log-sum-exp (module docstring). Saves q, k, v, out and the merged lse."""

    @staticmethod
    def forward(ctx, q, k, v, kernel: BlockKernel, prefix: int, scale: float):
        out, lse, states = _forward(kernel, q, k, v, prefix, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kernel, ctx.prefix, ctx.scale, ctx.states = kernel, prefix, scale, states
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        kernel, p, scale = ctx.kernel, ctx.prefix, ctx.scale
        if grad_out.stride() != out.stride():
            # dO laid out as O, as the kernel's backward plan assumes (module docstring); an
            # expanded gradient (of out.sum(), zero strides) is materialised on the way.
            grad_out = torch.empty_like(out).copy_(grad_out)
        prefix_state, square_state = ctx.states
        dq1, dk1, dv1 = kernel.backward(
            grad_out, q, k[:, :, :p], v[:, :, :p], out, lse, False, scale, prefix_state
        )
        dq2, dk2, dv2 = kernel.backward(
            grad_out, q, k[:, :, p:], v[:, :, p:], out, lse, True, scale, square_state
        )
        # A 16-bit sum is computed in float32 and rounded once: one launch, no casts.
        dq = dq1 + dq2
        return dq, torch.cat([dk1, dk2], dim=2), torch.cat([dv1, dv2], dim=2), None, None, None
