"""The SDPA path: ``torch.nn.functional.scaled_dot_product_attention``, optionally forcing one
of its backends, with attnkit's semantics on top.

Two translations are needed:

* Causal masks. SDPA's ``is_causal`` is aligned top-left; attnkit's is bottom-right
  (query i sees key j iff j <= i + M - N). For N > M the first N - M rows see no key: they are
  zero, and only the last M rows go to SDPA as a square causal problem. N < M runs at the
  cost of the N x M problem (:mod:`attnkit.sdpa_lower_right`: N = 1 non-causal, a lower-right
  mask for the kernels that take one, prefix + square merged by log-sum-exp for flash and
  cuDNN forwards). Only flash and cuDNN with gradients still prepend M - N zero query rows,
  making a square problem whose last N rows are exactly the bottom-right rows.
  (``torch.nn.attention.bias.causal_lower_right`` is not used: it picks its kernel itself,
  ignoring a forced backend, and drops GQA on its flash branch.)
* Non-positive and tiny scales. PyTorch's CPU flash kernel returns NaN for causal inputs when
  the scale is 0, negative, or below float32's smallest normal (torch 2.13). Both are
  translated exactly: ``softmax(s * q k^T) == softmax(|s| * q (-k)^T)`` for s < 0 (negation is
  exact), and for |s| below the smallest normal every score rounds to 0 in float32, so the call
  is made with a zeroed q (scale 1), which is the s = 0 function with dq = 0.
* Strides. PyTorch's CUDA flash kernel (torch 2.11) reads rows with 16-byte vector loads and
  faults with "misaligned address" — poisoning the CUDA context — when a row stride is not a
  multiple of 16 bytes (e.g. every other row of a (.., 2N, D + 3) buffer). Such operands are
  copied to contiguous memory first; aligned strided views pass through untouched.
* Errors. When a forced backend rejects the inputs, PyTorch raises a generic "no available
  kernel" error and explains the reason only in warnings; those warnings are captured and put
  into the error attnkit raises.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnkit import sdpa_lower_right as lower_right
from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import AttentionProblem

#: attnkit backend name -> the SDPA backend it forces (None: PyTorch chooses).
SDPA_BACKENDS: dict[str, SDPBackend | None] = {
    "sdpa": None,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-math": SDPBackend.MATH,
}

#: Backends that exist only as CUDA kernels (on CPU PyTorch has flash and math).
_CUDA_ONLY = {SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION}


def sdpa_device_support(name: str, device: torch.device) -> str | None:
    """Why backend ``name`` cannot run on ``device`` at all, or None if it can."""
    backend = SDPA_BACKENDS[name]
    if backend in _CUDA_ONLY and device.type != "cuda":
        return f"{name} is a CUDA kernel; device {device} is not a CUDA device"
    if backend == SDPBackend.CUDNN_ATTENTION and not torch.backends.cudnn.is_available():
        return f"{name} needs cuDNN, which this PyTorch build does not provide"
    return None


def sdpa_problem_support(name: str, problem: AttentionProblem) -> str | None:
    """Reasons known before launch; anything subtler comes from PyTorch at call time."""
    backend = SDPA_BACKENDS[name]
    if problem.dtype == torch.float64 and backend not in (None, SDPBackend.MATH):
        return f"{name} does not support float64 on {problem.device.type} (use sdpa-math)"
    return None


def _square_causal_operands(q, problem: AttentionProblem):
    """Return (q_for_sdpa, rows_to_keep) that turn bottom-right causal into SDPA's top-left."""
    offset = problem.causal_offset
    if offset > 0:  # N < M: prepend zero rows so that query row i lands at row i + offset.
        pad = q.new_zeros(problem.batch, problem.q_heads, offset, problem.head_dim)
        return torch.cat([pad, q], dim=2), slice(offset, None)
    return q[:, :, -offset:], None  # N >= M: only the last M rows see any key.


def _aligned_for_fused_kernels(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a contiguous copy if its layout would misalign CUDA fused kernels' loads."""
    if x.device.type != "cuda":
        return x
    item = x.element_size()
    aligned = (
        x.stride(-1) == 1
        and x.data_ptr() % 16 == 0
        and all(
            (stride * item) % 16 == 0
            for stride, size in zip(x.stride()[:-1], x.shape[:-1], strict=True)
            if size > 1
        )
    )
    return x if aligned else x.contiguous()


def _call_sdpa(name, q, k, v, problem, is_causal):
    backend = SDPA_BACKENDS[name]
    q, k, v = (_aligned_for_fused_kernels(x) for x in (q, k, v))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if backend is None:
                return F.scaled_dot_product_attention(
                    q, k, v, is_causal=is_causal, scale=problem.scale, enable_gqa=True
                )
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(
                    q, k, v, is_causal=is_causal, scale=problem.scale, enable_gqa=True
                )
        except RuntimeError as err:
            reasons = "; ".join(str(w.message).strip() for w in caught) or str(err)
            raise UnsupportedProblemError(
                f"backend {name!r} cannot run {problem.describe()} on {problem.device}: {reasons}"
            ) from err


def sdpa_attention(
    name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem
) -> torch.Tensor:
    """SDPA with attnkit's bottom-right causal convention; shapes as in :func:`attnkit.attention`."""
    if abs(problem.scale) < torch.finfo(torch.float32).tiny:
        q, problem = q * 0.0, dataclasses.replace(problem, scale=1.0)
    elif problem.scale < 0:
        k, problem = -k, dataclasses.replace(problem, scale=-problem.scale)
    if not problem.causal or problem.causal_offset == 0:
        return _call_sdpa(name, q, k, v, problem, problem.causal)
    if problem.causal_offset > 0:  # N < M: see attnkit.sdpa_lower_right
        backend = SDPA_BACKENDS[name]
        if problem.q_len == 1:  # the one row sees every key
            return _call_sdpa(name, q, k, v, problem, False)
        if backend in lower_right.MASK_KERNELS:
            q, k, v = (_aligned_for_fused_kernels(x) for x in (q, k, v))
            return lower_right.masked_attention(name, backend, q, k, v, problem)
        if lower_right.split_supported(backend, q, k, v, problem):
            q, k, v = (_aligned_for_fused_kernels(x) for x in (q, k, v))
            return lower_right.split_attention(name, backend, q, k, v, problem)
    q_square, keep = _square_causal_operands(q, problem)
    out = _call_sdpa(name, q_square, k, v, problem, True)
    if keep is not None:
        return out[:, :, keep]
    # N > M: the first N - M rows see no key and are zero.
    hidden = out.new_zeros(problem.batch, problem.q_heads, -problem.causal_offset, problem.value_dim)
    return torch.cat([hidden, out], dim=2)
