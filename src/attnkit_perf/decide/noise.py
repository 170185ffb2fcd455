"""A/A noise as a bound: what a benchmark's spread between runs of unchanged code lets the gate
assume about its sigma (the file it comes from: :mod:`attnkit_perf.formats.noise`).

The gate holds each benchmark to ``max(practical threshold, k x sigma)``, ``k`` from the
benchmark's share of the false-alarm budget (:func:`attnkit_perf.decide.gate.benchmark_threshold`,
:func:`attnkit_perf.decide.gate.noise_z`), where ``sigma`` is not the few runs' standard deviation
but its one-sided :data:`SD_CONFIDENCE` upper confidence bound (:func:`sd_upper_bound`): three
runs' sd is below the true sigma half the time, and a threshold built on it fails unchanged code.
The gate lists the benchmarks whose noise keeps them from being guarded at the practical
threshold.
"""

from __future__ import annotations

import math

from scipy.stats import chi2

#: Confidence of the upper bound on an A/A standard deviation (:func:`sd_upper_bound`).
SD_CONFIDENCE = 0.9


def sd_upper_bound(sd: float, runs: int, confidence: float = SD_CONFIDENCE) -> float:
    """One-sided ``confidence`` upper bound on sigma from the sample sd of ``runs`` normal
    values: ``(runs - 1) s^2 / sigma^2`` is chi-square with ``runs - 1`` degrees of freedom, so
    ``sigma <= s sqrt((runs - 1) / chi2.ppf(1 - confidence, runs - 1))``; x3.08 the sd for 3
    runs, x1.92 for 7, x1.47 for 10."""
    if runs < 2:
        return math.inf
    return sd * math.sqrt((runs - 1) / chi2.ppf(1.0 - confidence, runs - 1))


def noise_sigmas(document: dict) -> dict[str, float]:
    """``{benchmark name: upper bound on its log-ratio sigma}`` (:func:`sd_upper_bound`) of an A/A
    noise document (:func:`attnkit_perf.formats.noise.read_noise`)."""
    return {
        name: sd_upper_bound(entry["log_ratio_sd"], len(entry["ratios"]) or document["runs"])
        for name, entry in document["benchmarks"].items()
    }
