"""The host metric and the kept-memory rule on the CPU: the batch timer against functions of
known cost, preempted batches dropped, the decision over per-process values (simulated A/A runs
and slowdowns with realistic process noise), thresholds from A/A noise, the verdict block, and
the kept-memory reading with an earlier case's garbage freed between its two readings."""

from __future__ import annotations

import gc
import math
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attnkit.errors import UnsupportedProblemError
from attnkit_perf.decide import gate
from attnkit_perf.decide.host import decide_host, host_summary, join_host, with_kept
from attnkit_perf.decide.paired_rule import PairedRule
from attnkit_perf.decide.policy import RunPolicy
from attnkit_perf.formats.noise import build, host_noise_name
from attnkit_perf.formats.verdict import COMPARED, FAILING, BenchmarkVerdict, VerdictDocument
from attnkit_perf.measure.host import (
    KEPT_CALLS,
    HostBatch,
    KeptMemoryError,
    extend_host,
    host_per_call,
    kept_batches,
    kept_bytes,
    release_garbage,
    time_batch,
)
from attnkit_perf.measure.paired_session import PairedSettings, SideResult
from attnkit_perf.run.session import PerfSession

CPU = torch.device("cpu")
ALPHA = gate.per_benchmark_alpha(gate.Thresholds(), 110)


def _busy(seconds: float):
    """A call of ``seconds`` of this thread's CPU time (a busy loop on the thread's own clock:
    exact on a loaded machine, where wall time also counts other processes' turns)."""

    def spin():
        end = time.thread_time_ns() + seconds * 1e9
        while time.thread_time_ns() < end:
            pass

    return spin


# --- the batch timer -----------------------------------------------------------------------


def test_a_batch_times_each_call_of_a_busy_loop():
    batch = time_batch(_busy(200e-6), CPU, calls=10)
    per_call = batch.cpu_ns / batch.calls / 1e3
    assert batch.calls == 10 and 200 <= per_call < 260, (
        f"200 us of work read {per_call:.1f} us of CPU per call"
    )
    assert batch.wall_ns >= batch.cpu_ns, f"wall {batch.wall_ns} ns < cpu {batch.cpu_ns} ns"


def test_wall_time_counts_a_wait_that_cpu_time_does_not():
    """The metric is wall time: a call that starts waiting costs the caller, not the CPU clock."""
    result = host_per_call(lambda: time.sleep(1e-3), CPU, batches=5)
    assert 0.9e-3 <= result["per_call_s"] < 5e-3, result
    assert result["cpu_per_call_s"] < 0.5 * result["per_call_s"], result
    # Every batch waits alike: the systematic gap is no preemption (a late wake-up on a loaded
    # machine may still drop one).
    assert result["dropped"] <= 2 and result["batches"] == 5, result


def test_the_process_value_is_the_median_of_its_batches():
    result = host_per_call(_busy(100e-6), CPU, batches=5)
    assert 100e-6 <= result["cpu_per_call_s"] < 130e-6, result
    assert result["per_call_s"] >= result["cpu_per_call_s"], result


# --- preempted batches ---------------------------------------------------------------------


def test_a_preempted_batch_is_dropped():
    steady = [HostBatch(wall_ns=1_000_000 + 1000 * i, cpu_ns=990_000 + 1000 * i, calls=16) for i in range(9)]
    preempted = HostBatch(wall_ns=4_000_000, cpu_ns=1_000_000, calls=16)  # 3 ms lost to another process
    kept = kept_batches([*steady[:4], preempted, *steady[4:]])
    assert preempted not in kept and len(kept) == 9, [b.wall_ns for b in kept]


def test_a_systematic_gap_drops_nothing_and_a_slow_but_busy_batch_stays():
    """Wall above CPU in every batch (helper threads, a wait each call makes) is no preemption; a
    batch that ran longer because it did more work (its CPU time grew with it) is no preemption."""
    waiting = [HostBatch(wall_ns=2_000_000 + 500 * i, cpu_ns=1_000_000, calls=16) for i in range(8)]
    assert kept_batches(waiting) == waiting
    busy = [HostBatch(wall_ns=1_000_000, cpu_ns=990_000, calls=16) for _ in range(8)]
    longer = HostBatch(wall_ns=1_500_000, cpu_ns=1_490_000, calls=16)
    assert longer in kept_batches([*busy, longer])


