"""Host side of the Gluon backward for Hopper: its support rule and one launcher.

:func:`backward` runs the portable preprocess (delta = rowsum(dO * O)), then the
warp-specialized Gluon dK/dV pass and dQ pass (:mod:`.hopper_backward`; with
``BackwardConfig.gluon_dq`` False, the portable dQ pass :func:`attnkit.triton.launch.bwd_dq`).
Every gradient element is written by one program in a fixed order, so the result is bitwise
deterministic, as the portable backward's is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import AttentionProblem, check_inputs
from attnkit.triton.gluon.hopper_backward import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel
from attnkit.triton.launch import bwd_dq, bwd_preprocess, launch_setup

_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
SUPPORTED_HEAD_DIMS = (64, 128)
#: TMA row coordinates into (B * H * rows, D) are int32.
_MAX_ROWS = 2**31 - 1


#: Consumer warpgroups -> (consumer_regs, producer_regs, maxnreg). One CTA an SM: 2 consumers
#: and the producer's warp make 12 warps (rounded up to warpgroups), so ``maxnreg`` = 65536 /
#: 384 = 168 a thread; 3 make 16 warps and 128. ``setmaxnreg`` moves registers from the
#: producer to the consumers, keeping 128 * (consumers * consumer_regs + producer_regs) <=
#: 128 * (consumers + 1) * maxnreg.
REGISTERS = {2: (240, 24, 168), 3: (160, 32, 128)}


@dataclass(frozen=True)
class BackwardConfig:
    """Tiles of the two Gluon passes. dK/dV: each of ``consumers`` warpgroups owns ``block_n``
    keys (a program owns ``consumers * block_n``); query blocks of ``block_m`` rows stream
    through a ring of ``stages`` Q/dO slots. dQ (``gluon_dq``; False: the portable dQ pass):
    each of ``dq_consumers`` warpgroups owns ``dq_block_m`` query rows; key blocks of
    ``dq_block_n`` stream through ``dq_stages`` K/V slots. Three consumers fit D = 64 only
    (their registers: :data:`REGISTERS`)."""

    block_m: int = 64
    block_n: int = 64
    stages: int = 2
    consumers: int = 2
    #: Causal: the masked row blocks in a loop of their own (else one loop, masking by a
    #: runtime branch).
    split_masked: bool = False
    gluon_dq: bool = True
    dq_block_m: int = 64
    dq_block_n: int = 64
    dq_stages: int = 2
    dq_consumers: int = 2


#: (head dim, causal) -> the config of the cells where the Gluon backward measured faster than the
#: portable one, on an H200 (bf16, B * H * D = 4 * 2048 (2 * 2048 at N = 16384), N = 4096, 8192
#: and 16384, ``do_bench`` medians of both and cuDNN in one process). At D = 64 the Gluon dQ
#: pass was slower than the portable one, so only dK/dV runs on Gluon there, and three
#: consumer warpgroups were no faster than two. At D = 128 causal the dK/dV pass beats the
#: portable one only with the masked row blocks in a loop of their own (``split_masked``),
#: which made the D = 64 causal pass slower.
ROUTED_CELLS: dict[tuple[int, bool], BackwardConfig] = {
    (64, False): BackwardConfig(gluon_dq=False),
    (64, True): BackwardConfig(gluon_dq=False),
    (128, False): BackwardConfig(dq_block_n=128),
    (128, True): BackwardConfig(dq_block_n=128, split_masked=True),
}
#: The shortest query length measured faster (shorter ones were not measured).
MIN_Q_LEN = 4096


def backward_preferred(problem: AttentionProblem) -> BackwardConfig | None:
    """The config to run ``problem``'s backward on the Gluon kernels with, where they measured
    faster than the portable backward (:data:`ROUTED_CELLS`), else None. Pure: the caller also
    checks :func:`backward_support`, :func:`device_reason` and :func:`layout_ok`."""
    if problem.q_len < MIN_Q_LEN:
        return None
    return ROUTED_CELLS.get((problem.head_dim, problem.causal))


def backward_support(problem: AttentionProblem) -> str | None:
    """None if :func:`backward` takes ``problem`` (whatever the device), else why not."""
    p = problem
    if p.dtype not in _GL_DTYPES:
        return f"dtype {p.dtype} (float16 or bfloat16 only)"
    if p.head_dim != p.value_dim or p.head_dim not in SUPPORTED_HEAD_DIMS:
        return f"head dims D={p.head_dim}, Dv={p.value_dim} (D = Dv in {SUPPORTED_HEAD_DIMS} only)"
    if p.has_window:
        return f"sliding window {p.window}"
    if not p.scale > 0:
        return f"scale {p.scale} (must be > 0)"
    if p.q_len < 1 or p.kv_len < 1:
        return f"empty problem (N={p.q_len}, M={p.kv_len})"
    if p.batch * max(p.q_heads * p.q_len, p.kv_heads * p.kv_len) > _MAX_ROWS:
        return "B * H * rows exceeds the int32 TMA coordinates"
    return None


def layout_ok(*tensors: torch.Tensor) -> bool:
    """Whether the kernel reads the tensors as they are: contiguous, 16-byte aligned bases."""
    return all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in tensors)


def device_reason(device: torch.device) -> str | None:
    """None if the kernel can run on ``device``, else why not: a CUDA sm_90 device, and the
    Gluon API the kernels are written against (:func:`attnkit.triton.gluon.unavailable_reason`)."""
    from attnkit.triton import gluon  # the optional package: importing it never fails

    if device.type != "cuda":
        return f"device {device} (the Gluon backward runs on CUDA sm_90)"
    reason = gluon.unavailable_reason()
    if reason is not None:
        return reason
    capability = torch.cuda.get_device_capability(device)
    if capability != (9, 0):
        return f"device {device} is sm_{capability[0]}{capability[1]}, not sm_90"
    return None


def backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    do: torch.Tensor,
    lse: torch.Tensor,
    scale: float | None = None,
    causal: bool = False,
    config: BackwardConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward on an H100/H200.

    Args:
        q: (B, Hq, N, D) float16 or bfloat16, contiguous, D in :data:`SUPPORTED_HEAD_DIMS`.
        k, v: (B, Hkv, M, D), Hq a multiple of Hkv (GQA), same dtype, contiguous.
        o, do: (B, Hq, N, D), the forward's output and its gradient, contiguous.
        lse: (B, Hq, N) float32, the forward's natural-log log-sum-exp (+inf for rows that see
            no key), as :func:`attnkit.triton.launch.attention_forward` returns it.
        scale: softmax scale, > 0; default 1 / sqrt(D).
        causal: bottom-right causal mask (row i sees key j iff j <= i + M - N).
        config: overrides the problem's entry of :data:`ROUTED_CELLS` (for tuning and A/B
            runs); a cell without one runs :class:`BackwardConfig`'s defaults.

    Returns:
        ``(dq, dk, dv)`` in q's dtype, contiguous; dk, dv summed over each query-head group.
    """
    problem = check_inputs(q, k, v, causal, scale)
    reason = backward_support(problem) or device_reason(q.device)
    if reason is None and not layout_ok(q, k, v, o, do):
        reason = "q, k, v, o and do must be contiguous with 16-byte aligned bases"
    if reason is None and not (lse.dtype == torch.float32 and lse.is_contiguous()):
        reason = f"lse: expected contiguous float32, got {lse.dtype} with strides {lse.stride()}"
    if reason is not None:
        raise UnsupportedProblemError(f"the Gluon backward does not take this problem: {reason}")
    for name, x, shape in (
        ("o", o, (*q.shape[:3], problem.value_dim)),
        ("do", do, (*q.shape[:3], problem.value_dim)),
        ("lse", lse, q.shape[:3]),
    ):
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    return launch(q, k, v, o, do, lse, problem, config)


