"""The perf grid: the GPU grid's forwards, backwards and training steps, and the CPU smoke grid.

Benchmark names read ``test_fwd[sdpa-flash-bf16-B4-H16-N4096-D128-causal]``; groups put the
backends of one shape side by side. ``--attnkit-base=REF`` compares with a base commit on this
GPU (paired mode), ``--benchmark-compare`` with this GPU model's stored baseline
(docs/PERF_GATE.md). Which backends: :mod:`attnkit_perf.run.backend_choice`.
"""

from __future__ import annotations

import pytest

from attnkit_perf.suite.params import CASES, cpu_params, gpu_params

#: The grid each test times: a pass of the GPU grid, or the CPU smoke grid (None).
_GRIDS = {"test_fwd": "fwd", "test_bwd": "bwd", "test_fwd_bwd": "fwd+bwd", "test_cpu_smoke": None}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    name = metafunc.function.__name__
    if "case" not in metafunc.fixturenames or name not in _GRIDS:
        return
    pass_name = _GRIDS[name]
    params = cpu_params(metafunc.config) if pass_name is None else gpu_params(metafunc.config, pass_name)
    metafunc.parametrize("case", params)


@pytest.fixture(scope="module")
def runner_wrapper():
    """How each case's runner is wrapped before it is timed: as it is (a test module may define
    its own, e.g. to inject a slowdown)."""
    return lambda case, runner: runner


def test_fwd(benchmark, attnkit_perf, runner_wrapper, request, case):
    attnkit_perf(benchmark, CASES[case], runner_wrapper, request.node)


def test_bwd(benchmark, attnkit_perf, runner_wrapper, request, case):
    attnkit_perf(benchmark, CASES[case], runner_wrapper, request.node)


def test_fwd_bwd(benchmark, attnkit_perf, runner_wrapper, request, case):
    attnkit_perf(benchmark, CASES[case], runner_wrapper, request.node)


def test_cpu_smoke(benchmark, attnkit_perf, runner_wrapper, request, case):
    attnkit_perf(benchmark, CASES[case], runner_wrapper, request.node)