def test_a_batch_preempted_midway_is_dropped_from_the_process_value(monkeypatch):
    """Through the timer: a batch whose wall clock jumps by 5 ms while the thread's CPU clock
    does not (what losing the core looks like) is dropped, and the value is the others'."""
    clock = {"wall": 0, "cpu": 0, "preempt_in": 5, "calls": 0}

    def call():
        clock["wall"] += 50_000
        clock["cpu"] += 49_000
        clock["calls"] += 1
        if clock["calls"] == 16 * 5 + 3:  # midway through the fifth timed batch
            clock["wall"] += 5_000_000

    monkeypatch.setattr(time, "perf_counter_ns", lambda: clock["wall"])
    monkeypatch.setattr(time, "thread_time_ns", lambda: clock["cpu"])
    result = host_per_call(call, CPU, batches=10)
    assert result["dropped"] == 1, result
    assert result["per_call_s"] == pytest.approx(50e-6), result


# --- the decision over processes -----------------------------------------------------------

#: Host time per call moves between worker processes by about this (log sd of one process's
#: value; batches within a process agree far closer). The rule's power depends on it: with 4
#: processes per side a +10% change is slower in ~99% of single measurements at 1.5%, ~89% at
#: 2%, ~56% at 3% (the rest inconclusive, never same). The GPU verdict records every process's
#: value (``host.base_process_us``), so the real spread can be read off any run.
PROCESS_SD = 0.015


def _processes(rng, effect: float, processes: int = 4, sd: float = PROCESS_SD, per_call: float = 8e-6):
    base = per_call * np.exp(rng.normal(0.0, sd, processes))
    head = per_call * (1 + effect) * np.exp(rng.normal(0.0, sd, processes))
    return list(base), list(head)


def _outcomes(effect: float, threshold: float, runs: int = 400, seed: int = 0, confirmed: bool = True):
    rng = np.random.default_rng(seed)
    return [decide_host(*_processes(rng, effect), threshold, ALPHA, confirmed).outcome for _ in range(runs)]


def test_aa_processes_are_same_and_never_slower():
    outcomes = _outcomes(0.0, gate.Thresholds.host_slower)
    assert outcomes.count("slower") == 0, f"A/A slower {outcomes.count('slower')} of {len(outcomes)}"
    same = outcomes.count("same") / len(outcomes)
    assert same >= 0.9, f"A/A called same only {same:.1%} of the time (the rest inconclusive)"


def test_noisier_processes_make_the_rule_inconclusive_not_wrong():
    """At twice the process noise an A/A measurement is still almost never slower (each of the
    two measurements a failure needs is held to sqrt(alpha)) and a +10% change never same."""
    rng = np.random.default_rng(5)
    aa = [decide_host(*_processes(rng, 0.0, sd=0.03), 0.05, ALPHA, True).outcome for _ in range(2000)]
    assert aa.count("slower") / len(aa) <= 2 * math.sqrt(ALPHA), f"A/A slower {aa.count('slower')} of 2000"
    ten = [decide_host(*_processes(rng, 0.10, sd=0.03), 0.05, ALPHA, True).outcome for _ in range(500)]
    assert "same" not in ten and "faster" not in ten, set(ten)


def test_a_ten_percent_host_change_is_slower():
    outcomes = _outcomes(0.10, gate.Thresholds.host_slower)
    slower = outcomes.count("slower") / len(outcomes)
    assert slower >= 0.95, f"+10% host time called slower in {slower:.1%} of measurements"
    assert "same" not in outcomes and "faster" not in outcomes, set(outcomes)


