"""The perf grid (:mod:`attnkit_perf.suite.test_perf_grid`, installed with attnkit and run elsewhere as
``pytest --pyargs attnkit_perf.suite``) collected in this repository, with a fault-injection fixture
for verifying the gate on a GPU (perf_injection, stored mode only).

``--attnkit-base=REF`` compares with a base commit on this GPU (paired mode),
``--benchmark-compare`` with this GPU model's stored baseline (docs/PERF_GATE.md);
``--attnkit-backend NAME`` (repeatable) restricts the grid to those backends.
"""

from __future__ import annotations

import pytest
from perf_injection import wrapper_from_env

from attnkit_perf.suite.test_perf_grid import (  # noqa: F401
    pytest_generate_tests,
    test_bwd,
    test_cpu_smoke,
    test_fwd,
    test_fwd_bwd,
)


@pytest.fixture(scope="module")
def runner_wrapper():
    """Identity unless ATTNKIT_PERF_INJECT asks for a test-only slowdown or memory growth."""
    return wrapper_from_env() or (lambda case, runner: runner)
