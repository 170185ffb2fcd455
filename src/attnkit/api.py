"""The public entry point: ``attention(q, k, v, ...)`` over every registered path."""

from __future__ import annotations

import torch

from attnkit.errors import BackendUnavailableError, UnsupportedProblemError
from attnkit.inputs import check_inputs
from attnkit.reference import degenerate_attention
from attnkit.registry import auto_skip_reason, get_backend, unavailable_reason

#: Order in which ``backend="auto"`` tries paths: fastest first, as measured on the H100
#: (docs/PERFORMANCE.md); a path is skipped when it is unavailable or rejects the inputs.
AUTO_ORDER = ("triton", "sdpa", "tiled", "naive")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
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
            scores fit float32 (float64 for float64 inputs); see README "Input rules".
        backend: ``"auto"`` or a name from :func:`attnkit.available_backends`.

    Returns:
        (B, Hq, N, Dv) tensor with q's dtype and device. Any strides are accepted.

    Raises:
        TypeError / ValueError: bad arguments, raised before any compute.
        BackendUnavailableError (a ValueError): the backend cannot run on this device/build.
        UnsupportedProblemError (a NotImplementedError): the backend cannot take these inputs.
    """
    problem = check_inputs(q, k, v, causal, scale)
    if backend == "auto":
        return (
            degenerate_attention(q, k, v, problem) if problem.is_degenerate else _run_auto(q, k, v, problem)
        )
    chosen = get_backend(backend)
    reason = chosen.device_support(problem.device)
    if reason is not None:
        raise BackendUnavailableError(f"backend {backend!r} is unavailable: {reason}")
    reason = chosen.problem_support(problem)
    if reason is not None:
        raise UnsupportedProblemError(f"backend {backend!r} does not support {problem.describe()}: {reason}")
    if problem.is_degenerate:  # a zero-size dimension: one answer for every path (README)
        return degenerate_attention(q, k, v, problem)
    return chosen.run(q, k, v, problem)


def _run_auto(q, k, v, problem):
    rejections = []
    for name in AUTO_ORDER:
        try:
            candidate = get_backend(name)
        except ValueError:
            continue  # not registered in this build (e.g. no triton installed)
        reason = (
            auto_skip_reason(name, problem.device)
            or candidate.device_support(problem.device)
            or candidate.problem_support(problem)
        )
        if reason is None:
            try:
                return candidate.run(q, k, v, problem)
            except UnsupportedProblemError as err:
                reason = str(err)
        rejections.append(f"{name}: {reason}")
    raise UnsupportedProblemError(f"no backend supports {problem.describe()}: " + " | ".join(rejections))


__all__ = [
    "AUTO_ORDER",
    "BackendUnavailableError",
    "UnsupportedProblemError",
    "attention",
    "unavailable_reason",
]
