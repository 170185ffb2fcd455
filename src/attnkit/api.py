"""The public entry point: ``attention(q, k, v, ...)`` over every registered path."""

from __future__ import annotations

from functools import partial

import torch

from attnkit import fastpath
from attnkit.auto import auto_order, deterministic_order
from attnkit.errors import BackendUnavailableError, UnsupportedProblemError
from attnkit.inputs import AttentionProblem, check_inputs, records_backward
from attnkit.prepared import PreparedRun
from attnkit.reference import degenerate_attention
from attnkit.registry import Backend, auto_skip_reason, get_backend, on_backends_changed, unavailable_reason

#: Module-level names for what every call reads: a global lookup each instead of a global and
#: an attribute (dynamo knows ``is_compiling`` by its identity, whatever it is called here).
_is_compiling = torch.compiler.is_compiling
_Tensor = torch.Tensor
#: The compiled memo in front of the Python one (:mod:`attnkit.fastpath`), or None.
_compiled_memo = fastpath.memo


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int, int] | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Scaled dot-product attention, ``softmax(scale * q @ k^T) @ v``, with autograd.

    Args:
        q: (B, Hq, N, D) queries.
        k: (B, Hkv, M, D) keys; ``Hq % Hkv == 0`` (GQA; ``Hkv == 1`` is MQA).
        v: (B, Hkv, M, Dv) values.
        causal: mask keys after the query, aligned bottom-right: query i sees key j iff
            ``j <= i + M - N``. A row that sees no key outputs zeros and gets zero gradient.
        scale: multiplies the scores; default ``1 / sqrt(D)``. Any finite real, 0 included, whose
            scores fit float32 (float64 for float64 inputs); see docs/API.md, "Input rules".
        window: sliding (local) attention, ``(left, right)`` with -1 for an unbounded side;
            None (default): no window. Query i sees key j only if
            ``i + (M - N) - left <= j <= i + (M - N) + right`` (and, with causal, also
            ``j <= i + M - N``). A row that sees no key outputs zeros with zero gradient.
        backend: ``"auto"`` or a name from :func:`attnkit.available_backends`.

    Returns:
        (B, Hq, N, Dv) tensor with q's dtype and device. Any strides are accepted.

    Raises:
        TypeError / ValueError: bad arguments, raised before any compute.
        BackendUnavailableError (a ValueError): the backend cannot run on this device/build.
        UnsupportedProblemError (a NotImplementedError): the backend cannot take these inputs.
    """
    if _is_compiling():  # traced once: the plain checks, no host-side caches
        problem = check_inputs(q, k, v, causal, scale, window)
        return _plan(backend, problem)(q, k, v, problem)
    if _compiled_memo is not None:  # attnkit.fastpath: None where it keeps no entry
        out = _compiled_memo.call(q, k, v, causal, scale, window, backend)
        if out is not None:
            return out
    # The memo key: everything check_inputs and _plan read. Only tensors, a bool causal, a
    # None/float scale, a None/(int, int) tuple window and a str backend are looked up; anything
    # else goes straight to the checks, which raise the right error (``(True, 1)`` equals
    # ``(1, 1)`` as a key, so a window is looked up only when both sides are exactly ints).
    # Written out here rather than in a helper: the call alone was ~10% of the memo's cost. The
    # compiled memo's key (make_key in attnkit/fastpath/csrc) has these conditions too, but for
    # exact tensors only (a subclass's __torch_function__ must see its calls); a parity test
    # runs both over one table. The layouts are in the key: a sparse tensor of a dense call's
    # shape must reach the checks, and a strided nested tensor has no shape to read at all.
    if (
        isinstance(q, _Tensor)
        and isinstance(k, _Tensor)
        and isinstance(v, _Tensor)
        and type(causal) is bool
        # |scale| > 1 is checked against the data (overflowing scores), so never memoised.
        and (scale is None or (type(scale) is float and abs(scale) <= 1.0))
        and (window is None or _exact_int_pair(window))
        and type(backend) is str
    ):
        try:
            key = (
                q.shape,
                k.shape,
                v.shape,
                q.layout,
                k.layout,
                v.layout,
                q.dtype,
                k.dtype,
                v.dtype,
                q.device,
                k.device,
                v.device,
                causal,
                scale,
                window,
                backend,
            )
        except RuntimeError:  # a strided nested tensor's shape: check_inputs names it
            key = planned = None
        else:
            planned = _PLANNED.get(key)
    else:
        key = planned = None
    if planned is None:
        problem = check_inputs(q, k, v, causal, scale, window)
        prepared = _plan(backend, problem, prepared=True)
        # The run itself beside its PreparedRun: each call makes one call, not two.
        planned = problem, prepared.run, prepared
        if key is not None:
            if len(_PLANNED) >= _CACHE_SIZE:
                _PLANNED.clear()
            _PLANNED[key] = planned
    problem, run, prepared = planned
    out = run(q, k, v, problem)
    if key is not None and _compiled_memo is not None:  # after a call ran: its checks are made
        _compiled_memo.remember(q, k, v, causal, scale, window, backend, problem, prepared)
    return out


#: Host-side memo of what depends only on a call's signature: the validated problem, and the
#: backend's run once its support checks passed, prepared for the problem
#: (:meth:`Backend.prepared_run`; for ``auto``, the candidates' checks made too), as
#: ``(problem, prepared.run, prepared)``. A call with a
#: known signature pays one tuple and one dict lookup (~1.5 us on CPU) instead of the checks and
#: the plan (~10 us). Bounded: cleared when full; it holds no tensors. Backend availability is
#: therefore decided once per signature.
_CACHE_SIZE = 4096
_PLANNED: dict[tuple, tuple[AttentionProblem, object, PreparedRun]] = {}


def _forget_plans() -> None:
    """Drop every memoised plan (both memos): a replaced or removed backend's runs must not
    outlive it, nor ``auto``'s plans the fallback order of before a backend declared a rank."""
    _PLANNED.clear()
    if _compiled_memo is not None:
        _compiled_memo.forget()


