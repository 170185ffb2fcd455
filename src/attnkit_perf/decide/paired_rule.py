"""Paired mode's procedure for one benchmark, over what :mod:`attnkit_perf.measure.paired_session`
measured: decide as the pairs come in, confirm a slowdown on fresh processes, and name a case
one side could not run.

A measurement is ``{"base": side, "head": side}``, each side with ``blocks`` (seconds, pair
``i`` at index ``i``), ``workers`` (the worker process of each block), ``peak_bytes``,
``host_share``, ``unsupported`` (why the side could not run the case, or None),
``kept_bytes``, the host work count per worker process (``host_counts``) and the host
metric's wall time per worker process (``host_per_call``, ``host_cpu_per_call``,
``host_dropped``): the
:class:`attnkit_perf.measure.paired_session.SideResult` fields, read by name so that this package stays
free of the measuring code.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from attnkit_perf.decide.gate import Decision, Thresholds, _with_memory, confirm_slowdown
from attnkit_perf.decide.host import (
    CountComparison,
    compare_counts,
    count_decision,
    decide_host,
    host_bound_throughout,
    host_summary,
    join_host,
    paired_limit,
    with_kept,
)
from attnkit_perf.decide.identity import Identity, compare_fingerprints, identity_decision
from attnkit_perf.decide.sequential import SequentialPlan, decide_sequential


def _median(values) -> float | None:
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class PairedRule:
    """How one benchmark is decided: ``threshold`` is its own (A/A noise), ``alpha`` its share of
    the run's false-alarm budget."""

    thresholds: Thresholds
    alpha: float
    threshold: float
    #: The host metric's threshold (:func:`attnkit_perf.decide.policy.RunPolicy.host_threshold_for`)
    #: and whether a slowdown is confirmed on fresh processes before it fails.
    host_threshold: float | None = None
    confirmed: bool = True
    #: Most sets of processes one measurement of the host metric may pool (paired mode's
    #: ``PairedSettings.host_looks``); its level is spent over them.
    host_looks: int = 1
    #: The GPU time's sequential plan: looks over fresh sets of processes, levels spent over them.
    plan: SequentialPlan = field(default_factory=SequentialPlan)

    def identity(self, results: Mapping) -> Identity:
        """The two sides' fingerprints compared (:mod:`attnkit_perf.decide.identity`)."""
        return compare_fingerprints(
            getattr(results["base"], "fingerprint", None), getattr(results["head"], "fingerprint", None)
        )

    def same_work(self, results: Mapping) -> bool:
        """Whether both sides run the same GPU work, so the GPU time needs no timing."""
        return self.identity(results).identical

    def decide(self, results: Mapping, *earlier: Mapping) -> Decision:
        """The GPU time's decision on ``results``: same, untimed, where both sides run the same
        GPU work (:meth:`same_work`); else on its blocks, pooled over ``looks`` sets of
        processes (:func:`attnkit_perf.decide.sequential.decide_sequential`); ``earlier``
        measurements of the same benchmark only tighten the host-bound classification. Memory is
        judged by its own rule either way."""
        base, head = results["base"], results["head"]
        identity = self.identity(results)
        if identity.identical:
            time = identity_decision(identity)
        else:
            limit = paired_limit(self.threshold, self.thresholds, host_bound_throughout(results, *earlier))
            looks = getattr(head, "looks", 1)
            time = decide_sequential(
                base.blocks, head.blocks, head.workers, looks, self.plan, self.alpha, limit
            )
            if identity.outcome == "differs":  # why the row was timed: the first difference
                time.extra["identity"] = identity.reason
        return _with_memory(time, base.peak_bytes, head.peak_bytes, self.thresholds)

    def count_comparison(self, results: Mapping) -> CountComparison | None:
        """The two sides' host work counts compared (:func:`compare_counts`), or None where
        neither side counted."""
        base, head = results["base"], results["head"]
        if not base.host_counts and not head.host_counts:
            return None
        return compare_counts(base.host_counts, head.host_counts, self.thresholds.host_count_slower)

    def host_needs_wall(self, results: Mapping) -> bool:
        """Whether the host metric's wall time must be measured: the count does not decide it
        (it grew, or it cannot speak for the row: :mod:`attnkit_perf.decide.host`)."""
        count = self.count_comparison(results)
        return count is None or not count.decides

    def decide_host(self, results: Mapping) -> Decision | None:
        """The host metric's decision: the host work count's where it decides
        (:func:`count_decision`), else the wall time's (:func:`attnkit_perf.decide.host.decide_host`)
        over the worker processes' values with the count's evidence beside it; None where
        neither was measured."""
        base, head = results["base"], results["head"]
        count = self.count_comparison(results)
        if count is not None and count.decides:
            return count_decision(count)
        if not base.host_per_call and not head.host_per_call:
            return None
        threshold = self.thresholds.host_slower if self.host_threshold is None else self.host_threshold
        wall = decide_host(
            base.host_per_call, head.host_per_call, threshold, self.alpha, self.confirmed, self.host_looks
        )
        if count is not None:
            wall.reason = f"{count.reason}; wall time: {wall.reason}"
            wall.extra["count"] = count.summary()
        return wall

    def host_wants_more(self, results: Mapping) -> bool:
        """Whether the host metric measured so far cannot tell, so fresh processes should join it."""
        host = self.decide_host(results)
        return host is not None and host.outcome == "inconclusive"

    def decide_all(self, results: Mapping, *earlier: Mapping) -> tuple[Decision, Decision | None]:
        """``(GPU time's decision, host metric's or None)``."""
        return self.decide(results, *earlier), self.decide_host(results)

    def confirm_all(
        self, first: tuple[Decision, Decision | None], again: Mapping, earlier: Mapping
    ) -> tuple[Decision, Decision | None]:
        """A host-metric suspect confirmed on fresh processes: its slower stands only when the
        fresh processes show it too (:func:`confirm_slowdown`). The GPU time keeps its first
        decision: a sequential "slower" already showed on two sets of processes."""
        time, host = first
        if host is not None and host.outcome == "slower":
            host = confirm_slowdown(host, self.decide_host(again))
        return time, host

    @staticmethod
    def any_slower(time: Decision, host: Decision | None) -> bool:
        """Whether a metric needs confirmation on fresh processes: the host metric's slower (the
        GPU time's is sequential, shown on two sets of processes already)."""
        return host is not None and host.outcome == "slower"

    def join(self, time: Decision, host: Decision | None, results: Mapping) -> Decision:
        """The row's decision: the GPU time's, joined with the host metric's
        (:func:`join_host`) and the kept-memory rule, from the measurement ``results``."""
        base, head = results["base"], results["head"]
        if host is not None:
            timed = bool(base.host_per_call or head.host_per_call)
            cpu = {"base": _median(base.host_cpu_per_call), "head": _median(head.host_cpu_per_call)}
            cpu = cpu if timed else None
            dropped = {"base": base.host_dropped, "head": head.host_dropped} if timed else None
            time = join_host(time, host, host_summary(host, cpu, dropped))
        return with_kept(time, base.kept_bytes, head.kept_bytes, self.thresholds)

    def unsupported(self, results: Mapping) -> Decision | None:
        """The outcome of a case one side could not run, or None when both ran it. Both sides
        declining it is no outcome at all (the caller skips it)."""
        base, head = results["base"].unsupported, results["head"].unsupported
        if head and not base:
            return dropped(f"the base runs it, this checkout does not: {head}", self.thresholds)
        if base and not head:
            return Decision("new", reason=f"the base cannot run it: {base}")
        return None


def dropped(reason: str, t: Thresholds) -> Decision:
    """A benchmark the base ran that the head does not: a failure, unless accepted knowingly."""
    if t.allow_dropped:
        reason = f"{reason} (accepted: --attnkit-allow-dropped)"
    return Decision("dropped", reason=reason)
