"""The naive path: attention with the full score matrix materialised.

In float64 this is the oracle: the only definition of "correct" in attnkit. Tests and
benchmarks import :func:`reference_attention` instead of re-deriving softmax.

Run in a lower precision, the same code is the yardstick of the tolerance rule
(:mod:`attnkit.testing`). It then computes the way an ideal fused kernel does (and the way
FlashAttention's own low-precision reference does): q, k, v stay in their dtype, the scores and
the softmax are computed in float32, and the weights P are rounded to the input dtype before
P @ V. Keeping the softmax in float32 makes it 2-4x (median) more accurate than one in fp16/bf16
(``python -m attnkit_tools.pages.yardstick`` measures it), so the rule's multiple of its error is
a tight bound; it also keeps scores such as 7e4 * q.k finite where fp16 would overflow to inf and then NaN.
"""

from __future__ import annotations

import torch

from attnkit.inputs import AttentionProblem, check_inputs


def visibility(problem: AttentionProblem, device: torch.device) -> torch.Tensor:
    """Boolean (N, M) matrix, True where query i sees key j: the rule of
    :attr:`AttentionProblem.key_band` (bottom-right causal and the sliding window) made explicit.
    The one visibility matrix: the oracle masks with it, the SDPA paths pass it as their mask,
    and the tests check the other paths' loop bounds against it."""
    rows = torch.arange(problem.q_len, device=device)[:, None]
    cols = torch.arange(problem.kv_len, device=device)[None, :]
    visible = torch.ones(problem.q_len, problem.kv_len, dtype=torch.bool, device=device)
    lower, upper = problem.key_band
    if upper is not None:
        visible &= cols <= rows + upper
    if lower is not None:
        visible &= cols >= rows + lower
    return visible


def score_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores and softmax are computed in: float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def attention_scores(q: torch.Tensor, k: torch.Tensor, problem: AttentionProblem) -> torch.Tensor:
    """scale * q k^T with -inf where the causal mask or the window hides a key: (B, Hkv, G, N, M), in
    :func:`score_dtype` (q and k are upcast exactly, so the only roundings are float32's).

    GQA is handled by viewing q as (B, Hkv, G, N, D) so K broadcasts over the group instead of
    being repeated.
    """
    p = problem
    acc = score_dtype(q.dtype)
    qg = q.reshape(p.batch, p.kv_heads, p.group_size, p.q_len, p.head_dim).to(acc)
    scores = torch.matmul(qg, k.to(acc).unsqueeze(2).transpose(-1, -2)) * p.scale
    if p.causal or p.has_window:
        scores = scores.masked_fill(~visibility(p, q.device), float("-inf"))
    return scores


def attention_weights(q: torch.Tensor, k: torch.Tensor, problem: AttentionProblem) -> torch.Tensor:
    """softmax of :func:`attention_scores`: (B, Hkv, G, N, M), in :func:`score_dtype`. A row
    that sees no key gets all-zero weights."""
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
    """softmax(scale * q k^T) v, differentiable by autograd; shapes as in
    :func:`attnkit.attention`. Scores and softmax in :func:`score_dtype`; the weights are
    rounded to v's dtype for P @ V, as fused kernels do, and the result has q's dtype."""
    p = problem
    out = torch.matmul(attention_weights(q, k, p).to(v.dtype), v.unsqueeze(2))
    return out.reshape(p.batch, p.q_heads, p.q_len, p.value_dim)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The float64 oracle: upcasts q, k, v to float64 and returns a float64 result.

    Gradients flow back to the original tensors (in their own dtype).
    """
    problem = check_inputs(q, k, v, causal, scale, window)
    return naive_attention(q.double(), k.double(), v.double(), problem)


class _Zeros(torch.autograd.Function):
    """(B, Hq, N, Dv) zeros whose gradients to q, k and v are zeros, whatever q holds (a NaN
    in a row that sees no key stays out of the result, as on the kernel paths)."""

    @staticmethod
    def forward(ctx, q, k, v, value_dim):
        ctx.specs = [(x.shape, x.dtype, x.device) for x in (q, k, v)]
        return q.new_zeros(*q.shape[:-1], value_dim)

    @staticmethod
    def backward(ctx, grad):
        zeros = (torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.specs)
        return (*zeros, None)


def degenerate_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem
) -> torch.Tensor:
    """The result for a problem with a zero-size dimension, the same on every path: shapes as
    in :func:`attnkit.attention`.

    * B, Hq, N or Dv = 0: an empty (B, Hq, N, Dv) tensor;
    * M = 0: every row sees no key, so zeros with zero gradients (the documented rule for such
      rows);
    * D = 0 (with M > 0): every score is the empty sum 0, so each row is the mean of the values
      it sees, computed by the naive path (dq and dk are empty).
    """
    p = problem
    if p.head_dim == 0 and 0 not in (p.batch, p.q_heads, p.q_len, p.kv_len, p.value_dim):
        return naive_attention(q, k, v, p)
    return _Zeros.apply(q, k, v, p.value_dim)
