"""The gate's decision: is a benchmark the same, slower, faster, or using more memory than its
baseline? Pure functions over pytest-benchmark JSON dicts, so they are tested on synthetic
samples without a GPU.

Time. Each run's samples are first divided by the run's *drift*: how much slower the
calibration kernels ran than in the baseline run (:mod:`attnkit.bench.calibration`). Then a
benchmark is **slower** only when both hold (as asv does):

* practical: ``median(now) / median(baseline) >= 1 + slower`` (default 6%, so that a real 10%
  slowdown, seen through ~2% measurement noise, lands above it ~97% of the time), and
* significant: a one-sided Mann-Whitney U test over the per-round samples gives
  ``p < alpha`` (default 0.001).

A benchmark found slower is re-measured later in the session (``extra_info["confirm"]``); it
fails only if the second measurement is slower by the same rule, so one disturbed stretch of
time cannot fail a run. **faster** is the mirror image (not re-measured: it never fails).

Memory is deterministic, so it needs no statistics: **more-memory** when the peak grows by more
than ``max(memory_abs_bytes, memory_rel * baseline_peak)``.

Benchmarks only in the current run are **new**; only in the baseline, **missing**. Neither fails.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from attnkit.bench.calibration import drift_factor
from attnkit.bench.stats import bootstrap_ratio_ci, mann_whitney_greater, median

VERDICTS = ("same", "slower", "faster", "more-memory", "new", "missing")
FAILING = ("slower", "more-memory")
MIB = 1024 * 1024


@dataclass(frozen=True)
class Thresholds:
    """Decision parameters; every one is a CLI option and an ini key (see the plugin)."""

    slower: float = 0.06
    faster: float = 0.06
    alpha: float = 0.001
    memory_rel: float = 0.02
    memory_abs_bytes: int = MIB
    normalise: bool = True


@dataclass(frozen=True)
class TimeCheck:
    ratio: float
    p_slower: float
    p_faster: float
    slower: bool
    faster: bool


def check_time(baseline_s: list[float], now_s: list[float], drift: float, t: Thresholds) -> TimeCheck:
    """Compare two sample sets after dividing ``now_s`` by ``drift``."""
    adjusted = [s / drift for s in now_s]
    ratio = median(adjusted) / median(baseline_s)
    p_slower = mann_whitney_greater(adjusted, baseline_s)
    p_faster = mann_whitney_greater(baseline_s, adjusted)
    return TimeCheck(
        ratio=ratio,
        p_slower=p_slower,
        p_faster=p_faster,
        slower=ratio >= 1.0 + t.slower and p_slower < t.alpha,
        faster=ratio <= 1.0 / (1.0 + t.faster) and p_faster < t.alpha,
    )


def memory_grew(baseline_peak: int | None, now_peak: int | None, t: Thresholds) -> bool:
    if baseline_peak is None or now_peak is None:
        return False
    return now_peak - baseline_peak > max(t.memory_abs_bytes, t.memory_rel * baseline_peak)


@dataclass
class Verdict:
    """One row of the verdict file (field meanings in :mod:`attnkit.bench.verdict`)."""

    name: str
    fullname: str
    group: str | None
    backend: str | None
    pass_name: str | None
    shape: dict | None
    verdict: str
    baseline_median_ms: float | None = None
    now_median_ms: float | None = None
    ratio: float | None = None
    evidence: dict = field(default_factory=dict)
    baseline_peak_bytes: int | None = None
    now_peak_bytes: int | None = None
    tflops: float | None = None

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    def as_dict(self) -> dict:
        row = asdict(self)
        row["pass"] = row.pop("pass_name")
        return row


def run_calibration(run: dict) -> dict:
    """A run's calibration: per kernel, the median over its benchmarks' local calibrations."""
    per_kernel: dict[str, list[float]] = {}
    for bench in run.get("benchmarks", []):
        for key, value in ((bench.get("extra_info") or {}).get("calibration") or {}).items():
            per_kernel.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in per_kernel.items()}


def run_drift(baseline_run: dict, now_run: dict, t: Thresholds) -> float:
    return drift_factor(run_calibration(baseline_run), run_calibration(now_run)) if t.normalise else 1.0


def _describe(bench: dict) -> dict:
    info = bench.get("extra_info") or {}
    return {
        "name": info.get("name") or bench.get("name") or bench["fullname"],
        "fullname": bench["fullname"],
        "group": bench.get("group"),
        "backend": info.get("backend"),
        "pass_name": info.get("pass"),
        "shape": info.get("shape"),
    }


def _samples(bench: dict) -> list[float]:
    return list(bench["stats"]["data"])


def is_suspect(baseline_bench: dict, now_samples: list[float], drift: float, t: Thresholds) -> bool:
    """Whether a fresh measurement looks slower than its baseline: it is then re-measured."""
    return check_time(_samples(baseline_bench), now_samples, drift, t).slower


def decide(baseline_bench: dict | None, now_bench: dict | None, drift: float, t: Thresholds) -> Verdict:
    """The verdict for one benchmark present in either run."""
    if now_bench is None:
        info = _describe(baseline_bench)
        return Verdict(
            **info,
            verdict="missing",
            baseline_median_ms=median(_samples(baseline_bench)) * 1e3,
            baseline_peak_bytes=(baseline_bench.get("extra_info") or {}).get("peak_bytes"),
        )
    info = _describe(now_bench)
    now_extra = now_bench.get("extra_info") or {}
    now_samples = _samples(now_bench)
    verdict = Verdict(
        **info,
        verdict="new",
        now_median_ms=median(now_samples) * 1e3,
        now_peak_bytes=now_extra.get("peak_bytes"),
        tflops=now_extra.get("tflops"),
    )
    if baseline_bench is None:
        return verdict
    base_samples = _samples(baseline_bench)
    verdict.baseline_median_ms = median(base_samples) * 1e3
    verdict.baseline_peak_bytes = (baseline_bench.get("extra_info") or {}).get("peak_bytes")

    first = check_time(base_samples, now_samples, drift, t)
    low, high = bootstrap_ratio_ci(base_samples, [s / drift for s in now_samples])
    verdict.ratio = first.ratio
    verdict.evidence = {
        "drift": drift,
        "p_slower": first.p_slower,
        "p_faster": first.p_faster,
        "ratio_ci99": [low, high],
        "confirm": None,
    }
    slower = first.slower
    confirm = now_extra.get("confirm")
    if slower and confirm and confirm.get("samples_s"):
        second = check_time(base_samples, confirm["samples_s"], drift, t)
        verdict.evidence["confirm"] = {"ratio": second.ratio, "p_slower": second.p_slower}
        # Both measurements must show the slowdown; report the smaller, the one both support.
        slower = second.slower
        verdict.ratio = min(first.ratio, second.ratio) if slower else second.ratio

    grew = memory_grew(verdict.baseline_peak_bytes, verdict.now_peak_bytes, t)
    if grew:
        verdict.evidence["memory_growth_bytes"] = verdict.now_peak_bytes - verdict.baseline_peak_bytes
    if slower:
        verdict.verdict = "slower"
        verdict.evidence["also_more_memory"] = grew
    elif grew:
        verdict.verdict = "more-memory"
    elif first.faster:
        verdict.verdict = "faster"
    else:
        verdict.verdict = "same"
    return verdict


def compare_runs(baseline_run: dict, now_run: dict, t: Thresholds) -> tuple[list[Verdict], float]:
    """Verdicts for every benchmark of either run (current run's order, then missing ones),
    and the drift factor applied."""
    drift = run_drift(baseline_run, now_run, t)
    baseline = {b["fullname"]: b for b in baseline_run.get("benchmarks", [])}
    now = {b["fullname"]: b for b in now_run.get("benchmarks", [])}
    verdicts = [decide(baseline.get(name), bench, drift, t) for name, bench in now.items()]
    verdicts += [decide(bench, None, drift, t) for name, bench in baseline.items() if name not in now]
    return verdicts, drift


def geometric_mean(values: list[float]) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan
