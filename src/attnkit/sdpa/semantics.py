"""attnkit's semantics on SDPA: :func:`sdpa_attention`, the run of any problem a ``sdpa*``
backend accepts. SDPA's own arguments differ from attnkit's in four ways, each translated here:

* Causal masks. SDPA's ``is_causal`` is aligned top-left; attnkit's is bottom-right
  (query i sees key j iff j <= i + M - N). For N > M the first N - M rows see no key: they are
  zero, and only the last M rows go to SDPA as a square causal problem. N < M runs at the cost
  of the N x M problem: N = 1 non-causal (the one row sees every key), flash and efficient on
  CUDA in their own bottom-right mode, cuDNN as a non-causal prefix and a causal square merged
  by their log-sum-exp (:mod:`attnkit.sdpa.lower_right`), every other kernel (and cuDNN when
  M = N + 1 or traced) with the (N, M) visibility matrix as its mask, as for windows below.
* Sliding windows. SDPA has no window argument: the window goes in as an explicit boolean
  ``attn_mask``, :func:`attnkit.reference.visibility` (N x M, broadcast over batch and heads),
  on the kernels that take a mask (:data:`attnkit.sdpa.support.WINDOW_MASK_KERNELS`); flash
  takes none and declines before any call. SDPA's softmax over a fully masked row is NaN, so
  the rows that see no key (always the first ones: the band's upper edge is below key 0 there)
  are cut off before the call and returned as zeros, as for causal N > M.
* Non-positive and tiny scales. Translated exactly, because kernels fail on them (torch 2.13
  CPU flash returns NaN for causal inputs when the scale is 0, negative, or rounds to 0 in
  float32; on the H100, torch 2.11, cuDNN's backward returned inf gradients at a
  float32-subnormal scale of 2.5e-42): ``softmax(s * q k^T) == softmax(|s| * q (-k)^T)`` for
  s < 0 (negation is exact); a scale that rounds to 0 in the dtype the scores are computed in
  (float64 for float64 inputs, float32 otherwise) makes every score 0, so the call is made with
  a zeroed q (scale 1): the s = 0 function, dq = dk = 0; and a bf16 / fp32 scale below
  :data:`SMALLEST_KERNEL_SCALE` moves a power of two into q (``s q = (s 2^p)(q 2^-p)``, exact
  in their 8-bit exponent range), so every kernel sees a normal scale and the gradients keep
  their value (at s = 6.8e-39 and |q|, |k| ~ 30, dk is ~3e-37, a normal number). fp16's range
  is too small for that shift; there a scale below float32's smallest normal zeroes q, and the
  true dq, dk (below 1e-25) are 0 in fp16 anyway.
* cuDNN's masked float16 backward. On the H100 (torch 2.11.0+cu130), cuDNN's backward with an
  attention mask returned NaN in dq for float16 inputs with large logits (|q| ~ 30, a window of
  one to four keys, N = 64..66, D = 16; the output, dk and dv were finite, bfloat16 was right,
  and so was every call without a mask). A float16 call that hands cuDNN a mask
  (:func:`cudnn_gets_mask`: a window; causal 1 < N < M only where the split does not run) and
  needs gradients is therefore declined by ``sdpa-cudnn``, and ``sdpa`` runs a masked one with
  cuDNN left out of PyTorch's choice (PyTorch chose cuDNN there, with the same NaN).

Strides are the layout rule's (:mod:`attnkit.sdpa.layout`), kernel errors
:mod:`attnkit.sdpa.calls`'.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch.nn.attention import SDPBackend

from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import AttentionProblem
from attnkit.reference import visibility
from attnkit.sdpa import calls, lower_right
from attnkit.sdpa.layout import for_fused_kernels
from attnkit.sdpa.support import ANY_LAYOUT, SDPA_BACKENDS

#: Half of float32's smallest subnormal, 2**-149: a magnitude at or below it rounds to 0.
_FLOAT32_ROUNDS_TO_ZERO = 2.0**-150
#: The smallest scale handed to a kernel for bf16 / fp32 inputs; smaller ones are shifted into q.
#: Its reciprocal (1.8e19) and its products with any finite score stay normal float32 numbers.
SMALLEST_KERNEL_SCALE = 2.0**-64


def sdpa_attention(
    name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem
) -> torch.Tensor:
    """SDPA with attnkit's bottom-right causal convention; shapes as in :func:`attnkit.attention`."""
    if (
        SDPA_BACKENDS[name] is SDPBackend.CUDNN_ATTENTION  # `is`: no pybind comparison per call
        and calls.float16_backward_on_cuda(q, k, v, problem)
        and cudnn_gets_mask(problem)
    ):
        raise UnsupportedProblemError(
            f"backend {name!r} does not support {problem.describe()} with gradients: cuDNN's "
            "backward with an attention mask (a window; causal 1 < N < M where M = N + 1 or "
            "traced) returned NaN dq in float16 (H100, torch 2.11); use bfloat16, sdpa-efficient, "
            "or no gradients"
        )
    if problem.scale < SMALLEST_KERNEL_SCALE:  # else no kernel needs a translated scale
        q, k, problem = _kernel_scale(q, k, problem)
    if problem.has_window:
        return _masked_attention(name, q, k, v, problem)
    is_causal = one_call_causal(problem)
    if is_causal is not None:
        return calls.call_sdpa(name, q, k, v, problem, is_causal)
    if problem.causal_offset > 0:  # 1 < N < M
        if not torch.compiler.is_compiling() and name not in ANY_LAYOUT:
            q, k, v = for_fused_kernels(name, q, k, v, problem)
        out = lower_right.native_bottom_right(name, SDPA_BACKENDS[name], q, k, v, problem)
        return _masked_attention(name, q, k, v, problem) if out is None else out
    # N > M: the last M rows are a square causal problem; the first N - M see no key and are zero.
    out = calls.call_sdpa(name, q[:, :, -problem.kv_len :], k, v, problem, True)
    hidden = out.new_zeros(problem.batch, problem.q_heads, -problem.causal_offset, problem.value_dim)
    return torch.cat([hidden, out], dim=2)


