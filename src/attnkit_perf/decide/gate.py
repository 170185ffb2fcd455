"""The gate's decision for one benchmark: same, slower, faster, more-memory or inconclusive.

Pure functions over samples, so they are tested on synthetic data without a GPU. Two modes:

**Paired** (the PR gate): the base and the head were measured on the same GPU in the same job,
in blocks interleaved A-B-B-A, each side in its own processes. Paired mode decides its GPU time
sequentially, over looks on fresh sets of processes (:mod:`attnkit_perf.decide.sequential`,
through :class:`attnkit_perf.decide.paired_rule.PairedRule`); :func:`decide_paired` is the
earlier fixed-sample rule (the B/A ratio and its interval from the pairs,
:func:`attnkit_perf.decide.stats.paired_ratio`), which no run calls: its simulations in
``tests/gate/test_decision.py`` are the baseline the sequential rule's are compared with.

**Stored** (:func:`decide_stored`, the history of record): the head's samples against a
baseline JSON recorded earlier, possibly on another card of the same model. The head's samples
are divided by the run's calibration *drift* first (the GPU kernels' for GPU-bound benchmarks,
the host's for host-bound ones), then compared by the ratio of medians, a Mann-Whitney U test
and a bootstrap interval.

In both, with ``t`` the benchmark's threshold (:func:`benchmark_threshold`) and ``alpha`` its
share of the run's false-alarm budget (:func:`per_benchmark_alpha`):

* **slower**: the ratio is >= 1 + t *and* significant at ``alpha`` (rank test; in paired mode
  the 99% interval also lies above 1). Two conditions guard false alarms: ``alpha`` bounds the
  chance that noise looks like a shift, and ``t`` ignores shifts too small to matter (and
  the few-tenths-of-a-percent offsets between processes that A/A runs show);
* **faster**: the mirror image (reported, never failing). In paired mode a speed-up that the
  interval shows but the rank test does not yet is inconclusive, so it is measured on rather
  than settled as "same";
* **same**: a slowdown of ``t`` is excluded and no speed-up was shown: the one-sided 99% upper
  bound lies below 1 + t (paired; the bound is taken over the worker processes, the unit that
  carries an offset of its own, :func:`attnkit_perf.decide.stats.process_interval`; one-sided,
  because the gate guards slowdowns: an interval such as [0.97, 1.01] settles the question it
  asks), or the ratio is below 1 + t and its interval excludes 1 + 2t (stored, where the two
  runs' noise is wider). Calling "same" wrongly is a miss, not a false alarm, so this bound
  needs no share of the run's budget; it is held to a miss rate of about 5% at exactly 1 + t
  over the session's repeated looks (the gate's decision tests simulate it);
* **inconclusive**: anything else — too few, NaN, non-positive or constant samples, or an
  interval too wide to tell. The caller measures more; still unclear, it is reported loudly,
  never as "same".

Memory is deterministic: **more-memory** when the peak grows by more than
``max(memory_abs_bytes, memory_rel * base_peak)``; **kept-memory** when the memory a call
keeps after it returns grows (:func:`attnkit_perf.decide.host.with_kept`, beside the host
metric's other rules).

Two outcomes say that a benchmark was not compared although it should have been, and fail:
**error** (its measurement raised) and **dropped** (the base ran it, the head declined it or
lost its backend; ``--attnkit-allow-dropped`` accepts that knowingly). **new** (the base cannot
run it) and **missing** (in the baseline, not selected in this run) are listed, never failing.

Two say that paired mode ran out of its time budget (:mod:`attnkit_perf.decide.out_of_time`):
**unfinished** (measured, cut before it was decided) and **not-reached** (never started). They
fail only under ``--attnkit-out-of-time=fail``; either way every such row is named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scipy.stats import norm

from attnkit_perf.decide.stats import (
    bootstrap_ratio_ci,
    mann_whitney_greater,
    median,
    paired_ratio,
    sample_problem,
)

#: Confidence of the bound that must lie within the threshold for "same" (one-sided, over the
#: worker processes in paired mode) and of the pairs' interval behind "slower" (two-sided).
SAME_CONFIDENCE = 0.99

MIB = 1024 * 1024


#: The kept-memory rule's resolution: the smallest growth of kept bytes it can call (one output of
#: the host-bound shape is about this size), and the largest drop a reading may show without
#: being an error (:func:`attnkit_perf.measure.host.kept_bytes`).
KEPT_ABS_BYTES = 64 * 1024


@dataclass(frozen=True)
class Thresholds:
    """Decision parameters; each is a CLI option and an ini key of the plugin.

    ``slower``: practical threshold (a fraction); a benchmark's own threshold may be larger
    (A/A noise). ``run_alpha``: the false-alarm probability allowed for a whole run, split
    evenly over its benchmarks (Bonferroni). ``noise_k``: how many A/A standard deviations a
    benchmark's threshold must clear; None (the default) derives it from the benchmark's alpha
    (:func:`noise_z`).
    """

    slower: float = 0.02
    run_alpha: float = 0.01
    memory_rel: float = 0.01
    memory_abs_bytes: int = MIB
    noise_k: float | None = None
    fail_on_inconclusive: bool = False
    #: Whether a row paired mode did not decide within its time budget (``--attnkit-time-budget``)
    #: fails the run (``--attnkit-out-of-time=fail``) or is named and passes (``pass``).
    fail_out_of_time: bool = False
    #: Accept benchmarks the base ran and the head no longer runs (outcome "dropped").
    allow_dropped: bool = False
    #: Host-bound benchmarks (the Python layer and launches set their time) moved by tens of
    #: percent between worker processes in A/A runs on the H100: in paired mode they are held to at
    #: least this (an A/A noise file may raise it), so they guard against gross per-call
    #: regressions only.
    host_bound_slower: float = 0.25
    #: The host metric's practical threshold (host time per call, :mod:`attnkit_perf.decide.host`):
    #: the smallest per-call host change worth failing; its A/A noise may raise it.
    host_slower: float = 0.05
    #: The host work count's growth past which wall time decides whether it costs time
    #: (:func:`attnkit_perf.decide.host.compare_counts`). Counts do not move without a code change, so this is
    #: no noise margin: it spares the wall-time rounds for changes too small to reach
    #: ``host_slower`` unless each added instruction cost 5x a call's average one; one C call more
    #: exceeds it in any call of fewer than 100 C calls (every host-bound row on the GPU grid).
    host_count_slower: float = 0.01
    #: Memory a call keeps after it returns (:func:`attnkit_perf.decide.host.with_kept`) may grow by at most
    #: ``max(kept_abs_bytes, memory_rel x the base's kept bytes)``: one output of the host-bound
    #: shapes is 128 KiB, the allocator's smallest block 512 B.
    kept_abs_bytes: int = KEPT_ABS_BYTES

    #: Stored-mode default: GPU-bound kernels of this grid differed by up to 6% between two fresh
    #: H100s measured the same day (docs/PERF_GATE.md), machines of one model more than runs of one.
    STORED_SLOWER = 0.10


def per_benchmark_alpha(t: Thresholds, benchmarks: int) -> float:
    """Each benchmark's significance level: the run's budget split over ``benchmarks``."""
    return t.run_alpha / max(1, benchmarks)


def noise_z(alpha: float, confirmed: bool) -> float:
    """A/A standard deviations a benchmark's threshold must clear for noise alone to fail it with
    probability at most ``alpha``.

    An A/A run's log ratio moves by about ``sd`` between measurements (process offsets the pairs
    cannot see). With threshold ``z x sd`` one measurement exceeds it with probability
    ``P(Z > z)``. A paired slowdown fails only when a second measurement on fresh processes
    (``confirmed``) exceeds it too: two independent draws, ``P(Z > z)^2 <= alpha``, so
    ``z = isf(sqrt(alpha))``; without that confirmation ``z = isf(alpha)``. For 106 benchmarks
    at a run alpha of 0.01 that is 2.34 and 3.73."""
    return float(norm.isf(math.sqrt(alpha) if confirmed else alpha))


def benchmark_threshold(t: Thresholds, noise_sd: float | None, alpha: float, confirmed: bool) -> float:
    """``max(practical, k x A/A standard deviation of the log ratio)``, as a fraction; ``k`` is
    ``t.noise_k`` when set, else :func:`noise_z` of the benchmark's ``alpha``."""
    if noise_sd is None or not math.isfinite(noise_sd):
        return t.slower
    k = t.noise_k if t.noise_k is not None else noise_z(alpha, confirmed)
    return max(t.slower, math.expm1(k * noise_sd))


