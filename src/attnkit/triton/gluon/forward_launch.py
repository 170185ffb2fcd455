"""Host launcher of the Gluon Hopper forward: input checks (:func:`forward`), then TMA
descriptors and grid (:func:`launch`)."""

from __future__ import annotations

import functools
import math

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import check_inputs
from attnkit.triton.gluon.config import HopperForwardConfig, forward_config
from attnkit.triton.gluon.hopper_forward import _gluon_fwd_kernel
from attnkit.triton.gluon.support import device_support, layout_ok, problem_support

_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> None:
    """Raise before any kernel runs if the inputs are outside what the kernel supports: the
    arguments (:func:`attnkit.inputs.check_inputs`), then the one support rule of
    :mod:`attnkit.triton.gluon.support` (problem, layout, device)."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if not (isinstance(scale, float) and math.isfinite(scale) and scale > 0):
        raise UnsupportedProblemError(f"scale must be a finite float > 0, got {scale!r}")
    problem = check_inputs(q, k, v, causal, scale)
    reason = problem_support(problem)
    if reason is not None:
        raise UnsupportedProblemError(
            f"the Gluon Hopper forward does not take {problem.describe()}: {reason}"
        )
    if not layout_ok(q, k, v):
        raise UnsupportedProblemError(
            "q, k, v must be contiguous (B, H, rows, D) with 16-byte aligned bases (TMA), got strides "
            f"{q.stride()}, {k.stride()}, {v.stride()}"
        )
    # The device last: every check above also runs (and is tested) on a machine without a GPU.
    reason = device_support(q.device)
    if reason is not None:
        raise UnsupportedProblemError(f"the Gluon Hopper forward cannot run here: {reason}")


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    config: HopperForwardConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward on an H100/H200.

    Args:
        q: (B, H, N, D) float16 or bfloat16, contiguous, D in
            :data:`~attnkit.triton.gluon.support.GLUON_HEAD_DIMS`.
        k: (B, H, M, D), same dtype and device, contiguous.
        v: (B, H, M, D), same dtype and device, contiguous.
        causal: bottom-right causal mask (row i sees key j iff j <= i + M - N).
        scale: softmax scale, > 0; default 1 / sqrt(D).
        config: overrides the (head dim, causal) cell of the GPU's table
            (:func:`~attnkit.triton.gluon.config.forward_config`; for tuning and A/B runs).

    Returns:
        ``(o, lse)``: o (B, H, N, D) in q's dtype; lse (B, H, N) float32, the natural-log
        log-sum-exp of each row's scaled scores (+inf for a row that sees no key, whose
        output is 0) -- the convention of attnkit's Triton forward, so its backward can
        consume it.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if isinstance(q, torch.Tensor) and q.dim() == 4 else 1.0
    scale = float(scale) if isinstance(scale, int) and not isinstance(scale, bool) else scale
    _check(q, k, v, causal, scale)
    return launch(q, k, v, causal, scale, config)


def launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    config: HopperForwardConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`forward` without its input checks, for callers that have made them already: the
    Triton path routes only problems and layouts the kernel takes
    (:mod:`attnkit.triton.gluon.support`), so re-checking them, a device query included, on every
    call would be host time spent twice."""
    b, h, n, d = q.shape
    m = k.shape[2]
    cfg = forward_config(q.device, d, causal) if config is None else config
    o = torch.empty_like(q)
    lse = torch.empty((b, h, n), dtype=torch.float32, device=q.device)

    dtype = _GL_DTYPES[q.dtype]
    q_layout = gl.NVMMASharedLayout.get_default_for([cfg.block_m, d], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([cfg.block_n, d], dtype)
    q_desc = TensorDescriptor.from_tensor(q.view(b * h * n, d), [cfg.block_m, d], q_layout)
    k_desc = TensorDescriptor.from_tensor(k.view(b * h * m, d), [cfg.block_n, d], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v.view(b * h * m, d), [cfg.block_n, d], kv_layout)
    tiles = triton.cdiv(n, cfg.consumers * cfg.block_m) * b * h
    grid = (min(tiles, _sm_count(q.device)) if cfg.persistent else tiles,)
    _gluon_fwd_kernel[grid](
        q_desc, k_desc, v_desc, o, lse, n, m, m - n, b * h, scale * math.log2(math.e),
        HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CAUSAL=causal,
        OVERLAP=cfg.overlap, PINGPONG=cfg.pingpong, PERSISTENT=cfg.persistent, CONSUMERS=cfg.consumers,
        CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs,
        num_warps=4, maxnreg=cfg.maxnreg,
    )  # fmt: skip
    return o, lse
