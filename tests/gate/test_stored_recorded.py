"""Stored mode replayed on real recordings: two fresh-process recordings of 33 benchmarks on an
H100 pooled into a baseline, and a stored run of the same code against it
(``tests/gate/data/stored-*.json``, samples rounded to 6 digits, CPU details dropped). From two
recordings each benchmark's own spread has one degree of freedom; its chi-square bound is ~8x
the sd and gave thresholds of x4 to x790,000 on the host-bound loops, where a x1.6 reading was
called "same". The thresholds must come from the spread pooled over each kind instead, and the
host-bound loops must not be compared on time at all."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from attnkit_perf.decide import gate, pooled
from attnkit_perf.decide.host import STORED_HOST_BOUND
from attnkit_perf.decide.policy import RunPolicy
from attnkit_perf.decide.stored import StoredRule
from attnkit_perf.formats.verdict import FAILING

DATA = Path(__file__).parent / "data"
STORED = gate.Thresholds(slower=gate.Thresholds.STORED_SLOWER)
#: The widest threshold a GPU-bound or latency-bound benchmark may get from these recordings:
#: GPU kernels of one model differed by at most a few percent between them.
GPU_THRESHOLD_CAP = 0.15


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


@pytest.fixture(scope="module")
def recorded():
    """``(pooled baseline, spread document, policy, rule, run)``, as stored mode builds them."""
    runs = [_load(f"stored-recording-{i}.json") for i in (1, 2)]
    baseline, spread = pooled.merge(runs, ["recording-1.json", "recording-2.json"])
    run = _load("stored-run.json")
    sigmas = pooled.spread_sigmas(spread)
    policy = RunPolicy(STORED, confirmed=False, noise=sigmas, benchmark_count=len(run["benchmarks"]))
    return baseline, spread, policy, StoredRule(STORED, policy.alpha, policy.threshold_for), run


def test_a_benchmarks_own_spread_of_two_recordings_would_be_absurd(recorded):
    """The defect, on this data: one degree of freedom per benchmark."""
    _, spread, policy, _, _ = recorded
    own = {n: pooled.sigma_bound(e["log_sd"], 2) for n, e in spread["benchmarks"].items()}
    widest = max(math.expm1(policy.noise_k * s) for s in own.values())
    assert widest > 1000, f"the widest own threshold was x{widest:.0f}"


def test_pooled_by_kind_every_gpu_and_latency_threshold_is_sensible(recorded):
    _, spread, policy, _, _ = recorded
    pools = pooled.kind_pools(spread["benchmarks"])
    assert pools["gpu"][1] >= 10, f"GPU-bound benchmarks pool many degrees of freedom: {pools}"
    launch_ms = spread["calibration"].get("launch_ms")
    timed = {
        name: policy.threshold_for(name)
        for name, entry in spread["benchmarks"].items()
        if pooled.timing_kind(entry, launch_ms) in ("gpu", "latency")
    }
    assert len(timed) == len(spread["benchmarks"]), "every benchmark has a time kind's pool"
    wide = {n: round(t, 4) for n, t in timed.items() if t > GPU_THRESHOLD_CAP}
    assert not wide, f"thresholds above {GPU_THRESHOLD_CAP}: {wide}"


def test_the_aa_run_passes_and_no_host_bound_row_is_called_same(recorded):
    baseline, _, _, rule, run = recorded
    rows = rule.compare(baseline, run, {})
    assert len(rows) == 33, len(rows)
    outcomes = {info["name"]: d for info, d, _ in rows}
    failing = {n: d.reason for n, d in outcomes.items() if d.outcome in FAILING}
    assert not failing, f"unchanged code failed: {failing}"
    for info, d, measured in rows:
        if info.get("host_bound") and measured["host_bound"]:
            assert d.outcome == "inconclusive" and d.reason.startswith(STORED_HOST_BOUND), (info["name"], d)
            assert d.extra["time_compared"] is False
        else:
            assert d.outcome == "same" and d.threshold <= GPU_THRESHOLD_CAP, (info["name"], d.reason)
    loop = outcomes["fwd+bwd[sdpa-bf16-B1-H8-N128-D64-causal-loop]"]
    assert loop.ratio > 1.5 and loop.outcome != "same", f"the x1.6 loop: {loop.outcome} ({loop.reason})"


def test_a_benchmark_with_enough_recordings_keeps_its_own_wider_bound():
    """Its kind's pool is tight; with MIN_OWN_RECORDINGS recordings its own spread, wider,
    wins; with fewer the pool holds it."""
    quiet = {f"q{i}": [0.001, -0.001] for i in range(20)}
    n = pooled.MIN_OWN_RECORDINGS
    loud = [0.05 * (i - (n - 1) / 2) for i in range(n)]
    entries = {
        name: {
            "log_sd": _sd(offs),
            "log_offsets": offs,
            "medians_ms": [1.0] * len(offs),
            "kinds": ["gpu"] * len(offs),
        }
        for name, offs in {**quiet, "loud": loud, "loud-few": loud[:2]}.items()
    }
    sigmas = pooled.spread_sigmas({"benchmarks": entries, "calibration": {}})
    own = pooled.sigma_bound(_sd(loud), n)
    assert sigmas["loud"] == pytest.approx(own), (sigmas["loud"], own)
    assert sigmas["loud-few"] < own / 3, f"two recordings are held by the pool: {sigmas['loud-few']}"
    assert sigmas["q0"] == pytest.approx(sigmas["loud-few"]), "below 5 recordings: the pool alone"


def _sd(offsets: list[float]) -> float:
    mean = sum(offsets) / len(offsets)
    return math.sqrt(sum((x - mean) ** 2 for x in offsets) / (len(offsets) - 1))
