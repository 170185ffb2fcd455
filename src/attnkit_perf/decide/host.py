"""The host metric's rules, on :mod:`attnkit_perf.measure.host`'s measurements: the host work
count (both modes), host time per call (paired mode), host-bound benchmarks (both modes) and the
kept-memory rule (both modes), and how each joins a benchmark's GPU-time decision into one row.

**Host work, counted** (:func:`compare_counts`): Python bytecode instructions and C calls per
call, base against head. A count does not vary between runs, processes or machines of one
environment, so it needs no statistics: equal counts are the same host work, and a "same" host
row needs no wall-time rounds and no fresh processes. With ``t`` the option
``--attnkit-host-count-slower`` (:attr:`attnkit_perf.decide.gate.Thresholds.host_count_slower`):

* **same**: neither count grew by more than ``t`` (relative to the base's), and not both
  dropped by more than it;
* **faster**: the instructions or the C calls dropped by more than ``t`` and neither grew by more;
* **grew**: either count grew by more than ``t``. A count says how much more work, not how much
  more time (a C call may take 50 ns or a synchronisation's milliseconds), so host time per call
  then decides whether it costs time, and a slowdown it finds is confirmed and fails the row as
  before.

The count is not used, and host time per call decides, where it cannot speak for the row (the
reason says which):

* **unrepeatable**: the counted calls of one side disagree (between two calls of one process or
  between its processes): something besides the code moves the count;
* **unseen**: the call entered attnkit's compiled fast path and the two sides' fast paths are not
  the same build (its module's name carries its source's digest): the C++ work is invisible
  to a count. With one build on both sides the C++ is the same, and the count of the Python
  around it decides;
* **incomparable**: the counts come from different environments (Python, torch, Triton, or the
  counting mechanism: :func:`attnkit_perf.measure.host.count_environment`).

**Host time per call** (:func:`decide_host`, paired mode), where the count grew or cannot speak.
Each side's worker processes measure it, one value per process: the median of its batches. The
process is the unit of replication: host time moves between processes (code and heap placement,
which core's caches it warmed) far more than between batches of one process, so batches are
never counted as independent evidence. Process ``i`` of the base and process ``i`` of the head
measured interleaved, so their log ratio is one observation; over the ``G`` pairs of processes:

* the ratio is ``exp(mean log ratio)``;
* **slower**: the ratio is at least ``1 + t`` and a one-sided t-test over the ``G`` log ratios
  (``G - 1`` degrees of freedom) rejects "no slowdown" at ``sqrt(alpha) / looks`` when a
  slowdown must show again on fresh processes before it fails (two independent measurements:
  ``alpha``), at ``alpha / looks`` otherwise: the one-sided lower bound at that level is above 1;
* **faster**: the mirror image (never confirmed: it fails nothing);
* **same**: the one-sided ``1 - 5% / looks`` upper bound of the t-interval lies below
  ``1 + t``: a true change of exactly ``t`` is called same in at most 5%
  (:data:`HOST_SAME_CONFIDENCE`) of measurements over all their looks;
* **inconclusive** otherwise, or with fewer than two processes or a non-positive time.

Four processes per side settle a quiet host, not a noisy one: at a process sd of 2-3% a +10%
change was inconclusive as often as slower. So one measurement may look up to ``looks`` times:
while it is inconclusive, every worker is replaced by a fresh process and the fresh processes'
values join the earlier ones (:func:`attnkit_perf.measure.host.extend_host`), and the decision
is taken again over all of them. The level and the "same" miss rate are spent evenly over the
planned looks (Bonferroni), so the extra looks cost no false alarms; in the gate's simulations
(``tests/gate/test_host.py``) three looks of 4 processes make a +10% change slower in every
measurement at a process sd of 2-3%, where one look made it so in 78% and 33%. ``t`` is
:func:`attnkit_perf.decide.gate.benchmark_threshold` of the benchmark's host noise (the A/A
noise file's entry :func:`attnkit_perf.formats.noise.host_noise_name`) with
``Thresholds.host_slower`` as the practical floor: no fixed host-bound floor.

**Host-bound benchmarks**: those whose time the host's work (Python, dispatch, launches) sets.
A benchmark's *host share* (:func:`attnkit_perf.measure.timing.host_share`) is the part of its
measured time in which the GPU waited for the host; at :data:`HOST_BOUND_SHARE` or more the host
set the time. Host-bound times move by tens of percent between worker processes and between
machines, far more than GPU times, so:

* **paired mode** holds a benchmark that is host-bound on *both* sides, in *every* measurement
  of it, to at least ``Thresholds.host_bound_slower`` (:func:`paired_limit`). Neither side alone
  may loosen the rule: a change that adds host work to a GPU-bound benchmark raises only the
  head's share, and must be judged by the GPU rule, which then sees the slowdown. The host work
  itself is guarded by the count and the host time per call, which have no such floor;
* **stored mode** does not compare a host-bound benchmark's time across machines at all
  (:func:`stored_exempt`: inconclusive, with :data:`STORED_HOST_BOUND` as the reason; its
  memory is still compared): only where the baseline *and* this run were host-bound, so a
  change that makes a benchmark host-bound cannot exempt itself. Its host work count, compared
  against the baseline's, may decide it instead (:func:`with_stored_count`).

**Kept memory** (:func:`with_kept`): a deterministic reading (allocator bytes still held after a
fixed number of calls whose outputs were dropped): **kept-memory** when the head keeps more than
``max(kept_abs_bytes, memory_rel x the base's)`` beyond what the base keeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from attnkit_perf.decide.gate import Decision, Thresholds

# --- host work, counted ------------------------------------------------------------------------

#: Outcomes of a count comparison that decide the host metric without wall time.
DECIDING = ("same", "faster")
#: The two counts, and how a reason names them.
_COUNTS = {"instructions": "instructions", "c_calls": "C calls"}


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
    :func:`attnkit_perf.measure.host.host_count` answer), or ``(None, why not)`` when they
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
    return {k: count[k] for k in _COUNTS}


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
    ratios = {k: (head[k] / base[k] if base[k] else None) for k in _COUNTS}
    grew = [k for k in _COUNTS if head[k] > base[k] * (1 + threshold)]
    dropped = [k for k in _COUNTS if head[k] * (1 + threshold) < base[k]]
    text = ", ".join(f"{_COUNTS[k]} {base[k]} -> {head[k]}" for k in _COUNTS)
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


# --- host time per call ------------------------------------------------------------------------

#: Confidence of the upper bound that must lie below the threshold for "same", over all looks.
HOST_SAME_CONFIDENCE = 0.95


def _problem(base: Sequence[float], head: Sequence[float]) -> str | None:
    if len(base) != len(head):
        return f"{len(base)} base processes against {len(head)} head processes: not paired"
    if len(base) < 2:
        return f"{len(base)} process pairs, at least 2 needed"
    values = np.asarray([*base, *head], dtype=float)
    if not np.isfinite(values).all() or (values <= 0).any():
        return "host times contain non-positive or non-finite values"
    return None


def decide_host(
    base: Sequence[float],
    head: Sequence[float],
    threshold: float,
    alpha: float,
    confirmed: bool,
    looks: int = 1,
) -> Decision:
    """Decide the host time per call from per-process values: ``base[i]`` and ``head[i]``
    (seconds per call) were measured by the ``i``-th processes of each side, interleaved.
    ``looks``: the most times this measurement may be decided as fresh processes join it;
    each look is held to its share of the level and of the "same" miss rate (module docstring)."""
    problem = _problem(base, head)
    if problem:
        return Decision("inconclusive", threshold=threshold, alpha=alpha, reason=problem)
    logs = np.log(np.asarray(head, dtype=float)) - np.log(np.asarray(base, dtype=float))
    groups = len(logs)
    mean = float(logs.mean())
    se = float(logs.std(ddof=1)) / math.sqrt(groups)
    # Alpha spent evenly over the planned looks (Bonferroni): a measurement that may be
    # decided up to ``looks`` times calls noise slower at most ``level`` in all. A speed-up is
    # held to the same level (it never fails a run, so it is not confirmed).
    level = (math.sqrt(alpha) if confirmed else alpha) / looks
    if se > 0:
        p_slower = float(stats.t.sf(mean / se, groups - 1))
        p_faster = float(stats.t.cdf(mean / se, groups - 1))
    else:  # every process pair read the same ratio: the sign of the mean is the evidence
        p_slower, p_faster = float(mean <= 0), float(mean >= 0)
    confidence = 1.0 - (1.0 - HOST_SAME_CONFIDENCE) / looks
    ratio = math.exp(mean)
    up, down = 1.0 + threshold, 1.0 / (1.0 + threshold)
    faster = ratio <= down and p_faster < level
    # The bounds reported are the ones that decide: the lower at the slowdown test's level (above
    # 1 exactly when the t-test rejects "no slowdown"), the upper at the confidence "same" needs,
    # or for a speed-up at the level it passed (below 1). One interval at one confidence once
    # showed "slower" over bounds [0.631, 112.762].
    lower_at = 1.0 - level
    upper_at = 1.0 - level if faster else confidence
    lower = math.exp(mean - float(stats.t.ppf(lower_at, groups - 1)) * se)
    upper = math.exp(mean + float(stats.t.ppf(upper_at, groups - 1)) * se)
    text = (
        f"host x{ratio:.4f} over {groups} processes, bounds [{lower:.4f} at {lower_at:.1%}, "
        f"{upper:.4f} at {upper_at:.1%}]"
    )
    common = {"ratio": ratio, "ci": (lower, upper), "threshold": threshold, "alpha": alpha}
    if ratio >= up and p_slower < level:
        d = Decision("slower", p=p_slower, reason=f"{text}, p={p_slower:.1e} >= x{up:.3f}", **common)
    elif faster:
        d = Decision("faster", p=p_faster, reason=f"{text}, p={p_faster:.1e}", **common)
    elif upper < up:
        d = Decision("same", p=p_slower, reason=f"{text}: below x{up:.3f}", **common)
    else:
        d = Decision("inconclusive", p=p_slower, reason=f"{text}: cannot tell at x{up:.3f}", **common)
    d.extra.update(
        processes=groups,
        log_ratios=[round(float(x), 5) for x in logs],
        base_us=[round(x * 1e6, 3) for x in base],
        head_us=[round(x * 1e6, 3) for x in head],
    )
    return d


# --- the row's host block ----------------------------------------------------------------------

#: Outcomes a joined row keeps over the host metric's slower or inconclusive.
_WORSE_THAN_SLOWER = ("error", "dropped")


def host_summary(host: Decision, cpu: dict | None = None, dropped: dict | None = None) -> dict:
    """The verdict row's ``host`` block (stored mode's through :func:`stored_host_block`): the host
    metric's outcome and evidence beside the GPU time's (the host work count's, and the wall
    time's where it was measured). ``cpu``:
    ``{"base", "head"}`` median thread CPU time per call (s), the cross-check; ``dropped``:
    preempted batches dropped per side."""
    extra = host.extra
    return {
        "outcome": host.outcome,
        "reason": host.reason,
        "base_us": _median_or_none(extra.get("base_us")),
        "head_us": _median_or_none(extra.get("head_us")),
        "ratio": host.ratio,
        "ci": list(host.ci) if host.ci else None,
        "p": host.p,
        "threshold": host.threshold,
        "processes": extra.get("processes"),
        "base_process_us": extra.get("base_us"),
        "head_process_us": extra.get("head_us"),
        "cpu_us": None if cpu is None else {k: _us(v) for k, v in cpu.items()},
        "dropped_batches": dropped,
        "count": extra.get("count"),  # the host work count's block, when it was counted
    }


def _median_or_none(values) -> float | None:
    return None if not values else round(float(np.median(values)), 3)


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e6, 3)


def join_host(time: Decision, host: Decision, summary: dict) -> Decision:
    """The row's decision: the GPU time's, failed by a host slowdown, and never "same" while the
    host metric cannot tell. The row's ratio stays the GPU time's; ``summary``
    (:func:`host_summary`) goes to the row's ``host`` block."""
    time.extra["host"] = summary
    note = f"host: {host.outcome} ({host.reason})"  # the count's reason or the wall time's
    if time.outcome in _WORSE_THAN_SLOWER or host.outcome in ("same", "faster", "new"):
        time.reason = f"{time.reason}; {note}"
    elif host.outcome == "slower" and time.outcome != "slower":
        time.reason = f"{note}; GPU time: {time.outcome} ({time.reason})"
        time.outcome = "slower"
    elif host.outcome == "inconclusive" and time.outcome in ("same", "faster"):
        time.reason = f"{note}; GPU time: {time.outcome} ({time.reason})"
        time.outcome = "inconclusive"
    else:
        time.reason = f"{time.reason}; {note}"
    return time


# --- host-bound benchmarks ---------------------------------------------------------------------

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
    """Whether a paired benchmark is host-bound by one measurement (:func:`paired_share`)."""
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


# --- kept memory -------------------------------------------------------------------------------


def kept_limit(base_kept: int, t: Thresholds) -> float:
    """The most the head may keep beyond what the base keeps."""
    return max(t.kept_abs_bytes, t.memory_rel * max(base_kept, 0))


def with_kept(d: Decision, base_kept: int | None, head_kept: int | None, t: Thresholds) -> Decision:
    """``d`` with the kept-memory rule applied: the row's ``kept`` block, and the outcome
    kept-memory where the head keeps more beyond the limit and nothing graver was found."""
    if base_kept is None or head_kept is None:
        return d
    limit = kept_limit(base_kept, t)
    grew = head_kept - base_kept > limit
    d.extra["kept"] = {"base_bytes": base_kept, "head_bytes": head_kept, "limit_bytes": int(limit)}
    if grew and d.outcome not in (*_WORSE_THAN_SLOWER, "slower", "more-memory"):
        d.reason = (
            f"memory kept after the calls {base_kept} -> {head_kept} B (+{head_kept - base_kept} B > "
            f"{int(limit)} B); time: {d.outcome} ({d.reason})"
        )
        d.outcome = "kept-memory"
    return d


# --- stored mode -------------------------------------------------------------------------------

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


def stored_host_block(count: CountComparison, base_info: Mapping, head_info: Mapping) -> dict:
    """The verdict row's ``host`` block of a stored benchmark: the count's outcome (same or
    faster where it decides, else inconclusive), beside each side's recorded wall time per call
    (shown, not compared: the hosts are different machines)."""
    outcome = count.outcome if count.decides else "inconclusive"
    reason = f"{count.reason}; {STORED_GREW}" if count.outcome == "grew" else count.reason
    host = Decision(outcome, threshold=count.threshold, reason=reason, extra={"count": count.summary()})
    # Each side's recorded wall time, shown; no ratio: stored mode does not compare wall time
    # across machines.
    wall = {
        side: _us((info.get("host") or {}).get("per_call_s"))
        for side, info in (("base", base_info), ("head", head_info))
    }
    return {**host_summary(host), "base_us": wall["base"], "head_us": wall["head"]}


def with_stored_count(
    decision: Decision, base_info: Mapping, head_info: Mapping, threshold: float
) -> Decision:
    """A stored row with its host work count applied: the ``host`` block, and

    * where its time was not compared (host-bound on both machines,
      :func:`stored_exempt`) and the count decides, the count's
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
