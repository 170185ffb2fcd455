"""The host work of one call, counted: Python bytecode instructions executed and calls of
C functions made, after warm-up. Noise-free where the host metric's wall time is not: one
environment (Python, torch, Triton) reads the same count on every run, process and machine, so
paired mode and stored mode decide host rows on it (:mod:`attnkit_perf.decide.hostcount`).

**How.** Python 3.12 and later: :mod:`sys.monitoring` with a tool id of its own, ``INSTRUCTION``
and ``CALL`` events switched on for the counted call only (instrumenting every instruction is
costly; nothing outside the call pays for it). Its events fire on every thread, so the
backward's Python, which the autograd engine runs on its own thread for a CUDA tensor, is
counted too. Python 3.10 and 3.11: :func:`sys.settrace` with ``frame.f_trace_opcodes`` (one
event per instruction) and :func:`sys.setprofile`'s ``c_call``, on the calling thread (where
the autograd engine runs a CPU backward). The two count the same kinds of work but not the same
numbers, so counts are compared only within one environment (:func:`count_environment`).

**What would make a count move without a code change**, and how it is kept out:

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

**What a count cannot see**: work done in compiled code, above all attnkit's compiled fast path
(:mod:`attnkit.fastpath`), whose C++ replaces the Python memo on later calls: the call then
counts a few instructions and one C call into the fast path's module. The count says so
(``fastpath``: that module's name, which carries a digest of its source): where the two sides'
fast paths differ, wall time decides.
"""

from __future__ import annotations

import gc
import platform
import sys
import types
from collections.abc import Callable

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
    import torch

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