def launch(q, k, v, o, do, lse, problem: AttentionProblem, config: BackwardConfig | None = None):
    """:func:`backward` without its checks, for a caller that made them (``problem`` is
    q, k, v's, one :func:`backward_support` takes, on an sm_90 device, in layouts
    :func:`layout_ok` accepts)."""
    cfg = ROUTED_CELLS.get((problem.head_dim, problem.causal), BackwardConfig()) if config is None else config
    p = problem
    setup = launch_setup(p)
    delta = bwd_preprocess(setup, o, do)
    dk, dv = dkdv(q, k, v, do, lse, delta, p, cfg)
    dq = dq_pass(q, k, v, do, lse, delta, p, cfg) if cfg.gluon_dq else bwd_dq(setup, q, k, v, do, lse, delta)
    return dq, dk, dv


def dkdv(q, k, v, do, lse, delta, problem: AttentionProblem, cfg: BackwardConfig):
    """The Gluon dK/dV pass alone: (dk, dv), (B, Hkv, M, D) in q's dtype."""
    p = problem
    d = p.head_dim
    b, hq, n, hk, m = p.batch, p.q_heads, p.q_len, p.kv_heads, p.kv_len
    dtype = _GL_DTYPES[p.dtype]
    q_layout = gl.NVMMASharedLayout.get_default_for([cfg.block_m, d], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([cfg.block_n, d], dtype)
    q_desc = TensorDescriptor.from_tensor(q.view(b * hq * n, d), [cfg.block_m, d], q_layout)
    do_desc = TensorDescriptor.from_tensor(do.view(b * hq * n, d), [cfg.block_m, d], q_layout)
    k_desc = TensorDescriptor.from_tensor(k.view(b * hk * m, d), [cfg.block_n, d], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v.view(b * hk * m, d), [cfg.block_n, d], kv_layout)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    grid = (triton.cdiv(m, cfg.consumers * cfg.block_n) * b * hk,)
    consumer_regs, producer_regs, maxnreg = REGISTERS[cfg.consumers]
    _attn_bwd_dkdv_kernel[grid](
        q_desc, do_desc, k_desc, v_desc, lse, delta, dk, dv,
        n, m, hq, hk, p.group_size, p.causal_offset, p.scale * math.log2(math.e), p.scale,
        HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CAUSAL=p.causal,
        CONSUMERS=cfg.consumers, CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs,
        SPLIT_MASKED=cfg.split_masked, num_warps=4, maxnreg=maxnreg,
    )  # fmt: skip
    return dk, dv


def dq_pass(q, k, v, do, lse, delta, problem: AttentionProblem, cfg: BackwardConfig):
    """The Gluon dQ pass alone: dq, (B, Hq, N, D) in q's dtype."""
    p = problem
    d = p.head_dim
    b, hq, n, hk, m = p.batch, p.q_heads, p.q_len, p.kv_heads, p.kv_len
    dtype = _GL_DTYPES[p.dtype]
    q_layout = gl.NVMMASharedLayout.get_default_for([cfg.dq_block_m, d], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([cfg.dq_block_n, d], dtype)
    q_desc = TensorDescriptor.from_tensor(q.view(b * hq * n, d), [cfg.dq_block_m, d], q_layout)
    do_desc = TensorDescriptor.from_tensor(do.view(b * hq * n, d), [cfg.dq_block_m, d], q_layout)
    k_desc = TensorDescriptor.from_tensor(k.view(b * hk * m, d), [cfg.dq_block_n, d], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v.view(b * hk * m, d), [cfg.dq_block_n, d], kv_layout)
    dq = torch.empty_like(q)
    grid = (triton.cdiv(n, cfg.dq_consumers * cfg.dq_block_m) * b * hq,)
    consumer_regs, producer_regs, maxnreg = REGISTERS[cfg.dq_consumers]
    _attn_bwd_dq_kernel[grid](
        q_desc, do_desc, k_desc, v_desc, lse, delta, dq,
        n, m, b * hq, hq, p.group_size, p.causal_offset, p.scale * math.log2(math.e), p.scale,
        HEAD_DIM=d, BLOCK_M=cfg.dq_block_m, BLOCK_N=cfg.dq_block_n, STAGES=cfg.dq_stages, CAUSAL=p.causal,
        CONSUMERS=cfg.dq_consumers, CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs,
        num_warps=4, maxnreg=maxnreg,
    )  # fmt: skip
    return dq
