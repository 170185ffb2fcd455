"""The backend registry: every path attnkit can dispatch to, and why one may be unavailable."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from attnkit.device import default_device
from attnkit.inputs import AttentionProblem
from attnkit.prepared import PreparedRun, RunFn
from attnkit.reference import naive_attention
from attnkit.sdpa import (
    SDPA_BACKENDS,
    sdpa_attention,
    sdpa_device_support,
    sdpa_prepare,
    sdpa_problem_support,
)
from attnkit.tiled import tiled_attention

DeviceCheck = Callable[[torch.device], "str | None"]
ProblemCheck = Callable[[AttentionProblem], "str | None"]
Prepare = Callable[[AttentionProblem], PreparedRun | RunFn]


def _always(_) -> None:
    return None


@dataclass(frozen=True)
class Backend:
    """One attention path.

    ``device_support`` and ``problem_support`` return None when the path can run, or a
    sentence saying why not; they are cheap and run before any kernel. ``prepare``, if given,
    returns the eager run for one problem that passed both, as a
    :class:`~attnkit.prepared.PreparedRun` (or a plain run function, which describes nothing),
    with the work that depends on the problem alone done up front: :func:`attnkit.attention`
    calls it once per call signature and keeps the result (``run`` is what torch.compile
    traces). The prepared run may describe itself for the compiled fast path
    (:mod:`attnkit.prepared`: one SDPA call, or a forward of fixed kernel launches).
    """

    name: str
    summary: str
    run: RunFn
    device_support: DeviceCheck = _always
    problem_support: ProblemCheck = _always
    prepare: Prepare | None = None

    def prepared_run(self, problem: AttentionProblem) -> PreparedRun:
        """The eager run for ``problem``: ``prepare(problem)``, or ``run`` without one."""
        if self.prepare is None:
            return PreparedRun(self.run)
        prepared = self.prepare(problem)
        return prepared if isinstance(prepared, PreparedRun) else PreparedRun(prepared)


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> None:
    _REGISTRY[backend.name] = backend


def backend_names() -> list[str]:
    return list(_REGISTRY)


def get_backend(name: str) -> Backend:
    if not isinstance(name, str) or name not in _REGISTRY:
        valid = ", ".join(repr(n) for n in ["auto", *_REGISTRY])
        raise ValueError(f"backend: expected one of {valid}, got {name!r}")
    return _REGISTRY[name]


def unavailable_reason(name: str, device: torch.device | str | None = None) -> str | None:
    """Why backend ``name`` cannot run on ``device`` (default: the current default device)."""
    device = default_device() if device is None else torch.device(device)
    return get_backend(name).device_support(device)


def auto_skip_reason(name: str, device: torch.device | str) -> str | None:
    """Why ``backend="auto"`` passes over ``name`` on ``device`` although it may run there, or
    None. Interpreted Triton (the CPU under ``TRITON_INTERPRET=1``) is ~1000x slower than any
    native path: it runs only when asked for by name."""
    if name == "triton" and torch.device(device).type == "cpu":
        return "on the CPU Triton runs interpreted; it runs only when requested by name"
    return None


def available_backends(device: torch.device | str | None = None) -> list[str]:
    """Names of the backends usable on ``device`` (default: CUDA if present, else CPU)."""
    return [name for name in _REGISTRY if unavailable_reason(name, device) is None]


register(Backend("naive", "materialised score matrix; float64-capable oracle", naive_attention))
register(Backend("tiled", "FlashAttention-2 in pure PyTorch (online softmax, O(N) memory)", tiled_attention))
for _name in SDPA_BACKENDS:
    register(
        Backend(
            _name,
            "torch SDPA" + (f", forced to {SDPA_BACKENDS[_name].name}" if SDPA_BACKENDS[_name] else ""),
            partial(sdpa_attention, _name),
            partial(sdpa_device_support, _name),
            partial(sdpa_problem_support, _name),
            partial(sdpa_prepare, _name),
        )
    )

try:
    from attnkit.triton import prepare, run_after_support_check, triton_device_support, triton_problem_support
except ImportError:  # no triton in this install: the backend is simply not registered
    pass
else:
    register(
        Backend(
            "triton",
            "fused Triton FlashAttention-2 kernels, deterministic backward",
            run_after_support_check,
            triton_device_support,
            triton_problem_support,
            prepare,
        )
    )
