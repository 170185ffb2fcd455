"""The host metric's decision (host time per call, paired mode) and the kept-memory rule (both
modes), and how they join a benchmark's GPU-time decision into one row.

**Host time per call.** Measured only where the host work count does not decide the host
metric (:mod:`attnkit_perf.decide.hostcount`: the count grew, or cannot speak for the row).
Each side's worker processes measure it directly
(:mod:`attnkit_perf.measure.host`), one value per process: the median of its batches. The
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

**Looks.** Four processes per side settle a quiet host, not a noisy one: at a process sd of
2-3% a +10% change was inconclusive as often as slower. So one measurement may look up to
``looks`` times: while it is inconclusive, every worker is replaced by a fresh process and the
fresh processes' values join the earlier ones (:mod:`attnkit_perf.measure.host_rounds`), and
the decision is taken again over all of them. The level and the "same" miss rate are spent
evenly over the planned looks (Bonferroni), so the extra looks cost no false alarms; in the
gate's simulations (``tests/gate/test_host.py``) three looks of 4 processes make a +10% change
slower in every measurement at a process sd of 2-3%, where one look made it so in 78% and 33%.

``t`` is :func:`attnkit_perf.decide.gate.benchmark_threshold` of the benchmark's host noise (the
A/A noise file's entry :func:`attnkit_perf.formats.noise.host_noise_name`) with
``Thresholds.host_slower`` as the practical floor: no fixed host-bound floor.

**Kept memory.** A deterministic reading (allocator bytes still held after a fixed number of
calls whose outputs were dropped): **kept-memory** when the head keeps more than
``max(kept_abs_bytes, memory_rel x the base's)`` beyond what the base keeps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from attnkit_perf.decide.gate import Decision, Thresholds

#: Confidence of the upper bound that must lie below the threshold for "same", over all looks.
HOST_SAME_CONFIDENCE = 0.95
#: Outcomes a joined row keeps over the host metric's slower or inconclusive.
_WORSE_THAN_SLOWER = ("error", "dropped")


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


def host_summary(host: Decision, cpu: dict | None = None, dropped: dict | None = None) -> dict:
    """The verdict row's ``host`` block: the host metric's outcome and evidence beside the GPU
    time's (the host work count's, and the wall time's where it was measured). ``cpu``:
    ``{"base", "head"}`` median thread CPU time per call (s), the cross-check; ``dropped``:
    preempted batches dropped per side."""
    extra = host.extra
    median = {side: _median_or_none(extra.get(f"{side}_us")) for side in ("base", "head")}
    return {
        "outcome": host.outcome,
        "reason": host.reason,
        "base_us": median["base"],
        "head_us": median["head"],
        "ratio": host.ratio,
        "ci": list(host.ci) if host.ci else None,
        "p": host.p,
        "threshold": host.threshold,
        "processes": extra.get("processes"),
        "base_process_us": extra.get("base_us"),
        "head_process_us": extra.get("head_us"),
        "cpu_us": None if cpu is None else {k: _us(v) for k, v in cpu.items()},
        "dropped_batches": dropped,
        # The host work count (attnkit_perf.decide.hostcount), when it was counted.
        "count": extra.get("count"),
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


def kept_limit(base_kept: int, t: Thresholds) -> float:
    return max(t.kept_abs_bytes, t.memory_rel * max(base_kept, 0))


def with_kept(d: Decision, base_kept: int | None, head_kept: int | None, t: Thresholds) -> Decision:
    """``d`` with the kept-memory rule applied: the row's ``kept`` block, and the outcome
    kept-memory where the head keeps more beyond the limit and nothing graver was found."""
    if base_kept is None or head_kept is None:
        return d
    limit = kept_limit(base_kept, t)
    grew = head_kept - base_kept > limit
    d.extra["kept"] = {"base_bytes": base_kept, "head_bytes": head_kept, "limit_bytes": int(limit)}
    if grew and d.outcome not in ("error", "dropped", "slower", "more-memory"):
        d.reason = (
            f"memory kept after the calls {base_kept} -> {head_kept} B (+{head_kept - base_kept} B > "
            f"{int(limit)} B); time: {d.outcome} ({d.reason})"
        )
        d.outcome = "kept-memory"
    return d