def one_call_causal(problem: AttentionProblem) -> bool | None:
    """SDPA's ``is_causal`` for the one call that runs ``problem``'s causal rule as it is, or
    None where the rule takes more (N > M, or 1 < N < M: :func:`sdpa_attention`). Not causal,
    or N == M: SDPA's own flag, its top-left diagonal being attnkit's bottom-right one there.
    One query against more keys under bottom-right causal sees every key: a non-causal call
    (a decode step). Windows are not looked at: they go in as masks."""
    if not problem.causal or problem.causal_offset == 0:
        return problem.causal
    if problem.causal_offset > 0 and problem.q_len == 1:
        return False
    return None


def cudnn_gets_mask(problem: AttentionProblem) -> bool:
    """Whether :func:`sdpa_attention` hands cuDNN an attention mask for ``problem``: a window, or
    bottom-right causal with 1 < N < M where the mask-free split does not run (M = N + 1, or a
    traced call: :func:`attnkit.sdpa.lower_right.cudnn_runs_split`)."""
    if problem.has_window:
        return True
    n_below_m = problem.causal and problem.causal_offset > 0 and problem.q_len > 1
    return n_below_m and not lower_right.cudnn_runs_split(problem)


def _kernel_scale(q, k, problem: AttentionProblem):
    """(q, k, problem) with a scale every kernel computes exactly: negative, zero-rounding and
    tiny scales translated (module docstring). Only scales below SMALLEST_KERNEL_SCALE change."""
    if problem.scale < 0:
        k, problem = -k, dataclasses.replace(problem, scale=-problem.scale)
    if _zero_scale(problem.scale, problem.dtype):
        q, problem = q * 0.0, dataclasses.replace(problem, scale=1.0)
    elif problem.scale < SMALLEST_KERNEL_SCALE and problem.dtype in (torch.bfloat16, torch.float32):
        # |s| = m 2^e with m in [0.5, 1): s 2^shift lands in [2^-65, 2^-64).
        shift = -64 - math.frexp(problem.scale)[1]
        q, problem = q * 2.0**-shift, dataclasses.replace(problem, scale=problem.scale * 2.0**shift)
    return q, k, problem


def _zero_scale(scale: float, dtype: torch.dtype) -> bool:
    """Whether ``scale`` (>= 0) is run as 0: it rounds to 0 in the dtype the scores are computed
    in (float64 for float64 inputs: a Python float is already one; float32 otherwise), or, for
    fp16, is below float32's smallest normal (module docstring)."""
    if dtype == torch.float64:
        return scale == 0.0
    if dtype == torch.float16:
        return scale < torch.finfo(torch.float32).tiny
    return scale <= _FLOAT32_ROUNDS_TO_ZERO


def _masked_attention(name, q, k, v, problem: AttentionProblem) -> torch.Tensor:
    """The problem's visibility matrix (window and bottom-right causal) as a boolean mask; shapes
    as in :func:`attnkit.attention`. Only rows that see a key go to SDPA (module docstring): row i
    sees none iff ``i + upper < 0``, and the last row always sees one when M >= 1."""
    upper = problem.key_band[1]
    hidden = 0 if upper is None else min(problem.q_len, max(0, -upper))
    mask = visibility(problem, q.device)[hidden:]
    out = calls.call_sdpa(name, q[:, :, hidden:], k, v, problem, False, mask)
    if not hidden:
        return out
    zeros = out.new_zeros(problem.batch, problem.q_heads, hidden, problem.value_dim)
    return torch.cat([zeros, out], dim=2)
