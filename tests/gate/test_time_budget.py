"""Paired mode within a time budget, on the CPU with a virtual clock: what rows cost
(attnkit_perf.run.time_budget), which rows run first (attnkit_perf.select.priority), how a cut row
and a row never started read in the verdict (attnkit_perf.decide.out_of_time), and the looks
measure_looks takes when the budget runs out. The plugin end to end: tests/gate/test_gate_plugin.py.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from perf_synthetic import SHAPE

from attnkit_perf.decide.gate import Decision
from attnkit_perf.decide.out_of_time import after_looks, not_reached, unfinished
from attnkit_perf.decide.sequential import SequentialPlan
from attnkit_perf.formats.schema import validate
from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument
from attnkit_perf.measure.cases import BenchCase
from attnkit_perf.measure.paired_session import PairedSettings, PreparedCase, SideResult
from attnkit_perf.report.data import RunInfo
from attnkit_perf.report.markdown import render_markdown
from attnkit_perf.report.terminal import summary_line
from attnkit_perf.run import paired_benchmark
from attnkit_perf.run.time_budget import (
    PRIOR_LOOK_S,
    RowCosts,
    TimeBudget,
    process_start,
    row_kind,
    run_order,
)
from attnkit_perf.select.priority import TIERS, row_priority
from attnkit_perf.select.rules import Affected, Effect


class VirtualClock:
    """Seconds that move only when the test (or a fake measurement) says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _case(
    backend: str = "triton", pass_name: str = "fwd", mode: str = "eager", head_dim: int = 64
) -> BenchCase:
    shape = {**SHAPE, "dtype": "bf16", "head_dim": head_dim}
    return BenchCase(backend=backend, pass_name=pass_name, mode=mode, **shape)


# --- what a row costs -------------------------------------------------------------------------


def test_the_estimate_starts_at_the_prior_and_moves_to_what_the_run_measures():
    costs = RowCosts()
    assert costs.estimate("eager fwd") == PRIOR_LOOK_S["eager"], "no look measured: the prior"
    assert costs.estimate("loop fwd") == PRIOR_LOOK_S["loop"]
    costs.record("eager fwd", "first", 12.0)
    # The prior counts as one look, scaled by this machine's pace (12 s measured for a 24 s prior).
    assert costs.estimate("eager fwd") == pytest.approx((24.0 * 0.5 + 12.0) / 2)
    for _ in range(8):
        costs.record("eager fwd", "first", 12.0)
    assert costs.estimate("eager fwd") == pytest.approx(12.0), "measured looks outweigh the prior"
    # Further looks are estimated apart from first looks (kernels then load from the cache).
    costs.record("eager fwd", "look", 6.0)
    assert costs.estimate("eager fwd", "look") < costs.estimate("eager fwd", "first")


def test_a_kind_not_yet_measured_is_estimated_at_this_machines_pace():
    costs = RowCosts()
    costs.record("eager fwd", "first", 48.0)  # this machine takes twice the prior
    assert costs.pace == pytest.approx(2.0)
    assert costs.estimate("loop bwd") == pytest.approx(2.0 * PRIOR_LOOK_S["loop"])
    summary = costs.summary()
    assert summary["eager fwd"]["first"] == {"estimate_s": 48.0, "looks": 1}, summary


def test_a_row_kind_or_step_without_a_meaning_is_refused_by_name():
    with pytest.raises(ValueError, match="no prior for call mode 'warp'"):
        RowCosts().estimate("warp fwd")
    with pytest.raises(ValueError, match="step must be one of"):
        RowCosts().record("eager fwd", "second", 1.0)
    with pytest.raises(ValueError, match="TimeBudget: seconds must be a positive number"):
        TimeBudget(0)
    assert row_kind(_case(pass_name="bwd", mode="loop")) == "loop bwd"


# --- starting a row, taking a look --------------------------------------------------------------


