"""Host-bound benchmarks: those whose time the host's work (Python, dispatch, launches) sets,
and the rule each mode applies to them.

A benchmark's *host share* (:func:`attnkit_perf.measure.timing.host_share`) is the part of its
measured time in which the GPU waited for the host; at :data:`HOST_BOUND_SHARE` or more the host
set the time. Host-bound times move by tens of percent between worker processes and between
machines, far more than GPU times, so:

* **paired mode** holds a benchmark that is host-bound on *both* sides, in *every* measurement
  of it, to at least ``Thresholds.host_bound_slower`` (:func:`paired_limit`). Neither side alone
  may loosen the rule: a change that adds host work to a GPU-bound benchmark raises only the
  head's share, and must be judged by the GPU rule, which then sees the slowdown;
  The host work itself is guarded by the host metric (host time per call, timed without
  events and decided over processes, :mod:`attnkit_perf.decide.host`), which has no floor;
* **stored mode** does not compare a host-bound benchmark's time across machines at all
  (:func:`stored_exempt`: inconclusive, with :data:`STORED_HOST_BOUND` as the reason; its
  memory is still compared): only where the baseline *and* this run were host-bound, so a
  change that makes a benchmark host-bound cannot exempt itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from attnkit_perf.decide.gate import Decision, Thresholds

#: A benchmark is host-bound when the host set at least this share of its measured time.
HOST_BOUND_SHARE = 0.5


def paired_share(base_share: float | None, head_share: float | None) -> float | None:
    """The share that classifies a paired benchmark: the smaller of the two sides' (the other
    side's where one has none, as for a benchmark new to the head). Host-bound then means the
    host set the time of *both* codes. A GPU slowdown lowers the head's share; a host-only
    slowdown of a GPU-bound benchmark raises it but not the base's, so it is judged by the GPU
    rule. (Classifying by the host's issue time over the measured time instead, which the
    flush's head start makes meaningless, let GPU-bound benchmarks read 0.5-1.4 and pass real
    slowdowns of x1.10 and x1.24 on the H100 under the host-bound threshold.)"""
    shares = [s for s in (base_share, head_share) if s is not None]
    return min(shares) if shares else None


def host_bound_pair(base_share: float | None, head_share: float | None) -> bool:
    return (paired_share(base_share, head_share) or 0.0) >= HOST_BOUND_SHARE


def host_bound_throughout(*measurements: Mapping) -> bool:
    """Host-bound by every measurement of the benchmark (each ``{"base": r, "head": r}`` with a
    ``host_share`` on each side): a suspect's confirmation on fresh processes is judged by the
    strictest classification seen, so a slowdown seen under the GPU rule cannot pass because
    fresh processes read otherwise."""
    return all(host_bound_pair(m["base"].host_share, m["head"].host_share) for m in measurements)


def paired_limit(threshold: float, t: Thresholds, host_bound: bool) -> float:
    """The threshold a paired benchmark is held to. A host-bound one keeps the floor even with an
    A/A noise file: a few A/A runs cannot bound the tails of what moved by tens of percent
    between worker processes."""
    return max(threshold, t.host_bound_slower) if host_bound else threshold


#: The reason of a stored row whose time is not compared (host-bound in the baseline and here).
STORED_HOST_BOUND = (
    "host-bound here and in the baseline: time not compared across machines (hosts differ by "
    "machine; paired mode's host metric guards its host time)"
)


def stored_host_bound(base_info: Mapping, head_info: Mapping) -> bool:
    """Whether stored mode leaves a benchmark's time uncompared: host-bound in the baseline *and*
    in this run (a change that makes a benchmark host-bound cannot exempt itself)."""
    return bool(base_info.get("host_bound") and head_info.get("host_bound"))


def stored_exempt(decision: Decision, base_info: Mapping, head_info: Mapping) -> Decision:
    """A stored benchmark host-bound in the baseline *and* in this run is not compared on time,
    whatever its ratio: hosts differ far more than GPUs (x1.2-1.9 between two H100 machines), so
    a threshold wide enough for them would call a x1.6 change "same"; paired mode's host metric
    guards the host time on one machine. Its outcome is inconclusive (listed, not same), unless
    its peak grew (more-memory); the caller applies the kept-memory rule after this."""
    if not stored_host_bound(base_info, head_info):
        return decision
    time = f"time {decision.outcome} ({decision.reason})"
    grew = decision.outcome == "more-memory" or "memory_growth_bytes" in decision.extra
    decision.outcome = "more-memory" if grew else "inconclusive"
    decision.reason = f"{STORED_HOST_BOUND}; {time}"
    decision.extra["time_compared"] = False
    return decision
