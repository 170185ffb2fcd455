"""PyTorch's private SDPA ops behind one interface: a forward that also returns the row
log-sum-exp, and a backward that takes the output and log-sum-exp from the caller.

The public ``scaled_dot_product_attention`` returns neither the log-sum-exp nor lets a caller
hand its backward a different one; :mod:`attnkit.sdpa_split` needs both (it merges partial
attentions and differentiates the merge). Each fused kernel's private op pair does:

==================  ============================================================  ==========================
kernel              forward op (returns)                                          lse as returned
==================  ============================================================  ==========================
flash, CUDA         ``_scaled_dot_product_flash_attention`` (out, lse, cum_seq_q,  (B, H, N)
                    cum_seq_k, max_q, max_k, rng_state, unused, debug_mask)
flash, CPU          ``_scaled_dot_product_flash_attention_for_cpu`` (out, lse)     (B, H, N), strided
cuDNN               ``_scaled_dot_product_cudnn_attention`` (out, lse, cum_seq_q,  (B, H, N, 1)
                    cum_seq_k, max_q, max_k, philox_seed, philox_offset, debug)
efficient           ``_scaled_dot_product_efficient_attention`` (out, lse,         (B, H, N rounded up to
                    philox_seed, philox_offset)                                    32), padding rows +inf
==================  ============================================================  ==========================

All are float32, natural-log row sums of ``exp(scale * q k^T)``. Argument lists as in torch
2.13 (``torch.ops.aten.<op>.default._schema``); the cuDNN pair is quoted identically by code
built against earlier 2.x releases. A call that does not match raises, and the caller falls
back (:mod:`attnkit.sdpa_lower_right`), so a changed schema costs speed, not correctness.

A backward is handed the log-sum-exp in the exact tensor its forward returned (a clone, with
the rows overwritten: :func:`lse_for_backward`), so every kernel sees the shape, strides and
padding it produced itself. The flash and cuDNN ops get back the other returned values too
(sequence offsets, RNG state), as PyTorch's own autograd formula passes them; with dropout 0
the kernels do not read the RNG state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend

_OPS = torch.ops.aten


@dataclass(frozen=True)
class PrivateKernel:
    """One kernel's forward and backward.

    ``forward(q, k, v, causal, scale) -> (out, lse_raw, saved)``: q (B, H, N, D), k (B, H, M, D),
    v (B, H, M, Dv); out (B, H, N, Dv); ``lse_raw`` as the op returned it (see
    :func:`lse_rows`); ``saved``: what the backward needs besides tensors the caller has.

    ``backward(grad_out, q, k, v, out, lse_raw, saved, causal, scale) -> (dq, dk, dv)``.
    """

    name: str
    forward: Callable
    backward: Callable


def lse_rows(lse_raw: torch.Tensor, q_len: int) -> torch.Tensor:
    """The (B, H, N) view of a returned log-sum-exp: cuDNN's trailing unit dimension and the
    efficient kernel's padding rows dropped."""
    rows = lse_raw[..., 0] if lse_raw.dim() == 4 else lse_raw
    return rows[..., :q_len]


def lse_for_backward(lse_raw: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``lse_raw``'s layout (shape, strides, padding) holding ``lse`` (B, H, N) in its rows."""
    full = lse_raw.clone()
    lse_rows(full, lse.shape[-1]).copy_(lse)
    return full


def _flash_cuda_forward(q, k, v, causal, scale):
    out, lse, cum_q, cum_k, _, _, rng_state, unused, _ = _OPS._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False, scale=scale
    )
    return out, lse, (cum_q, cum_k, rng_state, unused)


def _flash_cuda_backward(grad_out, q, k, v, out, lse, saved, causal, scale):
    cum_q, cum_k, rng_state, unused = saved
    return _OPS._scaled_dot_product_flash_attention_backward(
        grad_out, q, k, v, out, lse, cum_q, cum_k, q.shape[2], k.shape[2], 0.0, causal, rng_state, unused,
        scale=scale,
    )  # fmt: skip


def _flash_cpu_forward(q, k, v, causal, scale):
    out, lse = _OPS._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out, lse, ()


def _flash_cpu_backward(grad_out, q, k, v, out, lse, saved, causal, scale):
    return _OPS._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, q, k, v, out, lse, 0.0, causal, scale=scale
    )


def _cudnn_forward(q, k, v, causal, scale):
    out, lse, cum_q, cum_k, _, _, seed, offset, _ = _OPS._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale
    )
    return out, lse, (cum_q, cum_k, seed, offset)


def _cudnn_backward(grad_out, q, k, v, out, lse, saved, causal, scale):
    cum_q, cum_k, seed, offset = saved
    return _OPS._scaled_dot_product_cudnn_attention_backward(
        grad_out, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, q.shape[2], k.shape[2], 0.0, causal,
        scale=scale,
    )  # fmt: skip


def _efficient_forward(q, k, v, causal, scale):
    out, lse, seed, offset = _OPS._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, causal, scale=scale
    )
    return out, lse, (seed, offset)


def _efficient_backward(grad_out, q, k, v, out, lse, saved, causal, scale):
    seed, offset = saved
    return _OPS._scaled_dot_product_efficient_attention_backward(
        grad_out, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False], causal, scale=scale
    )[:3]


#: Keyed by (backend name, device type): plain strings, which torch.compile guards on.
_KERNELS = {
    ("FLASH_ATTENTION", "cuda"): PrivateKernel("flash", _flash_cuda_forward, _flash_cuda_backward),
    ("FLASH_ATTENTION", "cpu"): PrivateKernel("flash", _flash_cpu_forward, _flash_cpu_backward),
    ("CUDNN_ATTENTION", "cuda"): PrivateKernel("cudnn", _cudnn_forward, _cudnn_backward),
    ("EFFICIENT_ATTENTION", "cuda"): PrivateKernel("efficient", _efficient_forward, _efficient_backward),
}


def private_kernel(backend: SDPBackend | None, device: torch.device) -> PrivateKernel | None:
    """The op pair of ``backend`` on ``device``'s type, or None where PyTorch has none."""
    if backend is None:
        return None
    return _KERNELS.get((backend.name, device.type))
