"""The statistics the gate decides with, all from scipy (well kept, tested against references):

* stored mode (two independent sample sets): a one-sided Mann-Whitney U test and a bootstrap
  interval for the ratio of medians;
* paired mode (A/B blocks measured back to back): the median log ratio of the pairs, its
  bootstrap interval, a Wilcoxon signed-rank test, and an interval over the worker processes
  that measured the pairs (:func:`process_interval`), for the claim "not slower".

Every function validates its samples first (:func:`sample_problem`): too few, non-finite,
non-positive or constant samples are *no evidence*, which the gate reports as inconclusive —
never as "same".
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

#: Fewest samples a side needs before any test is run on it.
MIN_SAMPLES = 5


def sample_problem(samples, what: str, minimum: int = MIN_SAMPLES) -> str | None:
    """Why ``samples`` cannot serve as evidence, or None when they can."""
    if samples is None:
        return f"{what}: no samples"
    try:
        values = np.asarray(samples, dtype=float)
    except (TypeError, ValueError):
        return f"{what}: samples are not numbers"
    if values.ndim != 1:
        return f"{what}: samples are not a flat list"
    if len(values) < minimum:
        return f"{what}: {len(values)} samples, at least {minimum} needed"
    if not np.isfinite(values).all():
        return f"{what}: samples contain NaN or infinity"
    if (values <= 0).any():
        return f"{what}: samples contain non-positive times"
    if np.ptp(values) == 0:
        return f"{what}: every sample is identical (a broken timer, not a measurement)"
    return None


def mann_whitney_greater(sample, reference) -> float:
    """p-value of the one-sided Mann-Whitney U test that ``sample`` tends to be larger."""
    return float(stats.mannwhitneyu(sample, reference, alternative="greater", method="auto").pvalue)


def bootstrap_ratio_ci(reference, sample, confidence: float = 0.99, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``median(sample) / median(reference)``."""

    def ratio_of_medians(ref, new, axis=-1):
        return np.median(new, axis=axis) / np.median(ref, axis=axis)

    result = stats.bootstrap(
        (np.asarray(reference, float), np.asarray(sample, float)),
        ratio_of_medians,
        confidence_level=confidence,
        n_resamples=999,
        method="percentile",
        vectorized=True,
        **_generator(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def median_interval(values, confidence: float, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``values`` (2000 resamples)."""
    interval = stats.bootstrap(
        (np.asarray(values, dtype=float),),
        np.median,
        confidence_level=confidence,
        n_resamples=2000,
        method="percentile",
        **_generator(seed),
    ).confidence_interval
    return float(interval.low), float(interval.high)


def _generator(seed: int) -> dict:
    """``stats.bootstrap``'s seeded generator argument: scipy >= 1.15 names it ``rng``, older
    releases ``random_state``."""
    name = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    return {name: np.random.default_rng(seed)}


def median(values) -> float:
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else math.nan


def process_interval(logs, clusters, confidence: float) -> tuple[float, float] | None:
    """One-sided ``confidence`` bounds ``(lower, upper)`` of the mean log ratio when pairs cluster
    on worker processes (``clusters[i]``: the process pairing that measured pair ``i``), or None
    with fewer than two processes.

    Each process carries an offset of its own that every pair it measured shares, so pairs are
    not independent and an interval that resamples them as if they were is too narrow: with
    process offsets of 0.5-1% it called a true slowdown of exactly the threshold "same" in
    11-14% of simulated benchmarks, against a nominal 0.5%. The process is the unit here: each
    one's median log ratio, then a Student t interval over those G medians with G - 1 degrees of
    freedom (the small-sample rule for few clusters; a cluster bootstrap over 4 processes has
    only 4^4 resamples and undercovers)."""
    logs, clusters = np.asarray(logs, dtype=float), np.asarray(clusters)
    groups = np.unique(clusters)
    if len(groups) < 2:
        return None
    centres = np.array([np.median(logs[clusters == g]) for g in groups])
    mean = float(centres.mean())
    half = float(stats.t.ppf(confidence, len(groups) - 1) * centres.std(ddof=1) / math.sqrt(len(groups)))
    return mean - half, mean + half


@dataclass(frozen=True)
class PairedEstimate:
    """The B/A time ratio estimated from paired blocks.

    ``ratio``: exp of the median of the pairs' log ratios (robust to a disturbed pair);
    ``low``/``high``: a percentile bootstrap interval of that median at ``confidence``, the pairs
    taken as independent (what one set of worker processes shows);
    ``lower``/``upper``: one-sided ``confidence`` bounds over the processes
    (:func:`process_interval`), or ``low``/``high`` when the processes are not known;
    ``p_slower``/``p_faster``: one-sided Wilcoxon signed-rank p-values of the log ratios;
    ``pairs``: how many pairs; ``processes``: how many process pairings measured them.
    """

    ratio: float
    low: float
    high: float
    p_slower: float
    p_faster: float
    pairs: int
    confidence: float
    lower: float
    upper: float
    processes: int | None = None


def paired_ratio(
    base_blocks, head_blocks, confidence: float = 0.99, seed: int = 0, clusters=None
) -> PairedEstimate:
    """Estimate head/base from block medians measured as adjacent pairs (same index = same pair);
    ``clusters[i]``, when given, names the worker processes that measured pair ``i``.

    Working on log ratios makes a slowdown and the matching speed-up symmetric, and pairing
    cancels what drifts slowly (clocks, temperature) because both blocks of a pair ran within
    milliseconds of each other.
    """
    logs = np.log(np.asarray(head_blocks, dtype=float)) - np.log(np.asarray(base_blocks, dtype=float))
    centre = float(np.median(logs))
    if np.ptp(logs) == 0:
        low = high = centre
    else:
        low, high = median_interval(logs, confidence, seed)
    if np.any(logs != 0):
        p_slower = float(stats.wilcoxon(logs, alternative="greater").pvalue)
        p_faster = float(stats.wilcoxon(logs, alternative="less").pvalue)
    else:
        p_slower = p_faster = 1.0
    bounds = None if clusters is None else process_interval(logs, clusters, confidence)
    lower, upper = bounds if bounds is not None else (low, high)
    return PairedEstimate(
        ratio=math.exp(centre),
        low=math.exp(low),
        high=math.exp(high),
        p_slower=p_slower,
        p_faster=p_faster,
        pairs=len(logs),
        confidence=confidence,
        lower=math.exp(lower),
        upper=math.exp(upper),
        processes=None if bounds is None else len(set(clusters)),
    )
