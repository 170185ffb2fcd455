"""The Triton path: fused FlashAttention-2 forward and backward kernels (backend ``"triton"``).

Layers, one module each:

* ``forward_kernels`` / ``backward_kernels``: the ``@triton.jit`` kernels;
* ``launch``: host launchers over one shared setup (shapes, strides, scale, grid, config);
* ``fast_launch`` / ``runtime``: each kernel launched without Triton's per-call binding once a
  layout was seen, and the Triton internals that needs;
* ``decode_kernels`` / ``decode``: the split-KV forward for few queries against many keys;
* ``gluon_route``: which forwards run on the warp-specialized Gluon kernel for Hopper
  (:mod:`attnkit.gluon`) instead of the plain one (``$ATTNKIT_GLUON=0``: none);
* ``config``: per-GPU tile configs, read from ``configs/<gpu>.json`` (written by ``tune``);
* this module: :class:`TritonImplementation` for the shared autograd function, the public
  :func:`triton_attention`, and the support checks the registry asks before dispatch.

Supports bottom-right causal with N != M, GQA/MQA, any strides, any N, M >= 1, head dims
1..256 (zero-padded to whole 16-byte rows before the launch, :mod:`~attnkit.triton.padding`, and
to a power of two in-kernel), Dv != D, fp16 / bf16 / fp32 (fp32 with IEEE dots, not tf32). Runs
on CUDA GPUs, and on the CPU through ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import os
from functools import partial

import torch

from attnkit.boundaries import DispatchBoundary
from attnkit.errors import UnsupportedProblemError
from attnkit.flash_autograd import PATHS, flash_attention
from attnkit.inputs import AttentionProblem
from attnkit.prepared import PreparedRun
from attnkit.triton.config import AttentionConfig, KernelConfig
from attnkit.triton.decode import (
    DEFAULT_DECODE_CONFIG,
    decode_forward,
    decode_forward_only,
    decode_native_forward_only,
    dense_plan,
    use_split_kv,
)
from attnkit.triton.forward_kernels import _attn_fwd_kernel
from attnkit.triton.gluon_route import GLUON_MIN_SCORES, ROUTED_CELLS, gluon_forward, gluon_layout_ok
from attnkit.triton.launch import TMA_MIN_SCORES, attention_backward, attention_forward, launch_setup
from attnkit.triton.padding import padded_attention, padded_problem

#: Whether @triton.jit built interpreter kernels: Triton reads TRITON_INTERPRET once, when the
#: kernels are decorated (at import), so availability follows the kernels, not today's variable.
_KERNELS_INTERPRETED = type(_attn_fwd_kernel).__name__ == "InterpretedFunction"

MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Every kernel runs on one grid axis of (row blocks x batch x heads) programs; CUDA caps
#: axis 0 at 2**31 - 1 (the other axes at 65535, which is why nothing else goes there).
MAX_PROGRAMS = 2**31 - 1
#: The smallest tile a config may have (KernelConfig): the most programs a problem can need.
_MIN_BLOCK = 16


class TritonImplementation:
    """Forward and backward kernels; see :class:`attnkit.flash_autograd.FlashImplementation`."""

    def __init__(self, config: AttentionConfig | None = None, tma: bool | None = None) -> None:
        """``config`` overrides the GPU's tuned table; ``tma`` forces TMA descriptors (True) or
        pointers (False) in every kernel instead of each launcher's choice (None), so that a
        tuner or a test checks the path it times, whatever the problem's size."""
        if config is not None and not isinstance(config, AttentionConfig):
            raise TypeError(f"config: expected an AttentionConfig or None, got {type(config).__name__}")
        if tma not in (None, True, False):
            raise TypeError(f"tma: expected True, False or None, got {tma!r}")
        self.config = config
        self.tma = tma
        self.op_name = "triton" if config is None and tma is None else None

    @staticmethod
    def lse_dtype(dtype: torch.dtype) -> torch.dtype:
        return torch.float32

    def forward(self, q, k, v, problem):
        if self.config is None and self.tma is None and use_split_kv(problem):  # decode-shaped
            return decode_forward(q, k, v, problem)
        setup = launch_setup(problem, self.config)
        if setup.gluon and self.tma is None and gluon_layout_ok(q, k, v):
            # The Gluon kernel's log-sum-exp is the plain forward's, for the same backward.
            return gluon_forward(q, k, v, problem)
        return attention_forward(q, k, v, setup, self.tma)

    def backward(self, grad_out, q, k, v, out, lse, problem):
        return attention_backward(grad_out, q, k, v, out, lse, launch_setup(problem, self.config), self.tma)


