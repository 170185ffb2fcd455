"""GPU timing: a batched CUDA-event protocol exposed as a pytest-benchmark timer, L2 flushing,
warm-up and round planning, and peak-memory measurement.

One round (one pytest-benchmark sample) is ``reps`` repetitions enqueued back to back, the way
``triton.testing.do_bench`` times:

    for each repetition:  flush L2 (read 256 MiB) -> start event -> call -> end event
    then one synchronise; the round's value is the mean of the end - start intervals.

The flush is outside every interval, and because the host enqueues the next repetition while
the GPU is still flushing, launch latency and Python dispatch are hidden instead of being
counted as kernel time; the GPU never idles between repetitions, so clocks stay where a real
workload keeps them. (Synchronising after every repetition instead measured 4-20% above
do_bench on the H100: the idle gap and the exposed launch got counted.)

pytest-benchmark reads time through its ``timer`` hook as ``timer() - timer()`` around the
target. :func:`gpu_time_clock` is a clock that only advances by GPU time measured inside timed
intervals, divided by the repetitions of the round: the difference pytest-benchmark computes
around one round is that round's mean GPU time per call.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: do_bench's flush size: 256 MB, five times the H100's 50 MB L2.
_FLUSH_BYTES_MIN = 256 * 1024 * 1024

#: The name of this module's protocol, stored with every baseline (``machine_info["attnkit"]
#: ["timing"]``): timings taken under another one are not compared
#: (:func:`attnkit_perf.formats.baseline.load_baseline`). The L2 is evicted by reading
#: (:class:`L2Flusher`); baselines that name no protocol were timed with a zeroing flush.
TIMING_PROTOCOL = "flush-by-read"


class _GpuTimeClock:
    """Seconds of GPU time per call, accumulated by :func:`make_round`."""

    elapsed = 0.0


def gpu_time_clock() -> float:
    """pytest-benchmark timer (``@pytest.mark.benchmark(timer=gpu_time_clock)``): advances only
    by the measured GPU time of timed calls (a round's mean per call)."""
    return _GpuTimeClock.elapsed


def clock_for(device: torch.device) -> Callable[[], float]:
    """The timer that measures work on ``device``: GPU time on a GPU, perf_counter on the CPU."""
    return gpu_time_clock if device.type == "cuda" else time.perf_counter


class L2Flusher:
    """Evicts the L2 cache by reading a buffer several times its size.

    Reading, not writing: a flush that writes (``triton.testing.do_bench`` zeroes its buffer)
    leaves the L2 full of dirty lines, and their write-back to memory then happens inside the
    next timed call. Measured on the H100 (torch 2.11, CUDA 13.0): a split-KV
    decode reading 134 MB of keys and values took 63.6 us after a zeroing flush and 53.8 us
    after a reading one (the same as zeroing then reading), B8 N1 M32768 371.7 against 361.8 us;
    a 1 GiB copy moved 3003 against 3013 GB/s. So every call paid ~10 us of someone else's
    write-back, which also dilutes a relative slowdown of a memory-bound kernel. The buffer is
    written once, here; a read leaves only clean lines, which the next call evicts for free."""

    def __init__(self, device: torch.device, evict: bool = True) -> None:
        """``evict=False``: a flusher that does nothing, for calls timed back to back (the
        ``loop`` mode of :class:`attnkit_perf.measure.cases.BenchCase`)."""
        self.device = device
        self._buffer = None
        self._seconds = None
        if device.type == "cuda" and evict:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
            nbytes = max(_FLUSH_BYTES_MIN, 4 * l2)
            self._buffer = torch.ones(nbytes // 4, dtype=torch.int32, device=device)
            self._sink = torch.empty((), dtype=torch.int32, device=device)

    def flush(self) -> None:
        if self._buffer is not None:
            torch.amax(self._buffer, dim=0, out=self._sink)

    def seconds(self) -> float:
        """GPU seconds one flush takes (median of 5, measured once): the head start one flush
        gives the host."""
        if self._seconds is None:
            if self._buffer is None:
                raise ValueError("seconds(): this flusher does not evict (evict=False or no GPU)")
            events = [torch.cuda.Event(enable_timing=True) for _ in range(6)]
            self.flush()  # warm-up
            for event in events:
                event.record()
                self.flush()
            events[-1].synchronize()
            times = sorted(a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(events))
            self._seconds = times[len(times) // 2]
        return self._seconds


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_round(fn: Callable[[], object], device: torch.device, flusher: L2Flusher, reps: int):
    """A zero-argument callable running ``reps`` flushed repetitions of ``fn`` and adding their
    mean GPU time to :func:`gpu_time_clock`. On the CPU it just calls ``fn`` once after the
    (no-op) flush, and perf_counter times it."""
    if device.type != "cuda":

        def host_round():
            flusher.flush()
            fn()

        return host_round
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]

    def gpu_round():
        for start, end in zip(starts, ends, strict=True):
            flusher.flush()
            start.record()
            fn()
            end.record()
        ends[-1].synchronize()
        total_ms = sum(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
        _GpuTimeClock.elapsed += total_ms / 1e3 / reps

    return gpu_round


def measure_samples(
    fn: Callable[[], object],
    device: torch.device,
    rounds: int,
    flusher: L2Flusher | None = None,
    reps: int = 1,
) -> list[float]:
    """``rounds`` samples (seconds per call) taken with the same protocol as a benchmark round,
    for measurements outside pytest-benchmark (calibration, re-measurement, estimates)."""
    flusher = flusher or L2Flusher(device)
    clock = clock_for(device)
    one_round = make_round(fn, device, flusher, reps)
    samples = []
    for _ in range(rounds):
        start = clock()
        one_round()
        samples.append(clock() - start)
    return samples


@dataclass(frozen=True)
class RoundPlan:
    """How long to warm up and how many rounds to take for one benchmark."""

    estimate_s: float
    reps: int
    rounds: int


def warm_up_and_plan(
    fn: Callable[[], object],
    device: torch.device,
    flusher: L2Flusher,
    *,
    budget_s: float,
    min_rounds: int,
    max_rounds: int,
    round_s: float = 0.005,
    max_reps: int = 25,
    max_total_s: float = 1.5,
    warmup_s: float = 0.05,
) -> RoundPlan:
    """Run ``fn`` until compiled, autotuned and cached (at least 3 calls and ``warmup_s`` of GPU
    time), then plan the rounds: ``reps`` repetitions make a round of about ``round_s`` (a round
    of several repetitions varies far less than one repetition), and about ``budget_s`` of
    rounds, at least ``min_rounds`` unless the benchmark would then take over ``max_total_s``
    (the pure-PyTorch paths at 100+ ms a call).

    The first call may compile (Triton) or pick an algorithm (cuDNN); it is never timed.
    """
    fn()
    synchronize(device)
    samples: list[float] = []
    while len(samples) < 3 or sum(samples) < warmup_s:
        samples.extend(measure_samples(fn, device, 1, flusher))
        if len(samples) >= 200:
            break
    estimate = max(sorted(samples)[len(samples) // 2], 1e-7)
    reps = min(max_reps, max(1, math.ceil(round_s / estimate)))
    rounds = min(max_rounds, max(min_rounds, math.ceil(budget_s / (reps * estimate))))
    rounds = max(5, min(rounds, math.floor(max_total_s / (reps * estimate))))
    return RoundPlan(estimate_s=estimate, reps=reps, rounds=rounds)


def issue_seconds(fn: Callable[[], object], device: torch.device, calls: int = 5) -> float:
    """Host seconds to *issue* one call (perf_counter around it, the GPU idle before it, no
    synchronise after): the Python layer and the launches; median of ``calls``."""
    issue = []
    for _ in range(calls):
        synchronize(device)
        start = time.perf_counter()
        fn()
        issue.append(time.perf_counter() - start)
    synchronize(device)
    return sorted(issue)[len(issue) // 2]


#: Repetitions timed with the host far ahead, and the most flushes queued to get it there
#: (about 40 ms of GPU work on the H100; a call that issues longer is measured as far as that
#: lead reaches, which can only read its share too low and judge it by the stricter GPU rule).
_AHEAD_REPS = 3
_MAX_LEAD_FLUSHES = 500


def host_share(
    fn: Callable[[], object],
    device: torch.device,
    measured_s: float,
    flusher: L2Flusher,
    between: L2Flusher | None = None,
) -> float | None:
    """Share of ``fn``'s measured time (``measured_s``, taken with ``between`` before each call:
    ``flusher`` unless given) in which the GPU waited for the host. None on the CPU.

    A timed interval holds host time only where the GPU ran out of queued work: the flush before
    each call gives the host a head start of one flush (~90 us on the H100), so a forward that
    takes 50 us to issue and 8 us to run is timed at 8 us, while a training step that takes
    400 us to issue is timed at nearly that. The host's issue time alone cannot tell the two
    apart, since what it hides depends on the launches' order, so the call is timed again with
    the host far ahead: flushes queued first, long enough to cover the issue of every
    repetition, and checked to have been: the first interval had not begun when the last call
    was issued. Then ``1 - ahead / measured`` is the part the host set: about 0 where the GPU
    sets the time (a kernel slowdown shows in full), near 1 where the host does (the Python
    layer and launches, which vary far more between processes and machines)."""
    if device.type != "cuda" or measured_s <= 0:
        return None
    between = flusher if between is None else between
    issue_s = issue_seconds(fn, device)
    lead_s = 2 * _AHEAD_REPS * issue_s + 1e-4
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(_AHEAD_REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(_AHEAD_REPS)]
    while True:
        lead = min(_MAX_LEAD_FLUSHES, math.ceil(lead_s / flusher.seconds()))
        synchronize(device)
        for _ in range(lead):
            flusher.flush()
        for start, end in zip(starts, ends, strict=True):
            between.flush()
            start.record()
            fn()
            end.record()
        ahead_throughout = not starts[0].query()
        ends[-1].synchronize()
        if ahead_throughout or lead == _MAX_LEAD_FLUSHES:
            break
        lead_s *= 4
    times = sorted(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True))
    return max(0.0, 1.0 - times[len(times) // 2] / measured_s)


def median_time_s(
    fn: Callable[[], object], device: torch.device, budget_s: float = 0.2, min_rounds: int = 10
) -> float:
    """Median seconds per call with the suite's protocol (warm-up, flushed repetitions, rounds):
    the one timing path of the gate, the grid, tune and the demo."""
    flusher = L2Flusher(device)
    plan = warm_up_and_plan(fn, device, flusher, budget_s=budget_s, min_rounds=min_rounds, max_rounds=200)
    samples = measure_samples(fn, device, plan.rounds, flusher, plan.reps)
    return sorted(samples)[len(samples) // 2]


def settle_autograd(device: torch.device) -> None:
    """Send a tiny backward through the autograd engine's thread for ``device``: that thread drops
    its reference to the previous graph task (and through it the gradients it handed back) at the
    end of the loop iteration that finished it, before it takes the next task."""
    tiny = torch.ones(1, device=device, requires_grad=True)
    torch.autograd.grad(tiny.sum(), tiny)


def peak_extra_bytes(fn: Callable[[], object], device: torch.device, calls: int = 3) -> int | None:
    """Bytes allocated beyond what was live before a call, at the call's peak (outputs and
    workspaces included): the largest of ``calls`` calls. None on the CPU, where the allocator
    keeps no statistics.

    A backward's gradients are handed back by the autograd engine's device thread, which can
    still hold them when the caller's next call begins; that call then counts them as live and
    frees them midway, reading their size too low. Measured on the H100 (tiled path, float32,
    B1 H16 N4096 D128, fwd+bwd, 16 busy processes on the host): 11 of 30 back-to-back readings
    were 96 MiB (dq, dk and dv) below the 272.5 MiB peak; after a tiny backward through the same
    thread, 30 of 30 read the peak; the largest of three readings without it was still low once
    in 10. So each reading follows :func:`settle_autograd`, and the largest of them counts:
    nothing makes a reading too high once the call has run before."""
    if device.type != "cuda":
        return None
    peaks = []
    for _ in range(calls):
        settle_autograd(device)
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        peaks.append(torch.cuda.max_memory_allocated(device) - before)
        del result
    return int(max(peaks))