on_backends_changed(_forget_plans)


def _exact_int_pair(window) -> bool:
    """A pair of exact ints that each fit a 64-bit word: the compiled memo keys its sides as such
    words, and both memos keep the same calls (a wider window goes to the checks every time)."""
    return (
        type(window) is tuple
        and len(window) == 2
        and type(window[0]) is int
        and type(window[1]) is int
        and _INT64_MIN <= window[0] <= _INT64_MAX
        and _INT64_MIN <= window[1] <= _INT64_MAX
    )


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@torch.compiler.assume_constant_result
def _device_reason(backend: str, device: torch.device) -> str | None:
    """Why ``backend`` cannot run on ``device``. A constant to torch.compile: the answer reads
    the environment and the CUDA/cuDNN builds, which the compiler cannot trace."""
    return get_backend(backend).device_support(device)


def choose_backend(backend: str, problem: AttentionProblem) -> str:
    """The one backend that runs ``problem`` (an inference call), checked before any compute:
    ``backend`` itself when it is available on the problem's device and accepts the problem, else
    :class:`~attnkit.BackendUnavailableError` / :class:`~attnkit.UnsupportedProblemError`; for
    ``"auto"``, the first path of the inference order that ``attention`` tries
    (:func:`attnkit.auto.auto_order`: the measured table of this GPU model, then the declared
    fallback order, :func:`attnkit.auto.fallback_order`) whose checks pass, else
    UnsupportedProblemError with every path's reason. For callers that dispatch once and run one
    path: :func:`attnkit.attention_with_kvcache`."""
    if backend != "auto":
        _check_named(backend, problem)
        return backend
    runs = _auto_runs(problem, False, auto_order(problem, training=False))
    for name, run in runs.items():
        if not isinstance(run, str):
            return name
    raise _none_supports(problem, runs.values())