def test_a_change_of_exactly_the_threshold_is_rarely_called_same():
    """ "Same" means a change of the threshold is excluded: at exactly it, at most ~5% (the
    one-sided 95% bound over processes), with realistic process noise."""
    outcomes = _outcomes(gate.Thresholds.host_slower, gate.Thresholds.host_slower, runs=2000, seed=3)
    same = outcomes.count("same") / len(outcomes)
    assert same <= 0.07, f"a true +{gate.Thresholds.host_slower:.0%} called same {same:.1%} of the time"


def test_the_reported_bounds_are_the_ones_that_decide():
    """A slower row's lower bound is above 1 and a same row's upper bound below the threshold:
    one interval at one confidence once showed "slower" over bounds [0.631, 112.762]."""
    rng = np.random.default_rng(11)
    threshold = gate.Thresholds.host_slower
    decided = {"slower": 0, "same": 0}
    for effect in [0.0] * 200 + [0.10] * 200 + [0.25] * 200:
        d = decide_host(*_processes(rng, effect, sd=0.03), threshold, ALPHA, confirmed=True, looks=3)
        lower, upper = d.ci
        assert lower <= d.ratio <= upper, d
        if d.outcome == "slower":
            assert lower > 1.0, f"slower over bounds {d.ci}: {d.reason}"
        if d.outcome == "same":
            assert upper < 1 + threshold, f"same over bounds {d.ci}: {d.reason}"
        if d.outcome in decided:
            decided[d.outcome] += 1
        # The lower bound is above 1 exactly when the slowdown test rejects at its level.
        level = math.sqrt(ALPHA) / 3
        assert (lower > 1.0) == (d.p is not None and d.p < level) or d.outcome == "faster", d
    assert min(decided.values()) >= 50, decided
    faster = decide_host(*_processes(rng, -0.25, sd=0.03), threshold, ALPHA, confirmed=True, looks=3)
    assert faster.outcome == "faster" and faster.ci[1] < 1.0, f"faster over bounds {faster.ci}"


def test_identical_code_is_called_faster_at_most_at_the_level():
    """A speed-up is reported on one measurement at the first stage's level: noise alone reads
    "faster" at most about that often."""
    rng = np.random.default_rng(13)
    outcomes = [
        decide_host(*_processes(rng, 0.0, sd=0.05), 0.05, 0.01, confirmed=True, looks=3).outcome
        for _ in range(3000)
    ]
    level = math.sqrt(0.01) / 3
    assert outcomes.count("faster") / len(outcomes) <= 1.5 * level, outcomes.count("faster")


def test_a_faster_head_is_faster():
    rng = np.random.default_rng(1)
    d = decide_host(*_processes(rng, -0.3), 0.05, ALPHA, confirmed=True)
    assert d.outcome == "faster" and d.ratio < 0.75, d


# --- more processes while the host metric cannot tell ------------------------------------

#: Looks one measurement may take (4 processes per side each): paired mode's setting.
LOOKS = PairedSettings().host_looks


def _sequential(rng, effect: float, sd: float, looks: int = LOOKS, threshold: float = 0.05):
    """One measurement as paired mode takes it: 4 processes per side, then 4 fresh ones pooled
    with them while the decision is inconclusive, up to ``looks`` sets."""
    base, head = [], []
    for _ in range(looks):
        more = _processes(rng, effect, sd=sd)
        base, head = base + more[0], head + more[1]
        d = decide_host(base, head, threshold, ALPHA, True, looks=looks)
        if d.outcome != "inconclusive":
            break
    return d


def _gated(rng, effect: float, sd: float, looks: int = LOOKS) -> str:
    """A benchmark's host outcome: a slowdown confirmed by a second measurement on fresh
    processes (itself taking up to ``looks`` looks)."""
    first = _sequential(rng, effect, sd, looks)
    if first.outcome == "slower":
        first = gate.confirm_slowdown(first, _sequential(rng, effect, sd, looks))
    return first.outcome


