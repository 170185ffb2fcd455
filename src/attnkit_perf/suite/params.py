"""The perf grid of a run as pytest parameters, with plain skip reasons for what cannot run here.

The cases come from the run's backends (:mod:`attnkit_perf.run.backend_choice`); tests are parametrised by
case name (pytest-benchmark stores params in its JSON, so they must be plain strings) and
:data:`CASES` maps the name back to its case.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attnkit
from attnkit.registry import get_backend
from attnkit_perf.bench import AUTO_BACKEND, BenchCase, gpu_suite_cases, gpu_time_clock
from attnkit_perf.plugin import SESSION
from attnkit_perf.run.session import PerfSession

#: Every case parametrised so far, by name.
CASES: dict[str, BenchCase] = {}


def _session(config: pytest.Config) -> PerfSession:
    session = config.stash.get(SESSION, None)
    if session is None:
        raise pytest.UsageError(
            "attnkit perf gate: the perf tests need pytest-benchmark (pip install 'attnkit[perf]')"
        )
    return session


def _no_gpu_reason(session: PerfSession) -> str | None:
    if session.device.type == "cuda":
        return None
    why = "no CUDA device (torch.cuda.is_available() is False)"
    if torch.cuda.is_available():
        why = f"ATTNKIT_TEST_DEVICE={session.device} selects no GPU"
    return f"GPU benchmarks skipped: {why}; the CPU smoke benchmarks and gate tests ran instead"


def _backend_skip(case: BenchCase, session: PerfSession, standard: frozenset[str]) -> str | None:
    """Why this checkout does not run ``case``: its backend is not registered or cannot run on
    the device; a backend outside the standard grid also declines here the shapes its
    ``supports`` refuses."""
    backend = case.backend
    if backend == AUTO_BACKEND:
        return None  # the dispatcher: some path it tries runs anywhere (naive does)
    if backend not in attnkit.backend_names():
        return f"backend {backend!r} is not registered in this build"
    reason = attnkit.unavailable_reason(backend, session.device)
    if reason:
        return f"{backend} unavailable on {session.device}: {reason}"
    if backend in standard:
        return None  # attnkit's own: a decline shows when the case is built, as it always did
    problem = dataclasses.replace(case.problem, device=session.device)
    reason = get_backend(backend).supports(problem)
    return f"backend {backend!r} declined {problem.describe()}: {reason}" if reason else None


def _skips(where: str | None, case: BenchCase, session: PerfSession, standard: frozenset[str]) -> list:
    """Skip marks: ``where`` the grid does not run here at all, else the backend's own reason,
    marked as declined by this checkout (paired mode then asks each side; stored mode reports a
    baseline benchmark declined here as dropped)."""
    if where:
        return [pytest.mark.skip(reason=where)]
    reason = _backend_skip(case, session, standard)
    return [pytest.mark.skip(reason=reason), pytest.mark.attnkit_declined(reason)] if reason else []


def gpu_params(config: pytest.Config, pass_name: str) -> list:
    """The run's GPU grid of one pass; every case is listed, the unrunnable ones skipped with why."""
    session = _session(config)
    standard = frozenset(c.backend for c in gpu_suite_cases())
    no_gpu = _no_gpu_reason(session)
    params = []
    for case in session.grid(gpu=True):
        if case.pass_name != pass_name:
            continue
        CASES[case.name] = case
        marks = [
            pytest.mark.benchmark(timer=gpu_time_clock, group=case.group),
            *_skips(no_gpu, case, session, standard),
        ]
        params.append(pytest.param(case.name, marks=marks, id=f"{case.backend}-{case.shape_label}"))
    return params


def cpu_params(config: pytest.Config) -> list:
    """The run's CPU smoke grid (skipped where there is a GPU)."""
    session = _session(config)
    standard = frozenset(c.backend for c in gpu_suite_cases())
    gpu = "CPU smoke benchmarks run only where there is no GPU" if session.device.type == "cuda" else None
    params = []
    for case in session.grid(gpu=False):
        CASES[case.name] = case
        params.append(pytest.param(case.name, marks=_skips(gpu, case, session, standard), id=case.name))
    return params
