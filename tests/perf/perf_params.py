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


def gpu_params(pass_name: str) -> list:
    """The GPU grid of one pass; every case is listed, the unrunnable ones skipped with why."""
    params = []
    no_gpu = _no_gpu_reason()
    for case in gpu_suite_cases():
        if case.pass_name != pass_name:
            continue
        reason = no_gpu or _backend_skip(case.backend)
        marks = [pytest.mark.benchmark(timer=gpu_time_clock, group=case.group)]
        if reason:
            marks.append(pytest.mark.skip(reason=reason))
        params.append(pytest.param(case.name, marks=marks, id=f"{case.backend}-{case.shape_label}"))
    return params


def cpu_params() -> list:
    params = []
    for case in cpu_suite_cases():
        reason = _backend_skip(case.backend)
        if DEVICE.type == "cuda":
            reason = "CPU smoke benchmarks run only where there is no GPU"
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(case.name, marks=marks, id=case.name))
    return params