def memory_grew(base_peak: int | None, head_peak: int | None, t: Thresholds) -> bool:
    if base_peak is None or head_peak is None:
        return False
    return head_peak - base_peak > max(t.memory_abs_bytes, t.memory_rel * base_peak)


@dataclass
class Decision:
    """The outcome for one benchmark and the evidence behind it (what the verdict row stores)."""

    outcome: str
    ratio: float | None = None
    ci: tuple[float, float] | None = None
    p: float | None = None
    threshold: float | None = None
    alpha: float | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        """Whether measuring more could not change the outcome (nor the time outcome kept under
        a memory one: a row that fails on memory still says whether it is also slower)."""
        if self.outcome == "more-memory":
            return self.extra.get("time_outcome") != "inconclusive"
        return self.outcome != "inconclusive"


def _with_memory(d: Decision, base_peak, head_peak, t: Thresholds) -> Decision:
    if memory_grew(base_peak, head_peak, t):
        d.extra["memory_growth_bytes"] = head_peak - base_peak
        if d.outcome != "slower":
            d.reason = f"peak {base_peak} -> {head_peak} B; time: {d.outcome} ({d.reason})"
            d.extra["time_outcome"] = d.outcome
            d.outcome = "more-memory"
    return d


def decide_paired(
    base_blocks,
    head_blocks,
    t: Thresholds,
    alpha: float,
    threshold: float,
    base_peak: int | None = None,
    head_peak: int | None = None,
    clusters=None,
) -> Decision:
    """Decide from block medians measured as adjacent A/B pairs (index i of each is pair i).

    ``clusters[i]``: the worker processes that measured pair ``i``. Given, "same" needs the
    upper bound over processes below ``1 + threshold``
    (:func:`attnkit_perf.decide.stats.process_interval`); without it the pairs are taken as
    independent."""
    problem = sample_problem(base_blocks, "base") or sample_problem(head_blocks, "head")
    if problem is None and len(base_blocks) != len(head_blocks):
        problem = f"{len(base_blocks)} base blocks against {len(head_blocks)} head blocks: not paired"
    if problem is None and clusters is not None and len(clusters) != len(head_blocks):
        problem = f"{len(clusters)} process labels for {len(head_blocks)} pairs"
    if problem:
        return _with_memory(Decision("inconclusive", reason=problem), base_peak, head_peak, t)
    est = paired_ratio(base_blocks, head_blocks, confidence=SAME_CONFIDENCE, clusters=clusters)
    up, down = 1.0 + threshold, 1.0 / (1.0 + threshold)
    common = {"ratio": est.ratio, "ci": (est.lower, est.upper), "threshold": threshold, "alpha": alpha}
    over = f" over {est.processes} processes" if est.processes else ""
    text = (
        f"x{est.ratio:.4f}, {SAME_CONFIDENCE:.0%} bounds{over} [{est.lower:.4f}, {est.upper:.4f}], "
        f"{est.pairs} pairs"
    )
    # The rank test's smallest p over n pairs is 2^-n: below alpha, "slower" cannot be reached.
    reachable = 0.5**est.pairs < alpha
    if est.ratio >= up and est.low > 1.0 and est.p_slower < alpha:
        d = Decision("slower", p=est.p_slower, reason=f"{text}, p={est.p_slower:.1e} >= x{up:.3f}", **common)
    elif est.ratio <= down and est.high < 1.0 and est.p_faster < alpha:
        d = Decision("faster", p=est.p_faster, reason=f"{text}, p={est.p_faster:.1e}", **common)
    elif est.ratio <= down and est.high < 1.0:
        # A speed-up shown by the interval but not yet at alpha (8 pairs cannot reach it: the
        # rank test's smallest p is 2^-8): "same" would misreport it, so measure on.
        why = f"looks faster, p={est.p_faster:.1e} not yet below {alpha:.1e}"
        d = Decision("inconclusive", p=est.p_faster, reason=f"{text}: {why}", **common)
    elif est.upper < up:
        d = Decision("same", p=est.p_slower, reason=f"{text}: below x{up:.3f}", **common)
    else:
        why = f"cannot tell at x{up:.3f}"
        if not reachable:
            why += f"; {est.pairs} pairs cannot show slower at alpha {alpha:.1e} (smallest p 2^-{est.pairs})"
        d = Decision("inconclusive", p=est.p_slower, reason=f"{text}: {why}", **common)
    logs = [math.log(h / b) for b, h in zip(base_blocks, head_blocks, strict=True)]
    d.extra.update(
        pairs=est.pairs,
        log_ratios=[round(x, 5) for x in logs],
        pairs_ci=[est.low, est.high],
        slower_reachable=reachable,
    )
    if est.processes:
        d.extra["processes"] = [int(c) for c in clusters]
    return _with_memory(d, base_peak, head_peak, t)


