"""The host work count's decision (:mod:`attnkit_perf.measure.hostcount`): Python bytecode
instructions and C calls per call, base against head, in paired mode and in stored mode.

A count does not vary between runs, processes or machines of one environment, so it needs no
statistics: equal counts are the same host work, and a "same" host row needs no wall-time
rounds and no fresh processes. The rule (:func:`compare_counts`), with ``t`` the option
``--attnkit-host-count-slower`` (:attr:`attnkit_perf.decide.gate.Thresholds.host_count_slower`):

* **same**: neither count grew by more than ``t`` (relative to the base's), and not both
  dropped by more than it;
* **faster**: the instructions or the C calls dropped by more than ``t`` and neither grew by more;
* **grew**: either count grew by more than ``t``. A count says how much more work, not how much
  more time (a C call may take 50 ns or a synchronisation's milliseconds), so the wall-time host
  metric (:mod:`attnkit_perf.decide.host`) then decides whether it costs time, and a slowdown
  it finds is confirmed and fails the row as before.

The count is not used, and the wall-time metric decides as before, where it cannot speak for
the row (the reason says which):

* **unrepeatable**: the counted calls of one side disagree (between two calls of one process or
  between its processes): something besides the code moves the count;
* **unseen**: the call entered attnkit's compiled fast path and the two sides' fast paths are not
  the same build (its module's name carries its source's digest): the C++ work is invisible
  to a count. With one build on both sides the C++ is the same, and the count of the Python
  around it decides;
* **incomparable**: the counts come from different environments (Python, torch, Triton, or the
  counting mechanism: :func:`attnkit_perf.measure.hostcount.count_environment`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from attnkit_perf.decide.gate import Decision

#: Outcomes of a count comparison that decide the host metric without wall time.
DECIDING = ("same", "faster")
_KEYS = ("instructions", "c_calls")
_LABELS = {"instructions": "instructions", "c_calls": "C calls"}


@dataclass(frozen=True)
class CountComparison:
    """Base's and head's count and what they say: ``outcome`` one of same, faster, grew,
    unrepeatable, unseen, incomparable (module docstring)."""

    outcome: str
    reason: str
    threshold: float
    base: dict | None = None
    head: dict | None = None
    #: Head over base, per count (None where the base's is 0).
    ratios: dict = field(default_factory=dict)
    fastpath: dict = field(default_factory=dict)

    @property
    def decides(self) -> bool:
        """Whether the count decides the host metric on its own (no wall-time rounds)."""
        return self.outcome in DECIDING

    def summary(self) -> dict:
        """The verdict row's ``host.count`` block."""
        return {
            "outcome": self.outcome,
            "reason": self.reason,
            "threshold": self.threshold,
            "base": self.base,
            "head": self.head,
            "ratios": self.ratios or None,
            "fastpath": self.fastpath or None,
        }


def side_count(counts: Sequence[Mapping]) -> tuple[dict | None, str | None]:
    """One side's count from every counted call of its processes (each a
    :func:`attnkit_perf.measure.hostcount.host_count` answer), or ``(None, why not)`` when they
    disagree or are missing."""
    if not counts:
        return None, "not counted"
    if not all(c.get("repeatable") for c in counts):
        seen = [c.get("counts") for c in counts if not c.get("repeatable")]
        return None, f"two calls of one process counted differently ({seen[0]})"
    values = {(c["instructions"], c["c_calls"], c.get("fastpath")) for c in counts}
    if len(values) > 1:
        return None, f"processes counted differently: {sorted(values, key=str)}"
    environments = {tuple(sorted((c.get("environment") or {}).items())) for c in counts}
    if len(environments) > 1:
        return None, "processes counted in different environments"
    first = counts[0]
    return {
        "instructions": first["instructions"],
        "c_calls": first["c_calls"],
        "fastpath": first.get("fastpath"),
        "environment": first.get("environment"),
    }, None


def environment_differences(base: Mapping | None, head: Mapping | None) -> dict[str, tuple]:
    """``{key: (base's, head's)}`` where two count environments differ."""
    base, head = base or {}, head or {}
    return {k: (base.get(k), head.get(k)) for k in sorted({*base, *head}) if base.get(k) != head.get(k)}


def _shown(count: dict) -> dict:
    return {k: count[k] for k in _KEYS}


