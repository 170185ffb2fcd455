"""The Triton path: fused FlashAttention-2 forward and backward kernels (backend ``"triton"``).

Layers, one module each:

* ``forward_kernels`` / ``backward_kernels``: the ``@triton.jit`` kernels;
* ``launch``: host launchers over one shared setup (shapes, strides, scale, grid, config);
* ``fast_launch`` / ``runtime``: each kernel launched without Triton's per-call binding once a
  layout was seen, and the Triton internals that needs;
* ``native_launch``: a bound launch described as data for the compiled fast path;
* ``softmax``: the online-softmax step both kinds of Triton forward share;
* ``decode_kernels`` / ``decode``: the split-KV forward for few queries against many keys;
* ``gluon/``: the warp-specialized Gluon kernels for Hopper, their support rule, per-GPU
  tiles and routed cells (``$ATTNKIT_GLUON=0``: none runs);
* ``plan``: which kind of kernel runs each pass of a problem (:class:`~attnkit.triton.plan.KernelPlan`),
  decided once per problem;
* ``config``: per-GPU tile configs, read from ``configs/<gpu>.json`` (written by ``tune``);
* ``router``: :class:`TritonImplementation` for the shared autograd function,
  :class:`PlannedKernels` (a problem's plan, run), the public :func:`triton_attention`, the
  registry's prepare step and the support checks it asks before dispatch;
* this module: the package's door, re-exporting the router's public names.

Supports bottom-right causal with N != M, GQA/MQA, any strides, any N, M >= 1, head dims
1..256 (zero-padded to whole 16-byte rows before the launch, :mod:`~attnkit.triton.padding`, and
to a power of two in-kernel), Dv != D, fp16 / bf16 / fp32 (fp32 with IEEE dots, not tf32). Runs
on CUDA GPUs, and on the CPU through ``TRITON_INTERPRET=1``.
"""

from attnkit.triton.config import AttentionConfig, KernelConfig
from attnkit.triton.plan import KernelPlan
from attnkit.triton.router import (
    MAX_HEAD_DIM,
    MAX_PROGRAMS,
    SUPPORTED_DTYPES,
    PlannedKernels,
    TritonImplementation,
    cache_forward,
    dispatch_boundaries,
    forget_plans,
    planned_kernels,
    prepare,
    run_after_support_check,
    triton_attention,
    triton_device_support,
    triton_problem_support,
)

__all__ = [
    "MAX_HEAD_DIM",
    "MAX_PROGRAMS",
    "SUPPORTED_DTYPES",
    "AttentionConfig",
    "KernelConfig",
    "KernelPlan",
    "PlannedKernels",
    "TritonImplementation",
    "cache_forward",
    "dispatch_boundaries",
    "forget_plans",
    "planned_kernels",
    "prepare",
    "run_after_support_check",
    "triton_attention",
    "triton_device_support",
    "triton_problem_support",
]