@pytest.mark.parametrize(("sd", "one_look_at_most"), [(0.02, 0.9), (0.03, 0.5)])
def test_more_processes_make_a_ten_percent_host_change_slower_at_a_noisy_host(sd, one_look_at_most):
    """Per-process sd 2-3% (the H100's loops): one look of 4 processes left a +10% change
    inconclusive too often; three looks (up to 12 processes) call it slower in ~every case."""
    rng = np.random.default_rng(11)
    looked = [_gated(rng, 0.10, sd) for _ in range(500)]
    once = [_gated(rng, 0.10, sd, looks=1) for _ in range(500)]
    slower, before = looked.count("slower") / 500, once.count("slower") / 500
    assert slower >= 0.97, f"sd {sd:.0%}: +10% slower in {slower:.1%} with {LOOKS} looks"
    assert before <= one_look_at_most, f"sd {sd:.0%}: one look already slower in {before:.1%}"
    assert "same" not in looked and "faster" not in looked, set(looked)


@pytest.mark.parametrize(("sd", "same_at_least"), [(0.015, 0.99), (0.02, 0.97), (0.03, 0.9)])
def test_aa_with_more_looks_is_never_slower_and_mostly_same(sd, same_at_least):
    rng = np.random.default_rng(12)
    outcomes = [_gated(rng, 0.0, sd) for _ in range(2000)]
    assert outcomes.count("slower") == 0, f"sd {sd:.0%}: A/A slower {outcomes.count('slower')} of 2000"
    same = outcomes.count("same") / len(outcomes)
    assert same >= same_at_least, f"sd {sd:.0%}: A/A same in {same:.1%} (the rest inconclusive)"


def test_the_looks_spend_the_level_a_single_measurement_has():
    """Noise alone over every look: a measurement says slower in at most its level
    (sqrt(alpha), the confirmation makes it alpha), and a change of exactly the threshold is
    called same in at most ~5% of measurements over all their looks."""
    rng = np.random.default_rng(13)
    level = math.sqrt(ALPHA)
    noise = [_sequential(rng, 0.0, 0.03, threshold=0.0).outcome for _ in range(4000)]
    assert noise.count("slower") / 4000 <= 2 * level, f"slower {noise.count('slower')} of 4000"
    at_t = [_sequential(rng, 0.05, 0.02).outcome for _ in range(2000)]
    same = at_t.count("same") / 2000
    assert same <= 0.065, f"a true +5% called same in {same:.1%} of measurements"


class _FakeSession:
    """A paired session whose fresh processes read ``values`` (per side, per process)."""

    def __init__(self, values: dict[str, list[float]]) -> None:
        self.values, self.restarts = values, 0

    def restart(self) -> None:
        self.restarts += 1

    def measure_host(self, case, settings):
        return {
            side: SideResult(host_per_call=list(v), host_cpu_per_call=list(v))
            for side, v in self.values.items()
        }


def test_fresh_processes_join_the_host_metric_until_it_can_tell():
    """An inconclusive host metric is measured again on fresh processes, pooled, until settled
    or the looks run out; a settled one is not."""
    rule = PairedRule(gate.Thresholds(), ALPHA, 0.02, host_threshold=0.05, host_looks=LOOKS)
    noisy = {"base": [10e-6, 10.6e-6, 9.6e-6, 10.2e-6], "head": [10.2e-6, 10.1e-6, 10.3e-6, 9.9e-6]}
    results = {
        side: SideResult(host_per_call=list(v), host_cpu_per_call=list(v)) for side, v in noisy.items()
    }
    assert rule.host_wants_more(results), rule.decide_host(results).reason
    session = _FakeSession({"base": [10e-6] * 4, "head": [10.01e-6] * 4})
    spent = extend_host(session, {}, PairedSettings(), results, rule.host_wants_more)
    host = rule.decide_host(results)
    assert host.outcome == "same" and host.extra["processes"] == 8, host.reason
    assert session.restarts == 1 and set(spent) == {"host_restart", "host_more"}, (session.restarts, spent)
    assert extend_host(session, {}, PairedSettings(), results, rule.host_wants_more) == {}, "settled"
    never = _FakeSession(noisy)
    results = {side: SideResult(host_per_call=list(v)) for side, v in noisy.items()}
    extend_host(never, {}, PairedSettings(), results, lambda r: True)
    assert never.restarts == LOOKS - 1 and len(results["head"].host_per_call) == 4 * LOOKS


