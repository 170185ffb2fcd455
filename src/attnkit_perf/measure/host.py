"""Host time per call, timed directly, and the device memory a call keeps after it returns.

**Host time.** A ``loop`` benchmark's GPU time is CUDA-event time around each call: the
events' own host cost (two records per call, about as much as a short forward's Python layer)
is inside it, so it halves a host regression, and where the GPU is the slower side it hides it
altogether. The host metric has no event inside its interval:

    synchronise (the queue is empty: nothing the host issues can wait on the GPU)
    perf_counter_ns and thread_time_ns -> ``calls`` back-to-back calls -> both clocks again

A batch's host time per call is its wall time over ``calls``. A batch is short (``calls`` times
a few launches stays far below the launch queue's ~1000 entries, and a host-bound call issues
faster than the GPU runs it), so the host never blocks on a full queue. The thread's CPU time
is the cross-check: a batch whose wall time exceeds its CPU time by much more than the
batches' usual gap was preempted (another process held the core) and is dropped
(:func:`kept_batches`). The per-process value is the median of the kept batches.

Wall time, not CPU time, is the metric: a call that starts waiting on something (a lock, a
device synchronisation it did not make before) costs wall time the thread's clock does not see.

**Kept memory.** :func:`kept_bytes`: ``memory_allocated`` after ``calls`` calls whose outputs
are dropped, minus before the first. A cache the call fills, or a leak, shows; the call's
transient peak does not (that is :func:`attnkit_perf.measure.timing.peak_extra_bytes`).

Both readings are taken after :func:`release_garbage`. Memory that only a reference cycle still
holds is freed whenever Python's cyclic collector happens to run, and it may run during the
calls. A stored-mode recording of the grid on an H200 read -96 MiB for
``fwd[triton-bf16-B1-H8-N128-D64-causal-loop]``: the size of the q, k and v of the case run just
before it (``fwd[sdpa-efficient-bf16-B4-H16kv4-N4096-D128-causal]``, declined by its backend at
its first call), whose frames, and so its inputs, the exception's traceback held in a cycle until
the collector ran during the next case's calls. A difference below zero is a measurement error
(:class:`KeptMemoryError`), never a value to store: a case cannot free memory that was live
before it started; only something outside it can. A drop within the kept-memory rule's
resolution (:data:`attnkit_perf.decide.gate.KEPT_ABS_BYTES`, 64 KiB) reads as nothing kept: the
A/A gate on an H200 read -512 B on a loop row, one small block another component released.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit_perf.decide.gate import KEPT_ABS_BYTES
from attnkit_perf.measure.cases import BenchCase, build_runner, make_inputs
from attnkit_perf.measure.timing import settle_autograd, synchronize

#: Calls per batch: enough that the clocks' resolution and the two reads do not matter (a call
#: takes 5-500 us), few enough that the queue cannot fill (see the module's docstring).
BATCH_CALLS = 16
#: Batches per process and measurement; their median is the process's value.
BATCHES = 15
#: A batch is preempted when its wall-minus-CPU gap exceeds the batches' median gap by this
#: share of their median wall time (a time slice lost to another process is 1-4 ms; the gap of a
#: batch that was not preempted moves by a few microseconds).
PREEMPT_SHARE = 0.2
#: Calls after which the memory a call keeps is read.
KEPT_CALLS = 8


@dataclass(frozen=True)
class HostBatch:
    """One batch: nanoseconds of wall and of the thread's CPU time, and the calls it made."""

    wall_ns: int
    cpu_ns: int
    calls: int


def time_batch(fn: Callable[[], object], device: torch.device, calls: int = BATCH_CALLS) -> HostBatch:
    """``calls`` back-to-back calls of ``fn`` from an empty queue (no event, no synchronise
    inside the interval)."""
    synchronize(device)
    wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(calls):
        fn()  # the output is dropped, as a loop of calls drops the previous one's
    cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
    return HostBatch(wall_ns=wall, cpu_ns=cpu, calls=calls)


def kept_batches(batches: list[HostBatch], share: float = PREEMPT_SHARE) -> list[HostBatch]:
    """The batches that were not preempted: those whose wall-minus-CPU gap is within ``share``
    of the median wall time of the batches' median gap. A systematic gap (helper threads doing
    part of the work, a wait every call makes) is every batch's and drops none."""
    if not batches:
        return []
    gap = statistics.median(b.wall_ns - b.cpu_ns for b in batches)
    allowed = gap + share * statistics.median(b.wall_ns for b in batches)
    return [b for b in batches if b.wall_ns - b.cpu_ns <= allowed]


