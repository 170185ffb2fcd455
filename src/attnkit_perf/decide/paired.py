"""Paired mode's procedure for one benchmark, over what :mod:`attnkit_perf.measure.paired`
measured: decide as the pairs come in, confirm a slowdown on fresh processes, and name a case
one side could not run.

A measurement is ``{"base": side, "head": side}``, each side with ``blocks`` (seconds, pair
``i`` at index ``i``), ``workers`` (the worker process of each block), ``peak_bytes``,
``host_share`` and ``unsupported`` (why the side could not run the case, or None): the
:class:`attnkit_perf.measure.paired.SideResult` fields, read by name so that this package stays
free of the measuring code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from attnkit_perf.decide.gate import Decision, Thresholds, confirm_slowdown, decide_paired
from attnkit_perf.decide.hostbound import host_bound_throughout, paired_limit


@dataclass(frozen=True)
class PairedRule:
    """How one benchmark is decided: ``threshold`` is its own (A/A noise), ``alpha`` its share of
    the run's false-alarm budget."""

    thresholds: Thresholds
    alpha: float
    threshold: float

    def decide(self, results: Mapping, *earlier: Mapping) -> Decision:
        """The decision on ``results``; ``earlier`` measurements of the same benchmark (a
        suspect's first, when ``results`` is its confirmation) only tighten the host-bound
        classification."""
        base, head = results["base"], results["head"]
        limit = paired_limit(self.threshold, self.thresholds, host_bound_throughout(results, *earlier))
        return decide_paired(
            base.blocks,
            head.blocks,
            self.thresholds,
            self.alpha,
            limit,
            base.peak_bytes,
            head.peak_bytes,
            clusters=head.workers or None,
        )

    @staticmethod
    def needs_confirmation(decision: Decision) -> bool:
        """Every pair so far ran on the same processes, whose offsets the rank test cannot see: a
        slowdown must show again on fresh ones (both sides restarted)."""
        return decision.outcome == "slower"

    def confirm(self, first: Decision, again: Mapping, earlier: Mapping) -> Decision:
        """``first`` (slower) against the measurement ``again`` on fresh processes, judged by the
        first measurement's classification too: a slowdown seen under the GPU rule must not pass
        because the fresh processes read host-bound."""
        return confirm_slowdown(first, self.decide(again, earlier))

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