def test_rows_start_while_the_time_left_covers_their_first_look():
    clock = VirtualClock()
    budget = TimeBudget(60.0, clock=clock)
    first = budget.start("eager fwd")
    assert not isinstance(first, str)
    first.record("first", 30.0)
    clock.now += 30.0
    # 30 s left; the estimate is now (24 * 1.25 + 30) / 2 = 30 s: it fits exactly.
    assert not isinstance(budget.start("eager fwd"), str)
    clock.now += 10.0
    why = budget.start("eager fwd")
    assert why == "20 s of 60 s left, the first look of a row (eager fwd) takes ~30 s", why
    assert budget.summary()["spent_s"] == 40.0


def test_the_first_row_always_starts_so_a_run_compares_something():
    clock = VirtualClock()
    budget = TimeBudget(1.0, clock=clock)
    clock.now += 5.0  # the workers' start took the whole budget
    assert not isinstance(budget.start("eager bwd"), str)
    assert isinstance(budget.start("eager bwd"), str), "the second row does not fit"


def test_without_a_budget_every_row_starts_and_the_costs_are_still_learned():
    clock = VirtualClock()
    budget = TimeBudget(None, clock=clock)
    row = budget.start("eager fwd")
    clock.now += 10_000
    assert row.may_look() and row.cut is None
    assert not isinstance(budget.start("eager fwd"), str)
    assert budget.summary() is None


