"""GPU timing: CUDA-event stamps as a pytest-benchmark timer, L2 flushing, warm-up and round
planning, and peak-memory measurement.

How one GPU sample is taken (the same as ``triton.testing.do_bench`` does for one repetition):

1. ``L2Flusher.flush()`` enqueues a write of zeros over a buffer larger than L2, so every
   repetition starts with cold caches. It is pytest-benchmark's ``setup`` callback, so it is
   outside the timed region.
2. The timer records a CUDA event *without synchronising*: the host goes on to enqueue the
   kernels while the GPU is still zeroing, so launch latency and Python dispatch are hidden
   behind the flush instead of being counted as kernel time.
3. After the call the timer records a second event; subtracting the two stamps waits for that
   event and returns the GPU time between them in seconds.

Each pytest-benchmark round is therefore one flushed repetition, and its per-round samples are
what the gate's statistics use.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: do_bench's flush size: 256 MB, five times the H100's 50 MB L2.
_FLUSH_BYTES_MIN = 256 * 1024 * 1024


class CudaEventStamp:
    """A point on the GPU's timeline; ``later - earlier`` is the GPU time between, in seconds."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record()

    def __sub__(self, earlier: CudaEventStamp) -> float:
        self.event.synchronize()
        return earlier.event.elapsed_time(self.event) / 1e3


def cuda_event_clock() -> CudaEventStamp:
    """pytest-benchmark timer (``@pytest.mark.benchmark(timer=cuda_event_clock)``).

    pytest-benchmark computes ``timer() - timer()`` around the target; with these stamps that
    difference is GPU time, not host time.
    """
    return CudaEventStamp()


def clock_for(device: torch.device) -> Callable[[], object]:
    """The timer that measures work on ``device``: CUDA events on a GPU, perf_counter on the CPU."""
    return cuda_event_clock if device.type == "cuda" else time.perf_counter


class L2Flusher:
    """Evicts the L2 cache by writing zeros over a buffer several times its size."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffer = None
        if device.type == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
            nbytes = max(_FLUSH_BYTES_MIN, 4 * l2)
            self._buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def flush(self) -> None:
        if self._buffer is not None:
            self._buffer.zero_()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_samples(
    fn: Callable[[], object], device: torch.device, rounds: int, flusher: L2Flusher | None = None
) -> list[float]:
    """``rounds`` samples of ``fn`` in seconds, each after an L2 flush: the same protocol as a
    pytest-benchmark round, for measurements taken outside a benchmark (calibration, re-checks)."""
    flusher = flusher or L2Flusher(device)
    clock = clock_for(device)
    samples = []
    for _ in range(rounds):
        flusher.flush()
        start = clock()
        fn()
        samples.append(clock() - start)
    return samples


@dataclass(frozen=True)
class RoundPlan:
    """How long to warm up and how many rounds to take for one benchmark."""

    estimate_s: float
    rounds: int


def warm_up_and_plan(
    fn: Callable[[], object],
    device: torch.device,
    flusher: L2Flusher,
    *,
    budget_s: float,
    min_rounds: int,
    max_rounds: int,
    warmup_s: float = 0.05,
) -> RoundPlan:
    """Run ``fn`` until compiled, autotuned and cached (at least 3 calls and ``warmup_s`` of GPU
    time), then choose enough rounds to spend about ``budget_s`` measuring.

    The first call may compile (Triton) or pick an algorithm (cuDNN); it is never timed.
    """
    fn()
    synchronize(device)
    samples: list[float] = []
    while len(samples) < 3 or sum(samples) < warmup_s:
        samples.extend(measure_samples(fn, device, 1, flusher))
        if len(samples) >= 200:
            break
    estimate = sorted(samples)[len(samples) // 2]
    rounds = min(max_rounds, max(min_rounds, math.ceil(budget_s / max(estimate, 1e-7))))
    return RoundPlan(estimate_s=estimate, rounds=rounds)


def peak_extra_bytes(fn: Callable[[], object], device: torch.device) -> int | None:
    """Bytes allocated beyond what was live before the call, at the call's peak (outputs and
    workspaces included). None on the CPU, where the allocator keeps no statistics."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del result
    return int(peak)
