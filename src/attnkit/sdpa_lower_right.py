"""Bottom-right causal attention with fewer queries than keys (N < M) on SDPA's kernels, at the
cost of the N x M problem (no M x M detour).

SDPA's ``is_causal`` is aligned top-left, so N < M needs a translation. Three, by kernel:

* **N = 1**: the one query row sees every key: the plain non-causal call (exact, any kernel).
* **A lower-right mask** for the kernels that take ``attn_mask`` (PyTorch's choice, efficient,
  math): a boolean (N, M) mask, broadcast over batch and heads; forward and backward are
  PyTorch's own.
* **Split and merge** for the kernels that take no mask (flash, cuDNN), forward only (no
  gradient needed): the keys split into the prefix every row sees, [0, M - N), run
  non-causally, and the trailing N x N square, where top-left and bottom-right coincide, run
  with ``is_causal``. Each part runs on the forced kernel and returns its log-sum-exp
  (PyTorch's private ``_scaled_dot_product_*`` ops); the parts merge exactly:
  ``lse = logaddexp(lse1, lse2)``, ``out = exp(lse1 - lse) o1 + exp(lse2 - lse) o2``.
  The prefix folds the query-head group into the query rows, (B, Hq, N, D) -> (B, Hkv, G*N, D)
  (every row sees the same keys), so GQA needs no key/value copy; the square repeats its N keys
  per query head (a copy of N rows only).

When gradients are needed, flash and cuDNN keep the exact square formulation of
:mod:`attnkit.sdpa` (their private ops return a log-sum-exp that autograd does not
differentiate, and a merge needs its gradient).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import AttentionProblem

#: Kernels that accept ``attn_mask`` (None: PyTorch chooses among those that do).
MASK_KERNELS = (None, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)

#: Kernels whose forward runs as prefix + square merged by log-sum-exp.
SPLIT_KERNELS = (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION)


def lower_right_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """(N, M) bool, True where query i sees key j (``j <= i + M - N``)."""
    rows = torch.arange(q_len, device=device)[:, None]
    return torch.arange(kv_len, device=device)[None, :] <= rows + (kv_len - q_len)


def split_supported(backend: SDPBackend | None, q, k, v, problem: AttentionProblem) -> bool:
    """Whether :func:`split_attention` can run: a no-mask kernel, no gradient wanted, and the
    dtypes / head dims the private ops take directly (the public API pads head dims to a
    multiple of 8 for flash; the private ops do not)."""
    p = problem
    if backend not in SPLIT_KERNELS or p.causal_offset <= 0:
        return False
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return False
    if p.head_dim != p.value_dim or p.head_dim % 8 != 0:
        return False
    if p.device.type == "cuda":
        return p.dtype in (torch.float16, torch.bfloat16)
    return backend == SDPBackend.FLASH_ATTENTION and p.dtype in (torch.float32, torch.bfloat16, torch.float16)


def _with_lse(backend: SDPBackend, q, k, v, causal: bool, scale: float):
    """One forced-kernel call: out (B, H, N, Dv) and its lse reshaped to (B, H, N) float32."""
    ops = torch.ops.aten
    if backend == SDPBackend.FLASH_ATTENTION and q.device.type == "cpu":
        out, lse = ops._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    elif backend == SDPBackend.FLASH_ATTENTION:
        out, lse = ops._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
    else:
        out, lse = ops._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal, False, scale=scale
        )[:2]
    # cuDNN returns (B, H, N, 1) statistics, flash (B, H, N); both are natural-log row sums.
    return out, lse.reshape(q.shape[:3]).float()


def split_attention(
    name: str,
    backend: SDPBackend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: AttentionProblem,
) -> torch.Tensor:
    """Forward of bottom-right causal N < M as prefix + square (module docstring).
    q: (B, Hq, N, D), k: (B, Hkv, M, D), v: (B, Hkv, M, D); returns (B, Hq, N, D) in q's dtype."""
    p = problem
    prefix = p.causal_offset
    folded = q.reshape(p.batch, p.kv_heads, p.group_size * p.q_len, p.head_dim)
    k_sq, v_sq = (x[:, :, prefix:].repeat_interleave(p.group_size, dim=1) for x in (k, v))
    try:
        o1, lse1 = _with_lse(backend, folded, k[:, :, :prefix], v[:, :, :prefix], False, p.scale)
        o2, lse2 = _with_lse(backend, q, k_sq, v_sq, True, p.scale)
    except RuntimeError as err:
        raise UnsupportedProblemError(
            f"backend {name!r} cannot run {p.describe()} on {p.device} as prefix + causal square: {err}"
        ) from err
    o1 = o1.reshape(p.batch, p.q_heads, p.q_len, p.value_dim)
    lse1 = lse1.reshape(p.batch, p.q_heads, p.q_len)
    lse = torch.logaddexp(lse1, lse2)
    out = o1.float() * torch.exp(lse1 - lse)[..., None] + o2.float() * torch.exp(lse2 - lse)[..., None]
    return out.to(p.dtype)


def masked_attention(
    name: str,
    backend: SDPBackend | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: AttentionProblem,
) -> torch.Tensor:
    """Bottom-right causal through a lower-right ``attn_mask``; shapes as in :func:`attnkit.attention`.
    Differentiable (PyTorch's forward and backward of the kernel)."""
    mask = lower_right_mask(problem.q_len, problem.kv_len, q.device)
    scale = problem.scale
    call = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    if torch.compiler.is_compiling():  # dynamo cannot trace the warnings machinery
        if backend is None:
            return call()
        with sdpa_kernel([backend]):
            return call()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if backend is None:
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, scale=problem.scale, enable_gqa=True
                )
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, scale=problem.scale, enable_gqa=True
                )
        except RuntimeError as err:
            reasons = "; ".join(str(w.message).strip() for w in caught) or str(err)
            raise UnsupportedProblemError(
                f"backend {name!r} cannot run {problem.describe()} on {problem.device} with a lower-right "
                f"causal mask: {reasons}"
            ) from err
