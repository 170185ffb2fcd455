"""The statistics the gate decides with, all from scipy (well kept, tested against references):

* stored mode (two independent sample sets): a one-sided Mann-Whitney U test and a bootstrap
  interval for the ratio of medians;
* paired mode (A/B blocks measured back to back): the median log ratio of the pairs, its
  bootstrap interval, and a Wilcoxon signed-rank test.

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


@dataclass(frozen=True)
class PairedEstimate:
    """The B/A time ratio estimated from paired blocks.

    ``ratio``: exp of the median of the pairs' log ratios (robust to a disturbed pair);
    ``low``/``high``: a percentile bootstrap interval of that median at ``confidence``;
    ``p_slower``/``p_faster``: one-sided Wilcoxon signed-rank p-values of the log ratios;
    ``pairs``: how many pairs.
    """

    ratio: float
    low: float
    high: float
    p_slower: float
    p_faster: float
    pairs: int
    confidence: float


def paired_ratio(base_blocks, head_blocks, confidence: float = 0.99, seed: int = 0) -> PairedEstimate:
    """Estimate head/base from block medians measured as adjacent pairs (same index = same pair).

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
    return PairedEstimate(
        ratio=math.exp(centre),
        low=math.exp(low),
        high=math.exp(high),
        p_slower=p_slower,
        p_faster=p_faster,
        pairs=len(logs),
        confidence=confidence,
    )
