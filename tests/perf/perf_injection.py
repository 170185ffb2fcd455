"""Test-only fault injection for verifying the gate on a GPU: it wraps a provider's runner, so
the library's hot path is untouched.

``ATTNKIT_PERF_INJECT`` = ``slow:<backend>:<fraction>`` (e.g. ``slow:sdpa-flash:0.10``: an extra
bf16 matmul sized to take that fraction of the case's own time runs inside every call) or
``memory:<backend>:<MiB>`` (every call also holds an extra buffer of that size at its peak).
"""

from __future__ import annotations

import os
import statistics

import torch

from attnkit_perf.measure.cases import BenchCase
from attnkit_perf.measure.timing import measure_samples

ENV = "ATTNKIT_PERF_INJECT"


def parse(spec: str | None) -> tuple[str, str, float] | None:
    if not spec:
        return None
    kind, backend, amount = spec.split(":")
    if kind not in ("slow", "memory"):
        raise ValueError(f"{ENV}: kind must be slow or memory, got {kind!r}")
    return kind, backend, float(amount)


def _median_s(fn, device) -> float:
    return statistics.median(measure_samples(fn, device, 5, reps=5))


def _busy_matmul(target_s: float, device: torch.device):
    """A square bf16 matmul whose median time is close to ``target_s`` (sized in two steps:
    guess from a reference size's rate, then correct once by the cube root of the miss)."""
    size = 1024
    for _ in range(3):
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        measured = _median_s(lambda a=a: a @ a, device)
        size = max(64, round(size * (target_s / measured) ** (1 / 3) / 64) * 64)
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(a)  # preallocated: the slowdown must not also grow peak memory
    return lambda: torch.matmul(a, a, out=out)


def wrapper_from_env():
    """A ``wrap(case, runner)`` for CaseMeasurer, or None when nothing is injected."""
    parsed = parse(os.environ.get(ENV))
    if parsed is None:
        return None
    kind, backend, amount = parsed

    def wrap(case: BenchCase, runner):
        if case.backend != backend:
            return runner
        device = torch.device("cuda")
        if kind == "memory":
            extra_bytes = int(amount * 1024 * 1024)

            def with_memory():
                hold = torch.empty(extra_bytes, dtype=torch.uint8, device=device)
                result = runner()
                del hold
                return result

            return with_memory
        runner()  # compile / autotune before timing it
        extra = _busy_matmul(amount * _median_s(runner, device), device)

        def with_slowdown():
            result = runner()
            extra()
            return result

        return with_slowdown

    return wrap