def chosen_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int, int] | None = None,
    backend: str = "auto",
) -> str | None:
    """The backend that :func:`attention` with the same arguments runs now, named before anything
    runs, by the same checks (raising the same errors). A named ``backend`` is itself; for
    ``"auto"``, the first path whose checks pass in the order this call takes: the training
    order when grad mode is on and an input requires grad (only paths with a deterministic
    backward under ``torch.use_deterministic_algorithms``), else the inference order. None for a
    problem with a zero-size dimension, whose defined result no backend computes. A path that
    declines a problem only once it runs hands the call to the next one, which this cannot
    foresee."""
    problem = check_inputs(q, k, v, causal, scale, window)
    if backend == "auto":
        if problem.is_degenerate:
            return None
        return _run_by_grad(*_auto_orders(problem, prepared=False), q, k, v, problem, run=_first_runnable)
    checked = _check_named(backend, problem)
    if problem.is_degenerate:
        return None
    refusal = checked.gradient_refusal(q, k, v, problem)
    if refusal is not None:
        raise UnsupportedProblemError(refusal)
    return backend


def _check_named(backend: str, problem: AttentionProblem) -> Backend:
    """The backend named ``backend``, once it is shown able to run ``problem``; else raise why not."""
    chosen = get_backend(backend)
    reason = _device_reason(backend, problem.device)
    if reason is not None:
        raise BackendUnavailableError(f"backend {backend!r} is unavailable: {reason}")
    reason = chosen.supports(problem)
    if reason is not None:
        raise UnsupportedProblemError(f"backend {backend!r} does not support {problem.describe()}: {reason}")
    return chosen


def _plan(backend: str, problem: AttentionProblem, prepared: bool = False):
    """The function that runs ``problem`` on ``backend``, or the error saying why it cannot;
    ``prepared``: the eager run made for this problem, a :class:`PreparedRun` (memoised), else
    the plain one (traced)."""
    if backend == "auto":
        if problem.is_degenerate:
            return PreparedRun(degenerate_attention) if prepared else degenerate_attention
        orders = _auto_orders(problem, prepared)
        # One order for every call (no path skipped under any mode): no per-call checks.
        run = partial(_run_first, orders[0]) if len(set(orders)) == 1 else partial(_run_by_grad, *orders)
        return PreparedRun(run) if prepared else run
    chosen = _check_named(backend, problem)
    if problem.is_degenerate:  # a zero-size dimension: one answer for every path (README)
        return PreparedRun(degenerate_attention) if prepared else degenerate_attention
    return chosen.prepared_run(problem) if prepared else chosen.call


def _auto_orders(problem: AttentionProblem, prepared: bool) -> tuple[tuple, tuple, tuple, tuple]:
    """``auto``'s candidates for ``problem`` (:func:`_auto_candidates`), for each kind of call that
    :func:`_run_by_grad` tells apart: inference, training, and training under
    ``torch.use_deterministic_algorithms(True)`` and under its ``warn_only=True``."""
    inference, training = auto_order(problem, training=False), auto_order(problem, training=True)
    runs = _auto_runs(problem, prepared, inference)
    runs.update(_auto_runs(problem, prepared, (n for n in training if n not in runs)))
    # A training call passes over the paths that compute no gradients on this device.
    trains = {
        name: f"{name}: forward-only on the {problem.device.type}"
        if not isinstance(run, str) and get_backend(name).is_forward_only(problem.device)
        else run
        for name, run in runs.items()
    }
    return (
        _auto_candidates(inference, runs),
        _auto_candidates(training, trains),
        _deterministic_candidates(training, trains, problem.device, warn_only=False),
        _deterministic_candidates(training, trains, problem.device, warn_only=True),
    )