@pytest.mark.parametrize(
    ("base", "head", "why"),
    [
        ([1e-5], [1e-5], "1 process pairs, at least 2 needed"),
        ([1e-5, 1e-5], [1e-5], "not paired"),
        ([1e-5, 0.0], [1e-5, 1e-5], "non-positive"),
        ([1e-5, math.nan], [1e-5, 1e-5], "non-finite"),
    ],
)
def test_no_evidence_is_inconclusive(base, head, why):
    d = decide_host(base, head, 0.05, ALPHA, confirmed=True)
    assert d.outcome == "inconclusive" and why in d.reason, d


def test_a_slowdown_seen_on_one_measurement_needs_a_level_it_could_not_reach_alone():
    """Unconfirmed, the test level is alpha; confirmed (a second measurement on fresh processes
    must agree), sqrt(alpha): the same evidence is slower only in the second case."""
    base = [10.0e-6, 10.1e-6, 9.9e-6, 10.0e-6]
    head = [11.0e-6, 11.6e-6, 10.9e-6, 11.3e-6]
    assert decide_host(base, head, 0.05, 1e-4, confirmed=True).outcome == "slower"
    assert decide_host(base, head, 0.05, 1e-4, confirmed=False).outcome == "inconclusive"


# --- thresholds from A/A noise -------------------------------------------------------------

NAME = "fwd[triton-bf16-B1-H8-N128-D64-causal-loop]"


def _row(name: str, ratio: float, host_ratio: float) -> BenchmarkVerdict:
    host = decide_host([1e-5, 1e-5], [1e-5 * host_ratio, 1.001e-5 * host_ratio], 0.05, ALPHA, True)
    host.ratio = host_ratio
    return BenchmarkVerdict(
        name=name,
        group="g",
        backend="triton",
        pass_name="fwd",
        shape={},
        outcome="same",
        ratio=ratio,
        host=host_summary(host),
    )


def _aa_doc(host_ratio: float) -> VerdictDocument:
    provenance = {"gpu_key": "nvidia-h100", "source": "abc", "timing": "flush-by-read"}
    return VerdictDocument(
        mode="paired",
        base={"label": "base", "provenance": provenance},
        head={"label": "head", "provenance": provenance},
        thresholds={"slower": 0.02, "run_alpha": 0.01, "memory_rel": 0.01, "memory_abs_bytes": 1},
        benchmarks=[_row(NAME, 1.0, host_ratio)],
    )


def test_the_host_threshold_comes_from_the_aa_runs_of_the_host_metric():
    noise = build([_aa_doc(r) for r in (1.00, 1.04, 0.97, 1.02)])
    entry = noise["benchmarks"][host_noise_name(NAME)]
    assert entry["ratios"] == [1.00, 1.04, 0.97, 1.02], entry
    assert NAME in noise["benchmarks"], "the GPU time keeps its own entry"
    t = gate.Thresholds()
    policy = RunPolicy(t, confirmed=True, benchmark_count=110)
    quiet = policy.host_threshold_for(NAME)
    assert quiet == t.host_slower, f"no noise: the practical floor {t.host_slower}, got {quiet}"
    policy.noise = {host_noise_name(NAME): entry["log_ratio_sd"]}
    noisy = policy.host_threshold_for(NAME)
    expected = math.expm1(policy.noise_k * entry["log_ratio_sd"])
    assert noisy == pytest.approx(expected) and noisy > t.host_slower, (noisy, expected)
    assert policy.threshold_for(NAME) == t.slower, "the GPU time's threshold is not the host metric's"


# --- joining the host metric and kept memory into the row ---------------------------------


def _time(outcome: str) -> gate.Decision:
    return gate.Decision(outcome, ratio=1.06, reason="gpu evidence")


