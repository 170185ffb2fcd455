"""Host launcher of the Gluon backward for Hopper: input checks (:func:`backward`, by the one
support rule of :mod:`attnkit.triton.gluon.support`), then descriptors and grids (:func:`launch`).

:func:`backward` runs the portable preprocess (delta = rowsum(dO * O)), then the
warp-specialized Gluon dK/dV pass and dQ pass (:mod:`.hopper_backward`; with
``BackwardConfig.gluon_dq`` False, the portable dQ pass :func:`attnkit.triton.launch.bwd_dq`).
Every gradient element is written by one program in a fixed order (no atomics), so the result
is bitwise deterministic, as the portable backward's is. Its tiles per cell are the GPU's table
(:func:`attnkit.triton.gluon.config.backward_config`); the Triton path runs it where its plan
says so (:mod:`attnkit.triton.plan`).
"""

from __future__ import annotations

import math

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import AttentionProblem, check_inputs
from attnkit.triton.gluon.config import BackwardConfig, backward_config
from attnkit.triton.gluon.hopper_backward import _gluon_bwd_dkdv_kernel, _gluon_bwd_dq_kernel
from attnkit.triton.gluon.support import backward_problem_support, device_support, layout_ok
from attnkit.triton.launch import bwd_dq, bwd_preprocess, launch_setup

_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


#: Consumer warpgroups -> (consumer_regs, producer_regs, maxnreg). One CTA an SM: 2 consumers
#: and the producer's warp make 12 warps (rounded up to warpgroups), so ``maxnreg`` = 65536 /
#: 384 = 168 a thread; 3 make 16 warps and 128. ``setmaxnreg`` moves registers from the
#: producer to the consumers, keeping 128 * (consumers * consumer_regs + producer_regs) <=
#: 128 * (consumers + 1) * maxnreg.
REGISTERS = {2: (240, 24, 168), 3: (160, 32, 128)}


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
        q: (B, Hq, N, D) float16 or bfloat16, contiguous, D in
            :data:`~attnkit.triton.gluon.support.GLUON_HEAD_DIMS`.
        k, v: (B, Hkv, M, D), Hq a multiple of Hkv (GQA), same dtype, contiguous.
        o, do: (B, Hq, N, D), the forward's output and its gradient, contiguous.
        lse: (B, Hq, N) float32, the forward's natural-log log-sum-exp (+inf for rows that see
            no key), as :func:`attnkit.triton.launch.attention_forward` returns it.
        scale: softmax scale, > 0; default 1 / sqrt(D).
        causal: bottom-right causal mask (row i sees key j iff j <= i + M - N).
        config: overrides the (head dim, causal) cell of the GPU's table
            (:func:`~attnkit.triton.gluon.config.backward_config`; for tuning and A/B runs).

    Returns:
        ``(dq, dk, dv)`` in q's dtype, contiguous; dk, dv summed over each query-head group.
    """
    problem = check_inputs(q, k, v, causal, scale)
    reason = backward_problem_support(problem)
    if reason is None and not layout_ok(q, k, v, o, do):
        reason = "q, k, v, o and do must be contiguous with 16-byte aligned bases"
    if reason is None and not (lse.dtype == torch.float32 and lse.is_contiguous()):
        reason = f"lse: expected contiguous float32, got {lse.dtype} with strides {lse.stride()}"
    # The device last: every check above also runs (and is tested) on a machine without a GPU.
    reason = reason or device_support(q.device)
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
    q, k, v's, one :func:`~attnkit.triton.gluon.support.backward_problem_support` takes, on a
    device :func:`~attnkit.triton.gluon.support.device_support` accepts, in layouts
    :func:`~attnkit.triton.gluon.support.layout_ok` accepts)."""
    cfg = backward_config(q.device, problem.head_dim, problem.causal) if config is None else config
    p = problem
    setup = launch_setup(p)
    delta = bwd_preprocess(setup, o, do)
    dk, dv = dkdv(q, k, v, do, lse, delta, p, cfg)
    dq = dq_pass(q, k, v, do, lse, delta, p, cfg) if cfg.gluon_dq else bwd_dq(setup, q, k, v, do, lse, delta)
    return dq, dk, dv


def _descriptors(q, do, k, v, problem: AttentionProblem, block_m: int, block_n: int):
    """TMA descriptors of q and do in blocks of ``block_m`` rows, of k and v in blocks of
    ``block_n``, each tensor viewed as its (B * H * rows, D) matrix."""
    p = problem
    d, dtype = p.head_dim, _GL_DTYPES[p.dtype]
    q_rows, kv_rows = p.batch * p.q_heads * p.q_len, p.batch * p.kv_heads * p.kv_len
    q_layout = gl.NVMMASharedLayout.get_default_for([block_m, d], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, d], dtype)
    return (
        TensorDescriptor.from_tensor(q.view(q_rows, d), [block_m, d], q_layout),
        TensorDescriptor.from_tensor(do.view(q_rows, d), [block_m, d], q_layout),
        TensorDescriptor.from_tensor(k.view(kv_rows, d), [block_n, d], kv_layout),
        TensorDescriptor.from_tensor(v.view(kv_rows, d), [block_n, d], kv_layout),
    )


def dkdv(q, k, v, do, lse, delta, problem: AttentionProblem, cfg: BackwardConfig):
    """The Gluon dK/dV pass alone: (dk, dv), (B, Hkv, M, D) in q's dtype."""
    p = problem
    d = p.head_dim
    b, hq, n, hk, m = p.batch, p.q_heads, p.q_len, p.kv_heads, p.kv_len
    q_desc, do_desc, k_desc, v_desc = _descriptors(q, do, k, v, p, cfg.block_m, cfg.block_n)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    grid = (triton.cdiv(m, cfg.consumers * cfg.block_n) * b * hk,)
    consumer_regs, producer_regs, maxnreg = REGISTERS[cfg.consumers]
    _gluon_bwd_dkdv_kernel[grid](
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
    b, hq, n, m = p.batch, p.q_heads, p.q_len, p.kv_len
    q_desc, do_desc, k_desc, v_desc = _descriptors(q, do, k, v, p, cfg.dq_block_m, cfg.dq_block_n)
    dq = torch.empty_like(q)
    grid = (triton.cdiv(n, cfg.dq_consumers * cfg.dq_block_m) * b * hq,)
    consumer_regs, producer_regs, maxnreg = REGISTERS[cfg.dq_consumers]
    _gluon_bwd_dq_kernel[grid](
        q_desc, do_desc, k_desc, v_desc, lse, delta, dq,
        n, m, b * hq, hq, p.group_size, p.causal_offset, p.scale * math.log2(math.e), p.scale,
        HEAD_DIM=d, BLOCK_M=cfg.dq_block_m, BLOCK_N=cfg.dq_block_n, STAGES=cfg.dq_stages, CAUSAL=p.causal,
        CONSUMERS=cfg.dq_consumers, CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs,
        num_warps=4, maxnreg=maxnreg,
    )  # fmt: skip
    return dq