def compare_counts(
    base_counts: Sequence[Mapping], head_counts: Sequence[Mapping], threshold: float
) -> CountComparison:
    """The comparison of the two sides' counted calls (module docstring)."""
    base, base_why = side_count(base_counts)
    head, head_why = side_count(head_counts)
    common = {"threshold": threshold}
    if base is None or head is None:
        why = "; ".join(f"{side}: {w}" for side, w in (("base", base_why), ("head", head_why)) if w)
        return CountComparison("unrepeatable", f"host work count not repeatable ({why})", **common)
    shown = {"base": _shown(base), "head": _shown(head)}
    fastpath = {side: c["fastpath"] for side, c in (("base", base), ("head", head)) if c["fastpath"]}
    differs = environment_differences(base["environment"], head["environment"])
    if differs:
        text = ", ".join(f"{k} {a} vs {b}" for k, (a, b) in differs.items())
        return CountComparison(
            "incomparable", f"host work counted in different environments ({text})", **common, **shown
        )
    if fastpath and base["fastpath"] != head["fastpath"]:
        return CountComparison(
            "unseen",
            f"the call runs attnkit's compiled fast path, another build on each side "
            f"({base['fastpath']} vs {head['fastpath']}): its C++ work is not counted",
            fastpath=fastpath,
            **common,
            **shown,
        )
    ratios = {k: (head[k] / base[k] if base[k] else None) for k in _KEYS}
    grew = [k for k in _KEYS if head[k] > base[k] * (1 + threshold)]
    dropped = [k for k in _KEYS if head[k] * (1 + threshold) < base[k]]
    text = ", ".join(f"{_LABELS[k]} {base[k]} -> {head[k]}" for k in _KEYS)
    via = " (through the compiled fast path, one build on both sides)" if fastpath else ""
    if grew:
        outcome, reason = "grew", f"host work per call grew past {threshold:.1%}: {text}{via}"
    elif dropped:
        outcome, reason = "faster", f"host work per call dropped past {threshold:.1%}: {text}{via}"
    else:
        outcome, reason = "same", f"host work per call within {threshold:.1%}: {text}{via}"
    ratios = {k: (None if r is None else round(r, 5)) for k, r in ratios.items()}
    return CountComparison(outcome, reason, ratios=ratios, fastpath=fastpath, **common, **shown)


def count_decision(count: CountComparison) -> Decision:
    """The host metric's decision where the count decides it (:attr:`CountComparison.decides`).
    It has no ratio: the host metric's ratio is wall time's (A/A runs build its noise from it,
    :mod:`attnkit_perf.decide.noise`); the counts' ratios are in its ``count`` block."""
    if not count.decides:
        raise ValueError(f"count outcome {count.outcome!r} does not decide the host metric")
    d = Decision(count.outcome, threshold=count.threshold, reason=count.reason)
    d.extra["count"] = count.summary()
    return d


# --- stored mode -----------------------------------------------------------------------------

#: What stored mode says of a host row whose count grew: it cannot time the growth on this
#: machine against the baseline's (hosts differ by machine far more than the change).
STORED_GREW = (
    "stored mode cannot time it against another machine's host: compare in paired mode "
    "(--attnkit-base=<the baseline's commit>)"
)


def stored_comparison(base_info: Mapping, head_info: Mapping, threshold: float) -> CountComparison | None:
    """A stored benchmark's count against its baseline entry's (``extra_info["host_count"]``),
    or None where this run did not count it. A baseline without a count (recorded before counts
    were kept) is incomparable, and says so."""
    head = head_info.get("host_count")
    if head is None:
        return None
    base = base_info.get("host_count")
    if base is None:
        return CountComparison(
            "incomparable",
            "the baseline has no host work count (recorded before counts were kept): re-record it",
            threshold,
            head=_shown(head),
        )
    return compare_counts([base], [head], threshold)


def _wall_us(info: Mapping) -> float | None:
    seconds = (info.get("host") or {}).get("per_call_s")
    return None if seconds is None else round(seconds * 1e6, 3)


def stored_host_block(count: CountComparison, base_info: Mapping, head_info: Mapping) -> dict:
    """The verdict row's ``host`` block of a stored benchmark: the count's outcome (same or
    faster where it decides, else inconclusive), beside each side's recorded wall time per call
    (shown, not compared: the hosts are different machines)."""
    outcome = count.outcome if count.decides else "inconclusive"
    reason = f"{count.reason}; {STORED_GREW}" if count.outcome == "grew" else count.reason
    return {
        "outcome": outcome,
        "reason": reason,
        "base_us": _wall_us(base_info),
        "head_us": _wall_us(head_info),
        "ratio": None,  # wall time's, which stored mode does not compare across machines
        "ci": None,
        "p": None,
        "threshold": count.threshold,
        "processes": None,
        "base_process_us": None,
        "head_process_us": None,
        "cpu_us": None,
        "dropped_batches": None,
        "count": count.summary(),
    }


def with_stored_count(
    decision: Decision, base_info: Mapping, head_info: Mapping, threshold: float
) -> Decision:
    """A stored row with its host work count applied: the ``host`` block, and

    * where its time was not compared (host-bound on both machines,
      :func:`attnkit_perf.decide.hostbound.stored_exempt`) and the count decides, the count's
      outcome is the row's (the host work is what sets its time);
    * where the count grew, a row that read same or faster is inconclusive (:data:`STORED_GREW`);
    * a count that cannot speak for the row (unrepeatable, unseen, incomparable) is shown only.
    """
    count = stored_comparison(base_info, head_info, threshold)
    if count is None:
        return decision
    decision.extra["host"] = stored_host_block(count, base_info, head_info)
    note = f"host work count: {count.outcome} ({count.reason})"
    exempt = decision.extra.get("time_compared") is False and decision.outcome == "inconclusive"
    if exempt and count.decides:
        decision.outcome = "same"
        decision.reason = f"{note}; {decision.reason}"
    elif count.outcome == "grew" and decision.outcome in ("same", "faster"):
        decision.reason = f"{note}; {STORED_GREW}; time: {decision.outcome} ({decision.reason})"
        decision.outcome = "inconclusive"
    else:
        decision.reason = f"{decision.reason}; {note}"
    return decision
