"""The sequential decision of GPU rows (attnkit_perf.decide.sequential), simulated with the gate's
own functions on synthetic looks with realistic noise (tests/gate/perf_synthetic.py::look_blocks:
a process offset of 1-2% per process pairing, heavy-tailed; a round jitter of 2-5% with 2% of
rounds 1.2-3x slow). Each row's threshold is what the policy makes of its A/A noise
(gate.benchmark_threshold), never below the practical 2%. The figures kept:

* a true slowdown of 1.5x the threshold fails in >= 90% of rows;
* a true slowdown of exactly the threshold is called same in <= 5% of rows;
* unchanged code (A/A) is never slower nor faster, over 600 rows, and same in >= 95%.

Runs of 25 rows share a look budget, 10 of them changed: the bank the unchanged rows leave is
what the changed ones are measured to the end with.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from perf_synthetic import look_blocks

from attnkit_perf.decide import gate
from attnkit_perf.decide.sequential import LookBudget, SequentialPlan, decide_sequential, process_units
from attnkit_perf.measure.paired_session import PROCESSES_PER_SIDE, PairedSettings

T = gate.Thresholds()
RUN_BENCHMARKS = 100
ALPHA = gate.per_benchmark_alpha(T, RUN_BENCHMARKS)
PLAN = SequentialPlan()
PAIRS = PairedSettings().pairs_per_look


def _noise_sd(process_sd: float, cv: float) -> float:
    """The sd of one look's log ratio that an A/A noise file of this row would hold: its 4 units,
    each a process offset plus the median of its pairs' block noise (a block, the median of 3
    rounds, has about 0.67 x the round's sd)."""
    per_unit = PAIRS // PROCESSES_PER_SIDE
    unit_var = process_sd**2 + 2 * (0.67 * cv) ** 2 / per_unit
    return math.sqrt(unit_var / PROCESSES_PER_SIDE)


def _row(rng, effect: float, budget: LookBudget) -> tuple[str, int]:
    """One row's outcome and looks: a true slowdown of ``effect`` times its threshold."""
    process_sd, cv = rng.uniform(0.01, 0.02), rng.uniform(0.02, 0.05)
    threshold = gate.benchmark_threshold(T, _noise_sd(process_sd, cv), ALPHA, confirmed=True)
    base, head, labels, look = [], [], [], 0
    while True:
        more = look_blocks(rng, PAIRS, 1 + effect * threshold, process_sd, cv)
        base += more[0]
        head += more[1]
        labels += [look * PROCESSES_PER_SIDE + i % PROCESSES_PER_SIDE for i in range(PAIRS)]
        look += 1
        d = decide_sequential(base, head, labels, look, PLAN, ALPHA, threshold)
        if d.settled or not budget.may_look(look):
            break
    budget.settle(look)
    return d.outcome, look


def simulate(effect: float, seed: int, runs: int = 20, rows: int = 25, changed: int = 10) -> dict:
    """``runs`` runs of ``rows`` rows sharing a :class:`LookBudget` each, ``changed`` of them (at
    random places) slowed by ``effect`` times their threshold, the others unchanged:
    ``{"changed": [(outcome, looks)], "unchanged": [...]}``."""
    rng = np.random.default_rng(seed)
    found = {"changed": [], "unchanged": []}
    for _ in range(runs):
        budget = LookBudget(PLAN)
        slowed = set(rng.choice(rows, changed, replace=False).tolist())
        for row in range(rows):
            kind = "changed" if row in slowed else "unchanged"
            found[kind].append(_row(rng, effect if kind == "changed" else 0.0, budget))
    return found


@pytest.fixture(scope="module")
def runs() -> dict[float, dict]:
    """Simulated runs at a true slowdown of 1.5 thresholds and of exactly the threshold (the
    other rows of each run unchanged): 200 changed and 300 unchanged rows each."""
    return {effect: simulate(effect, seed=int(effect * 10)) for effect in (1.5, 1.0)}


def _outcomes(rows) -> list[str]:
    return [outcome for outcome, _ in rows]


