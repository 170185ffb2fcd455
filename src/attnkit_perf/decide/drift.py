"""Calibration drift: how much slower this machine runs fixed kernels than the baseline's did,
divided out of a stored comparison (:func:`attnkit_perf.decide.gate.decide_stored`).

The kernels are measured by :mod:`attnkit_perf.measure.calibration`: ``matmul_ms`` and
``copy_ms`` on the GPU, ``host_ms`` on the host, ``launch_ms`` (a CUDA graph replaying one tiny
kernel) for the GPU's fixed latencies. Each benchmark has a *drift kind* (:func:`drift_kind`):

* ``host``: this run measured it host-bound; corrected by the host's drift. This run's
  host-boundness alone picks it: a baseline time its host set is at least its GPU time, so a
  slowdown against it is a slowdown of the GPU work. (On the H200 the host calibration read
  x0.77 between two runs minutes apart while the benchmarks did not move; divided out of two
  GPU-bound benchmarks that the baseline had marked host-bound, it turned ratios of 0.98 into
  "slower" at x1.27.)
* ``latency``: GPU-bound, but so short that fixed latencies set its time: its baseline median
  is at most :data:`LATENCY_MULTIPLE` launch probes (:func:`latency_bound`). **Not divided.**
  The matmul measures tensor throughput at full occupancy, the copy bandwidth; a graph replay
  of ~9 us runs a few CTAs through launch, memory latency and one serial chain, which neither
  tracks: divided by their drift, an unchanged replay read x1.15 "slower" on two fresh H200s
  while paired mode on one of them read x0.998. The launch probe's own drift is reported with
  the row but not divided out either: a divisor adds its own noise, and that it tracks graph
  replays across machines is not shown. What the machines really differ by is measured by the
  pooled baseline's spread between recordings (:mod:`attnkit_perf.decide.pooled`), which
  raises the benchmark's threshold, and a stored "slower" is adjudicated by paired mode
  (:mod:`attnkit_perf.decide.adjudication`).
* ``gpu``: every other benchmark; corrected by the GPU kernels' drift.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

GPU_KEYS = ("matmul_ms", "copy_ms")
HOST_KEYS = ("host_ms",)
LATENCY_KEYS = ("launch_ms",)
KINDS = ("gpu", "host", "latency")
#: A GPU-bound benchmark whose median per call is at most this many launch probes is
#: latency-bound. A kernel that short runs a few waves at most, so its time is launch and memory
#: latency and a CTA's serial chain, not the throughput the matmul and copy measure. In the
#: committed baselines the grid's graph replays take 7.6-9.1 us and its next-shortest GPU-bound
#: benchmark (a decode step) 87-104 us: a multiple of 8 separates them for any probe from 1.2 to
#: 10.8 us (the verdict reports the probe's value with every latency-bound row).
LATENCY_MULTIPLE = 8.0


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


def latency_bound(median_s: float | None, launch_ms: float | None) -> bool:
    """Whether a call of ``median_s`` seconds is set by fixed latencies: at most
    :data:`LATENCY_MULTIPLE` launch probes of ``launch_ms``. Without a probe (the CPU, a
    baseline recorded before the probe existed and no probe in this run either) nothing is."""
    if not median_s or not launch_ms or not (math.isfinite(median_s) and math.isfinite(launch_ms)):
        return False
    return median_s * 1e3 <= LATENCY_MULTIPLE * launch_ms


def drift_kind(
    host_bound: bool, base_median_s: float | None, base_calibration: Mapping | None, head_calibration=None
) -> str:
    """``host``, ``latency`` or ``gpu`` (module docstring). Latency-boundness is read from the
    *baseline's* median, so a change cannot move its own benchmark between kinds, against the
    baseline's launch probe, or this run's where the baseline has none (the same GPU model)."""
    if host_bound:
        return "host"
    probe = (base_calibration or {}).get("launch_ms") or (head_calibration or {}).get("launch_ms")
    return "latency" if latency_bound(base_median_s, probe) else "gpu"


def drift_for(base_calibration: Mapping | None, head_calibration: Mapping | None, kind: str) -> float:
    """The drift to divide out of a benchmark of drift kind ``kind``: 1.0 for ``latency``."""
    if kind not in KINDS:
        raise ValueError(f"drift kind {kind!r} is not one of {KINDS}")
    if kind == "latency":
        return 1.0
    return drift_factor(base_calibration, head_calibration, HOST_KEYS if kind == "host" else GPU_KEYS)


def latency_drift(base_calibration: Mapping | None, head_calibration: Mapping | None) -> float | None:
    """The launch probe's drift, reported beside a latency-bound row and never divided out; None
    when a side has no probe (a baseline recorded before it existed)."""
    if not all((cal or {}).get(k) for cal in (base_calibration, head_calibration) for k in LATENCY_KEYS):
        return None
    return drift_factor(base_calibration, head_calibration, LATENCY_KEYS)
