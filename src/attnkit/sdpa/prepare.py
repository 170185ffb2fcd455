"""The SDPA path's prepared runs (:func:`sdpa_prepare`): every decision that depends on the
problem alone taken once per call signature, and a plain problem's run described as a
:class:`~attnkit.prepared.PlainSdpaCall` for the compiled fast path."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from attnkit.inputs import AttentionProblem
from attnkit.prepared import PlainSdpaCall, PreparedRun
from attnkit.sdpa import calls
from attnkit.sdpa.forcing import FORCERS, KERNELS
from attnkit.sdpa.layout import layout_memo, unit_rows
from attnkit.sdpa.semantics import SMALLEST_KERNEL_SCALE, one_call_causal, sdpa_attention
from attnkit.sdpa.support import ANY_LAYOUT, SDPA_BACKENDS

#: SDPA's enable-flags in the order a :class:`~attnkit.prepared.PlainSdpaCall` lists them (and
#: the compiled fast path sets them); None for one this torch lacks.
FLAG_ORDER = tuple(
    getattr(SDPBackend, member, None)
    for member in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION", "OVERRIDEABLE")
)


def sdpa_prepare(name: str, problem: AttentionProblem) -> PreparedRun:
    """The eager run of backend ``name`` for ``problem`` (validated and supported), which
    :func:`attnkit.attention` makes once per call signature and keeps.

    A plain problem (no window; not causal, or N == M, or one query; a scale no kernel needs
    translated) is one of :func:`~attnkit.sdpa.semantics.sdpa_attention`'s first cases: one SDPA
    call on the operands as they are. Its run takes every decision that depends on the problem
    alone here, once: the flags to set, SDPA's arguments, which layout rule applies (CUDA's
    fused-kernel rule; CPU flash's rows of stride 1), and the kernel's ATen op where one is
    called directly (:func:`kernel_op`). Any other problem runs
    :func:`~attnkit.sdpa.semantics.sdpa_attention`.

    The run's first call goes through :func:`attnkit.sdpa.calls.call_sdpa`, which records
    PyTorch's warnings: a kernel that declines the problem explains why in attnkit's error and
    prints nothing (SDPA gives its reasons only as warnings), and the call is not taken for
    accepted. After one that ran, each call does only what it must. Through SDPA (PyTorch's
    choice, or flash with its flags set) it calls SDPA, which checks every call itself; math
    calls its op, which takes any operands attnkit validated. The efficient and cuDNN ops skip
    the checks SDPA would make, and those read besides the operands whether gradients are needed
    and whether deterministic algorithms are on: the first call in each such state goes through
    the checked call too, later ones call the op. A call the kernel declines after all (another
    layout, another state) is made again through the checked call, which lays the operands out
    for the kernel and, if it still declines, raises with PyTorch's reasons. On an H100 host
    (torch 2.11) every step a call skips counts: there attnkit's checks cost ~1.3 us of host time
    per call and the layout rule ~1.7-2.8 us, each measured with the SDPA call after it."""
    forced = KERNELS[name] is not None
    is_causal = one_call_causal(problem)
    if (
        problem.has_window
        or problem.scale < SMALLEST_KERNEL_SCALE
        or is_causal is None
        or (forced and FORCERS is None)
    ):
        return PreparedRun(partial(sdpa_attention, name))
    op = kernel_op(name, problem) if forced else None
    scale = _scale_argument(problem)
    fused = problem.device.type == "cuda" and name not in ANY_LAYOUT
    cpu_flash = problem.device.type == "cpu" and SDPA_BACKENDS[name] is SDPBackend.FLASH_ATTENTION
    layout = layout_memo() if fused else unit_rows if cpu_flash else None
    plain = _plain_call(name, problem, is_causal, scale, fused)

    if op is None or SDPA_BACKENDS[name] is SDPBackend.MATH:  # no per-call state check
        if op is not None:  # math's op: it takes no log-sum-exp flag
            call = partial(op, needs_grad=False, is_causal=is_causal, scale=scale)
        else:
            call = partial(F.scaled_dot_product_attention, **_plain_keywords(problem, is_causal, scale))
            if forced:
                call = partial(FORCERS[name], call)
        checked = False

        def run(q, k, v, problem):
            nonlocal checked
            if not checked:
                out = calls.call_sdpa(name, q, k, v, problem, is_causal)
                checked = True
                return out
            if layout is not None:
                q, k, v = layout(q, k, v, problem)
            try:
                return call(q, k, v)
            except RuntimeError:
                return calls.call_sdpa(name, q, k, v, problem, is_causal)

        return PreparedRun(run, plain_sdpa_call=plain)

    accepted_states: set[int] = set()  # needs_grad + 2 * deterministic, as an int
    is_grad_enabled, deterministic = torch.is_grad_enabled, torch.are_deterministic_algorithms_enabled

    def run_op(q, k, v, problem):
        # attnkit.inputs.records_backward, written out: this runs on every call, and the call to
        # the helper costs as much again as the test itself (about +100 ns a call on a CPU core).
        needs_grad = (q.requires_grad or k.requires_grad or v.requires_grad) and is_grad_enabled()
        state = needs_grad + 2 * deterministic()
        if state not in accepted_states:
            out = calls.call_sdpa(name, q, k, v, problem, is_causal)
            accepted_states.add(state)
            return out
        if layout is not None:
            q, k, v = layout(q, k, v, problem)
        try:
            return op(q, k, v, needs_grad, is_causal, scale)
        except RuntimeError:
            return calls.call_sdpa(name, q, k, v, problem, is_causal)

    return PreparedRun(run_op, plain_sdpa_call=plain)


def kernel_op(name: str, problem: AttentionProblem):
    """The ATen op SDPA itself calls for forced backend ``name`` on ``problem``'s plain calls
    (no mask), as ``op(q, k, v, needs_grad, is_causal, scale) -> out``, or None where SDPA
    would do more than call it.

    Why: ``F.scaled_dot_product_attention`` chooses its kernel on every call, and forcing one
    means saving, setting and restoring five enable-flags around it; calling the op SDPA would
    call skips both (torch 2.11 / 2.13 ``aten/src/ATen/native/transformers/attention.cpp``: for
    these kernels SDPA's only other work is GQA expansion, excluded here), once the first call of
    the problem in each state SDPA's checks read has shown that the kernel takes it (efficient
    and cuDNN; math's op takes every operand attnkit validated: :func:`sdpa_prepare`).
    Autograd reaches the same backward kernels: the ops have their own derivatives. Not for
    PyTorch's choice, a mask, or an MPS tensor (SDPA's math path differs there). Not for flash
    either: called as its op (``_scaled_dot_product_flash_attention``, with SDPA's explicit
    scale), its backward's CUDA graph capture failed with ``cudaErrorStreamCaptureInvalidated``
    in two of three GPU test runs (H100, torch 2.11; ``test_cuda_graph_capture_and_replay``),
    which never happened through SDPA; the cause is not known."""
    backend = SDPA_BACKENDS[name]
    if problem.q_heads != problem.kv_heads and backend != SDPBackend.MATH:
        return None
    op, aten_name, on_cpu = _KERNEL_OPS.get(backend, (None, None, False))
    if op is None or not hasattr(torch, aten_name) or problem.device.type == "mps":
        return None
    return op if problem.device.type == "cuda" or on_cpu else None


def _efficient_op(q, k, v, needs_grad, is_causal, scale):
    return torch._scaled_dot_product_efficient_attention(
        q, k, v, None, needs_grad, 0.0, is_causal, scale=scale
    )[0]


def _cudnn_op(q, k, v, needs_grad, is_causal, scale):
    return torch._scaled_dot_product_cudnn_attention(
        q, k, v, None, needs_grad, 0.0, is_causal, False, scale=scale
    )[0]


def _math_op(q, k, v, needs_grad, is_causal, scale):
    return torch._scaled_dot_product_attention_math(
        q, k, v, None, 0.0, is_causal, None, scale=scale, enable_gqa=True
    )[0]


#: Each forced kernel's call, the ATen op it makes, and whether SDPA calls that op on the CPU too.
_KERNEL_OPS = {
    SDPBackend.EFFICIENT_ATTENTION: (_efficient_op, "_scaled_dot_product_efficient_attention", False),
    SDPBackend.CUDNN_ATTENTION: (_cudnn_op, "_scaled_dot_product_cudnn_attention", False),
    SDPBackend.MATH: (_math_op, "_scaled_dot_product_attention_math", True),
}


def _scale_argument(problem: AttentionProblem) -> float | None:
    """The scale a prepared run hands SDPA: None where it is SDPA's own default, 1 / sqrt(D)
    (which PyTorch computes in double from the same D: the same number), else the problem's.
    Passing the default explicitly cost host time on the CPU (torch 2.13, B1 H1 N8 D16 bf16):
    ~0.3 us per forward, ~3.5 us per math forward and backward. Decided once per problem
    (:func:`sdpa_prepare`); every other call, traced ones included, passes the problem's."""
    if problem.head_dim and problem.scale == 1.0 / math.sqrt(problem.head_dim):
        return None
    return problem.scale


