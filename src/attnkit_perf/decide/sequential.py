"""Paired mode's sequential decision for a GPU row: looks over fresh sets of worker processes,
stopped as soon as the evidence decides, and a run budget that gives the undecided rows the
looks the settled ones did not need.

**Units.** Pairs measured on one worker process share its offset (allocation addresses, code
placement: 1-2% between processes), so pairs are not independent evidence: 48 pairs on 4
processes are 4 observations of the offset. The unit of evidence is the **process pairing**
(worker ``i`` of the base with worker ``i`` of the head within one set of processes): its value
is the median log ratio of its pairs (robust to a disturbed block), and units of different
processes are independent.

**Looks.** A look is one set of ``G`` fresh processes per side measuring ``pairs_per_look``
pairs: ``G`` more units. After look ``k`` (``n = G k`` units, mean ``m``, standard error
``se``), with ``T = log(1 + t)`` and ``K`` the planned looks:

* **slower**: ``m >= T`` and the one-sided Student t lower bound at ``alpha / (K - 1)`` is above
  0; only from the second look on (a slowdown must show on two independent sets of processes,
  which replaces a separate confirmation);
* **faster**: the mirror image;
* **same**: the one-sided upper bound at ``miss / K`` is below ``T`` and no speed-up is shown;
* otherwise **inconclusive**: another look, while the plan and the run's budget allow.

Levels are spent evenly over the looks that may decide (Bonferroni), so however many looks a
row takes, unchanged code fails with probability at most ``alpha`` and a true change of exactly
``t`` is called same with probability at most ``miss`` (5%). Stopping early only leaves some of
the level unspent. ``tests/gate/test_sequential.py`` simulates this with realistic noise.

**Budget.** :class:`LookBudget` gives every row ``fair`` looks and banks what a settled row left
unused; a row still inconclusive after ``fair`` looks draws on the bank, up to the plan's
``looks``. The bank never changes a level (the plan fixes ``K``), only whether a row is measured
to its end.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from attnkit_perf.decide.gate import Decision
from attnkit_perf.decide.stats import sample_problem

#: Fewest pairs a unit needs (its median then is more than one block pair's value).
MIN_PAIRS_PER_UNIT = 2


@dataclass(frozen=True)
class SequentialPlan:
    """``looks``: most sets of fresh processes one row may take (the ``K`` its levels are spread
    over); ``fair``: looks each row is entitled to before it draws on the run's bank; ``miss``:
    the chance of calling a true change of exactly the threshold "same", over all looks."""

    looks: int = 6
    fair: int = 4
    miss: float = 0.05

    def __post_init__(self) -> None:
        if self.looks < 2:
            raise ValueError(
                f"SequentialPlan.looks: at least 2 (a slowdown shows on two sets), got {self.looks}"
            )
        if not 1 <= self.fair <= self.looks:
            raise ValueError(f"SequentialPlan.fair: between 1 and looks={self.looks}, got {self.fair}")
        if not 0 < self.miss < 1:
            raise ValueError(f"SequentialPlan.miss: a probability in (0, 1), got {self.miss}")


def process_units(logs, processes) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, medians)``: each process pairing's median log ratio (``processes[i]`` labels
    pair ``i``; labels must differ between sets of processes)."""
    logs, processes = np.asarray(logs, dtype=float), np.asarray(processes)
    labels = np.unique(processes)
    return labels, np.array([np.median(logs[processes == g]) for g in labels])


@functools.lru_cache(maxsize=256)
def _t_quantile(level: float, df: int) -> float:
    return float(stats.t.isf(level, df))


def _bound(units: np.ndarray, level: float, upper: bool) -> float:
    """One-sided Student t bound of the units' mean at ``level`` (its miss probability)."""
    n = len(units)
    half = _t_quantile(level, n - 1) * units.std(ddof=1) / math.sqrt(n)
    return float(units.mean() + half if upper else units.mean() - half)