@pytest.mark.parametrize(
    ("time_outcome", "host_outcome", "row"),
    [
        ("same", "slower", "slower"),  # the per-call host regression the events halved
        ("inconclusive", "slower", "slower"),
        ("same", "inconclusive", "inconclusive"),  # "same" only when both metrics say so
        ("faster", "inconclusive", "inconclusive"),
        ("same", "same", "same"),
        ("slower", "same", "slower"),
        ("error", "slower", "error"),
        ("more-memory", "same", "more-memory"),
    ],
)
def test_the_row_joins_the_gpu_time_and_the_host_metric(time_outcome, host_outcome, row):
    host = gate.Decision(host_outcome, ratio=1.4, reason="host evidence")
    joined = join_host(_time(time_outcome), host, host_summary(host))
    assert joined.outcome == row, f"GPU {time_outcome} + host {host_outcome}: {joined.outcome}"
    assert joined.ratio == 1.06, "the row's ratio stays the GPU time's"
    assert "host evidence" in joined.reason and joined.extra["host"]["outcome"] == host_outcome


@pytest.mark.parametrize(
    ("base", "head", "outcome"),
    [
        (0, 0, "same"),
        (131072, 131072 + 32 * 1024, "same"),  # under the 64 KiB floor
        (0, 256 * 1024, "kept-memory"),  # a cache of two 128 KiB outputs
        (50 * gate.MIB, 50 * gate.MIB + 400 * 1024, "same"),  # under 1% of what the base keeps
        (50 * gate.MIB, 51 * gate.MIB, "kept-memory"),
        (256 * 1024, 0, "same"),  # keeping less never fails
        (None, 1 << 30, "same"),  # not measured (the CPU)
    ],
)
def test_kept_memory_growing_past_the_limit_fails(base, head, outcome):
    d = with_kept(gate.Decision("same", reason="time same"), base, head, gate.Thresholds())
    assert d.outcome == outcome, f"kept {base} -> {head} B: {d.outcome} ({d.reason})"
    if base is not None:
        assert d.extra["kept"] == {
            "base_bytes": base,
            "head_bytes": head,
            "limit_bytes": d.extra["kept"]["limit_bytes"],
        }
    assert ("kept-memory" in FAILING) and ("kept-memory" in COMPARED)


def test_a_slower_row_stays_slower_when_it_also_keeps_more():
    d = with_kept(gate.Decision("slower", reason="time"), 0, 10 * gate.MIB, gate.Thresholds())
    assert d.outcome == "slower" and d.extra["kept"]["head_bytes"] == 10 * gate.MIB, d


def test_the_verdict_carries_the_host_and_kept_blocks_through_its_schema(tmp_path):
    host = decide_host([10e-6, 10.1e-6, 9.9e-6], [14e-6, 14.2e-6, 13.9e-6], 0.05, ALPHA, confirmed=True)
    summary = host_summary(host, cpu={"base": 9e-6, "head": 13e-6}, dropped={"base": 1, "head": 0})
    decision = with_kept(join_host(_time("same"), host, summary), 0, 256 * 1024, gate.Thresholds())
    row = BenchmarkVerdict.from_decision(
        {"name": NAME, "group": "g", "backend": "triton", "pass_name": "fwd", "shape": {}}, decision
    )
    assert row.host["outcome"] == "slower" and row.host["base_us"] == 10.0, row.host
    assert row.kept["head_bytes"] == 256 * 1024 and "host" not in row.evidence, row
    doc = _aa_doc(1.0)
    doc.benchmarks = [row]
    back = VerdictDocument.read(doc.write(tmp_path / "v.json"))
    assert back.benchmarks[0].host == row.host and back.benchmarks[0].kept == row.kept
    assert back.benchmarks[0].host["cpu_us"] == {"base": 9.0, "head": 13.0}


