"""The host work of one call, measured in the benchmark's processes: counted (instructions and
C calls), timed (host time per call), over more processes while its decision cannot tell; and the
device memory a call keeps after it returns. The rules that decide on these are
:mod:`attnkit_perf.decide.host`'s.

**Host work, counted** (:func:`host_count`): Python bytecode instructions executed and calls of
C functions made by one call, after warm-up. Noise-free where wall time is not: one environment
(Python, torch, Triton) reads the same count on every run, process and machine, so paired mode
and stored mode decide host rows on it first. Python 3.12 and later: :mod:`sys.monitoring` with
a tool id of its own, ``INSTRUCTION`` and ``CALL`` events switched on for the counted call only
(instrumenting every instruction is costly; nothing outside the call pays for it). Its events
fire on every thread, so the backward's Python, which the autograd engine runs on its own thread
for a CUDA tensor, is counted too. Python 3.10 and 3.11: :func:`sys.settrace` with
``frame.f_trace_opcodes`` (one event per instruction) and :func:`sys.setprofile`'s ``c_call``,
on the calling thread (where the autograd engine runs a CPU backward). The two count the same
kinds of work but not the same numbers, so counts are compared only within one environment
(:func:`count_environment`). What would make a count move without a code change, and how it is
kept out:

* the garbage collector, whose passes start at allocation thresholds and run callbacks and
  finalizers: switched off during the counted call;
* first-call work (lazy imports, compilation, caches filled, ``functools.lru_cache`` misses):
  the call is counted after the caller's warm-up, and counted :data:`REPEATS` times: a count
  that differs between two calls of one process is reported unrepeatable
  (``repeatable: False``) and the decision falls back to wall time for that row;
* waiting on the device: ``torch.cuda.synchronize()`` is one C call however long it waits; a
  Python loop polling the device would count its iterations, and so shows as unrepeatable;
* hash randomization: set iteration order may differ between processes (a loop over a set of
  strings takes its branches in another order); paired mode's decision requires every worker's
  count to agree, so a count that depends on it is unrepeatable too.

A count cannot see work done in compiled code, above all attnkit's compiled fast path
(:mod:`attnkit.fastpath`), whose C++ replaces the Python memo on later calls: the call then
counts a few instructions and one C call into the fast path's module. The count says so
(``fastpath``: that module's name, which carries a digest of its source): where the two sides'
fast paths differ, wall time decides.

**Host time per call** (:func:`host_per_call`), where the count cannot decide. A ``loop``
benchmark's GPU time is CUDA-event time around each call: the events' own host cost (two records
per call, about as much as a short forward's Python layer) is inside it, so it halves a host
regression, and where the GPU is the slower side it hides it altogether. The host metric has no
event inside its interval:

    synchronise (the queue is empty: nothing the host issues can wait on the GPU)
    perf_counter_ns and thread_time_ns -> ``calls`` back-to-back calls -> both clocks again

A batch's host time per call is its wall time over ``calls``. A batch is short (``calls`` times
a few launches stays far below the launch queue's ~1000 entries, and a host-bound call issues
faster than the GPU runs it), so the host never blocks on a full queue. The thread's CPU time
is the cross-check: a batch whose wall time exceeds its CPU time by much more than the
batches' usual gap was preempted (another process held the core) and is dropped
(:func:`kept_batches`). The per-process value is the median of the kept batches. Wall time, not
CPU time, is the metric: a call that starts waiting on something (a lock, a device
synchronisation it did not make before) costs wall time the thread's clock does not see.

**More processes** (:func:`extend_host`, paired mode). The process is the host time's unit of
replication (it moves between processes far more than between batches of one process), so the
way to more evidence is more processes, not more batches: while the decision over the processes
measured says inconclusive, every worker is replaced by a fresh process, which measures the host
time only, and its values join the earlier ones. The decision spends its level over the planned
looks (``PairedSettings.host_looks``), so looking again costs no false alarms.

**Kept memory** (:func:`kept_bytes`): ``memory_allocated`` after ``calls`` calls whose outputs
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
import platform
import statistics
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attnkit_perf.decide.gate import KEPT_ABS_BYTES
from attnkit_perf.measure.cases import BenchCase, build_runner, make_inputs
from attnkit_perf.measure.timing import settle_autograd, synchronize

if TYPE_CHECKING:
    from attnkit_perf.measure.paired_session import PairedSession, PairedSettings, SideResult


# --- host work, counted ------------------------------------------------------------------------

#: Counted calls per measurement; all of them must agree for the count to be used.
REPEATS = 2
#: sys.monitoring tool ids tried in turn (0-2 and 5 are named for debuggers, coverage,
#: profilers and optimizers; 3 and 4 are free for any tool).
_TOOL_IDS = (4, 3)
_PYTHON_CALLABLES = (types.FunctionType, types.MethodType)


def counter_kind() -> str:
    """``"monitoring"`` (Python >= 3.12) or ``"settrace"``: which mechanism counts here."""
    return "monitoring" if hasattr(sys, "monitoring") else "settrace"


def count_environment() -> dict:
    """What a count depends on besides the code: counts are comparable only where all of these
    are equal (stored mode refuses the comparison otherwise)."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "torch": torch.__version__,
        "triton": triton_version,
        "counter": counter_kind(),
    }


def _fast_path_module():
    """attnkit's compiled fast path module where it is loaded, else None."""
    fastpath = sys.modules.get("attnkit.fastpath")
    return getattr(fastpath, "memo", None)


def _enters(fast, function) -> bool:
    """Whether calling ``function`` enters the compiled fast path module ``fast``: a function of
    a plain extension module is bound to the module; one made by pybind11 names it."""
    if fast is None:
        return False
    bound = getattr(function, "__self__", None)
    return bound is fast or getattr(function, "__module__", None) == fast.__name__


