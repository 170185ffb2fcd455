"""Stored mode's procedure: this run's benchmarks against the baseline JSON, each decided by
:func:`attnkit_perf.decide.gate.decide_stored` after the calibration drift
(:mod:`attnkit_perf.decide.drift`: the GPU's, the host's, or none for a latency-bound
benchmark), confirmed by re-measurement, and exempted where host-bound
on both machines (:func:`attnkit_perf.decide.host.stored_exempt`), where the host work count decides
instead (:func:`attnkit_perf.decide.host.with_stored_count`).

**Confirmation.** A benchmark that looks slower or inconclusive while it is measured (against
its own calibration) is re-measured at the end of the run, minutes later. A "slower" stands
only when two consecutive measurements say so (:func:`settle`); while the latest measurement
is slower and the one before it was not, the benchmark is measured again
(:meth:`StoredRule.wants_remeasure`), up to :data:`MAX_REMEASURES` times. A slowdown never
fails on one measurement unless confirmation was turned off (``--attnkit-no-confirm``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from attnkit_perf.decide.drift import drift_for, drift_kind, latency_drift, run_calibration
from attnkit_perf.decide.gate import Decision, Thresholds, decide_stored
from attnkit_perf.decide.host import stored_exempt, stored_host_bound, with_kept, with_stored_count
from attnkit_perf.decide.paired_rule import dropped

#: Re-measurements a suspect may take before it is reported unconfirmed.
MAX_REMEASURES = 3


def settle(decisions: list[Decision]) -> Decision:
    """One benchmark's outcome from its measurements in order (the first, then re-measurements):
    slower only when the last two agree; a last-only slower is inconclusive, unconfirmed."""
    last = decisions[-1]
    if len(decisions) == 1:
        return last
    before = decisions[-2]
    history = ", ".join(d.outcome for d in decisions[:-1])
    if last.outcome == "slower" and before.outcome == "slower":
        if before.ratio < last.ratio:  # the slowdown both measurements support, with its interval
            last.ratio, last.ci = before.ratio, before.ci
        last.reason = f"{before.reason}; re-measured: {last.reason}"
    elif last.outcome == "slower":
        last.outcome = "inconclusive"
        last.reason = (
            f"slower on the last of {len(decisions)} measurements only ({history} before): {last.reason}"
        )
    elif last.outcome == "faster" and any(d.outcome == "slower" for d in decisions):
        last.outcome = "inconclusive"
        last.reason = f"measured {history}, then: {last.reason}"
    else:
        last.reason = f"measured {history}, re-measured: {last.reason}"
    return last


def _median_ms(samples) -> float | None:
    """Median of ``samples`` (seconds) in ms, or None when they are no evidence (empty, NaN):
    the row's outcome says why, and the verdict stays valid JSON."""
    values = [float(s) for s in samples or ()]
    median = statistics.median(values) * 1e3 if values else math.nan
    return median if math.isfinite(median) else None


def confirmations(info: Mapping) -> list[dict]:
    """The re-measurements stored in a benchmark's ``extra_info["confirm"]`` (a list; a single
    object in runs written before a suspect could be re-measured more than once)."""
    confirm = info.get("confirm")
    if not confirm:
        return []
    return [confirm] if isinstance(confirm, dict) else list(confirm)


