"""The Triton backend's router: which kernel runs each pass of a problem, and the checks the
registry asks before dispatch.

:class:`TritonImplementation` (the kernels behind the shared autograd function),
:class:`PlannedKernels` (one problem's :class:`~attnkit.triton.plan.KernelPlan`, run), the public
:func:`triton_attention`, the registry's :func:`prepare` and :func:`run_after_support_check`,
the support checks (:func:`triton_device_support`, :func:`triton_problem_support`) and the sizes
at which the backend switches kernels (:func:`dispatch_boundaries`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

import torch

from attnkit.boundaries import DispatchBoundary
from attnkit.errors import UnsupportedProblemError
from attnkit.flash_autograd import PATHS, flash_attention
from attnkit.inputs import AttentionProblem
from attnkit.prepared import NativeForward, PreparedRun
from attnkit.triton.config import AttentionConfig
from attnkit.triton.decode import (
    DEFAULT_DECODE_CONFIG,
    decode_config,
    decode_forward,
    decode_forward_only,
    decode_native_forward_only,
    dense_plan,
)
from attnkit.triton.forward_kernels import _plain_fwd_kernel
from attnkit.triton.gluon.route import gluon_backward, gluon_forward
from attnkit.triton.gluon.support import layout_ok as gluon_layout_ok
from attnkit.triton.launch import (
    TMA_MIN_SCORES,
    LaunchSetup,
    attention_backward,
    attention_forward,
    forget_setups,
    launch_setup,
)
from attnkit.triton.padding import padded_attention, padded_problem
from attnkit.triton.plan import GLUON_MIN_SCORES, KernelPlan, packaged_routed_cells, plan_kernels

#: Whether @triton.jit built interpreter kernels: Triton reads TRITON_INTERPRET once, when the
#: kernels are decorated (at import), so availability follows the kernels, not today's variable.
_KERNELS_INTERPRETED = type(_plain_fwd_kernel).__name__ == "InterpretedFunction"

MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Every kernel runs on one grid axis of (row blocks x batch x heads) programs; CUDA caps
#: axis 0 at 2**31 - 1 (the other axes at 65535, which is why nothing else goes there).
MAX_PROGRAMS = 2**31 - 1
#: The smallest tile a config may have (KernelConfig): the most programs a problem can need.
_MIN_BLOCK = 16


class TritonImplementation:
    """Forward and backward kernels; see :class:`attnkit.flash_autograd.FlashImplementation`.

    The default (no ``config``, no ``tma``) runs each problem's plan (:class:`PlannedKernels`);
    an explicit config or TMA choice runs the plain kernels with it, which is what a tuner or a
    test of those kernels times."""

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
        if self.op_name is not None:
            return planned_kernels(problem).forward(q, k, v, problem)
        return attention_forward(q, k, v, launch_setup(problem, self.config), self.tma)

    def backward(self, grad_out, q, k, v, out, lse, problem):
        if self.op_name is not None:
            return planned_kernels(problem).backward(grad_out, q, k, v, out, lse, problem)
        return attention_backward(grad_out, q, k, v, out, lse, launch_setup(problem, self.config), self.tma)


class PlannedKernels:
    """One problem's :class:`~attnkit.triton.plan.KernelPlan` with what its kernels need,
    looked up once (:func:`planned_kernels`): the default implementation of that problem, whose
    forward and backward run what the plan names without deciding anything per call."""

    op_name = "triton"
    lse_dtype = TritonImplementation.lse_dtype

    def __init__(self, problem: AttentionProblem) -> None:
        self.problem = problem
        self.plan: KernelPlan = plan_kernels(problem)
        #: The plain kernels' setup: the plain forward and backward, and the fallback of a
        #: layout the Gluon kernels do not read.
        self.setup: LaunchSetup = launch_setup(problem)
        #: The forward of a call no backward follows (output only), and that forward as a
        #: NativeProgram per layout (None: the run stays in Python), chosen once by the plan:
        #: bound launches of the split-KV or plain kernels; the Gluon launch is not a bound
        #: Triton launch, so it has no native program.
        self.forward_only: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
        self.native_forward: NativeForward | None
        if self.plan.forward == "split_kv":
            split_plan = dense_plan(problem)
            self.forward_only = partial(_split_kv_forward_only, problem, split_plan)
            self.native_forward = partial(_split_kv_native_forward_only, problem, split_plan)
        elif self.plan.forward == "gluon":
            self.forward_only, self.native_forward = self._forward_only, None
        else:
            self.forward_only = self.setup.forward_only
            self.native_forward = self.setup.native_forward_only

    def forward(self, q, k, v, problem):
        kind = self.plan.forward
        if kind == "split_kv":
            return decode_forward(q, k, v, problem)
        if kind == "gluon" and gluon_layout_ok(q, k, v):
            # The Gluon kernel's log-sum-exp is the plain forward's, for the same backward.
            return gluon_forward(q, k, v, problem)
        return attention_forward(q, k, v, self.setup)

    def backward(self, grad_out, q, k, v, out, lse, problem):
        if self.plan.backward == "gluon" and gluon_layout_ok(q, k, v, out, grad_out) and lse.is_contiguous():
            return gluon_backward(grad_out, q, k, v, out, lse, problem)
        return attention_backward(grad_out, q, k, v, out, lse, self.setup)

    def _forward_only(self, q, k, v) -> torch.Tensor:
        # Chosen once per plan in __init__: the Gluon forward for layouts it reads as they are.
        if gluon_layout_ok(q, k, v):
            return gluon_forward(q, k, v, self.problem)[0]
        return self.setup.forward_only(q, k, v)


def _split_kv_forward_only(problem, split_plan, q, k, v) -> torch.Tensor:
    return decode_forward_only(q, k, v, problem, split_plan)


def _split_kv_native_forward_only(problem, split_plan, q, k, v):
    return decode_native_forward_only(q, k, v, problem, split_plan)


_PLANNED: dict[AttentionProblem, PlannedKernels] = {}


def planned_kernels(problem: AttentionProblem) -> PlannedKernels:
    """:class:`PlannedKernels` of ``problem``, made once per problem in a process."""
    planned = _PLANNED.get(problem)
    if planned is None:
        if len(_PLANNED) >= 4096:  # a bound for programs that sweep shapes; refilled on demand
            _PLANNED.clear()
        planned = _PLANNED[problem] = PlannedKernels(problem)
    return planned


def forget_plans() -> None:
    """Drop every memoised plan and launch setup (after changing ``$ATTNKIT_GLUON``,
    ``$ATTNKIT_TRITON_CONFIG`` or a table); prepared runs of :func:`attnkit.attention` keep
    theirs until its own memo is dropped."""
    _PLANNED.clear()
    forget_setups()


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
    # Traced by torch.compile, the problem is a constant: trace the pure function, not the memo
    # around it (Dynamo would warn that it ignores a functools.lru_cache wrapper).
    padded = padded_problem.__wrapped__(problem) if torch.compiler.is_compiling() else padded_problem(problem)
    if padded is None:
        return flash_attention(impl, q, k, v, problem)
    return padded_attention(impl, q, k, v, problem, padded)


def prepare(problem: AttentionProblem) -> PreparedRun:
    """The registry's eager run of ``problem`` (supported: checked before), made once per call
    signature: :func:`run_after_support_check` with the problem's :class:`PlannedKernels`, whose
    plan the run carries (``PreparedRun.plan``). A call no backward follows runs
    :meth:`PlannedKernels.forward_only`, whose bound launches, per layout, are the run's
    ``native_forward``, except for a problem whose head dims are padded
    (:mod:`attnkit.triton.padding`): a native program would launch on the caller's unpadded
    operands, so that run stays in Python."""
    padded = padded_problem(problem)
    planned = planned_kernels(problem if padded is None else padded)
    if padded is not None:
        run = partial(padded_attention, planned, padded=padded, forward_only=planned.forward_only)
        return PreparedRun(run, plan=planned.plan)
    run = partial(flash_attention, planned, forward_only=planned.forward_only)
    return PreparedRun(run, native_forward=planned.native_forward, plan=planned.plan)


def cache_forward(q, k_cache, v_cache, cache, block_table) -> torch.Tensor | None:
    """The registry's ``cache_forward``: the split-KV kernel reading a KV cache in place, through
    the block table when it is paged (:func:`attnkit.attention_with_kvcache`). None, for the
    gathered route, where the head dims need padding (:mod:`~attnkit.triton.padding`: that would
    copy the whole cache on every call, while the gathered route pads each sequence's keys) or a
    group of query rows exceeds what one program of the split-KV kernel holds."""
    problem = cache.problem
    paged = block_table is not None
    if (
        padded_problem(problem) is not None
        or problem.group_size * problem.q_len > decode_config(paged).max_rows
    ):
        return None
    seqlens = cache.lengths.to(device=q.device, dtype=torch.int32)
    table = block_table.to(torch.int32) if paged else None
    return decode_forward(q, k_cache, v_cache, problem, seqlens=seqlens, block_table=table)[0]


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
    sides of (:mod:`attnkit.boundaries`), read from the data the router decides with: the
    Gluon kernels' routed cells in every GPU model's table and their size floor
    (:mod:`~attnkit.triton.plan`), TMA descriptors (:data:`~attnkit.triton.launch.TMA_MIN_SCORES`)
    and the split-KV forward (:func:`~attnkit.triton.decode.use_split_kv`'s config). On a device
    where a path cannot run (the CPU, another GPU than sm_90) both sides run the same kernel, and
    the problems still hold."""
    bf16, split = torch.bfloat16, DEFAULT_DECODE_CONFIG
    cells = packaged_routed_cells()  # every GPU model's measured cells: a boundary somewhere
    gluon = []
    for (pass_name, dim, causal), min_len in sorted(cells.items()):
        batch = -(-GLUON_MIN_SCORES // min_len**2)  # enough scores at N = M = min_len
        cell = {"head_dim": dim, "causal": causal, "dtype": bf16, "batch": batch}
        masking = "causal" if causal else "not causal"
        gluon.append(
            DispatchBoundary(
                f"Gluon {pass_name} from N = {min_len} (D={dim}, {masking})", "seq_len", min_len, cell
            )
        )
    routed = {
        "head_dim": 128,
        "dtype": bf16,
        "q_heads": 2,
        "kv_heads": 2,
        "q_len": min(cells.values(), default=4096),
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