def test_the_report_shows_the_host_metric_beside_the_gpu_time():
    from attnkit_perf.report.host import host_lines

    host = decide_host([10e-6, 10.1e-6, 9.9e-6], [14e-6, 14.2e-6, 13.9e-6], 0.05, ALPHA, confirmed=True)
    decision = with_kept(join_host(_time("same"), host, host_summary(host)), 0, 256 * 1024, gate.Thresholds())
    row = BenchmarkVerdict.from_decision(
        {"name": NAME, "group": "g", "backend": "triton", "pass_name": "fwd", "shape": {}}, decision
    )
    doc = _aa_doc(1.0)
    doc.benchmarks = [row]
    text = "\n".join(host_lines(doc))
    assert "### Host work and host time per call" in text and f"`{NAME}`" in text, text
    assert "10.00 µs" in text and "1.060×" in text and "0 B → 256.0 KiB" in text, text


# --- kept memory: an earlier case's garbage between the two readings -----------------------
#
# On an H200, a stored-mode recording read -96 MiB kept for the loop case that followed a case
# its backend declined at the first call: the q, k and v of that case (96 MiB) were held by the
# skip's exception chain in a reference cycle and freed when the collector ran, during the next
# case's calls. On the CPU the allocator keeps no statistics, so a buffer that counts its own
# bytes while it lives stands for a device tensor here.

MIB = 2**20


class _Buffer:
    """Stands for a device tensor: its bytes count as allocated while it lives (what
    ``torch.cuda.memory_allocated`` reads on a GPU)."""

    live = 0

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        _Buffer.live += nbytes

    def __del__(self) -> None:
        _Buffer.live -= self.nbytes


@pytest.fixture
def no_collector():
    """Python's cyclic collector runs only where a test calls it (as it runs only when its
    thresholds are crossed, at a moment a measurement does not choose)."""
    gc.collect()
    assert _Buffer.live == 0, f"{_Buffer.live} B of buffers alive from another test"
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def _raw(device) -> int:
    """A reading that releases nothing first (the reading before the fix)."""
    return _Buffer.live


def _settled(device) -> int:
    """The reading :func:`attnkit_perf.measure.host.allocated` takes, on the stand-in buffers."""
    release_garbage(device)
    return _Buffer.live


def _caught(fn) -> None:
    """Call ``fn`` and keep what it raised, as a test runner keeps a test's outcome (pytest's
    ``CallInfo``): the frame holding the exception is on that exception's own traceback, a
    reference cycle that only the collector frees, with everything the exception reaches."""
    try:
        fn()
    except BaseException:
        outcome = sys.exc_info()  # noqa: F841 (held by this frame: the cycle)


def _declined_at_the_first_call(nbytes: int) -> None:
    inputs = _Buffer(nbytes)  # noqa: F841 (the case's q, k and v, live when the backend declines)
    raise UnsupportedProblemError("sdpa-efficient declined the shape at its first call")


def _skip_raised_inside_the_except_block(nbytes: int) -> None:
    """The declined case as stored mode once skipped it: the skip's implicit context is the
    backend's error, whose traceback holds the measuring frames and so the inputs."""
    try:
        _declined_at_the_first_call(nbytes)
    except UnsupportedProblemError as err:
        pytest.skip(f"does not support this shape: {err}")


def test_an_earlier_case_freed_during_the_calls_is_a_measurement_error_not_a_negative_value(no_collector):
    _caught(lambda: _skip_raised_inside_the_except_block(96 * MIB))
    assert _Buffer.live == 96 * MIB, "the declined case's inputs are held by the cycle"
    before = _raw(CPU)
    # The collector runs during the calls (here: called by them) and frees the earlier case.
    with pytest.raises(KeptMemoryError) as err:
        kept_bytes(gc.collect, CPU, before, read=_raw)
    message = str(err.value)
    assert "(-100663296 B)" in message and "100663296 B that were live before the calls" in message, message
    assert "never stored" in message, message