def host_per_call(fn: Callable[[], object], device: torch.device, batches: int = BATCHES) -> dict:
    """One process's host time per call of ``fn`` (already warmed up), as the worker answers it:
    ``{"per_call_s", "cpu_per_call_s", "batches", "dropped"}``; ``per_call_s`` is the median wall
    time per call of the batches kept, ``cpu_per_call_s`` their median CPU time per call."""
    time_batch(fn, device)  # untimed: the first batch after other work refills the host's caches
    timed = [time_batch(fn, device) for _ in range(batches)]
    synchronize(device)
    kept = kept_batches(timed)
    return {
        "per_call_s": statistics.median(b.wall_ns / b.calls for b in kept) / 1e9,
        "cpu_per_call_s": statistics.median(b.cpu_ns / b.calls for b in kept) / 1e9,
        "batches": len(timed),
        "dropped": len(timed) - len(kept),
    }


class KeptMemoryError(RuntimeError):
    """A kept-memory reading came out negative: memory live before the first call was freed by
    the time of the second reading, so the difference measures something outside the case."""


def release_garbage(device: torch.device) -> None:
    """Bring the process to a state a memory reading can be taken in: what only a reference
    cycle holds is collected (an earlier case's tensors, held by its exception's traceback or a
    closure cycle), the autograd engine's thread drops its last graph
    (:func:`attnkit_perf.measure.timing.settle_autograd`), and the queue is empty."""
    gc.collect()
    settle_autograd(device)
    synchronize(device)


def allocated(device: torch.device) -> int | None:
    """Bytes the caching allocator has handed out on ``device`` once :func:`release_garbage` has
    run (None on the CPU, where the allocator keeps no statistics)."""
    if device.type != "cuda":
        return None
    release_garbage(device)
    return torch.cuda.memory_allocated(device)


def kept_bytes(
    fn: Callable[[], object],
    device: torch.device,
    before: int | None,
    calls: int = KEPT_CALLS,
    read: Callable[[torch.device], int | None] = allocated,
) -> int | None:
    """Bytes still allocated after ``calls`` calls of ``fn`` whose outputs were dropped, beyond
    ``before`` (``read``, by default :func:`allocated`, before ``fn``'s first call: a cache
    filled by the first call counts). None where ``before`` is (the CPU).

    Raises :class:`KeptMemoryError` when more than :data:`~attnkit_perf.decide.gate.KEPT_ABS_BYTES`
    fewer bytes are allocated after the calls than before them (the module's docstring says why
    that is never the case's own); a smaller drop reads 0."""
    if before is None:
        return None
    for _ in range(calls):
        fn()  # the output is dropped at once
    after = read(device)
    if before - after > KEPT_ABS_BYTES:
        raise KeptMemoryError(
            f"kept memory read negative: {after} B allocated after {calls} calls, {before} B before "
            f"the first ({after - before} B): {before - after} B that were live before the calls "
            "were freed during them, so the reading measures something outside this case (an "
            "earlier case's tensors held by a reference cycle until the collector ran, a buffer "
            "another component freed); a negative kept memory is never stored"
        )
    return max(int(after - before), 0)  # a drop within the rule's resolution: nothing kept


@dataclass
class BuiltCase:
    """A case's runner and the memory readings taken while it was built: ``before_calls``
    (:func:`allocated` before the runner's first call, for :func:`kept_bytes`) and ``graph_peak``
    (a ``graph`` case's peak beyond its inputs during warm-up and capture, else None)."""

    runner: Callable[[], object]
    before_calls: int | None
    graph_peak: int | None


def build_measured(case: BenchCase, device: torch.device, seed: int = 0) -> BuiltCase:
    """:func:`attnkit_perf.measure.cases.build_runner` with the memory readings of
    :class:`BuiltCase`.

    A graph replay allocates nothing: its outputs and workspaces were allocated once, in the
    graph's own pool, while it was captured, so the peak around a replay reads 0. Its peak is
    read around the build instead: the largest allocation beyond what was live before, less its
    inputs (measured by making the same inputs once first)."""
    graph_peak = None
    if case.mode == "graph" and device.type == "cuda":
        start = allocated(device)
        inputs = make_inputs(case, device, seed)
        input_bytes = allocated(device) - start
        del inputs
        torch.cuda.reset_peak_memory_stats(device)
        runner = build_runner(case, device, seed)
        synchronize(device)
        graph_peak = int(torch.cuda.max_memory_allocated(device) - start - input_bytes)
    else:
        runner = build_runner(case, device, seed)
    return BuiltCase(runner=runner, before_calls=allocated(device), graph_peak=graph_peak)