def count_call(fn: Callable[[], object]) -> dict:
    """One call of ``fn``, counted: ``{"instructions", "c_calls", "fastpath"}``. ``fastpath``:
    the compiled fast path module's name when the call entered it, else None."""
    fast = _fast_path_module()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        counted = _count_monitored(fn, fast) if counter_kind() == "monitoring" else _count_traced(fn, fast)
    finally:
        if was_enabled:
            gc.enable()
    instructions, c_calls, entered = counted
    return {
        "instructions": instructions,
        "c_calls": c_calls,
        "fastpath": fast.__name__ if entered else None,
    }


def _count_traced(fn: Callable[[], object], fast) -> tuple[int, int, bool]:
    counts = [0, 0, False]

    def local(frame, event, arg):
        if event == "opcode":
            counts[0] += 1
        return local

    def on_call(frame, event, arg):
        frame.f_trace_opcodes = True
        return local

    def on_profile(frame, event, arg):
        if event == "c_call":
            counts[1] += 1
            if _enters(fast, arg):
                counts[2] = True

    old_trace, old_profile = sys.gettrace(), sys.getprofile()
    sys.setprofile(on_profile)
    sys.settrace(on_call)
    try:
        result = fn()
    finally:
        sys.settrace(old_trace)
        sys.setprofile(old_profile)
    del result  # dropped outside the counted interval: its deallocation is not the call's work
    return counts[0], counts[1], counts[2]


def _count_monitored(fn: Callable[[], object], fast) -> tuple[int, int, bool]:
    monitoring = sys.monitoring
    events = monitoring.events
    tool = next((t for t in _TOOL_IDS if monitoring.get_tool(t) is None), None)
    if tool is None:
        raise RuntimeError(f"sys.monitoring tool ids {_TOOL_IDS} are all in use: host work cannot be counted")
    counts = [0, 0, False]

    def on_instruction(code, offset):
        counts[0] += 1

    def on_call(code, offset, callable_, arg0):
        if not isinstance(callable_, _PYTHON_CALLABLES):
            counts[1] += 1
            if _enters(fast, callable_):
                counts[2] = True

    monitoring.use_tool_id(tool, "attnkit-host-count")
    try:
        monitoring.register_callback(tool, events.INSTRUCTION, on_instruction)
        monitoring.register_callback(tool, events.CALL, on_call)
        monitoring.set_events(tool, events.INSTRUCTION | events.CALL)
        try:
            result = fn()
        finally:
            monitoring.set_events(tool, events.NO_EVENTS)
    finally:
        monitoring.register_callback(tool, events.INSTRUCTION, None)
        monitoring.register_callback(tool, events.CALL, None)
        monitoring.free_tool_id(tool)
    del result
    return counts[0], counts[1], counts[2]


def host_count(fn: Callable[[], object], repeats: int = REPEATS) -> dict:
    """The host work of one call of ``fn`` (already warmed up), counted ``repeats`` times:
    ``{"instructions", "c_calls", "fastpath", "repeatable", "counts", "environment"}``; the
    first three are the last count's, ``counts`` every ``[instructions, c_calls]`` in order,
    ``repeatable`` whether they all agree."""
    if repeats < 1:
        raise ValueError(f"repeats: expected at least 1, got {repeats}")
    counted = [count_call(fn) for _ in range(repeats)]
    pairs = [[c["instructions"], c["c_calls"]] for c in counted]
    last = counted[-1]
    same_path = all(c["fastpath"] == last["fastpath"] for c in counted)
    return {
        **last,
        "repeatable": same_path and all(p == pairs[0] for p in pairs),
        "counts": pairs,
        "environment": count_environment(),
    }


# --- host time per call ------------------------------------------------------------------------

#: Calls per batch: enough that the clocks' resolution and the two reads do not matter (a call
#: takes 5-500 us), few enough that the queue cannot fill (see the module's docstring).
BATCH_CALLS = 16
#: Batches per process and measurement; their median is the process's value.
BATCHES = 15
#: A batch is preempted when its wall-minus-CPU gap exceeds the batches' median gap by this
#: share of their median wall time (a time slice lost to another process is 1-4 ms; the gap of a
#: batch that was not preempted moves by a few microseconds).
PREEMPT_SHARE = 0.2


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


# --- more processes ----------------------------------------------------------------------------


def extend_host(
    session: PairedSession,
    case: dict,
    settings: PairedSettings,
    results: dict[str, SideResult],
    wants_more: Callable[[dict[str, SideResult]], bool],
) -> dict[str, float]:
    """While ``wants_more(results)`` and fewer than ``settings.host_looks`` sets of processes
    have measured the host metric, replace every worker by a fresh process and pool its host
    metric into ``results``. Returns the seconds spent, ``{"host_restart", "host_more"}`` (a
    restart is process start, imports and identification; "host_more" the case's preparation
    on the fresh workers and their host rounds), empty when no more were needed."""
    done, spent = 1, {}
    while done < settings.host_looks and wants_more(results):
        start = time.perf_counter()
        session.restart()
        spent["host_restart"] = spent.get("host_restart", 0.0) + time.perf_counter() - start
        start = time.perf_counter()
        fresh = session.measure_host(case, settings)
        spent["host_more"] = spent.get("host_more", 0.0) + time.perf_counter() - start
        if any(r.unsupported or not r.host_per_call for r in fresh.values()):
            break  # a fresh base worker failed: the evidence so far stands
        for side, result in fresh.items():
            results[side].pool_host(result)
        done += 1
    return spent


# --- kept memory -------------------------------------------------------------------------------

#: Calls after which the memory a call keeps is read.
KEPT_CALLS = 8


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