class FakePaired:
    """A paired session whose every measurement is inconclusive and costs ``look_s`` virtual
    seconds, half preparing and half measuring pairs: the time budget alone stops its looks."""

    def __init__(self, clock: VirtualClock, look_s: float) -> None:
        self.clock, self.look_s, self.restarts = clock, look_s, 0

    def prepare(self, case, fingerprint=False):
        self.clock.now += self.look_s / 2
        return PreparedCase(case, {side: SideResult() for side in ("base", "head")}, reps=1)

    def prepare_others(self, prepared):
        prepared.everyone = True

    def measure_pairs(self, prepared, pairs, rounds):
        self.clock.now += self.look_s / 2
        blocks = [1.0, 1.1] * (pairs // 2)
        for result in prepared.results.values():
            result.blocks, result.workers = list(blocks), list(range(len(blocks)))

    def release(self):
        pass

    def restart(self):
        self.restarts += 1


def test_a_row_still_undecided_when_the_time_runs_out_is_cut_and_says_why(monkeypatch):
    clock = VirtualClock()
    # measure_looks times its looks with time.perf_counter: the same virtual clock here.
    monkeypatch.setattr(paired_benchmark, "time", SimpleNamespace(perf_counter=clock))
    budget = TimeBudget(100.0, clock=clock)
    row = budget.start("eager fwd")
    paired = FakePaired(clock, look_s=30.0)
    rule = SimpleNamespace(
        plan=SequentialPlan(),
        decide=lambda *results: Decision("inconclusive"),
        same_work=lambda results: False,
    )
    settings = PairedSettings(budget_s=1e9)
    results, seconds = paired_benchmark.measure_looks(
        paired, rule, _case().as_dict(), settings, host=False, clock=row
    )
    # Looks of 30 s each: after 3 (90 s) the 10 s left cannot cover a fourth.
    assert results["head"].looks == 3 and paired.restarts == 2, (results["head"].looks, paired.restarts)
    assert row.cut == "10 s of 100 s left, a further look takes ~30 s", row.cut
    assert budget.costs.measured == {("first", "eager fwd"): [30.0], ("look", "eager fwd"): [30.0, 30.0]}
    assert seconds == {"prepare": 15.0, "measure": 30.0, "looks": 60.0}, seconds


# --- the verdict of a run out of time -------------------------------------------------------------


def _row(name: str, decision: Decision) -> BenchmarkVerdict:
    return BenchmarkVerdict.from_decision(
        {"name": name, "group": "g", "backend": "triton", "pass_name": "fwd", "shape": {}}, decision
    )


def _document(out_of_time: str) -> VerdictDocument:
    cut = Decision("inconclusive", ratio=1.01, reason="x1.0100 over 4 processes: cannot tell at x1.020")
    rows = [
        _row("fwd[a]", Decision("same", ratio=1.0, reason="below x1.020")),
        _row("fwd[b]", unfinished(cut, "10 s of 360 s left, a further look takes ~24 s", 1, 6)),
        _row("fwd[c]", not_reached("3 s of 360 s left, the first look of a row (eager fwd) takes ~24 s")),
    ]
    thresholds = {
        "slower": 0.02,
        "run_alpha": 0.01,
        "memory_rel": 0.01,
        "memory_abs_bytes": 1,
        "out_of_time": out_of_time,
    }
    return VerdictDocument(
        mode="paired",
        base={"label": "base"},
        head={"label": "head"},
        thresholds=thresholds,
        benchmarks=rows,
        time_budget={"seconds": 360.0, "spent_s": 357.0, "estimates": {}},
    )


@pytest.mark.parametrize(("out_of_time", "passed"), [("pass", True), ("fail", False)])
def test_a_run_out_of_time_names_every_undecided_row_and_passes_only_when_told(out_of_time, passed):
    doc = _document(out_of_time)
    assert doc.undecided == ["fwd[b]", "fwd[c]"]
    assert doc.passed is passed, doc.failing
    line = summary_line(doc)
    assert line.endswith("; 2 rows not decided in the time budget of 360 s: fwd[b], fwd[c]"), line
    assert ("passed" if passed else "FAILED") in line, line
    data = doc.to_dict()
    validate("verdict", data, "the verdict of a run out of time")
    assert data["time_budget"]["undecided"] == ["fwd[b]", "fwd[c]"], data["time_budget"]
    assert data["counts"] == {"unfinished": 1, "not-reached": 1, "same": 1}, data["counts"]
    again = VerdictDocument.from_dict(data)
    assert again.undecided == doc.undecided and again.passed is passed
    markdown = render_markdown(doc, [], RunInfo(), plots=None, plots_skipped="not needed here")
    assert "2 rows not decided in the time budget of 360 s" in markdown, markdown
    assert "`fwd[b]`, `fwd[c]`" in markdown, markdown


@pytest.mark.parametrize("outcome", ["slower", "more-memory", "same", "faster"])
def test_a_row_decided_before_the_cut_keeps_its_outcome(outcome):
    decided = Decision(outcome, reason="decided in time")
    assert after_looks(decided, "5 s left", 2, 6) is decided
    measured_out = after_looks(Decision("inconclusive"), None, 6, 6)
    assert measured_out.outcome == "inconclusive", "not cut: measured to the end of its plan"
    assert after_looks(Decision("inconclusive"), "5 s left", 1, 6).outcome == "unfinished"


def test_an_unfinished_row_keeps_its_evidence_and_counts_its_looks():
    cut = Decision("inconclusive", ratio=1.01, reason="x1.0100: cannot tell", extra={"looks": 2})
    row = unfinished(cut, "5 s left", 2, 6)
    assert row.outcome == "unfinished" and row.ratio == 1.01 and row.extra["looks"] == 2
    assert row.reason.startswith("not decided within the time budget: 2 of 6 looks (5 s left)"), row.reason
    assert row.reason.endswith("x1.0100: cannot tell"), row.reason


# --- which rows run first -----------------------------------------------------------------------


def _affected(*effects: Effect, entry_rules: dict | None = None) -> Affected:
    known = ("triton", "sdpa", "tiled", "naive", "auto")
    return Affected(
        "main", [e.path for e in effects], list(effects), None, {"auto": None}, known, entry_rules or {}
    )


def test_rows_of_a_backend_whose_own_code_changed_come_first():
    decision = _affected(Effect("src/attnkit/triton/forward.py", "backends", "", {"triton": "all"}))
    assert row_priority(decision, _case("triton")) == 0
    assert row_priority(decision, _case("auto")) == 2, "reached through auto's dispatch only"
    assert row_priority(decision, _case("triton", mode="loop")) == 0
    backward = _affected(Effect("src/attnkit/triton/backward.py", "backends", "", {"triton": "backward"}))
    assert row_priority(backward, _case("triton", "bwd")) == 0
    assert row_priority(backward, _case("triton", "fwd")) == 2, "a forward row does not run the change"


def test_rows_reading_a_changed_table_entry_come_first():
    rules = {"families": {"rows": "family"}}
    table = Effect(
        "src/attnkit/triton/configs/x.json",
        "backends",
        "",
        {"triton": "all"},
        entries=("families/16bit-d64-causal",),
    )
    decision = _affected(table, entry_rules=rules)
    assert row_priority(decision, _case("triton", head_dim=64)) == 0
    assert row_priority(decision, _case("triton", head_dim=128)) == 2


def test_host_rows_come_first_when_shared_code_changed():
    decision = _affected(Effect("src/attnkit/api.py", "everything", "shared"))
    assert row_priority(decision, _case("sdpa", mode="loop")) == 1
    assert row_priority(decision, _case("sdpa")) == 2
    assert row_priority(None, _case("sdpa", mode="loop")) == 1, "no diff decided: host rows first too"
    assert len(TIERS) == 3


def test_the_run_order_is_by_tier_then_cheapest_first_ties_kept_in_grid_order():
    decision = _affected(
        Effect("src/attnkit/api.py", "everything", "shared"),
        Effect("src/attnkit/triton/forward.py", "backends", "", {"triton": "all"}),
    )
    grid = [
        _case("sdpa", "bwd"),
        _case("sdpa", "fwd"),
        _case("sdpa", "fwd", mode="loop"),
        _case("triton", "bwd"),
        _case("triton", "fwd", mode="loop"),
    ]
    costs = RowCosts()
    costs.record("eager bwd", "first", 60.0)  # backward rows measured dearer than forward ones
    costs.record("eager fwd", "first", 20.0)
    order = run_order(grid, lambda c: row_priority(decision, c), costs)
    names = [(c.backend, c.pass_name, c.mode) for c in order]
    assert names == [
        ("triton", "fwd", "loop"),  # own code, the cheaper kind
        ("triton", "bwd", "eager"),
        ("sdpa", "fwd", "loop"),  # a host row under a shared change
        ("sdpa", "fwd", "eager"),
        ("sdpa", "bwd", "eager"),
    ], names


def test_the_option_outside_paired_mode_is_refused_and_the_ini_key_ignored():
    """Every run of a project reads its ini keys (the correctness suite too): a budget set there
    plans the paired runs and leaves the others alone; the option, given by hand, is refused."""
    from attnkit_perf.run.options import time_budget

    assert time_budget(None, "paired", "300") == 300.0
    assert time_budget(None, None, "300") is None and time_budget(None, "stored", "300") is None
    assert time_budget("none", "paired", "300") is None, "the option overrides the ini key"
    with pytest.raises(pytest.UsageError, match="this run is not comparing: drop the option"):
        time_budget("300", None)
    with pytest.raises(pytest.UsageError, match="expected a number of seconds > 0 or 'none', got 'soon'"):
        time_budget(None, "paired", "soon")


def test_the_budget_counts_from_the_process_start_where_the_caller_started_its_clock():
    """The imports, collection and workers' start of the pytest process are part of the step the
    caller budgeted: a budget counted from the session's start ran 35 s over on an H200."""
    started = process_start()
    assert started <= time.monotonic()
    age = time.monotonic() - started
    # This process imported torch and collected tests before this line: far more than the
    # microseconds a budget counted from now would give.
    assert 0.2 < age < 24 * 3600, age
    budget = TimeBudget(100.0, started=started)
    assert budget.remaining() == pytest.approx(100.0 - age, abs=1.0)