def test_a_slowdown_of_one_and_a_half_thresholds_fails_in_at_least_90_percent_of_rows(runs):
    outcomes = _outcomes(runs[1.5]["changed"])
    caught = outcomes.count("slower") / len(outcomes)
    assert caught >= 0.90, f"1.5 t: slower in {caught:.1%} of {len(outcomes)} rows; {sorted(set(outcomes))}"
    assert "same" not in outcomes, f"1.5 t called same in {outcomes.count('same')} rows"


def test_a_slowdown_of_exactly_the_threshold_is_same_in_at_most_5_percent_of_rows(runs):
    outcomes = _outcomes(runs[1.0]["changed"])
    same = outcomes.count("same") / len(outcomes)
    assert same <= 0.05, f"exactly t: same in {same:.1%} of {len(outcomes)} rows"


def test_unchanged_code_never_fails_and_mostly_settles_same_in_few_looks(runs):
    rows = runs[1.5]["unchanged"] + runs[1.0]["unchanged"]
    outcomes = _outcomes(rows)
    alarms = outcomes.count("slower") + outcomes.count("faster")
    assert alarms == 0, f"{alarms} of {len(rows)} unchanged rows slower or faster"
    same = outcomes.count("same") / len(outcomes)
    assert same >= 0.95, f"unchanged: same in {same:.1%} of {len(rows)} rows"
    looks = np.mean([taken for _, taken in rows])
    assert looks <= 3, f"unchanged rows took {looks:.2f} looks on average"


def test_one_set_of_processes_never_shows_slower():
    """A slowdown must show on two independent sets of processes: one set's offsets can fake it."""
    rng = np.random.default_rng(4)
    base, head = look_blocks(rng, 48, 1.5, process_sd=0.001, cv=0.01)
    labels = [i % PROCESSES_PER_SIDE for i in range(48)]
    first = decide_sequential(base, head, labels, 1, PLAN, ALPHA, 0.02)
    assert first.outcome == "inconclusive", first.reason
    two_sets = [x + PROCESSES_PER_SIDE * (i >= 24) for i, x in enumerate(labels)]
    second = decide_sequential(base, head, two_sets, 2, PLAN, ALPHA, 0.02)
    assert second.outcome == "slower", second.reason
    assert second.ratio == pytest.approx(1.5, rel=0.02), second.reason


def test_units_are_medians_per_process():
    labels, units = process_units([0.0, 0.1, 0.2, 1.0, 1.1, 5.0], [0, 0, 0, 7, 7, 7])
    assert list(labels) == [0, 7] and list(units) == pytest.approx([0.1, 1.1]), units


def test_no_evidence_is_inconclusive():
    d = decide_sequential([1.0] * 8, [1.0] * 8, [0, 1, 2, 3] * 2, 1, PLAN, ALPHA, 0.02)
    assert d.outcome == "inconclusive" and "identical" in d.reason, d.reason
    d = decide_sequential([1.0, 1.1] * 4, [1.0, 1.2] * 4, [0, 1] * 3, 1, PLAN, ALPHA, 0.02)
    assert d.outcome == "inconclusive" and "process labels" in d.reason, d.reason


def test_the_bank_lends_looks_only_from_what_settled_rows_left():
    assert LookBudget(SequentialPlan(looks=5, fair=2)).bank == 3, "a run opens with one row's extension"
    budget = LookBudget(SequentialPlan(looks=5, fair=2), bank=0)
    assert budget.may_look(1) and not budget.may_look(2), "no bank: the fair share only"
    budget.settle(1)  # one look left unused
    assert budget.may_look(2) and not budget.may_look(3), "one banked look lends one look"
    budget.settle(3)
    assert budget.bank == 0 and not budget.may_look(2), "the lent look is spent"


@pytest.mark.parametrize(("field", "value"), [("looks", 1), ("fair", 0), ("miss", 1.5)])
def test_a_bad_plan_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"SequentialPlan.{field}"):
        SequentialPlan(**{field: value})
