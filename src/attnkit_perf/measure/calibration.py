"""Calibration kernels, timed in the same session as the benchmarks, for stored mode.

Two cards of one model differ by a few percent in sustained clock and memory speed, and one
card drifts with temperature and power state; two hosts differ far more in how fast they run
Python and issue launches. The gate divides those effects out by comparing the calibration of
the baseline run with this run's (:func:`attnkit_perf.decide.drift.drift_factor`):

* ``matmul_ms`` (a fixed bf16 matmul, compute-bound) and ``copy_ms`` (a device copy,
  bandwidth-bound) for GPU-bound benchmarks;
* ``host_ms`` (a fixed loop of small PyTorch calls on the CPU: interpreter, dispatcher and
  allocator speed) for host-bound ones;
* ``launch_ms`` (a CUDA graph replaying one tiny kernel, timed like a benchmark: the GPU's
  fixed latency of a replay) by which a benchmark is classed latency-bound
  (:func:`attnkit_perf.decide.drift.latency_bound`); such a benchmark is not divided by the GPU
  drift, which it does not track.

What is specific to one kernel is left for the gate.
"""

from __future__ import annotations

import statistics
import time

import torch

from attnkit_perf.measure.cases import captured
from attnkit_perf.measure.timing import L2Flusher, measure_samples

#: 4096^3 bf16: ~0.17 ms at the H100's ~800 TFLOP/s, long enough to be clock-limited, short
#: enough that 50 repetitions cost under 10 ms.
MATMUL_SIZE = 4096
#: 256 MiB read + 256 MiB written: ~0.18 ms at 3 TB/s, five times the L2.
COPY_BYTES = 256 * 1024 * 1024
ROUNDS = 5
REPS = 10


def _host_loop() -> None:
    # Small tensors: each call is dispatch and allocation, like attnkit's own layer.
    x = torch.ones(8)
    for _ in range(200):
        x = torch.add(x, 1.0).view(2, 4).t().contiguous().flatten()


def measure_host_ms(rounds: int = 7) -> float:
    _host_loop()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        _host_loop()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


#: The launch probe's graph per device, captured once: a capture costs more than the probe.
_LAUNCH_PROBES: dict[torch.device, object] = {}


def launch_probe(device: torch.device):
    """A zero-argument callable replaying a CUDA graph of one single-element kernel: what a
    replay costs the GPU when the kernel does no work (launch, scheduling, completion)."""
    if device not in _LAUNCH_PROBES:
        cell = torch.zeros(1, device=device)
        with torch.cuda.device(device):
            _LAUNCH_PROBES[device] = captured(lambda: cell.add_(1.0))
    return _LAUNCH_PROBES[device]


def measure_calibration(
    device: torch.device, rounds: int = ROUNDS, flusher: L2Flusher | None = None, reps: int = REPS
) -> dict:
    """Median milliseconds of each calibration kernel: ``{"matmul_ms", "copy_ms", "launch_ms",
    "host_ms"}`` on a GPU; empty on the CPU, where nothing is gated."""
    if device.type != "cuda":
        return {}
    flusher = flusher or L2Flusher(device)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=torch.bfloat16, generator=gen)
    src = torch.randn(COPY_BYTES // 4, device=device, dtype=torch.float32, generator=gen)
    dst = torch.empty_like(src)
    result = {}
    kernels = (
        ("matmul_ms", lambda: a @ b),
        ("copy_ms", lambda: dst.copy_(src)),
        ("launch_ms", launch_probe(device)),
    )
    for key, fn in kernels:
        measure_samples(fn, device, 1, flusher, 3)  # warm-up: cuBLAS handle and heuristics
        samples = measure_samples(fn, device, rounds, flusher, reps)
        result[key] = statistics.median(samples) * 1e3
    result["host_ms"] = measure_host_ms()
    return result