def test_the_readings_release_earlier_garbage_so_a_case_reads_only_what_it_keeps(no_collector):
    _caught(lambda: _skip_raised_inside_the_except_block(96 * MIB))
    cache = []

    def plain():
        gc.collect()  # the collector running in the middle of the calls changes nothing now
        return _Buffer(MIB)

    def leaky():
        out = plain()
        cache.append(out)  # every call keeps its output
        return out

    assert kept_bytes(plain, CPU, _settled(CPU), read=_settled) == 0
    _caught(lambda: _skip_raised_inside_the_except_block(96 * MIB))
    kept = kept_bytes(leaky, CPU, _settled(CPU), read=_settled)
    assert kept == KEPT_CALLS * MIB, f"{KEPT_CALLS} outputs of 1 MiB kept, read {kept} B"


def test_stored_mode_skips_a_declined_case_without_keeping_its_inputs_alive(no_collector):
    """The cause at its source: the skip is raised after the except block, so nothing chains
    the backend's error (and the frames holding the inputs) to the outcome the runner keeps."""
    declined = {}

    def benchmark_case(benchmark, case, wrap):
        _declined_at_the_first_call(96 * MIB)

    session = SimpleNamespace(
        measurer=SimpleNamespace(benchmark_case=benchmark_case),
        record_declined=lambda nodeid, why: declined.update({nodeid: why}),
    )
    benchmark = SimpleNamespace(fullname="test_fwd[sdpa-efficient-x]", skipped=False)
    case = SimpleNamespace(backend="sdpa-efficient")
    _caught(lambda: PerfSession.run_stored(session, benchmark, case, None))
    assert benchmark.skipped and "declined the shape" in declined[benchmark.fullname], declined
    assert _Buffer.live == 0, f"{_Buffer.live} B of the declined case still alive after its skip"


# --- on a GPU: kept memory and a graph case's peak -----------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="the allocator's statistics are CUDA's")


@needs_cuda
def test_a_call_that_caches_its_output_keeps_memory_and_a_plain_call_does_not():
    from attnkit_perf.measure.host import KEPT_CALLS, allocated, kept_bytes

    device = torch.device("cuda")
    x = torch.randn(256, 256, device=device)
    cache = []

    def leaky():
        out = x * 2
        cache.append(out)  # a leak: every call keeps its 256 KiB output
        return out

    plain = kept_bytes(lambda: x * 2, device, allocated(device))
    leaked = kept_bytes(leaky, device, allocated(device))
    assert plain == 0, f"a call that keeps nothing read {plain} B kept"
    assert leaked == KEPT_CALLS * x.numel() * 4, f"{KEPT_CALLS} outputs of 256 KiB kept, read {leaked} B"


@needs_cuda
def test_a_tensor_held_by_a_reference_cycle_is_released_before_the_first_reading(no_collector):
    from attnkit_perf.measure.host import allocated

    device = torch.device("cuda")
    holder = SimpleNamespace(tensor=torch.empty(96 * MIB, dtype=torch.uint8, device=device))
    holder.itself = holder  # a cycle: only the collector frees the 96 MiB
    del holder
    kept = kept_bytes(gc.collect, device, allocated(device))
    assert kept == 0, f"a call that keeps nothing read {kept} B kept"


@needs_cuda
def test_a_graph_case_reads_the_peak_of_its_capture():
    from attnkit_perf.measure.cases import BenchCase
    from attnkit_perf.measure.host import build_measured

    case = BenchCase("sdpa", "fwd", 1, 8, 8, 128, 64, True, mode="graph")
    built = build_measured(case, torch.device("cuda"))
    out_bytes = 1 * 8 * 128 * 64 * 2
    assert built.graph_peak is not None and built.graph_peak >= out_bytes, (built.graph_peak, out_bytes)


def test_a_drop_within_the_rules_resolution_reads_nothing_kept():
    """A small block another component frees during the calls (-512 B read on an H200) is below
    what the kept-memory rule can call, not a measurement error."""
    readings = iter([10_000_000 - 512])
    assert kept_bytes(lambda: None, CPU, 10_000_000, calls=1, read=lambda device: next(readings)) == 0
    readings = iter([10_000_000 - 2 * MIB])
    with pytest.raises(KeptMemoryError):
        kept_bytes(lambda: None, CPU, 10_000_000, calls=1, read=lambda device: next(readings))
