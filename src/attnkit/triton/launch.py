"""Host launchers of the Triton path: one shared setup, then the forward and backward launches.

:class:`LaunchSetup` derives everything both directions need (padded head dims, the log2-domain
scale, the dot precision, the tile config) once, so forward and backward cannot disagree.
On Hopper each kernel reads the tensors its loop streams (the forward and the dQ pass: K and V;
the dK/dV pass: Q and dO) through TMA tensor descriptors where the layout allows
(:meth:`LaunchSetup.use_tma`); everything else uses pointers.
Kernels are launched through :class:`attnkit.triton.fast_launch.KernelLaunch` objects built once
per setup, which skip Triton's per-call argument binding once a layout has been seen.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass, field
from enum import Enum

import torch
import triton

from attnkit.inputs import AttentionProblem
from attnkit.prepared import NativeProgram
from attnkit.triton.backward_kernels import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel, _attn_bwd_preprocess
from attnkit.triton.config import AttentionConfig, get_config, padded_dim
from attnkit.triton.fast_launch import KernelLaunch
from attnkit.triton.forward_kernels import _plain_fwd_kernel
from attnkit.triton.native_launch import native_launch

#: Host-side TMA descriptors arrived in triton 3.4; older versions keep the pointer path.
_HAS_DESCRIPTORS = importlib.util.find_spec("triton.tools.tensor_descriptor") is not None

#: Problems with fewer (query, key) score pairs than this (B * Hq * N * M) keep K and V on
#: pointers: their forward runs in tens of microseconds, about what building two TMA
#: descriptors and encoding them at launch costs the host, so descriptors would only add
#: host time to calls that are host-bound already (B=1 H=8 N=M=128 has 2**17 pairs).
TMA_MIN_SCORES = 2**24

#: Offsets inside one tile are int32: row stride x block rows must stay below this.
_INT32_LIMIT = 2**31

#: float32 inputs use IEEE float32 dots, not tf32: the tolerance rule's floor assumes float32
#: accumulation of float32 products, and tf32 (10-bit mantissa) would miss it by ~1000x.
#: 16-bit inputs run tensor-core dots with float32 accumulation whatever this says.
_DOT_PRECISION = {torch.float32: "ieee", torch.float16: "tf32", torch.bfloat16: "tf32"}


def _dot_precision(problem: AttentionProblem) -> str:
    if problem.dtype == torch.bfloat16 and problem.device.type != "cuda":
        return "upcast"  # see forward_kernels._dot: the interpreter's bf16 dot is wrong
    return _DOT_PRECISION[problem.dtype]


@dataclass(frozen=True)
class LaunchSetup:
    """What the forward and backward launches share for one problem.

    Everything here depends only on the problem's signature (shapes, dtype, device, causal,
    scale) and the config, so :func:`launch_setup` builds it once per signature: a call then
    pays a dictionary lookup instead of the config lookup, the grids and the constants."""

    problem: AttentionProblem
    config: AttentionConfig
    head_pad: int
    value_pad: int
    qk_scale: float
    dot_precision: str
    #: Launch grids (1-D, see forward_kernels._program_coords) and sizes, in kernel order.
    fwd_grid: tuple[int] = (1,)
    dkdv_grid: tuple[int] = (1,)
    dq_grid: tuple[int] = (1,)
    sizes: tuple[int, ...] = ()
    #: Row / column strides at or above this would overflow in-tile int32 offsets.
    stride_limit: int = _INT32_LIMIT
    #: The device and dtype allow TMA descriptors (the layout is checked per call).
    tma_possible: bool = False
    #: Keyword arguments (constexprs, warps, stages) of each launch, built once.
    kernel_kwargs: dict = field(default_factory=dict, compare=False)
    #: Each kernel with those arguments ("fwd", "preprocess", "dkdv", "dq"; "*_tma" with
    #: descriptors for the streamed tensors).
    launches: dict = field(default_factory=dict, compare=False)
    #: What :meth:`tile_safe_all` does to each tensor, by the tensors' strides (their shapes,
    #: dtype and device are the problem's).
    _layouts: dict = field(default_factory=dict, compare=False, repr=False)
    #: :meth:`forward_only`'s bound launches, by the strides of q, k and v (False: that layout
    #: is not launched bound).
    _bound: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, problem: AttentionProblem, config: AttentionConfig | None = None) -> LaunchSetup:
        p = problem
        if config is None:
            config = get_config(p.device, p.dtype, p.head_dim, p.value_dim, p.causal)
        head_pad, value_pad = padded_dim(p.head_dim), padded_dim(p.value_dim)
        largest_block = max(
            config.fwd.block_m, config.fwd.block_n, config.dkdv.block_m, config.dkdv.block_n,
            config.dq.block_m, config.dq.block_n, head_pad, value_pad,
        )  # fmt: skip
        setup = cls(
            problem=p,
            config=config,
            head_pad=head_pad,
            value_pad=value_pad,
            qk_scale=p.scale * math.log2(math.e),
            dot_precision=_dot_precision(p),
            fwd_grid=launch_grid(p.q_len, config.fwd.block_m, p.batch * p.q_heads),
            dkdv_grid=launch_grid(p.kv_len, config.dkdv.block_n, p.batch * p.kv_heads),
            dq_grid=launch_grid(p.q_len, config.dq.block_m, p.batch * p.q_heads),
            sizes=(p.q_len, p.kv_len, p.q_heads, p.kv_heads, p.group_size, *_band_offsets(p)),
            stride_limit=-(-_INT32_LIMIT // largest_block),
            tma_possible=(
                p.device.type == "cuda"
                and p.dtype in (torch.float16, torch.bfloat16)
                and _HAS_DESCRIPTORS
                and _capability(p.device)[0] == 9
                and p.batch * p.q_heads * p.q_len * p.kv_len >= TMA_MIN_SCORES
            ),
        )
        for name in ("fwd", "dkdv", "dq"):
            cfg = getattr(config, name)
            setup.kernel_kwargs[name] = dict(
                setup.constants(cfg.block_m, cfg.block_n), num_warps=cfg.num_warps, num_stages=cfg.num_stages
            )
        setup.kernel_kwargs["fwd"]["NEGATE_Q"] = setup.qk_scale < 0
        fwd_kwargs = setup.kernel_kwargs["fwd"]
        setup.kernel_kwargs["preprocess"] = dict(
            VALUE_DIM=p.value_dim, VALUE_PAD=value_pad, BLOCK_M=config.dq.block_m, num_warps=4
        )
        kwargs = setup.kernel_kwargs

        def streamed_blocks(x_position: int, y_position: int, block_rows: int) -> dict:
            """The descriptors of a kernel's streamed pair (:meth:`use_descriptors`): (1, 1,
            ``block_rows``, padded dim) blocks of the head-dim tensor and the value-dim one."""
            return {
                x_position: (1, 1, block_rows, head_pad),
                y_position: (1, 1, block_rows, value_pad),
            }

        # Positions of the streamed pair in each kernel's arguments: K, V (forward, dQ), Q, dO (dK/dV).
        fwd_tma = streamed_blocks(1, 2, config.fwd.block_n)
        dkdv_tma = streamed_blocks(0, 3, config.dkdv.block_m)
        dq_tma = streamed_blocks(1, 2, config.dq.block_n)
        setup.launches.update(
            fwd=KernelLaunch(_plain_fwd_kernel, **fwd_kwargs, TMA=False, STORE_LSE=True),
            fwd_tma=KernelLaunch(
                _plain_fwd_kernel, tensor_descriptors=fwd_tma, **fwd_kwargs, TMA=True, STORE_LSE=True
            ),
            # Without the log-sum-exp: the forward of a call no backward follows.
            fwd_out=KernelLaunch(_plain_fwd_kernel, **fwd_kwargs, TMA=False, STORE_LSE=False),
            fwd_out_tma=KernelLaunch(
                _plain_fwd_kernel, tensor_descriptors=fwd_tma, **fwd_kwargs, TMA=True, STORE_LSE=False
            ),
            preprocess=KernelLaunch(_attn_bwd_preprocess, **kwargs["preprocess"]),
            dkdv=KernelLaunch(_attn_bwd_dkdv_kernel, **kwargs["dkdv"], TMA=False),
            dkdv_tma=KernelLaunch(
                _attn_bwd_dkdv_kernel, tensor_descriptors=dkdv_tma, **kwargs["dkdv"], TMA=True
            ),
            dq=KernelLaunch(_attn_bwd_dq_kernel, **kwargs["dq"], TMA=False),
            dq_tma=KernelLaunch(_attn_bwd_dq_kernel, tensor_descriptors=dq_tma, **kwargs["dq"], TMA=True),
        )
        return setup

    def constants(self, block_m: int, block_n: int) -> dict:
        p = self.problem
        return dict(
            HEAD_DIM=p.head_dim,
            HEAD_PAD=self.head_pad,
            VALUE_DIM=p.value_dim,
            VALUE_PAD=self.value_pad,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            # The kernels' CAUSAL is "the band has an upper edge", WINDOW "a lower edge".
            CAUSAL=p.key_band[1] is not None,
            WINDOW=p.key_band[0] is not None,
            DOT_PRECISION=self.dot_precision,
        )

    def use_tma(self, *tensors: torch.Tensor) -> bool:
        """Whether a kernel can read ``tensors`` (the pair its loop streams) through TMA tensor descriptors:
        16-bit inputs on Hopper (where it is measured faster), at least
        :data:`TMA_MIN_SCORES` score pairs, a contiguous last dim, and
        16-byte aligned base and strides (the copy engine's rules; a zero stride, as an
        expanded tensor has, is left to the pointer path). Elsewhere the pointer path runs."""
        return self.tma_possible and all(_tma_layout_ok(x) for x in tensors)

    def use_descriptors(self, x: torch.Tensor, y: torch.Tensor, tma: bool | None) -> bool:
        """Whether a kernel reads the pair of tensors its loop streams, ``x`` of the head dim (K,
        or Q in the dK/dV pass) and ``y`` of the value dim (V, or dO), through TMA descriptors:
        then it is launched through its ``*_tma`` launch, which describes them as (1, 1, block
        rows, padded dim) blocks (:meth:`build`). ``tma`` forces one or the other; None asks
        :meth:`use_tma`."""
        return self.use_tma(x, y) if tma is None else tma

    def forward_only(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """:func:`attention_forward`'s output without the log-sum-exp, for a call no backward
        follows: one allocation fewer, and each layout of q, k and v is launched through a
        :class:`~attnkit.triton.fast_launch.BoundLaunch` after its first call. Its fixed
        arguments (the strides, sizes and scale after q, k, v, out and the unused log-sum-exp
        pointer) follow from this setup and the strides it is keyed on: ``out`` is allocated
        here with the problem's contiguous shape. A layout the kernels must not see as it is
        (:meth:`tile_safe`), or one read through TMA descriptors, is never bound."""
        p = self.problem
        key = (q.stride(), k.stride(), v.stride())
        bound = self._bound.get(key)
        out = torch.empty(p.batch, p.q_heads, p.q_len, p.value_dim, dtype=p.dtype, device=q.device)
        # The unused log-sum-exp pointer is ``out``: any pointer does.
        if bound and bound(q, k, v, out, out):
            return out
        safe_q, safe_k, safe_v = self.tile_safe_all(q, k, v)
        descriptors = self.use_descriptors(safe_k, safe_v, None)
        launch = self.launches["fwd_out_tma" if descriptors else "fwd_out"]
        args = _forward_args(safe_q, safe_k, safe_v, out, out, self)
        launch(self.fwd_grid, *args)
        # A layout's first call, or one its bound launch declined (a changed knob or runtime),
        # binds the launch just made; not after a copy (the layout itself is never bound then).
        if safe_q is q and safe_k is k and safe_v is v:
            bound = False if descriptors else launch.bind(self.fwd_grid, args, 5)
            if bound is not None:  # None: not launched directly (yet): hooks, no runtime
                if len(self._bound) >= 64:  # a bound for programs that sweep layouts
                    self._bound.clear()
                self._bound[key] = bound
        return out

    def native_forward_only(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> NativeProgram | None:
        """:meth:`forward_only` for q, k and v's layout as a
        :class:`~attnkit.prepared.NativeProgram`, for :mod:`attnkit.fastpath` to run
        without Python: the output's allocation and the bound launch, with the same arguments;
        None until the layout's launch is bound (after its first call), or where it is not."""
        bound = self._bound.get((q.stride(), k.stride(), v.stride()))
        launch = native_launch(bound, (0, 1, 2, 3, 3)) if bound else None  # out stands in for the log-sum-exp
        if launch is None:
            return None
        p = self.problem
        output = ((p.batch, p.q_heads, p.q_len, p.value_dim), p.dtype)
        return NativeProgram(device=bound.device, allocations=(output,), launches=(launch,), result=3)

    def tile_safe(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` itself, or a copy when its layout is one the kernels must not see:

        * a stride so large that in-tile int32 offsets could overflow (contiguous copy);
        * on a GPU, a base or stride that is not a multiple of 16 bytes, or a last dim that is
          not contiguous (copy with rows padded to 16 bytes, :func:`aligned_copy`, since a row
          of D = 59 fp16 values is itself 118 bytes). Compiled with such strides, triton 3.6's
          causal forward faulted on the H100 ("out-of-range shared address", V with Dv=16
          and a 76-byte row stride); 16-byte aligned rows are also what vectorised loads
          need. Zero strides (expanded tensors) are aligned and never copied.

        Everyday layouts (contiguous, (B, N, H, D) transposed, slices of whole rows) pass as they are.
        """
        return _apply(_layout_fix(x, self.stride_limit), x)

    def tile_safe_all(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """:meth:`tile_safe` of each tensor, for tensors of this problem's shapes, dtype and
        device (a launcher's inputs): their layouts' verdicts are memoised by strides, so a
        call pays the strides, the base pointers and one lookup instead of the checks."""
        key = tuple([x.stride() for x in tensors])
        fixes = self._layouts.get(key)
        if fixes is None:
            if len(self._layouts) >= 64:  # a bound for programs that sweep layouts
                self._layouts.clear()
            fixes = self._layouts[key] = tuple(_layout_fix(x, self.stride_limit) for x in tensors)
        return tuple([_apply(fix, x) for fix, x in zip(fixes, tensors, strict=True)])


class _Fix(Enum):
    """What :meth:`LaunchSetup.tile_safe` does to a tensor, decided from its shape and strides."""

    KEEP = "keep"
    KEEP_IF_ALIGNED = "keep if the base is 16-byte aligned, else an aligned copy"  # CUDA
    CONTIGUOUS = "contiguous copy"
    ALIGNED_COPY = "aligned copy"


def _layout_fix(x: torch.Tensor, stride_limit: int) -> _Fix:
    stride = x.stride()
    if stride[2] >= stride_limit or stride[3] >= stride_limit:
        return _Fix.CONTIGUOUS
    if not x.is_cuda:
        return _Fix.KEEP
    return _Fix.KEEP_IF_ALIGNED if _aligned_rows(x) else _Fix.ALIGNED_COPY


def _apply(fix: _Fix, x: torch.Tensor) -> torch.Tensor:
    if fix is _Fix.KEEP or (fix is _Fix.KEEP_IF_ALIGNED and x.data_ptr() % 16 == 0):
        return x
    return x.contiguous() if fix is _Fix.CONTIGUOUS else aligned_copy(x)


def _band_offsets(problem: AttentionProblem) -> tuple[int, int]:
    """(causal_offset, lower_offset) of the kernels: row i sees key j iff
    ``i + lower_offset <= j <= i + causal_offset`` (see forward_kernels). An unbounded side
    passes a value the kernels ignore (their CAUSAL / WINDOW flag is off): the bottom-right
    offset, as before windows, and 0."""
    lower, upper = problem.key_band
    return (problem.causal_offset if upper is None else upper), (0 if lower is None else lower)


def aligned_copy(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` (any shape) whose rows start on 16-byte boundaries: stored with the last
    dim padded to a multiple of 16 bytes, viewed back to ``x``'s shape. A plain contiguous copy
    is not enough when the row itself is not a multiple of 16 bytes (D = 59 in fp16: 118 bytes)."""
    per_16_bytes = max(1, 16 // x.element_size())
    width = -(-x.shape[-1] // per_16_bytes) * per_16_bytes
    view = x.new_empty(*x.shape[:-1], width)[..., : x.shape[-1]]
    view.copy_(x)
    return view


_SETUPS: dict[tuple, LaunchSetup] = {}


def launch_setup(problem: AttentionProblem, config: AttentionConfig | None = None) -> LaunchSetup:
    """:meth:`LaunchSetup.build`, memoised on the problem and the config. The config-table
    override (``$ATTNKIT_TRITON_CONFIG``) is read when a problem's setup is built, not on
    every call (reading the environment cost ~1.5 us a call); :func:`forget_setups` makes
    a changed value take effect."""
    key = (problem, config)
    setup = _SETUPS.get(key)
    if setup is None:
        if len(_SETUPS) >= 4096:  # a bound for programs that sweep shapes; refilled on demand
            _SETUPS.clear()
        setup = _SETUPS[key] = LaunchSetup.build(problem, config)
    return setup


def forget_setups() -> None:
    """Drop every memoised :class:`LaunchSetup` (after changing ``$ATTNKIT_TRITON_CONFIG``;
    :func:`attnkit.triton.forget_plans` drops the plans too)."""
    _SETUPS.clear()


def launch_grid(rows: int, block: int, programs: int) -> tuple[int]:
    """One axis of ``cdiv(rows, block) * programs`` programs (CUDA allows 2**31 - 1 on axis 0;
    the kernels split the index back, see forward_kernels._program_coords)."""
    return (triton.cdiv(rows, block) * programs,)


def _aligned_rows(x: torch.Tensor) -> bool:
    """Contiguous last dim (or a single column), 16-byte aligned outer strides (the base
    pointer is checked apart: :func:`_apply`)."""
    item = x.element_size()
    if x.is_contiguous():  # the everyday case, without walking the strides in Python
        return (x.shape[-1] * item) % 16 == 0 or x.shape[:-1].numel() == 1
    last_ok = x.stride(-1) == 1 or x.shape[-1] == 1
    outer_ok = all(
        stride * item % 16 == 0
        for size, stride in zip(x.shape[:-1], x.stride()[:-1], strict=True)
        if size > 1
    )
    return last_ok and outer_ok


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _tma_layout_ok(x: torch.Tensor) -> bool:
    item = x.element_size()
    return (
        x.stride(-1) == 1
        and x.data_ptr() % 16 == 0
        and all(stride > 0 and stride * item % 16 == 0 for stride in x.stride()[:-1])
    )


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, setup: LaunchSetup, tma: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: (B, Hq, N, D), k: (B, Hkv, M, D), v: (B, Hkv, M, Dv), any strides.
    Returns out (B, Hq, N, Dv) in q's dtype and lse (B, Hq, N) float32 (natural log, +inf for
    rows that see no key). ``tma`` forces K and V through TMA descriptors or pointers (tests
    run descriptors in the interpreter); None picks descriptors where
    :meth:`LaunchSetup.use_tma` allows. :meth:`LaunchSetup.forward_only` is the same kernel
    without the log-sum-exp."""
    p = setup.problem
    q, k, v = setup.tile_safe_all(q, k, v)
    out = torch.empty(p.batch, p.q_heads, p.q_len, p.value_dim, dtype=p.dtype, device=q.device)
    lse = torch.empty(p.batch, p.q_heads, p.q_len, dtype=torch.float32, device=q.device)
    setup.launches["fwd_tma" if setup.use_descriptors(k, v, tma) else "fwd"](
        setup.fwd_grid, *_forward_args(q, k, v, out, lse, setup)
    )
    return out, lse


def _forward_args(q, k, v, out, lse, setup: LaunchSetup) -> tuple:
    """The forward kernel's positional arguments."""
    return (
        q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *setup.sizes, abs(setup.qk_scale),
    )  # fmt: skip


def bwd_preprocess(setup: LaunchSetup, out: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """delta = rowsum(dO * O): (B, Hq, N) float32."""
    p = setup.problem
    delta = torch.empty(p.batch, p.q_heads, p.q_len, dtype=torch.float32, device=out.device)
    setup.launches["preprocess"](
        setup.dq_grid, out, grad_out, delta, *out.stride(), *grad_out.stride(), p.q_len, p.q_heads
    )
    return delta


def bwd_dkdv(
    setup: LaunchSetup, q, k, v, grad_out, lse, delta, tma: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """dk (B, Hkv, M, D) and dv (B, Hkv, M, Dv), each summed over the query-head group. ``tma``
    as in :func:`attention_forward`, for Q and dO (the tensors this pass streams)."""
    p = setup.problem
    dk = torch.empty(p.batch, p.kv_heads, p.kv_len, p.head_dim, dtype=p.dtype, device=q.device)
    dv = torch.empty(p.batch, p.kv_heads, p.kv_len, p.value_dim, dtype=p.dtype, device=q.device)
    setup.launches["dkdv_tma" if setup.use_descriptors(q, grad_out, tma) else "dkdv"](
        setup.dkdv_grid,
        q, k, v, grad_out, lse, delta, dk, dv,
        *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *dk.stride(), *dv.stride(),
        *setup.sizes, setup.qk_scale, p.scale,
    )  # fmt: skip
    return dk, dv


def bwd_dq(setup: LaunchSetup, q, k, v, grad_out, lse, delta, tma: bool | None = None) -> torch.Tensor:
    """dq (B, Hq, N, D). ``tma`` as in :func:`attention_forward`, for K and V."""
    p = setup.problem
    dq = torch.empty(p.batch, p.q_heads, p.q_len, p.head_dim, dtype=p.dtype, device=q.device)
    setup.launches["dq_tma" if setup.use_descriptors(k, v, tma) else "dq"](
        setup.dq_grid,
        q, k, v, grad_out, lse, delta, dq,
        *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *dq.stride(),
        *setup.sizes, setup.qk_scale, p.scale,
    )  # fmt: skip
    return dq


def attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    setup: LaunchSetup,
    tma: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """grad_out, out: (B, Hq, N, Dv); lse: (B, Hq, N) from :func:`attention_forward`.
    Returns dq (B, Hq, N, D), dk (B, Hkv, M, D), dv (B, Hkv, M, Dv), contiguous, in q's dtype.
    Deterministic: each gradient element is written by one program, in a fixed order.
    ``tma`` forces descriptors or pointers in both passes (None: each pass decides)."""
    q, k, v, out, grad_out = setup.tile_safe_all(q, k, v, out, grad_out)
    delta = bwd_preprocess(setup, out, grad_out)
    dk, dv = bwd_dkdv(setup, q, k, v, grad_out, lse, delta, tma)
    dq = bwd_dq(setup, q, k, v, grad_out, lse, delta, tma)
    return dq, dk, dv
