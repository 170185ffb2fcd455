"""The perf grids as pytest parameters, with plain skip reasons for what cannot run here."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit_perf.measure.cases import cpu_suite_cases, gpu_suite_cases
from attnkit_perf.measure.timing import gpu_time_clock
from attnkit_perf.session import perf_device

DEVICE = perf_device()


def _no_gpu_reason() -> str | None:
    if DEVICE.type == "cuda":
        return None
    why = "no CUDA device (torch.cuda.is_available() is False)"
    if torch.cuda.is_available():
        why = f"ATTNKIT_TEST_DEVICE={DEVICE} selects no GPU"
    return f"GPU benchmarks skipped: {why}; the CPU smoke benchmarks and gate tests ran instead"


def _backend_skip(backend: str) -> str | None:
    if backend not in attnkit.backend_names():
        return f"backend {backend!r} is not registered in this build"
    reason = attnkit.unavailable_reason(backend, DEVICE)
    return f"{backend} unavailable on {DEVICE}: {reason}" if reason else None


#: Tests are parametrised by case name (pytest-benchmark stores params in its JSON, so they must
#: be plain strings); this maps the name back to its case.
CASES = {case.name: case for case in gpu_suite_cases() + cpu_suite_cases()}


def _skips(where: str | None, backend: str) -> list:
    """Skip marks: ``where`` the grid does not run here at all, else the backend's own reason,
    marked as declined by this checkout (paired mode then asks each side; stored mode reports a
    baseline benchmark declined here as dropped)."""
    if where:
        return [pytest.mark.skip(reason=where)]
    reason = _backend_skip(backend)
    return [pytest.mark.skip(reason=reason), pytest.mark.attnkit_declined(reason)] if reason else []


def gpu_params(pass_name: str) -> list:
    """The GPU grid of one pass; every case is listed, the unrunnable ones skipped with why."""
    params = []
    no_gpu = _no_gpu_reason()
    for case in gpu_suite_cases():
        if case.pass_name != pass_name:
            continue
        marks = [pytest.mark.benchmark(timer=gpu_time_clock, group=case.group), *_skips(no_gpu, case.backend)]
        params.append(pytest.param(case.name, marks=marks, id=f"{case.backend}-{case.shape_label}"))
    return params


def cpu_params() -> list:
    gpu = "CPU smoke benchmarks run only where there is no GPU" if DEVICE.type == "cuda" else None
    return [pytest.param(c.name, marks=_skips(gpu, c.backend), id=c.name) for c in cpu_suite_cases()]
