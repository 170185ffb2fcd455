"""Statistics over per-round samples: a one-sided Mann-Whitney U test and a bootstrap interval
for the ratio of medians. numpy only, deterministic (fixed bootstrap seed), fast enough to run
thousands of times in the gate's simulation tests.
"""

from __future__ import annotations

import math

import numpy as np


def _rank(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks (1-based) of ``values`` and the sizes of the tie groups."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    _, first, counts = np.unique(sorted_values, return_index=True, return_counts=True)
    average = first + (counts + 1) / 2.0
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(average, counts)
    return ranks, counts


def mann_whitney_greater(sample: list[float], reference: list[float]) -> float:
    """p-value of the one-sided Mann-Whitney U test that ``sample`` tends to be larger than
    ``reference`` (normal approximation with tie and continuity correction: the gate compares
    dozens of samples per side, where it is accurate to well under the alphas used).

    1.0 when either side has fewer than 2 samples: no evidence.
    """
    a = np.asarray(sample, dtype=float)
    b = np.asarray(reference, dtype=float)
    n1, n2 = len(a), len(b)
    if n1 < 2 or n2 < 2:
        return 1.0
    ranks, ties = _rank(np.concatenate([a, b]))
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    tie_term = ((ties**3 - ties).sum()) / (n * (n - 1))
    variance = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if variance <= 0:
        return 1.0
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def bootstrap_ratio_ci(
    reference: list[float], sample: list[float], confidence: float = 0.99, resamples: int = 400, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``median(sample) / median(reference)``."""
    a = np.asarray(reference, dtype=float)
    b = np.asarray(sample, dtype=float)
    if len(a) == 0 or len(b) == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    ref_medians = np.median(a[rng.integers(0, len(a), (resamples, len(a)))], axis=1)
    new_medians = np.median(b[rng.integers(0, len(b), (resamples, len(b)))], axis=1)
    ratios = new_medians / ref_medians
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(ratios, [tail, 100.0 - tail])
    return float(low), float(high)


def median(values: list[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else math.nan
