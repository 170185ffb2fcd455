"""The GPU perf grid (cases.gpu_suite_cases) and the CPU smoke grid.

Benchmark names read ``test_fwd[sdpa-flash-bf16-B4-H16-N4096-D128-causal]``; groups put the
backends of one shape side by side. ``--attnkit-base=REF`` compares with a base commit on this
GPU (paired mode), ``--benchmark-compare`` with this GPU model's stored baseline
(docs/PERF_GATE.md). The injection fixture (perf_injection) applies to stored mode only.
"""

from __future__ import annotations

import pytest
from perf_injection import wrapper_from_env
from perf_params import CASES, cpu_params, gpu_params


@pytest.fixture(scope="module")
def runner_wrapper():
    """Identity unless ATTNKIT_PERF_INJECT asks for a test-only slowdown or memory growth."""
    return wrapper_from_env() or (lambda case, runner: runner)


@pytest.mark.parametrize("case", gpu_params("fwd"))
def test_fwd(benchmark, attnkit_perf, runner_wrapper, request, case):
    attnkit_perf(benchmark, CASES[case], runner_wrapper, request.node)


@pytest.mark.parametrize("case", gpu_params("bwd"))
def test_bwd(benchmark, attnkit_perf, runner_wrapper, request, case):
    attnkit_perf(benchmark, CASES[case], runner_wrapper, request.node)


@pytest.mark.parametrize("case", gpu_params("fwd+bwd"))
def test_fwd_bwd(benchmark, attnkit_perf, runner_wrapper, request, case):
    attnkit_perf(benchmark, CASES[case], runner_wrapper, request.node)


@pytest.mark.parametrize("case", cpu_params())
def test_cpu_smoke(benchmark, attnkit_perf, runner_wrapper, request, case):
    attnkit_perf(benchmark, CASES[case], runner_wrapper, request.node)
