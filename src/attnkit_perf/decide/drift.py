"""Calibration drift: how much slower this machine runs fixed kernels than the baseline's did,
divided out of a stored comparison (:func:`attnkit_perf.decide.gate.decide_stored`).

The kernels are measured by :mod:`attnkit_perf.measure.calibration`: ``matmul_ms`` and
``copy_ms`` on the GPU, ``host_ms`` on the host. A GPU-bound benchmark is corrected by the GPU's
drift, a host-bound one by the host's. This run's host-boundness alone picks which: a baseline
time its host set is at least its GPU time, so a slowdown against it is a slowdown of the GPU
work. (On the H200 the host calibration read x0.77 between two runs minutes apart while the
benchmarks did not move; divided out of two GPU-bound benchmarks that the baseline had marked
host-bound, it turned ratios of 0.98 into "slower" at x1.27.)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

GPU_KEYS = ("matmul_ms", "copy_ms")
HOST_KEYS = ("host_ms",)


def drift_factor(baseline: Mapping | None, now: Mapping | None, keys: tuple[str, ...] = GPU_KEYS) -> float:
    """The geometric mean of ``now / baseline`` over ``keys`` that both measured; 1.0 if none."""
    if not baseline or not now:
        return 1.0
    ratios = [now[k] / baseline[k] for k in keys if baseline.get(k) and now.get(k)]
    if not ratios:
        return 1.0
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def run_calibration(run: Mapping) -> dict:
    """A run's calibration: per kernel, the median over its benchmarks' local calibrations."""
    per_key: dict[str, list[float]] = {}
    for bench in run.get("benchmarks", []):
        for key, value in ((bench.get("extra_info") or {}).get("calibration") or {}).items():
            per_key.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in per_key.items()}


def drift_for(base_calibration: Mapping | None, head_calibration: Mapping | None, host_bound: bool) -> float:
    """The drift to divide out of a benchmark this run measured as ``host_bound`` (or not)."""
    return drift_factor(base_calibration, head_calibration, HOST_KEYS if host_bound else GPU_KEYS)
