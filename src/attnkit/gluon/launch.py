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
from attnkit.gluon.config import SUPPORTED_HEAD_DIMS, HopperForwardConfig, get_config
from attnkit.gluon.hopper_forward import _attn_fwd_kernel

_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
#: TMA coordinates are int32: the row coordinate into (B * H * rows, D) must fit.
_MAX_ROWS = 2**31 - 1


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> None:
    """Raise before any kernel runs if the inputs are outside what the kernel supports."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name}: expected 4 dims (B, H, rows, D), got shape {tuple(x.shape)}")
        if x.dtype not in _GL_DTYPES:
            raise UnsupportedProblemError(f"{name}: dtype {x.dtype} not supported (float16 or bfloat16)")
        if not x.is_contiguous():
            raise UnsupportedProblemError(
                f"{name}: must be contiguous (B, H, rows, D), got strides {x.stride()}"
            )
        if x.data_ptr() % 16:
            raise UnsupportedProblemError(f"{name}: base address must be 16-byte aligned for TMA")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")
    (b, h, n, d), (bk, hk, m, dk) = q.shape, k.shape
    if (bk, hk) != (b, h) or tuple(v.shape[:3]) != (b, h, m):
        raise UnsupportedProblemError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected the same batch and heads "
            "(no GQA) and k, v with the same key count"
        )
    if dk != d or v.shape[3] != d:
        raise UnsupportedProblemError(f"head dims q {d}, k {dk}, v {v.shape[3]}: expected Dv = D")
    if d not in SUPPORTED_HEAD_DIMS:
        raise UnsupportedProblemError(f"head_dim {d} not supported (one of {SUPPORTED_HEAD_DIMS})")
    if n < 1 or m < 1:
        raise ValueError(f"empty problem: N={n}, M={m}")
    if b * h * max(n, m) > _MAX_ROWS:
        raise UnsupportedProblemError(f"B * H * rows = {b * h * max(n, m)} exceeds the int32 TMA coordinates")
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if not (isinstance(scale, float) and math.isfinite(scale) and scale > 0):
        raise UnsupportedProblemError(f"scale must be a finite float > 0, got {scale!r}")
    # The device last: every check above also runs (and is tested) on a machine without a GPU.
    if q.device.type != "cuda":
        raise UnsupportedProblemError(f"the Gluon Hopper forward runs on CUDA, got device {q.device}")
    capability = torch.cuda.get_device_capability(q.device)
    if capability != (9, 0):
        raise UnsupportedProblemError(
            f"the Gluon Hopper forward needs sm_90, device {q.device} is sm_{capability[0]}{capability[1]}"
        )


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
        q: (B, H, N, D) float16 or bfloat16, contiguous, D in :data:`SUPPORTED_HEAD_DIMS`.
        k: (B, H, M, D), same dtype and device, contiguous.
        v: (B, H, M, D), same dtype and device, contiguous.
        causal: bottom-right causal mask (row i sees key j iff j <= i + M - N).
        scale: softmax scale, > 0; default 1 / sqrt(D).
        config: overrides the (head dim, causal) entry of :data:`~attnkit.gluon.config.CONFIGS`
            (for tuning and A/B runs).

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
    (:mod:`attnkit.triton.gluon_route`), so re-checking them, a device query included, on every
    call would be host time spent twice."""
    b, h, n, d = q.shape
    m = k.shape[2]
    cfg = get_config(d, causal) if config is None else config
    o = torch.empty_like(q)
    lse = torch.empty((b, h, n), dtype=torch.float32, device=q.device)

    dtype = _GL_DTYPES[q.dtype]
    q_layout = gl.NVMMASharedLayout.get_default_for([cfg.block_m, d], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([cfg.block_n, d], dtype)
    q_desc = TensorDescriptor.from_tensor(q.view(b * h * n, d), [cfg.block_m, d], q_layout)
    k_desc = TensorDescriptor.from_tensor(k.view(b * h * m, d), [cfg.block_n, d], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v.view(b * h * m, d), [cfg.block_n, d], kv_layout)
    if cfg.consumers not in (2, 3) or (cfg.pingpong and cfg.consumers != 2):
        raise ValueError(
            f"config: {cfg.consumers} consumers (2, or 3 without pingpong), pingpong={cfg.pingpong}"
        )
    tiles = triton.cdiv(n, cfg.consumers * cfg.block_m) * b * h
    grid = (min(tiles, _sm_count(q.device)) if cfg.persistent else tiles,)
    _attn_fwd_kernel[grid](
        q_desc, k_desc, v_desc, o, lse, n, m, m - n, b * h, scale * math.log2(math.e),
        HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CAUSAL=causal,
        OVERLAP=cfg.overlap, PINGPONG=cfg.pingpong, PERSISTENT=cfg.persistent, CONSUMERS=cfg.consumers,
        CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs,
        num_warps=4, maxnreg=cfg.maxnreg,
    )  # fmt: skip
    return o, lse