@dataclass(frozen=True)
class StoredRule:
    """``threshold_for(name)``: a benchmark's own threshold (A/A noise, or the pooled baseline's
    spread between recordings); ``alpha`` its share of the run's false-alarm budget."""

    thresholds: Thresholds
    alpha: float
    threshold_for: Callable[[str], float]

    def decide(
        self, base_entry: Mapping, samples, head_info: Mapping, base_cal: Mapping | None, head_cal
    ) -> Decision:
        """One measurement (``samples``) against the baseline entry, the drift of its kind
        (:func:`attnkit_perf.decide.drift.drift_kind`) between the calibrations given divided out."""
        base_info = base_entry.get("extra_info") or {}
        name = base_info.get("name") or base_entry["fullname"]
        base_samples = base_entry["stats"]["data"]
        median_ms = _median_ms(base_samples)
        kind = drift_kind(
            bool(head_info.get("host_bound")), median_ms and median_ms / 1e3, base_cal, head_cal
        )
        drift, text = drift_for(base_cal, head_cal, kind), None
        if kind == "latency":
            gpu, probe = drift_for(base_cal, head_cal, "gpu"), latency_drift(base_cal, head_cal)
            probe_text = "not in the baseline" if probe is None else f"x{probe:.4f}"
            text = f"latency-bound: GPU drift x{gpu:.4f} not divided out, launch probe {probe_text}"
        decision = decide_stored(
            base_samples,
            samples,
            drift,
            self.thresholds,
            self.alpha,
            self.threshold_for(name),
            base_info.get("peak_bytes"),
            head_info.get("peak_bytes"),
            drift_text=text,
        )
        decision.extra["drift_kind"] = kind
        return decision

    def _local(self, base_entry: Mapping, samples, head_info: Mapping, calibration) -> Decision:
        """Decided against the benchmark's own calibration (the run's is not in yet)."""
        base_cal = (base_entry.get("extra_info") or {}).get("calibration")
        return self.decide(base_entry, samples, head_info, base_cal, calibration)

    def suspect(self, base_entry: Mapping, samples, head_info: Mapping) -> bool:
        """Whether a benchmark just measured needs a second measurement at the end of the run
        (never one whose time is not compared, :func:`stored_exempt`)."""
        if stored_host_bound(base_entry.get("extra_info") or {}, head_info):
            return False
        first = self._local(base_entry, samples, head_info, head_info.get("calibration"))
        return first.outcome in ("slower", "inconclusive")

    def wants_remeasure(self, base_entry: Mapping, samples, head_info: Mapping) -> bool:
        """After the re-measurements in ``head_info``: whether the latest is an unconfirmed slower."""
        decisions = [self._local(base_entry, samples, head_info, head_info.get("calibration"))]
        for again in confirmations(head_info):
            decisions.append(self._local(base_entry, again["samples_s"], head_info, again.get("calibration")))
        if len(decisions) == 1:  # a suspect: always measured a second time
            return True
        unconfirmed = decisions[-1].outcome == "slower" and decisions[-2].outcome != "slower"
        return unconfirmed and len(decisions) - 1 < MAX_REMEASURES

    def judge(
        self, base_entry: Mapping, head_entry: Mapping, base_cal: Mapping, head_cal: Mapping
    ) -> Decision:
        """A benchmark's outcome from every measurement of it, against the runs' calibrations."""
        info = head_entry.get("extra_info") or {}
        decisions = [self.decide(base_entry, head_entry["stats"]["data"], info, base_cal, head_cal)]
        if decisions[0].outcome in ("slower", "inconclusive"):
            decisions += [
                self.decide(base_entry, c["samples_s"], info, base_cal, head_cal) for c in confirmations(info)
            ]
        base_info = base_entry.get("extra_info") or {}
        decision = stored_exempt(settle(decisions), base_info, info)
        decision = with_stored_count(decision, base_info, info, self.thresholds.host_count_slower)
        return with_kept(decision, base_info.get("kept_bytes"), info.get("kept_bytes"), self.thresholds)

    def compare(
        self, baseline: Mapping, run: Mapping, declined: Mapping[str, str], errored: Collection[str] = ()
    ) -> list[tuple]:
        """``(extra_info, decision, measured)`` per benchmark of the run and of the baseline.
        ``declined``: test node id (a baseline's ``fullname``) -> why this run skipped it; a
        baseline benchmark this run declined is dropped, one it did not select is missing;
        ``errored`` benchmarks (node ids) have a row of their own (the caller's), none here."""
        base_runs = {b["fullname"]: b for b in baseline["benchmarks"]}
        base_cal, head_cal = run_calibration(baseline), run_calibration(run)
        rows, seen = [], set()
        for bench in run.get("benchmarks", []):
            info = bench.get("extra_info") or {}
            seen.add(bench["fullname"])
            measured = {
                "head_median_ms": _median_ms(bench["stats"]["data"]),
                "head_peak_bytes": info.get("peak_bytes"),
                "tflops": info.get("tflops"),
                "host_bound": info.get("host_bound"),
            }
            reference = base_runs.get(bench["fullname"])
            if reference is None:
                rows.append((info, Decision("new", reason="not in the baseline"), measured))
                continue
            measured["base_median_ms"] = _median_ms(reference["stats"]["data"])
            measured["base_peak_bytes"] = (reference.get("extra_info") or {}).get("peak_bytes")
            rows.append((info, self.judge(reference, bench, base_cal, head_cal), measured))
        for fullname, reference in base_runs.items():
            if fullname in seen:
                continue
            info = reference["extra_info"]
            if fullname in errored:
                continue
            why = declined.get(fullname)
            if why is not None:
                decision = dropped(f"in the baseline, this checkout declined it: {why}", self.thresholds)
            else:
                decision = Decision("missing", reason="in the baseline, not selected in this run")
            measured = {
                "base_median_ms": _median_ms(reference["stats"]["data"]),
                "base_peak_bytes": info.get("peak_bytes"),
            }
            rows.append((info, decision, measured))
        return rows