def triton_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: AttentionProblem,
    config: AttentionConfig | None = None,
) -> torch.Tensor:
    """Fused attention with autograd. q: (B, Hq, N, D), k: (B, Hkv, M, D), v: (B, Hkv, M, Dv);
    returns (B, Hq, N, Dv) in q's dtype. ``config`` overrides the GPU's tuned table."""
    reason = triton_problem_support(problem)
    if reason is not None:
        raise UnsupportedProblemError(f"backend 'triton' does not support {problem.describe()}: {reason}")
    return _attention(TritonImplementation(config), q, k, v, problem)


def run_after_support_check(q, k, v, problem: AttentionProblem) -> torch.Tensor:
    """The registry's run: :func:`triton_attention` without its support check, which the
    dispatcher has made before choosing this path (``triton_problem_support``, once per
    problem signature), and with one shared default implementation."""
    return _attention(_DEFAULT_IMPLEMENTATION, q, k, v, problem)


def _attention(impl: TritonImplementation, q, k, v, problem: AttentionProblem) -> torch.Tensor:
    """``impl`` through the shared autograd function, on head dims padded where the kernels
    need it (:mod:`attnkit.triton.padding`)."""
    padded = padded_problem(problem)
    if padded is None:
        return flash_attention(impl, q, k, v, problem)
    return padded_attention(impl, q, k, v, problem, padded)


def prepare(problem: AttentionProblem) -> PreparedRun:
    """The registry's eager run of ``problem`` (supported: checked before), made once per call
    signature: :func:`run_after_support_check`, except that a call no backward follows runs
    the forward without the log-sum-exp, through launches bound per layout: the split-KV
    forward for decode-shaped problems (:func:`~attnkit.triton.decode.decode_forward_only`),
    else :meth:`~attnkit.triton.launch.LaunchSetup.forward_only` of the problem's setup,
    looked up here once. Those bound launches, per layout, are its ``native_forward``, except
    for a problem whose head dims are padded (:mod:`attnkit.triton.padding`): a native program
    would launch on the caller's unpadded operands, so that run stays in Python; and except for
    a problem whose forward runs on the Gluon kernel (:mod:`attnkit.triton.gluon_route`), which
    stays in Python too."""
    padded = padded_problem(problem)
    kernel_problem = problem if padded is None else padded
    if use_split_kv(kernel_problem):
        plan = dense_plan(kernel_problem)

        def forward_only(q, k, v):
            return decode_forward_only(q, k, v, kernel_problem, plan)

        def native_forward(q, k, v):
            return decode_native_forward_only(q, k, v, kernel_problem, plan)

    else:
        setup = launch_setup(kernel_problem)
        forward_only, native_forward = setup.forward_only, setup.native_forward_only
        if setup.gluon:
            # No native program: the Gluon launch is not a bound Triton launch.
            forward_only, native_forward = partial(_gluon_forward_only, setup), None
    if padded is not None:
        run = partial(padded_attention, _DEFAULT_IMPLEMENTATION, padded=padded, forward_only=forward_only)
        return PreparedRun(run)
    run = partial(flash_attention, _DEFAULT_IMPLEMENTATION, forward_only=forward_only)
    return PreparedRun(run, native_forward=native_forward)


def _gluon_forward_only(setup, q, k, v) -> torch.Tensor:
    """The forward of a Gluon-routed problem without gradients: the Gluon kernel for layouts it
    reads as they are, the plain kernels for the others."""
    if gluon_layout_ok(q, k, v):
        return gluon_forward(q, k, v, setup.problem)[0]
    return setup.forward_only(q, k, v)


