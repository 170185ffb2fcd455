"""Paired mode within a time budget (``--attnkit-time-budget=SECONDS``): what a row costs, and
whether the run may start a row or take a further look of one.

A row's time goes into its looks (:func:`attnkit_perf.run.paired_benchmark.measure_looks`): the
first builds the case on every worker of both sides, compiles or loads its kernels, warms up and
measures its pairs; each further look does the same on a fresh set of processes (the kernels
then load from the cache). :class:`RowCosts` estimates both per **row kind** (:func:`row_kind`:
the call mode and the pass) from a prior (:data:`PRIOR_LOOK_S`) and the looks this run has
measured. The prior counts as one look, scaled by how this machine compares with it on the kinds
measured so far, so the estimate moves to what this run takes as rows complete.

:class:`TimeBudget` counts from the pytest process's start (:func:`process_start`). Before a row
starts, the time left must cover its first look's estimate; before a further look, a look's. The
run's first row always starts (a run that compared nothing has not passed, whatever its budget).
What the budget stops becomes an ``unfinished`` or ``not-reached`` row
(:mod:`attnkit_perf.decide.out_of_time`). The host metric's extra processes and a host slowdown's
confirmation are not cut: they are bounded (``PairedSettings.host_looks``), and a slowdown needs
them to fail.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from attnkit_perf.measure.cases import BenchCase

#: Seconds one look of a row takes before this run has measured any, per call mode. On a fresh
#: H200, a look of an eager GPU row spent ~12 s preparing (building the case, compiling or
#: loading its kernels, warming up on 8 processes) and ~12 s measuring; 19 host-shape rows
#: (``loop``), whose host work count decides their host metric with no wall time, took 150 s.
#: The ``compiled`` and ``graph`` modes were not timed apart: they get the eager figure.
PRIOR_LOOK_S: Mapping[str, float] = {"eager": 24.0, "compiled": 24.0, "graph": 24.0, "loop": 8.0}
#: The two costs of a row: its first look (kernels compiled or loaded for the first time) and
#: each further look.
STEPS = ("first", "look")


def row_kind(case: BenchCase) -> str:
    """The kind a row's cost is estimated under: its call mode and pass, e.g. ``eager bwd``."""
    return f"{case.mode} {case.pass_name}"


def run_order(cases: list[BenchCase], tier: Callable[[BenchCase], int], costs: RowCosts) -> list[BenchCase]:
    """``cases`` in the order a run within a budget measures them: by ``tier`` (lowest first:
    :func:`attnkit_perf.select.priority.row_priority`), within a tier the cheapest first (their
    first look's estimate), ties in their given order."""
    return sorted(cases, key=lambda case: (tier(case), costs.estimate(row_kind(case))))


@dataclass
class RowCosts:
    """Estimated seconds per step (:data:`STEPS`) of a row kind: the prior counting as one
    observation, then every look of that kind this run measured."""

    prior: Mapping[str, float] = field(default_factory=lambda: dict(PRIOR_LOOK_S))
    #: (step, kind) -> seconds of each look measured.
    measured: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def _prior(self, kind: str) -> float:
        mode = kind.split()[0]
        if mode not in self.prior:
            raise ValueError(f"RowCosts: no prior for call mode {mode!r} (row kind {kind!r})")
        return self.prior[mode]

    @property
    def pace(self) -> float:
        """How this machine compares with the prior: seconds measured over the prior's seconds
        for the same looks (1 before any look)."""
        looks = [(kind, s) for (_, kind), seen in self.measured.items() for s in seen]
        if not looks:
            return 1.0
        return sum(s for _, s in looks) / sum(self._prior(kind) for kind, _ in looks)

    def estimate(self, kind: str, step: str = "first") -> float:
        """Seconds a ``step`` of a row of ``kind`` is expected to take."""
        if step not in STEPS:
            raise ValueError(f"RowCosts.estimate: step must be one of {STEPS}, got {step!r}")
        seen = self.measured.get((step, kind), [])
        return (self._prior(kind) * self.pace + sum(seen)) / (1 + len(seen))

    def record(self, kind: str, step: str, seconds: float) -> None:
        """A ``step`` of a row of ``kind`` took ``seconds``."""
        if step not in STEPS:
            raise ValueError(f"RowCosts.record: step must be one of {STEPS}, got {step!r}")
        self._prior(kind)
        self.measured.setdefault((step, kind), []).append(float(seconds))

    def summary(self) -> dict:
        """The verdict's view: per kind measured, each step's estimate and looks measured."""
        kinds = sorted({kind for _, kind in self.measured})
        return {
            kind: {
                step: {
                    "estimate_s": round(self.estimate(kind, step), 2),
                    "looks": len(self.measured.get((step, kind), [])),
                }
                for step in STEPS
            }
            for kind in kinds
        }