def decide_sequential(
    base_blocks,
    head_blocks,
    processes,
    look: int,
    plan: SequentialPlan,
    alpha: float,
    threshold: float,
) -> Decision:
    """The GPU time's decision after ``look`` looks (1-based) on blocks measured as pairs (index
    ``i`` of each side is pair ``i``), ``processes[i]`` the process pairing that measured pair
    ``i``. Memory is judged apart, by its own rule (:meth:`PairedRule.decide`)."""
    problem = sample_problem(base_blocks, "base") or sample_problem(head_blocks, "head")
    if problem is None and not len(base_blocks) == len(head_blocks) == len(processes):
        counts = (len(base_blocks), len(head_blocks), len(processes))
        problem = "{} base and {} head blocks, {} process labels".format(*counts)
    if problem is None and not 1 <= look <= plan.looks:
        problem = f"look {look} outside the plan's 1..{plan.looks}"
    if problem:
        return Decision("inconclusive", reason=problem)
    logs = np.log(np.asarray(head_blocks, float)) - np.log(np.asarray(base_blocks, float))
    labels, units = process_units(logs, processes)
    counts = [int(np.sum(np.asarray(processes) == g)) for g in labels]
    limit = math.log1p(threshold)
    mean = float(units.mean())
    common = {"ratio": math.exp(mean), "threshold": threshold, "alpha": alpha}
    if len(units) < 2 or min(counts) < MIN_PAIRS_PER_UNIT or np.ptp(units) == 0:
        why = f"{len(units)} processes, {min(counts)} pairs on the fewest: too little to bound"
        return Decision("inconclusive", reason=why, **common)
    level = alpha / (plan.looks - 1)
    low, high = _bound(units, level, upper=False), _bound(units, level, upper=True)
    same_high = _bound(units, plan.miss / plan.looks, upper=True)
    same_low = _bound(units, plan.miss / plan.looks, upper=False)
    common["ci"] = (math.exp(same_low), math.exp(same_high))
    text = (
        f"x{math.exp(mean):.4f} over {len(units)} processes ({len(logs)} pairs, look {look} of "
        f"{plan.looks}), {1 - plan.miss:.0%} bounds [{math.exp(same_low):.4f}, {math.exp(same_high):.4f}]"
    )
    if look >= 2 and mean >= limit and low > 0:
        d = Decision("slower", reason=f"{text}; above x1 at {level:.1e}, >= x{1 + threshold:.3f}", **common)
    elif look >= 2 and mean <= -limit and high < 0:
        d = Decision("faster", reason=f"{text}; below x1 at {level:.1e}", **common)
    elif mean <= -limit and same_high < 0:
        d = Decision("inconclusive", reason=f"{text}: looks faster, not yet shown at {level:.1e}", **common)
    elif same_high < limit:
        d = Decision("same", reason=f"{text}: below x{1 + threshold:.3f}", **common)
    else:
        d = Decision("inconclusive", reason=f"{text}: cannot tell at x{1 + threshold:.3f}", **common)
    d.extra.update(
        pairs=len(logs),
        looks=look,
        planned_looks=plan.looks,
        units=[round(float(u), 5) for u in units],
        log_ratios=[round(float(x), 5) for x in logs],
        processes=[int(p) for p in processes],
        pairs_ci=[math.exp(low), math.exp(high)],
        slower_reachable=look < plan.looks or d.outcome != "inconclusive",
    )
    return d


@dataclass
class LookBudget:
    """A run's looks: each row may take ``plan.fair`` looks, and more up to ``plan.looks`` while
    the bank of looks the earlier rows left unused lasts. The bank opens with one row's extension
    (``looks - fair``), so a change met by the run's first row is measured to its end too."""

    plan: SequentialPlan
    bank: int | None = None

    def __post_init__(self) -> None:
        if self.bank is None:
            self.bank = self.plan.looks - self.plan.fair

    def may_look(self, done: int) -> bool:
        """Whether a row that has taken ``done`` looks and is still inconclusive may take another."""
        if done >= self.plan.looks:
            return False
        return done < self.plan.fair or done - self.plan.fair < self.bank

    def settle(self, taken: int) -> None:
        """A row finished after ``taken`` looks: its unused fair share goes to the bank, its
        looks beyond the fair share come out of it."""
        self.bank = max(self.bank + self.plan.fair - taken, 0)