def triton_device_support(device: torch.device) -> str | None:
    """None if the kernels can run on ``device``, else why not."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available in this PyTorch build or machine"
        return None
    if device.type == "cpu":
        if _KERNELS_INTERPRETED:
            return None
        if os.environ.get("TRITON_INTERPRET") == "1":
            return (
                "TRITON_INTERPRET=1 was set after attnkit was imported; Triton decides at import "
                "whether kernels are interpreted: set it before importing attnkit"
            )
        return "on the CPU the Triton kernels run only through the interpreter: set TRITON_INTERPRET=1"
    return f"Triton kernels run on CUDA devices (or the CPU interpreter), not on {device.type}"


def triton_problem_support(problem: AttentionProblem) -> str | None:
    """None if the kernels take ``problem``, else why not (checked before any launch)."""
    if problem.dtype not in SUPPORTED_DTYPES:
        return (
            f"dtype {problem.dtype} is not supported (fp16, bf16, fp32 only: the kernels accumulate "
            "in float32; use 'naive' or 'tiled' for float64)"
        )
    # Rows that are not whole 16-byte vectors and 16-bit value tiles narrower than the key tile
    # are padded before the launch (attnkit.triton.padding), which keeps every width <= 256.
    for name, dim in (("head_dim", problem.head_dim), ("value_dim", problem.value_dim)):
        if dim > MAX_HEAD_DIM:
            return f"{name} {dim} exceeds {MAX_HEAD_DIM}: its tiles would not fit in shared memory"
    programs = -(-max(problem.q_len, problem.kv_len) // _MIN_BLOCK) * problem.batch * problem.q_heads
    if programs > MAX_PROGRAMS:
        return (
            f"cdiv(max(N, M), {_MIN_BLOCK}) * batch * q_heads = {programs} programs exceed the launch "
            f"grid's {MAX_PROGRAMS}"
        )
    return None


def dispatch_boundaries() -> tuple[DispatchBoundary, ...]:
    """The sizes at which this backend switches kernels, for the installed suite to test both
    sides of (:mod:`attnkit.boundaries`), read from the constants the router decides with: the
    Gluon forward's cells and size (:mod:`~attnkit.triton.gluon_route`), TMA descriptors
    (:data:`~attnkit.triton.launch.TMA_MIN_SCORES`) and the split-KV forward
    (:func:`~attnkit.triton.decode.use_split_kv`'s config). On a device where a path cannot run
    (the CPU, another GPU than sm_90) both sides run the same kernel, and the problems still hold."""
    bf16, split = torch.bfloat16, DEFAULT_DECODE_CONFIG
    gluon = []
    for (dim, causal), min_len in sorted(ROUTED_CELLS.items()):
        batch = -(-GLUON_MIN_SCORES // min_len**2)  # enough scores at N = M = min_len
        cell = {"head_dim": dim, "causal": causal, "dtype": bf16, "batch": batch}
        masking = "causal" if causal else "not causal"
        gluon.append(
            DispatchBoundary(
                f"Gluon forward from N = {min_len} (D={dim}, {masking})", "seq_len", min_len, cell
            )
        )
    routed = {
        "head_dim": 128,
        "dtype": bf16,
        "q_heads": 2,
        "kv_heads": 2,
        "q_len": min(ROUTED_CELLS.values()),
    }
    tma = {"head_dim": 64, "causal": True, "dtype": bf16, "q_heads": 4, "kv_heads": 4, "q_len": 2048}
    decode = {"q_len": 1, "q_heads": 8, "kv_heads": 2, "head_dim": 128, "dtype": bf16}
    group = 4  # query heads per kv head: G x N reaches max_rows at N = max_rows / G
    last_rows = split.max_rows // group
    grouped = {
        "kv_len": split.min_keys_per_row * (last_rows + 2),
        "q_heads": group,
        "head_dim": 64,
        "dtype": bf16,
    }
    # A full GPU (B * Hq >= fill_fraction x SMs on any GPU) splits only for many keys per row.
    full = {"q_len": 16, "batch": 8, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": bf16}
    return (
        *gluon,
        DispatchBoundary("Gluon forward from B*H*N*M = GLUON_MIN_SCORES", "scores", GLUON_MIN_SCORES, routed),
        DispatchBoundary("TMA descriptors from B*H*N*M = TMA_MIN_SCORES", "scores", TMA_MIN_SCORES, tma),
        DispatchBoundary("split-KV forward from M = 2 x min_keys_per_split", "kv_len",
                         2 * split.min_keys_per_split, decode),
        DispatchBoundary("split-KV forward up to G x N = max_rows", "q_len", last_rows + 1, grouped),
        DispatchBoundary("split-KV forward on a full GPU from M = min_keys_per_row x N", "kv_len",
                         split.min_keys_per_row * full["q_len"], full),
    )  # fmt: skip


PATHS["triton"] = TritonImplementation
_DEFAULT_IMPLEMENTATION = TritonImplementation()

__all__ = [
    "AttentionConfig",
    "KernelConfig",
    "TritonImplementation",
    "triton_attention",
    "triton_device_support",
    "triton_problem_support",
]
