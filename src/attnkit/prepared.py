"""The prepared run: what a backend makes once per call signature, and what an accelerator may
read off it.

:func:`attnkit.attention` validates a call, asks the chosen backend's ``prepare`` (see
:class:`attnkit.registry.Backend`) for a :class:`PreparedRun` of the problem, and keeps it per
call signature. ``run`` is the eager run; the two optional fields describe that run as data, for
the compiled fast path (:mod:`attnkit.fastpath`) to make the same work without Python once a call
of the signature ran:

* ``plain_sdpa_call``: the run is one SDPA call (:class:`PlainSdpaCall`);
* ``native_forward(q, k, v)``: the run's forward without gradients, for q, k and v's layout, is a
  fixed sequence of kernel launches (:class:`NativeProgram`), or None (not known yet, or not one).

A backend fills what it knows; the fast path reads only these fields, and a run with neither is
simply called. Nothing here decides anything: the types are the contract between the two sides.

``plan``: which kernels the run launches, as the backend decided them when it prepared the
problem (the Triton path: :class:`attnkit.triton.plan.KernelPlan`), for a reader (tests,
tools); None where a backend does not say.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from attnkit.inputs import AttentionProblem

RunFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionProblem], torch.Tensor]


class PlainSdpaCall(NamedTuple):
    """One call ``scaled_dot_product_attention(q, k, v, is_causal=..., scale=..., enable_gqa=...)``
    with no mask, made on the operands as they are once the layout rule passes them.

    ``kernels``: None (PyTorch chooses), or whether each of SDPA's enable-flags is on during the
    call, in :data:`attnkit.sdpa.prepare.FLAG_ORDER` (flash, efficient, math, cuDNN,
    overrideable). ``scale``: None for SDPA's default. ``layout``: None, or ``(item size, D, Dv)``
    where the fused-kernel layout rule (:func:`attnkit.sdpa.layout.aligned_for_fused_kernels`)
    applies: an operand it would copy is left to the run."""

    kernels: tuple[bool, bool, bool, bool, bool] | None
    is_causal: bool
    scale: float | None
    enable_gqa: bool
    layout: tuple[int, int, int] | None


class NativeLaunch(NamedTuple):
    """One kernel launch of a :class:`NativeProgram` (:func:`attnkit.triton.native_launch.native_launch`).
    ``params`` are the kernel's parameters in order: ``("tensor", slot, aligned)`` (the address
    of the program's tensor ``slot``, which must be 16-byte aligned if ``aligned`` is, and must
    not be if it is not: the kernel was specialised on it), ``("i32" | "i64" | "u64", int)``,
    ``("fp32", float)``, ``("ptr", address)``. ``ready()`` is asked before every call: False
    sends the call back to the run."""

    ready: Callable[[], bool]
    function: int  # CUfunction
    grid: tuple[int, int, int]
    block: int  # threads
    shared: int  # dynamic shared memory, bytes
    pdl: bool  # programmatic stream serialization
    cooperative: bool
    params: tuple


class NativeProgram(NamedTuple):
    """A forward call as launches: tensors 0, 1, 2 are the call's q, k and v; each of
    ``allocations``, ``(sizes, dtype)``, is allocated on their device as the next slot;
    ``launches`` run in order on the current stream of CUDA device ``device``; the result is the
    tensor in slot ``result``. Valid for the strides of q, k and v it was made for."""

    device: int
    allocations: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    launches: tuple[NativeLaunch, ...]
    result: int


NativeForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], "NativeProgram | None"]


class PreparedRun:
    """A backend's eager run of one problem, ``prepared(q, k, v, problem) -> out`` (shapes as in
    :func:`attnkit.attention`), with what it describes of itself (module docstring).

    Callers on the hot path call ``prepared.run`` directly (one call, no extra frame); calling
    the object itself does the same through ``__call__``."""

    __slots__ = ("native_forward", "plain_sdpa_call", "plan", "run")

    def __init__(
        self,
        run: RunFn,
        *,
        plain_sdpa_call: PlainSdpaCall | None = None,
        native_forward: NativeForward | None = None,
        plan: object | None = None,
    ) -> None:
        if not callable(run):
            raise TypeError(f"run: expected a callable, got {type(run).__name__}")
        if plain_sdpa_call is not None and not isinstance(plain_sdpa_call, PlainSdpaCall):
            raise TypeError(f"plain_sdpa_call: expected a PlainSdpaCall or None, got {plain_sdpa_call!r}")
        if native_forward is not None and not callable(native_forward):
            raise TypeError(f"native_forward: expected a callable or None, got {native_forward!r}")
        self.run = run
        self.plain_sdpa_call = plain_sdpa_call
        self.native_forward = native_forward
        self.plan = plan

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem):
        return self.run(q, k, v, problem)

    def __repr__(self) -> str:
        described = [
            name for name in ("plain_sdpa_call", "native_forward", "plan") if getattr(self, name) is not None
        ]
        return f"PreparedRun({self.run!r}{''.join(f', {name}=...' for name in described)})"
