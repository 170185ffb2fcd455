"""Regressions in one benchmark's history: sudden steps and slow drifts.

The series (per-run medians, oldest commit first) is first fitted with a piecewise-constant
function by asv's step detection (:func:`asv.step_detect.detect_steps`: the Potts model with an
automatically chosen penalty, L1 and so robust to an odd run); each point's *level* is the value
of its piece. A piece of one run between two others is an odd run, not a level, and takes the
level before it. Then, with the thresholds of :class:`Rule` (``detection.json``):

* a **step** is a rise from one piece to the next of at least ``step_min`` (new level / old
  level - 1); its commits are the last run at the old level and the first at the new one;
* a **drift** is a rise of at least ``drift_min`` within any ``drift_lookback`` runs once the
  steps inside are divided out: several small steps (or a slope) that no single step explains.
  asv's fit models correlated noise, and a slow rise is exactly that to it (it fits one piece to
  three 1.5% steps), so drifts are measured on a running median of ``drift_window`` runs
  instead. A noisy series needs more: the threshold is raised to ``drift_noise_z`` standard
  deviations of the ratio of two running medians, the noise estimated from consecutive runs
  (:func:`drift_threshold`), so 2% run-to-run noise does not read as drift. Overlapping windows
  merge, and the drift is reported from the last run near the lowest running median to the
  first near the highest.

A finding ``persists`` when the latest level still holds at least half of its rise.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from asv.step_detect import detect_steps

RULE_FILE = "detection.json"


@dataclass(frozen=True)
class Rule:
    """Thresholds of :func:`detect` (fractions of the old level; counts of runs)."""

    step_min: float
    drift_min: float
    drift_lookback: int
    drift_window: int
    drift_noise_z: float
    min_points: int

    @classmethod
    def load(cls, path: Path | str | None = None) -> Rule:
        """The rule in ``path``, or the packaged ``detection.json``."""
        if path is None:
            text = resources.files("attnkit_perf.history").joinpath(RULE_FILE).read_text()
        else:
            text = Path(path).read_text(encoding="utf8")
        data = json.loads(text)
        rule = cls(**{key: data[key] for key in cls.__dataclass_fields__})
        if (
            min(rule.step_min, rule.drift_min) <= 0
            or rule.drift_lookback < 2
            or rule.min_points < 3
            or rule.drift_window < 1
        ):
            raise ValueError(f"detection rule {path or RULE_FILE} is out of range: {rule}")
        return rule

    def as_dict(self) -> dict:
        return {key: getattr(self, key) for key in self.__dataclass_fields__}


@dataclass(frozen=True)
class Finding:
    """A rise of ``ratio`` (new level / old level) between point ``good`` (last at the old
    level) and point ``bad`` (first at the new one); for a drift, the steps inside are divided
    out of ``ratio``."""

    kind: str
    good: int
    bad: int
    ratio: float
    persists: bool


def levels(values: list[float]) -> list[float]:
    """The level of each point: asv's piecewise-constant fit, odd single runs smoothed over.

    values: one positive number per run, oldest first. Returns a list of the same length."""
    pieces = detect_steps(list(values))
    level = [0.0] * len(values)
    for index, (left, right, value, _min, _err) in enumerate(pieces):
        odd = right - left == 1 and 0 < index < len(pieces) - 1
        level[left:right] = [level[left - 1] if odd else value] * (right - left)
    return level


def running_median(values: list[float], window: int) -> list[float]:
    """The median of the ``window`` runs centred on each point (fewer at the ends)."""
    half = window // 2
    return [statistics.median(values[max(0, k - half) : k + half + 1]) for k in range(len(values))]


def run_noise(values: list[float]) -> float:
    """The run-to-run standard deviation of log(value), from consecutive runs (a step moves one
    difference of many, so the median ignores it): median |log ratio| / (0.6745 sqrt 2)."""
    diffs = [abs(math.log(b / a)) for a, b in itertools.pairwise(values)]
    return statistics.median(diffs) / (0.6745 * math.sqrt(2)) if diffs else 0.0


def drift_threshold(values: list[float], rule: Rule) -> float:
    """``drift_min``, raised for a noisy series to ``drift_noise_z`` standard deviations of the
    ratio of two running medians (each ~1.25 sigma / sqrt(window) for normal noise)."""
    spread = math.sqrt(2) * 1.2533 * run_noise(values) / math.sqrt(rule.drift_window)
    return max(rule.drift_min, rule.drift_noise_z * spread)


def detect(values: list[float], rule: Rule) -> tuple[list[float], list[Finding]]:
    """``(levels, findings)`` of one series; no findings below ``rule.min_points`` runs."""
    if len(values) < rule.min_points:
        return list(values), []
    level = levels(values)
    last = len(level) - 1
    findings = [
        Finding("step", k - 1, k, level[k] / level[k - 1], level[last] / level[k - 1] - 1 >= rise / 2)
        for k in range(1, len(level))
        if (rise := level[k] / level[k - 1] - 1) >= rule.step_min
    ]
    step_ratio = {f.bad: f.ratio for f in findings}

    smooth = running_median(list(values), rule.drift_window)
    drift_min = drift_threshold(list(values), rule)

    def unexplained(i: int, j: int) -> float:
        ratio = smooth[j] / smooth[i]
        for k, step in step_ratio.items():
            if i < k <= j:
                ratio /= step
        return ratio

    windows = [
        (max(0, j - rule.drift_lookback), j)
        for j in range(1, len(level))
        if unexplained(max(0, j - rule.drift_lookback), j) - 1 >= drift_min
    ]
    merged: list[list[int]] = []
    for start, end in windows:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    for start, end in merged:
        # From the last run near the floor to the first near the top: "near" is a quarter of
        # drift_min, so the run-to-run wobble of a flat stretch does not move the ends.
        top = max(range(start, end + 1), key=lambda k: (smooth[k], -k))
        floor = min(smooth[start : top + 1])
        low = max(k for k in range(start, top + 1) if smooth[k] <= floor * (1 + drift_min / 4))
        high = min(k for k in range(low, top + 1) if smooth[k] >= smooth[top] * (1 - drift_min / 4))
        ratio = unexplained(low, top)
        if ratio - 1 >= drift_min:
            persists = unexplained(low, last) - 1 >= (ratio - 1) / 2
            findings.append(Finding("drift", low, high, ratio, persists))
    return level, sorted(findings, key=lambda f: (f.bad, f.kind))
