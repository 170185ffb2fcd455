"""The procedures of attnkit_perf.decide around the decision rule: stored mode's confirmation by
re-measurement and its host-bound exemption, the budget that cannot show "slower", and the A/A
noise file's bound on sigma and its coverage of the grid."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from perf_synthetic import H100_KEY, bench_entry, case_for, noisy_samples
from scipy import stats

from attnkit_perf.decide import gate
from attnkit_perf.decide.host import STORED_HOST_BOUND, stored_exempt
from attnkit_perf.decide.noise import SD_CONFIDENCE, noise_sigmas, sd_upper_bound
from attnkit_perf.decide.policy import RunPolicy
from attnkit_perf.decide.stored import MAX_REMEASURES, StoredRule, settle
from attnkit_perf.formats.noise import coverage_notes, read_noise
from attnkit_perf.formats.schema import FormatError
from attnkit_perf.formats.verdict import BenchmarkVerdict
from attnkit_perf.run.session import describe

MS = 1e-3
STORED = gate.Thresholds(slower=gate.Thresholds.STORED_SLOWER)
RULE = StoredRule(STORED, 1e-4, lambda name: STORED.slower)


def _d(outcome: str, ratio: float = 1.2) -> gate.Decision:
    return gate.Decision(outcome, ratio=ratio, reason=f"{outcome} evidence")


# --- stored mode: every slower confirmed -----------------------------------------------------


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        (("slower",), "slower"),  # no re-measurement asked for (--attnkit-no-confirm)
        (("slower", "slower"), "slower"),
        (("slower", "same"), "same"),
        (("slower", "inconclusive"), "inconclusive"),
        (("slower", "faster"), "inconclusive"),
        (("inconclusive", "slower"), "inconclusive"),  # unconfirmed: never a failure
        (("inconclusive", "slower", "slower"), "slower"),
        (("inconclusive", "slower", "same"), "same"),
        (("slower", "same", "slower"), "inconclusive"),
        (("inconclusive", "same"), "same"),
    ],
)
def test_a_stored_slower_stands_only_on_two_consecutive_measurements(sequence, expected):
    d = settle([_d(o, 1.1 + 0.1 * i) for i, o in enumerate(sequence)])
    assert d.outcome == expected, f"{' -> '.join(sequence)}: {d.outcome} ({d.reason})"
    if expected == "slower" and len(sequence) > 1:
        assert d.ratio == pytest.approx(1.1 + 0.1 * (len(sequence) - 2)), "the ratio both support"


def _entry(scale: float, seed: int, confirms=()) -> tuple[dict, list, dict]:
    rng = np.random.default_rng(seed)
    base = bench_entry("sdpa", noisy_samples(rng, MS, outlier_rate=0.0))
    head = noisy_samples(rng, MS, scale=scale, outlier_rate=0.0)
    info = {"peak_bytes": None, "calibration": {}, "host_bound": False}
    info["confirm"] = [{"samples_s": noisy_samples(rng, MS, scale=s, outlier_rate=0.0)} for s in confirms]
    return base, head, info


@pytest.mark.parametrize(
    ("first", "confirms", "again"),
    [
        (1.0, (), False),  # same: no suspect
        (1.3, (), True),  # slower, never re-measured yet
        (1.3, (1.3,), False),  # confirmed
        (1.3, (1.0,), False),  # refuted
        (1.3, (1.0, 1.3), True),  # slower again after a same: unconfirmed, measure again
        (1.3, (1.0, 1.3, 1.3), False),  # confirmed by the last two
        (1.3, (1.0, 1.3, 1.0), False),  # out of re-measurements
    ],
)
def test_an_unconfirmed_stored_slower_is_measured_again(first, confirms, again):
    base, head, info = _entry(first, 3, confirms)
    assert RULE.suspect(base, head, info) is (first != 1.0)
    wants = RULE.wants_remeasure(base, head, info) if first != 1.0 else False
    assert wants is again, f"x{first} then {confirms}: wants another measurement {wants}"
    assert len(confirms) <= MAX_REMEASURES


def test_a_stored_benchmark_that_turned_slower_on_re_measure_fails_only_when_confirmed():
    """Inconclusive, then slower on its re-measurement, must not fail on that one measurement."""
    base, head, info = _entry(1.0, 4, (1.3,))
    head = [s * 1.12 for s in head]  # first: between the threshold and the interval's reach
    entry = {"fullname": base["fullname"], "stats": {"data": head}, "extra_info": info}
    first = RULE.decide(base, head, info, {}, {})
    assert first.outcome in ("inconclusive", "slower"), first.reason
    info["confirm"] = info["confirm"][:1]
    if first.outcome == "inconclusive":
        assert RULE.judge(base, entry, {}, {}).outcome == "inconclusive", "one slower is not confirmed"
        assert RULE.wants_remeasure(base, head, info), "so it is measured again"
    info["confirm"].append({"samples_s": info["confirm"][0]["samples_s"]})
    assert RULE.judge(base, entry, {}, {}).outcome == "slower", "two consecutive slowers fail"


@pytest.mark.parametrize(
    ("base_host_bound", "head_host_bound", "exempt"),
    [(True, True, True), (False, True, False), (True, False, False), (None, True, False)],
)
def test_stored_host_bound_exemption_needs_the_baseline_host_bound_too(
    base_host_bound, head_host_bound, exempt
):
    """A change that makes a benchmark host-bound must not exempt itself from stored mode."""
    d = stored_exempt(_d("slower"), {"host_bound": base_host_bound}, {"host_bound": head_host_bound})
    assert (d.outcome == "inconclusive") is exempt, f"baseline {base_host_bound}, run {head_host_bound}: {d}"
    if exempt:
        assert d.reason.startswith("host-bound here and in the baseline"), d.reason


@pytest.mark.parametrize(
    ("outcome", "grew", "expected"),
    [
        ("same", False, "inconclusive"),  # a x1.6 "same" under an inflated threshold, before
        ("faster", False, "inconclusive"),
        ("slower", True, "more-memory"),  # the peak is still compared
        ("more-memory", True, "more-memory"),
    ],
)
def test_a_stored_host_bound_benchmarks_time_is_not_compared_its_memory_is(outcome, grew, expected):
    d = _d(outcome, ratio=1.6)
    if grew:
        d.extra["memory_growth_bytes"] = 4 * gate.MIB
    d = stored_exempt(d, {"host_bound": True}, {"host_bound": True})
    assert d.outcome == expected and d.extra["time_compared"] is False, d
    assert d.reason.startswith(STORED_HOST_BOUND) and f"time {outcome}" in d.reason, d.reason


# --- a budget that cannot show "slower" -------------------------------------------------------


def test_eight_pairs_cannot_show_slower_among_a_hundred_benchmarks_and_the_verdict_says_so():
    rng = np.random.default_rng(5)
    base = list(MS * np.exp(rng.normal(0, 0.001, 8)))
    head = [b * 1.5 for b in base]
    alpha = gate.per_benchmark_alpha(gate.Thresholds(), 100)
    d = gate.decide_paired(base, head, gate.Thresholds(), alpha, 0.02)
    assert d.outcome == "inconclusive" and d.extra["slower_reachable"] is False, d.reason
    assert "8 pairs cannot show slower" in d.reason and "2^-8" in d.reason, d.reason
    alone = gate.decide_paired(base, head, gate.Thresholds(), 0.01, 0.02)
    assert alone.outcome == "slower" and alone.extra["slower_reachable"] is True, alone.reason
    row = BenchmarkVerdict.from_decision(describe(case_for("sdpa")), d)
    notes = RunPolicy.budget_notes([row, BenchmarkVerdict.from_decision(describe(case_for("tiled")), alone)])
    assert len(notes) == 1 and case_for("sdpa").name in notes[0] and "tiled" not in notes[0], notes


# --- A/A noise: an upper bound on sigma, and a file that describes this grid ------------------


@pytest.mark.parametrize("runs", [3, 7, 10])
def test_the_noise_bound_covers_sigma_at_its_confidence(runs):
    """Against the chi-square formula, and by simulation: the bound from ``runs`` A/A runs lies
    above the true sigma in SD_CONFIDENCE of draws (a plain sd of 3 runs: about half)."""
    sd = 0.01
    expected = sd * math.sqrt((runs - 1) / stats.chi2.ppf(1 - SD_CONFIDENCE, runs - 1))
    assert sd_upper_bound(sd, runs) == pytest.approx(expected, rel=1e-12)
    draws = np.random.default_rng(runs).normal(0.0, sd, (4000, runs)).std(axis=1, ddof=1)
    covered = np.mean([sd_upper_bound(s, runs) >= sd for s in draws])
    plain = np.mean(draws >= sd)
    assert abs(covered - SD_CONFIDENCE) < 0.02, f"{runs} runs: bound covers sigma {covered:.1%}"
    assert plain < 0.6, f"{runs} runs: the sample sd alone covers sigma {plain:.1%}"


def _noise(tmp_path, names, timing="flush-by-read", runs=3) -> str:
    path = tmp_path / "noise.json"
    entries = {n: {"log_ratio_sd": 0.004, "ratios": [1.0, 1.004, 0.996][:runs]} for n in names}
    provenance = {"gpu_key": H100_KEY} | ({"timing": timing} if timing else {})
    doc = {"format": "attnkit-perf-noise/1", "gpu_key": H100_KEY, "mode": "paired", "runs": runs}
    path.write_text(json.dumps({**doc, "provenance": provenance, "benchmarks": entries}))
    return str(path)


def test_the_gate_reads_the_bound_not_the_sample_sd(tmp_path):
    path = _noise(tmp_path, ["fwd[a]"])
    bound = noise_sigmas(read_noise(path, H100_KEY, "paired", timing_protocol="flush-by-read"))["fwd[a]"]
    assert bound == pytest.approx(sd_upper_bound(0.004, 3)) and bound > 3 * 0.004, bound


def test_a_noise_file_of_another_timing_protocol_is_refused(tmp_path):
    path = _noise(tmp_path, ["fwd[a]"], timing="flush-by-zeroing")
    with pytest.raises(FormatError, match="measured with the 'flush-by-zeroing' timing protocol, this run"):
        read_noise(path, H100_KEY, "paired", timing_protocol="flush-by-read")


def test_a_noise_file_that_does_not_describe_the_grid_says_so_loudly(tmp_path):
    """A noise file from before the loop cases (as the committed ones were) lacks every -loop
    benchmark: the run names each, and the stale entries of cases the grid dropped."""
    grid = ["fwd[a]", "fwd[a-loop]", "fwd+bwd[a-loop]"]
    notes = coverage_notes("n.json", ["fwd[a]", "fwd[gone]"], grid, grid, protocol=None)
    text = "\n".join(notes)
    assert all(n.startswith("WARNING: A/A noise n.json") for n in notes), notes
    assert "names no timing protocol" in notes[0], notes
    assert "holds 1 benchmarks the grid no longer has" in text and "fwd[gone]" in text, text
    assert "lacks 2 benchmarks of this run" in text and "fwd+bwd[a-loop], fwd[a-loop]" in text, text
    assert coverage_notes("n.json", grid, grid, grid, protocol="flush-by-read") == [], "a matching file"