def decide_stored(
    base_samples,
    head_samples,
    drift: float,
    t: Thresholds,
    alpha: float,
    threshold: float,
    base_peak: int | None = None,
    head_peak: int | None = None,
    drift_text: str | None = None,
) -> Decision:
    """Decide the head's samples (divided by ``drift``) against a stored baseline's;
    ``drift_text`` says in the reason what was divided out (default: the drift)."""
    problem = sample_problem(base_samples, "baseline") or sample_problem(head_samples, "this run")
    if problem is None and not (math.isfinite(drift) and drift > 0):
        problem = f"calibration drift {drift} is not a positive number"
    if problem:
        return _with_memory(Decision("inconclusive", reason=problem), base_peak, head_peak, t)
    head = [s / drift for s in head_samples]
    ratio = median(head) / median(base_samples)
    # The one-sided rank test's smallest p over n and m samples is 1 / C(n + m, n).
    n, m = len(head), len(base_samples)
    reachable = math.lgamma(n + m + 1) - math.lgamma(n + 1) - math.lgamma(m + 1) > -math.log(alpha)
    p_slower = mann_whitney_greater(head, base_samples)
    p_faster = mann_whitney_greater(base_samples, head)
    low, high = bootstrap_ratio_ci(base_samples, head, confidence=0.99)
    up, down = 1.0 + threshold, 1.0 / (1.0 + threshold)
    common = {"ratio": ratio, "ci": (low, high), "threshold": threshold, "alpha": alpha}
    drift_text = drift_text or f"drift x{drift:.4f} divided out"
    text = f"x{ratio:.4f} ({drift_text}), 99% interval [{low:.4f}, {high:.4f}]"
    if ratio >= up and p_slower < alpha:
        d = Decision("slower", p=p_slower, reason=f"{text}, p={p_slower:.1e} < {alpha:.1e}", **common)
    elif ratio <= down and p_faster < alpha:
        d = Decision("faster", p=p_faster, reason=f"{text}, p={p_faster:.1e}", **common)
    elif ratio < up and high < 1.0 + 2.0 * threshold:
        d = Decision("same", p=p_slower, reason=text, **common)
    else:
        why = "not significant" if ratio >= up else f"interval reaches x{1 + 2 * threshold:.3f}"
        if not reachable:
            why += f"; {len(base_samples)} and {len(head)} samples cannot show slower at alpha {alpha:.1e}"
        d = Decision("inconclusive", p=p_slower, reason=f"{text}, p={p_slower:.1e}: {why}", **common)
    d.extra.update(drift=drift, slower_reachable=reachable)
    return _with_memory(d, base_peak, head_peak, t)


def confirm_slowdown(first: Decision, second: Decision) -> Decision:
    """A suspect re-measured (stored mode: minutes later; paired mode: by fresh worker
    processes): slower only when both say so. A first slower that the second measurement calls
    same was a disturbed stretch of time, or the offset of the processes that measured it."""
    if first.outcome != "slower":
        return first
    if second.outcome == "slower":
        if first.ratio < second.ratio:  # the slowdown both measurements support, with its bounds
            second.ratio, second.ci = first.ratio, first.ci
        second.reason = f"{first.reason}; re-measured: {second.reason}"
        return second
    second.reason = f"first measurement slower ({first.reason}), re-measured: {second.reason}"
    if second.outcome == "same":
        return second
    second.outcome = "inconclusive"
    return second