class RowClock:
    """One row's view of the run's budget: whether it may take a further look, and what its
    looks took (into the run's :class:`RowCosts`)."""

    def __init__(self, budget: TimeBudget, kind: str) -> None:
        self.budget, self.kind = budget, kind
        #: Why the budget stopped this row's looks, or None.
        self.cut: str | None = None

    def may_look(self) -> bool:
        """Whether the time left covers a further look (else :attr:`cut` says why not)."""
        need = self.budget.costs.estimate(self.kind, "look")
        if self.budget.remaining() >= need:
            return True
        self.cut = self.budget.shortfall(need, "a further look")
        return False

    def record(self, step: str, seconds: float) -> None:
        self.budget.costs.record(self.kind, step, seconds)


def process_start() -> float:
    """When this process started, on :func:`time.monotonic`'s scale (Linux's ``/proc``); now
    where that is not known. A caller's budget for the perf step covers the whole pytest process:
    its imports, collection and workers' start took ~35 s of a gate's 144 s perf step on an H200,
    all outside a budget counted from the session's start."""
    try:
        # Field 22, starttime in clock ticks since boot, after "pid (comm)" (comm may hold spaces).
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    return time.monotonic() - max(age, 0.0)


class TimeBudget:
    """The run's time budget: ``seconds`` (None: no budget) from ``started`` (default: now; the
    session passes :func:`process_start`), read from ``clock``."""

    def __init__(
        self,
        seconds: float | None,
        costs: RowCosts | None = None,
        clock: Callable[[], float] = time.monotonic,
        started: float | None = None,
    ) -> None:
        if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"TimeBudget: seconds must be a positive number or None, got {seconds!r}")
        self.seconds = seconds
        self.costs = costs or RowCosts()
        self.clock = clock
        self.started = clock() if started is None else started
        self.rows_started = 0

    def spent(self) -> float:
        return self.clock() - self.started

    def remaining(self) -> float:
        return math.inf if self.seconds is None else self.seconds - self.spent()

    def shortfall(self, need: float, what: str) -> str:
        """Why ``what``, estimated at ``need`` seconds, does not fit in what is left."""
        left = max(self.remaining(), 0.0)
        return f"{_seconds(left)} s of {self.seconds:g} s left, {what} takes ~{_seconds(need)} s"

    def start(self, kind: str) -> RowClock | str:
        """A row of ``kind`` starts: its :class:`RowClock`, or why it may not (the time left does
        not cover its first look; never for the run's first row)."""
        need = self.costs.estimate(kind, "first")
        if self.rows_started and self.remaining() < need:
            return self.shortfall(need, f"the first look of a row ({kind})")
        self.rows_started += 1
        return RowClock(self, kind)

    def summary(self) -> dict | None:
        """The verdict's ``time_budget`` block (None without a budget)."""
        if self.seconds is None:
            return None
        return {"seconds": self.seconds, "spent_s": round(self.spent(), 1), "estimates": self.costs.summary()}


def _seconds(value: float) -> str:
    """Seconds as a person reads them: whole above 10, one decimal below (a CPU row's look)."""
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"
