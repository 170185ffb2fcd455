"""The SDPA path: ``torch.nn.functional.scaled_dot_product_attention``, optionally forcing one
of its backends, with attnkit's semantics on top.

Two translations are needed:

* Causal masks. SDPA's ``is_causal`` is aligned top-left; attnkit's is bottom-right
  (query i sees key j iff j <= i + M - N). For N > M the first N - M rows see no key: they are
  zero, and only the last M rows go to SDPA as a square causal problem. N < M runs at the cost
  of the N x M problem: N = 1 non-causal (the one row sees every key), flash and efficient on
  CUDA in their own bottom-right mode, cuDNN as a non-causal prefix and a causal square merged
  by their log-sum-exp (:mod:`attnkit.sdpa_lower_right`), every other kernel (and cuDNN when
  M = N + 1 or traced) with the (N, M) visibility matrix as its mask, as for windows below.
* Sliding windows. SDPA has no window argument: the window goes in as an explicit boolean
  ``attn_mask``, :func:`attnkit.reference.visibility` (N x M, broadcast over batch and heads),
  on the kernels that take a mask (:data:`WINDOW_MASK_KERNELS`); flash takes none and declines
  in :func:`sdpa_problem_support`. SDPA's softmax over a fully masked row is NaN, so the rows
  that see no key (always the first ones: the band's upper edge is below key 0 there) are cut
  off before the call and returned as zeros, as for causal N > M.
* Non-positive and tiny scales. Translated exactly, because kernels fail on them (torch 2.13
  CPU flash returns NaN for causal inputs when the scale is 0, negative, or rounds to 0 in
  float32; on the H100, torch 2.11, cuDNN's backward returned inf gradients at a
  float32-subnormal scale of 2.5e-42): ``softmax(s * q k^T) == softmax(|s| * q (-k)^T)`` for
  s < 0 (negation is exact); a scale that rounds to 0 in the dtype the scores are computed in
  (float64 for float64 inputs, float32 otherwise) makes every score 0, so the call is made with
  a zeroed q (scale 1): the s = 0 function, dq = dk = 0; and a bf16 / fp32 scale below
  :data:`_SMALLEST_KERNEL_SCALE` moves a power of two into q (``s q = (s 2^p)(q 2^-p)``, exact
  in their 8-bit exponent range), so every kernel sees a normal scale and the gradients keep
  their value (at s = 6.8e-39 and |q|, |k| ~ 30, dk is ~3e-37, a normal number). fp16's range
  is too small for that shift; there a scale below float32's smallest normal zeroes q, and the
  true dq, dk (below 1e-25) are 0 in fp16 anyway.
* Strides. PyTorch's CUDA flash kernel (torch 2.11) reads rows with 16-byte vector loads and
  faults with "misaligned address" — poisoning the CUDA context — when a row stride is not a
  multiple of 16 bytes (e.g. every other row of a (.., 2N, D + 3) buffer). Such operands are
  copied to contiguous memory first; aligned strided views pass through untouched.
* cuDNN's masked float16 backward. On the H100 (torch 2.11.0+cu130), cuDNN's backward with an
  attention mask returned NaN in dq for float16 inputs with large logits (|q| ~ 30, a window of
  one to four keys, N = 64..66, D = 16; the output, dk and dv were finite, bfloat16 was right,
  and so was every call without a mask). A float16 call that hands cuDNN a mask
  (:func:`_cudnn_gets_mask`: a window; causal 1 < N < M only where the split does not run) and
  needs gradients is therefore declined by ``sdpa-cudnn`` (:func:`sdpa_attention`), and
  ``sdpa`` runs a masked one with cuDNN left out of PyTorch's choice (PyTorch chose cuDNN
  there, with the same NaN).
* Errors. When a forced backend rejects the inputs, PyTorch raises a generic "no available
  kernel" error and explains the reason only in warnings; those warnings are captured and put
  into the error attnkit raises.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnkit import sdpa_lower_right as lower_right
from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import AttentionProblem
from attnkit.reference import visibility

#: attnkit backend name -> the SDPA backend it forces (None: PyTorch chooses).
SDPA_BACKENDS: dict[str, SDPBackend | None] = {
    "sdpa": None,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-math": SDPBackend.MATH,
}

#: Kernels that take a sliding window as an ``attn_mask``: PyTorch's choice, efficient, math, and
#: cuDNN, whose SDPA accepts a mask (PyTorch's ``can_use_cudnn_attention`` checks the mask's
#: shape, ``check_attn_mask_shape``, where ``can_use_flash_attention`` rejects any mask,
#: ``check_for_attn_mask``). A kernel that declines a particular masked call still says why at
#: call time.
WINDOW_MASK_KERNELS = (None, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION)

#: Backends that exist only as CUDA kernels (on CPU PyTorch has flash and math).
_CUDA_ONLY = {SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION}

#: Backends that take operands in any layout: math is composite ATen ops (matmuls, softmax),
#: none of which reads rows with the fused kernels' vector loads, so the layout rule
#: (:func:`_for_fused_kernels`) is not applied to it: no copies, and no per-call layout check
#: (on an H100 host every microsecond of Python before the math op cost it ~3.7 us:
#: docs/evidence/h100-2026-11-24/session17).
_ANY_LAYOUT = frozenset({"sdpa-math"})


def sdpa_device_support(name: str, device: torch.device) -> str | None:
    """Why backend ``name`` cannot run on ``device`` at all, or None if it can."""
    backend = SDPA_BACKENDS[name]
    if backend in _CUDA_ONLY and device.type != "cuda":
        return f"{name} is a CUDA kernel; device {device} is not a CUDA device"
    if backend == SDPBackend.CUDNN_ATTENTION and not torch.backends.cudnn.is_available():
        return f"{name} needs cuDNN, which this PyTorch build does not provide"
    return None


def sdpa_problem_support(name: str, problem: AttentionProblem) -> str | None:
    """Reasons known before launch; anything subtler comes from PyTorch at call time."""
    backend = SDPA_BACKENDS[name]
    if problem.dtype == torch.float64 and backend not in (None, SDPBackend.MATH):
        return f"{name} does not support float64 on {problem.device.type} (use sdpa-math)"
    if problem.has_window and backend not in WINDOW_MASK_KERNELS:
        return (
            f"{name} takes no attn_mask, and a sliding window reaches SDPA only as a mask "
            "(use sdpa-efficient, sdpa-cudnn, sdpa-math or sdpa)"
        )
    return None


def _aligned_for_fused_kernels(x: torch.Tensor, item: int, last_dim: int) -> torch.Tensor:
    """``x`` (a CUDA tensor of ``item``-byte elements whose last dimension is ``last_dim``: the
    problem's, so no per-call size queries), or a contiguous copy if its layout would misalign
    CUDA fused kernels' loads or broadcast a dimension through a zero stride."""
    if x.data_ptr() % 16:
        return _packed(x)
    if (last_dim * item) % 16:
        # Rows no layout can align: PyTorch pads the head dim itself; a copy only makes them dense.
        return x.contiguous()
    # Every stride, size-1 dimensions' included: is_contiguous ignores those, the memory-efficient
    # backward does not (on the H100, torch 2.11, a (1, 1, 1, 16) fp16 key viewed with a row
    # stride of 38 elements had "no kernel found to launch"). A zero stride (an expanded tensor)
    # is materialised too: cuDNN (torch 2.11) crashed the process with a segmentation fault on
    # operands expanded along the batch. The item size (2, 4 or 8 bytes) divides 16, so each
    # stride is a whole number of 16-byte steps iff its low bits are zero, which their OR tests
    # at once (x is 4-D: validated).
    batch, heads, rows, last = x.stride()
    aligned = last == 1 and 0 not in (batch, heads, rows) and ((batch | heads | rows) * item) % 16 == 0
    return x if aligned else _packed(x)


def _for_fused_kernels(q, k, v, problem: AttentionProblem):
    """q, k, v laid out for CUDA fused kernels (:func:`_aligned_for_fused_kernels`); CPU tensors
    as they are. Eager only: under torch.compile the tensors are symbolic (no data pointer), and
    Inductor's SDPA lowering enforces the same 16-byte alignment itself."""
    if not q.is_cuda:
        return q, k, v
    return _fused_layout(q, k, v, problem)


def _fused_layout(q, k, v, problem: AttentionProblem):
    """:func:`_aligned_for_fused_kernels` applied to q, k and v, whatever their device."""
    item = problem.dtype.itemsize
    return (
        _aligned_for_fused_kernels(q, item, problem.head_dim),
        _aligned_for_fused_kernels(k, item, problem.head_dim),
        _aligned_for_fused_kernels(v, item, problem.value_dim),
    )


def _layout_memo():
    """The fused-kernel layout rule for the calls of one problem, as a function
    ``(q, k, v, problem) -> (q, k, v)`` that remembers the strides it last passed untouched. The
    rule reads only the data pointers' 16-byte alignment and the strides (the shapes are the
    problem's), so operands with those strides and aligned pointers pass as they are without the
    rule's arithmetic on each (~0.5 us less per call, measured on CPU tensors); any other call
    runs the rule. A closure, not an object with ``__call__``: calling one is cheaper."""
    passed = [None]  # the strides of q, k, v the rule last passed untouched

    def laid_out(q, k, v, problem: AttentionProblem):
        strides = (q.stride(), k.stride(), v.stride())
        if strides == passed[0] and not (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16:
            return q, k, v
        result = _fused_layout(q, k, v, problem)
        if result[0] is q and result[1] is k and result[2] is v:
            passed[0] = strides
        return result

    return laid_out


def _packed(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` with the row-major strides of its shape, size-1 dimensions included
    (``x.contiguous()`` returns ``x`` itself when only size-1 dimensions have odd strides)."""
    return torch.empty_like(x, memory_format=torch.contiguous_format).copy_(x)


#: The choice of kernels SDPA is given for the calls cuDNN gets wrong (module docstring): every
#: kernel but cuDNN. A label beside the backend names in :data:`_KERNELS`.
_WITHOUT_CUDNN = "sdpa without cuDNN"

#: What each choice lets SDPA pick from: an attnkit backend name (one forced kernel, or None:
#: PyTorch chooses), or :data:`_WITHOUT_CUDNN`. Calls name their choice by its label, never by
#: its kernels: an SDPBackend comparison or hash is a pybind call (~0.3 us each, CPU).
_KERNELS: dict[str, tuple[SDPBackend, ...] | None] = {
    **{name: None if backend is None else (backend,) for name, backend in SDPA_BACKENDS.items()},
    _WITHOUT_CUDNN: tuple(
        kernel
        for kernel in SDPBackend.__members__.values()
        if kernel not in (SDPBackend.CUDNN_ATTENTION, SDPBackend.ERROR)
    ),
}


def _kernel_forcers():
    """For each restricted choice of :data:`_KERNELS`, a function ``forced(call, *args)`` that
    returns ``call(*args)`` with SDPA's enable-flags set to exactly the choice's kernels, each
    flag put back as it was afterwards, whatever happens. None if the private names moved, or
    are not the five flags of torch 2.11 and 2.13 (then ``sdpa_kernel`` is used).

    Why: ``torch.nn.attention.sdpa_kernel`` costs ~17 us per call on CPU (torch 2.13; a generator
    and list work per call, and ``SDPBackend`` comparisons); a loop over prebuilt (getter,
    setter) pairs ~0.55 us, and on the H100 host its 15 flag calls and loops cost a forced flash
    call +7.7 us with gradients (docs/evidence/h100-2026-11-24/session19). Written out over
    the five flags, with nothing built per call, the same calls take ~0.3 us on CPU."""
    names = getattr(torch.nn.attention, "_backend_names", None)
    try:
        getters = tuple(getattr(torch._C, f"_get_{flag}_sdp_enabled") for flag in names)
        setters = tuple(getattr(torch._C, f"_set_sdp_use_{flag}") for flag in names)
        members = tuple(getattr(SDPBackend, member) for member in names.values())
    except (AttributeError, TypeError):
        return None
    if len(members) != 5:
        return None
    (get0, get1, get2, get3, get4), (set0, set1, set2, set3, set4) = getters, setters

    def forcer(kernels: tuple[SDPBackend, ...]):
        on0, on1, on2, on3, on4 = (member in kernels for member in members)

        def forced(call, *args):
            was0, was1, was2, was3, was4 = get0(), get1(), get2(), get3(), get4()
            try:
                set0(on0)
                set1(on1)
                set2(on2)
                set3(on3)
                set4(on4)
                return call(*args)
            finally:
                set0(was0)
                set1(was1)
                set2(was2)
                set3(was3)
                set4(was4)

        return forced

    return {choice: forcer(kernels) for choice, kernels in _KERNELS.items() if kernels is not None}


_FORCERS = _kernel_forcers()


def _sdpa(choice, q, k, v, scale, is_causal, mask=None):
    """SDPA restricted to the kernels of ``choice`` (a key of :data:`_KERNELS`), or PyTorch's full
    choice; the enable-flags are restored afterwards, whatever happens."""
    kernels = _KERNELS[choice]
    if kernels is None:
        return _scaled_dot_product(q, k, v, scale, is_causal, mask)
    if _FORCERS is None or torch.compiler.is_compiling():  # dynamo traces sdpa_kernel, not the flags
        with sdpa_kernel(list(kernels)):
            return _scaled_dot_product(q, k, v, scale, is_causal, mask)
    return _FORCERS[choice](_scaled_dot_product, q, k, v, scale, is_causal, mask)


def _scaled_dot_product(q, k, v, scale, is_causal, mask):
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True
    )


#: Signatures (backend, problem, is_causal, choice) SDPA has already run: their calls skip
#: recording warnings (~5 us). A new signature runs once under ``catch_warnings``, so a kernel that
#: declines it explains why in attnkit's error and prints no stray warnings. Bounded.
_ACCEPTED: set[tuple] = set()


def _declined(name, problem, err, caught) -> UnsupportedProblemError:
    reasons = "; ".join(str(w.message).strip() for w in caught) or str(err)
    return UnsupportedProblemError(
        f"backend {name!r} cannot run {problem.describe()} on {problem.device}: {reasons}"
    )


def _cudnn_gets_mask(problem: AttentionProblem) -> bool:
    """Whether :func:`sdpa_attention` hands cuDNN an attention mask for ``problem``: a window, or
    bottom-right causal with 1 < N < M where the mask-free split does not run (M = N + 1, or a
    traced call: :func:`attnkit.sdpa_lower_right.cudnn_runs_split`)."""
    if problem.has_window:
        return True
    n_below_m = problem.causal and problem.causal_offset > 0 and problem.q_len > 1
    return n_below_m and not lower_right.cudnn_runs_split(problem)


def _float16_backward_on_cuda(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem
) -> bool:
    """Whether this call is float16 on CUDA and will need a backward: with a mask, the calls
    cuDNN gets wrong (module docstring)."""
    return (
        problem.dtype == torch.float16
        and q.is_cuda
        and torch.is_grad_enabled()
        and (q.requires_grad or k.requires_grad or v.requires_grad)
    )


def _call_sdpa(name, q, k, v, problem, is_causal, mask=None):
    choice = name
    if _KERNELS[name] is None and mask is not None and _float16_backward_on_cuda(q, k, v, problem):
        choice = _WITHOUT_CUDNN
    if torch.compiler.is_compiling():  # a traced graph has no warnings to record
        return _sdpa(choice, q, k, v, problem.scale, is_causal, mask)
    if name not in _ANY_LAYOUT:
        q, k, v = _for_fused_kernels(q, k, v, problem)
    # The mask, if any, follows from the problem (its window), so it needs no place in the key.
    key = (name, problem, is_causal, choice)
    if key in _ACCEPTED:
        try:
            return _sdpa(choice, q, k, v, problem.scale, is_causal, mask)
        except RuntimeError as err:  # the same shapes in another layout: gather the reasons
            caught = lower_right.warnings_of(lambda: _sdpa(choice, q, k, v, problem.scale, is_causal, mask))
            raise _declined(name, problem, err, caught) from err
    # PyTorch gives its reasons for declining only as warnings.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = _sdpa(choice, q, k, v, problem.scale, is_causal, mask)
        except RuntimeError as err:
            raise _declined(name, problem, err, caught) from err
    if len(_ACCEPTED) >= 4096:
        _ACCEPTED.clear()
    _ACCEPTED.add(key)
    return out


def _scale_argument(problem: AttentionProblem) -> float | None:
    """The scale a prepared run hands SDPA: None where it is SDPA's own default, 1 / sqrt(D)
    (which PyTorch computes in double from the same D: the same number), else the problem's.
    Passing the default explicitly cost host time on the CPU (torch 2.13, B1 H1 N8 D16 bf16):
    ~0.3 us per forward, ~3.5 us per math forward and backward. Decided once per problem
    (:func:`sdpa_prepare`); every other call, traced ones included, passes the problem's."""
    if problem.head_dim and problem.scale == 1.0 / math.sqrt(problem.head_dim):
        return None
    return problem.scale


def _kernel_op(name: str, problem: AttentionProblem):
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
    either: called as its op
    (``_scaled_dot_product_flash_attention``, with SDPA's explicit scale), its backward's CUDA
    graph capture failed with ``cudaErrorStreamCaptureInvalidated`` in two of three GPU test
    runs (H100, torch 2.11; ``test_cuda_graph_capture_and_replay``), which never happened
    through SDPA; the cause is not known (docs/evidence/h100-2026-11-24/session13)."""
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


def sdpa_prepare(name: str, problem: AttentionProblem):
    """The eager run of backend ``name`` for ``problem`` (validated and supported), which
    :func:`attnkit.attention` makes once per call signature and keeps.

    A plain problem (no window; not causal, or N == M, or one query; a scale no kernel needs
    translated) is one of :func:`sdpa_attention`'s first cases: one SDPA call on the operands as
    they are. Its run takes every decision that depends on the problem alone here, once: the
    flags to set, SDPA's arguments, whether the fused-kernel layout rule applies (CUDA), and the
    kernel's ATen op where one is called directly (:func:`_kernel_op`). Any other problem runs
    :func:`sdpa_attention`.

    The run's first call goes through :func:`_call_sdpa`, which records PyTorch's warnings: a
    kernel that declines the problem explains why in attnkit's error and prints nothing (SDPA
    gives its reasons only as warnings), and the call is not taken for accepted. After one that
    ran, each call does only what it must. Through SDPA (PyTorch's choice, or flash with its
    flags set) it calls SDPA, which checks every call itself; math calls its op, which takes
    any operands attnkit validated. The efficient and cuDNN ops skip the checks SDPA would make,
    and those read besides the operands whether gradients are needed and whether deterministic
    algorithms are on: the first call in each such state goes through :func:`_call_sdpa` too,
    later ones call the op. A kernel that declines a call after all (another layout, another
    state) raises, and SDPA is then asked again with its warnings recorded, for the reasons
    attnkit's error gives. On the H100 host every step a call skips counts: there attnkit's checks cost
    ~1.3 us of host time per call, the layout rule ~1.7-2.8 us, each measured with the SDPA call
    after it (docs/evidence/h100-2026-11-24/session18)."""
    forced = _KERNELS[name] is not None
    is_causal = _one_call_causal(problem)
    if (
        problem.has_window
        or problem.scale < _SMALLEST_KERNEL_SCALE
        or is_causal is None
        or (forced and _FORCERS is None)
    ):
        return partial(sdpa_attention, name)
    kernel_op = _kernel_op(name, problem) if forced else None
    scale = _scale_argument(problem)
    layout = _layout_memo() if problem.device.type == "cuda" and name not in _ANY_LAYOUT else None

    def declined(q, k, v, err: RuntimeError) -> UnsupportedProblemError:
        caught = lower_right.warnings_of(lambda: _sdpa(name, q, k, v, scale, is_causal))
        return _declined(name, problem, err, caught)

    if kernel_op is None or SDPA_BACKENDS[name] is SDPBackend.MATH:  # no per-call state check
        if kernel_op is not None:  # math's op: it takes no log-sum-exp flag
            call = partial(kernel_op, needs_grad=False, is_causal=is_causal, scale=scale)
        else:
            call = partial(F.scaled_dot_product_attention, **_plain_keywords(problem, is_causal, scale))
            if forced:
                call = partial(_FORCERS[name], call)
        checked = False

        def run(q, k, v, problem):
            nonlocal checked
            if not checked:
                out = _call_sdpa(name, q, k, v, problem, is_causal)
                checked = True
                return out
            if layout is not None:
                q, k, v = layout(q, k, v, problem)
            try:
                return call(q, k, v)
            except RuntimeError as err:
                raise declined(q, k, v, err) from err

        run.plain_sdpa_call = _plain_call(name, problem, is_causal, scale, layout is not None)
        return run

    accepted_states: set[int] = set()  # needs_grad + 2 * deterministic, as an int
    is_grad_enabled, deterministic = torch.is_grad_enabled, torch.are_deterministic_algorithms_enabled

    def run(q, k, v, problem):
        needs_grad = (q.requires_grad or k.requires_grad or v.requires_grad) and is_grad_enabled()
        state = needs_grad + 2 * deterministic()
        if state not in accepted_states:
            out = _call_sdpa(name, q, k, v, problem, is_causal)
            accepted_states.add(state)
            return out
        if layout is not None:
            q, k, v = layout(q, k, v, problem)
        try:
            return kernel_op(q, k, v, needs_grad, is_causal, scale)
        except RuntimeError as err:
            raise declined(q, k, v, err) from err

    run.plain_sdpa_call = _plain_call(name, problem, is_causal, scale, layout is not None)
    return run


#: The enable-flags :func:`_plain_call` names, in the order attnkit.fast_calls sets them.
_FLAG_ORDER = tuple(
    getattr(SDPBackend, member, None)
    for member in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION", "OVERRIDEABLE")
)


def _plain_call(name: str, problem: AttentionProblem, is_causal: bool, scale: float | None, layout: bool):
    """The SDPA call a prepared plain run makes once its first call ran, for the compiled memo
    (:mod:`attnkit.fast_calls`), which makes it without the run: ``(kernels, is_causal, scale,
    enable_gqa, layout)``. ``kernels``: None (PyTorch's choice) or whether each flag of
    :data:`_FLAG_ORDER` is on; ``layout``: None, or ``(item size, D, Dv)`` where the fused-kernel
    layout rule applies. SDPA itself, also for the kernels whose op the run calls directly: SDPA
    checks every call, so no state needs tracking. None where the memo cannot set the flags."""
    kernels = _KERNELS[name]
    if kernels is not None and None in _FLAG_ORDER:
        return None
    return (
        None if kernels is None else tuple(member in kernels for member in _FLAG_ORDER),
        is_causal,
        scale,
        problem.q_heads != problem.kv_heads,
        (problem.dtype.itemsize, problem.head_dim, problem.value_dim) if layout else None,
    )


def _one_call_causal(problem: AttentionProblem) -> bool | None:
    """SDPA's ``is_causal`` for the one call that runs ``problem``'s causal rule as it is, or
    None where the rule takes more (N > M, or 1 < N < M: :func:`sdpa_attention`). Not causal,
    or N == M: SDPA's own flag, its top-left diagonal being attnkit's bottom-right one there.
    One query against more keys under bottom-right causal sees every key: a non-causal call
    (a decode step). Windows are not looked at: they go in as masks."""
    if not problem.causal or problem.causal_offset == 0:
        return problem.causal
    if problem.causal_offset > 0 and problem.q_len == 1:
        return False
    return None


def _plain_keywords(problem: AttentionProblem, is_causal: bool, scale: float | None) -> dict:
    """The keyword arguments a plain problem's prepared calls give SDPA: only those that differ
    from SDPA's defaults. Each one is parsed on every call: with ``attn_mask=None``,
    ``scale=None`` and ``enable_gqa=True`` besides ``is_causal`` a call cost ~0.2 us more on the
    H100 host than with ``is_causal`` alone (docs/evidence/h100-2026-11-24/session19)."""
    keywords = {"is_causal": True} if is_causal else {}
    if scale is not None:
        keywords["scale"] = scale
    if problem.q_heads != problem.kv_heads:
        keywords["enable_gqa"] = True
    return keywords


def sdpa_attention(
    name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem
) -> torch.Tensor:
    """SDPA with attnkit's bottom-right causal convention; shapes as in :func:`attnkit.attention`."""
    if (
        SDPA_BACKENDS[name] is SDPBackend.CUDNN_ATTENTION  # `is`: no pybind comparison per call
        and _float16_backward_on_cuda(q, k, v, problem)
        and _cudnn_gets_mask(problem)
    ):
        raise UnsupportedProblemError(
            f"backend {name!r} does not support {problem.describe()} with gradients: cuDNN's "
            "backward with an attention mask (a window; causal 1 < N < M where M = N + 1 or "
            "traced) returned NaN dq in float16 (H100, torch 2.11); use bfloat16, sdpa-efficient, "
            "or no gradients"
        )
    if problem.scale < _SMALLEST_KERNEL_SCALE:  # else no kernel needs a translated scale
        q, k, problem = _kernel_scale(q, k, problem)
    if problem.has_window:
        return _masked_attention(name, q, k, v, problem)
    is_causal = _one_call_causal(problem)
    if is_causal is not None:
        return _call_sdpa(name, q, k, v, problem, is_causal)
    if problem.causal_offset > 0:  # 1 < N < M
        if not torch.compiler.is_compiling() and name not in _ANY_LAYOUT:
            q, k, v = _for_fused_kernels(q, k, v, problem)
        out = lower_right.native_bottom_right(name, SDPA_BACKENDS[name], q, k, v, problem)
        return _masked_attention(name, q, k, v, problem) if out is None else out
    # N > M: the last M rows are a square causal problem; the first N - M see no key and are zero.
    out = _call_sdpa(name, q[:, :, -problem.kv_len :], k, v, problem, True)
    hidden = out.new_zeros(problem.batch, problem.q_heads, -problem.causal_offset, problem.value_dim)
    return torch.cat([hidden, out], dim=2)


#: Half of float32's smallest subnormal, 2**-149: a magnitude at or below it rounds to 0.
_FLOAT32_ROUNDS_TO_ZERO = 2.0**-150
#: The smallest scale handed to a kernel for bf16 / fp32 inputs; smaller ones are shifted into q.
#: Its reciprocal (1.8e19) and its products with any finite score stay normal float32 numbers.
_SMALLEST_KERNEL_SCALE = 2.0**-64


def _kernel_scale(q, k, problem: AttentionProblem):
    """(q, k, problem) with a scale every kernel computes exactly: negative, zero-rounding and
    tiny scales translated (module docstring). Only scales below _SMALLEST_KERNEL_SCALE change."""
    if problem.scale < 0:
        k, problem = -k, dataclasses.replace(problem, scale=-problem.scale)
    if _zero_scale(problem.scale, problem.dtype):
        q, problem = q * 0.0, dataclasses.replace(problem, scale=1.0)
    elif problem.scale < _SMALLEST_KERNEL_SCALE and problem.dtype in (torch.bfloat16, torch.float32):
        # |s| = m 2^e with m in [0.5, 1): s 2^shift lands in [2^-65, 2^-64).
        shift = -64 - math.frexp(problem.scale)[1]
        q, problem = q * 2.0**-shift, dataclasses.replace(problem, scale=problem.scale * 2.0**shift)
    return q, k, problem


def _zero_scale(scale: float, dtype: torch.dtype) -> bool:
    """Whether ``scale`` (>= 0) is run as 0: it rounds to 0 in the dtype the scores are computed
    in (float64 for float64 inputs: a Python float is already one; float32 otherwise), or, for
    fp16, is below float32's smallest normal (module docstring)."""
    if dtype == torch.float64:
        return scale == 0.0
    if dtype == torch.float16:
        return scale < torch.finfo(torch.float32).tiny
    return scale <= _FLOAT32_ROUNDS_TO_ZERO


def _masked_attention(name, q, k, v, problem: AttentionProblem) -> torch.Tensor:
    """The problem's visibility matrix (window and bottom-right causal) as a boolean mask; shapes
    as in :func:`attnkit.attention`. Only rows that see a key go to SDPA (module docstring): row i
    sees none iff ``i + upper < 0``, and the last row always sees one when M >= 1."""
    upper = problem.key_band[1]
    hidden = 0 if upper is None else min(problem.q_len, max(0, -upper))
    mask = visibility(problem, q.device)[hidden:]
    out = _call_sdpa(name, q[:, :, hidden:], k, v, problem, False, mask)
    if not hidden:
        return out
    zeros = out.new_zeros(problem.batch, problem.q_heads, hidden, problem.value_dim)
    return torch.cat([zeros, out], dim=2)