def _plain_keywords(problem: AttentionProblem, is_causal: bool, scale: float | None) -> dict:
    """The keyword arguments a plain problem's prepared calls give SDPA: only those that differ
    from SDPA's defaults. Each one is parsed on every call: with ``attn_mask=None``,
    ``scale=None`` and ``enable_gqa=True`` besides ``is_causal`` a call cost ~0.2 us more on an
    H100 host (torch 2.11) than with ``is_causal`` alone."""
    keywords = {"is_causal": True} if is_causal else {}
    if scale is not None:
        keywords["scale"] = scale
    if problem.q_heads != problem.kv_heads:
        keywords["enable_gqa"] = True
    return keywords


def _plain_call(
    name: str, problem: AttentionProblem, is_causal: bool, scale: float | None, layout: bool
) -> PlainSdpaCall | None:
    """The SDPA call a prepared plain run makes once its first call ran, for the compiled fast
    path, which makes it without the run. SDPA itself, also for the kernels whose op the run
    calls directly: SDPA checks every call, so no state needs tracking. ``layout``: whether the
    fused-kernel layout rule applies. None where the fast path cannot set the flags."""
    kernels = KERNELS[name]
    if kernels is not None and None in FLAG_ORDER:
        return None
    return PlainSdpaCall(
        kernels=None if kernels is None else tuple(member in kernels for member in FLAG_ORDER),
        is_causal=is_causal,
        scale=scale,
        enable_gqa=problem.q_heads != problem.kv_heads,
        layout=(problem.dtype.itemsize, problem.head_dim, problem.value_dim) if layout else None,
    )
