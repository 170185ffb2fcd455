"""Calibration kernels: a fixed bf16 matmul (compute-bound) and a device copy (bandwidth-bound),
timed in the same session as the benchmarks.

Two cards of one model differ by a few percent in sustained clock and memory speed, and one
card drifts with temperature and power state. Those effects move every kernel together; the
gate divides them out by comparing the calibration medians of the baseline run and of the
current run (:func:`drift_factor`). What is specific to one kernel is left for the gate.
"""

from __future__ import annotations

import math
import statistics

import torch

from attnkit.bench.timing import L2Flusher, measure_samples

#: 4096^3 bf16: ~0.17 ms at the H100's ~800 TFLOP/s, long enough to be clock-limited, short
#: enough that 50 repetitions cost under 10 ms.
MATMUL_SIZE = 4096
#: 256 MiB read + 256 MiB written: ~0.18 ms at 3 TB/s, five times the L2.
COPY_BYTES = 256 * 1024 * 1024
ROUNDS = 5
REPS = 10


def measure_calibration(
    device: torch.device, rounds: int = ROUNDS, flusher: L2Flusher | None = None, reps: int = REPS
) -> dict:
    """Median milliseconds of each calibration kernel on ``device``: ``{"matmul_ms", "copy_ms"}``.

    Empty on the CPU: host timings there are not normalised.
    """
    if device.type != "cuda":
        return {}
    flusher = flusher or L2Flusher(device)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=torch.bfloat16, generator=gen)
    src = torch.randn(COPY_BYTES // 4, device=device, dtype=torch.float32, generator=gen)
    dst = torch.empty_like(src)
    result = {}
    for key, fn in (("matmul_ms", lambda: a @ b), ("copy_ms", lambda: dst.copy_(src))):
        measure_samples(fn, device, 1, flusher, 3)  # warm-up: cuBLAS handle and heuristics
        samples = measure_samples(fn, device, rounds, flusher, reps)
        result[key] = statistics.median(samples) * 1e3
    return result


def drift_factor(baseline: dict | None, now: dict | None) -> float:
    """How much slower this machine runs the calibration kernels than the baseline's did: the
    geometric mean of ``now / baseline`` over the kernels both measured; 1.0 if none."""
    if not baseline or not now:
        return 1.0
    ratios = [now[k] / baseline[k] for k in baseline if k in now and baseline[k] and now[k]]
    if not ratios:
        return 1.0
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))