def _auto_runs(problem: AttentionProblem, prepared: bool, names) -> dict:
    """For each of ``names``: ``name -> run`` when its checks pass, ``name -> "name: reason"``
    when it is skipped (checks that depend only on the problem and the device, so made once per
    memoised signature); names not registered in this build (e.g. no triton) are left out."""
    runs = {}
    for name in names:
        try:
            candidate = get_backend(name)
        except ValueError:
            continue
        reason = (
            auto_skip_reason(name, problem.device)
            or _device_reason(name, problem.device)
            or candidate.supports(problem)
        )
        if reason is None:
            runs[name] = candidate.prepared_run(problem).run if prepared else candidate.call
        else:
            runs[name] = f"{name}: {reason}"
    return runs


def _auto_candidates(order: tuple[str, ...], runs: dict) -> tuple:
    """``backend="auto"``'s paths in ``order``: ``(name, run)`` for one that may run,
    ``(rejection, None)`` for one that is skipped."""
    return tuple(
        (runs[name], None) if isinstance(runs[name], str) else (name, runs[name])
        for name in order
        if name in runs
    )


def _deterministic_candidates(
    order: tuple[str, ...], runs: dict, device: torch.device, warn_only: bool
) -> tuple:
    """:func:`_auto_candidates` of the training ``order`` under
    ``torch.use_deterministic_algorithms(True, warn_only=warn_only)``: a path whose backward is
    not then deterministic on ``device`` (:func:`attnkit.auto.deterministic_order`) is skipped,
    with that reason."""
    kept = set(deterministic_order(order, warn_only, device))
    mode = "True, warn_only=True" if warn_only else "True"
    reason = (
        f"its backward is not deterministic on {device.type} under torch.use_deterministic_algorithms({mode})"
    )
    marked = {name: run if name in kept else f"{name}: {reason}" for name, run in runs.items()}
    return _auto_candidates(order, marked)


def _run_first(candidates: tuple, q, k, v, problem):
    """The result of the first of :func:`_auto_candidates` that runs ``problem``; if none does,
    the error listing every path's reason, in order."""
    rejections = []
    for name, run in candidates:
        if run is None:
            rejections.append(name)
            continue
        try:
            return run(q, k, v, problem)
        except UnsupportedProblemError as err:
            rejections.append(f"{name}: {err}")
    raise _none_supports(problem, rejections)


def _first_runnable(candidates: tuple, q, k, v, problem) -> str:
    """The name of the first of :func:`_auto_candidates` whose checks passed (the path
    :func:`_run_first` tries first); if none did, the error it raises."""
    for name, run in candidates:
        if run is not None:
            return name
    raise _none_supports(problem, [name for name, _ in candidates])


def _none_supports(problem: AttentionProblem, rejections) -> UnsupportedProblemError:
    """``auto``'s error when no path takes ``problem``: every path's reason, in order."""
    return UnsupportedProblemError(f"no backend supports {problem.describe()}: " + " | ".join(rejections))


def _run_by_grad(
    inference: tuple, training: tuple, strict: tuple, warn_only: tuple, q, k, v, problem, run=_run_first
):
    """``auto``'s run: a call that records a backward runs the training order (chosen by
    forward and backward time together), kept to paths with a deterministic backward while
    ``torch.use_deterministic_algorithms`` is on (``strict``, or ``warn_only`` in that mode);
    any other call runs the inference order. ``run``: what is done with that order
    (:func:`_run_first`; :func:`chosen_backend` names its first path instead)."""
    if not records_backward(q, k, v):
        return run(inference, q, k, v, problem)
    if torch.are_deterministic_algorithms_enabled():
        training = warn_only if torch.is_deterministic_algorithms_warn_only_enabled() else strict
    return run(training, q, k, v, problem)


__all__ = [
    "BackendUnavailableError",
    "UnsupportedProblemError",
    "attention",
    "chosen_backend",
    "unavailable_reason",
]
