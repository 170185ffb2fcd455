"""The naive path: attention with the full score matrix materialised.

In float64 this is the oracle: the only definition of "correct" in attnkit. Tests and
benchmarks import :func:`reference_attention` instead of re-deriving softmax.

Run in a low-precision dtype, the same code is the yardstick of the tolerance rule
(:mod:`attnkit.testing`): it shows how much error plain PyTorch makes in that dtype.
"""

from __future__ import annotations

import torch

from attnkit.inputs import AttentionProblem, check_inputs


def causal_visibility(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """Boolean (q_len, kv_len) matrix, True where query i sees key j (bottom-right aligned)."""
    rows = torch.arange(q_len, device=device)[:, None]
    cols = torch.arange(kv_len, device=device)[None, :]
    return cols <= rows + (kv_len - q_len)


def attention_scores(q: torch.Tensor, k: torch.Tensor, problem: AttentionProblem) -> torch.Tensor:
    """scale * q k^T with -inf where the causal mask hides a key, in q's dtype: (B, Hkv, G, N, M).

    GQA is handled by viewing q as (B, Hkv, G, N, D) so K broadcasts over the group instead of
    being repeated.
    """
    p = problem
    qg = q.reshape(p.batch, p.kv_heads, p.group_size, p.q_len, p.head_dim)
    scores = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) * p.scale
    if p.causal:
        visible = causal_visibility(p.q_len, p.kv_len, q.device)
        scores = scores.masked_fill(~visible, float("-inf"))
    return scores


def attention_weights(q: torch.Tensor, k: torch.Tensor, problem: AttentionProblem) -> torch.Tensor:
    """softmax of :func:`attention_scores`: (B, Hkv, G, N, M). A row that sees no key gets
    all-zero weights."""
    scores = attention_scores(q, k, problem)
    # Subtracting the row max keeps exp() in range for large logits. A row that sees no key
    # has max -inf; replacing it by 0 makes every exp() exactly 0 and the row's output 0.
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)
    denom = weights.sum(dim=-1, keepdim=True)
    return weights / torch.where(denom == 0, torch.ones_like(denom), denom)


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem
) -> torch.Tensor:
    """softmax(scale * q k^T) v, computed in q's dtype, differentiable by autograd."""
    p = problem
    out = torch.matmul(attention_weights(q, k, p), v.unsqueeze(2))
    return out.reshape(p.batch, p.q_heads, p.q_len, p.value_dim)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """The float64 oracle: upcasts q, k, v to float64 and returns a float64 result.

    Gradients flow back to the original tensors (in their own dtype).
    """
    problem = check_inputs(q, k, v, causal, scale)
    return naive_attention(q.double(), k.double(), v.double(), problem)
