"""Paired mode's loop for one benchmark: the one place that decides which step comes next.

A benchmark is measured in **looks**, each on one set of worker processes
(:class:`attnkit_perf.measure.paired_session.PairedSession`, which runs the steps and decides
nothing). The first look (:func:`_look`) prepares each side's first worker and takes both
sides' fingerprints; where the rule finds the same GPU work on both sides
(:meth:`PairedRule.same_work`) no pair is timed; else every worker is prepared and one look's
pairs are measured. A host-timed case then has its host work counted, and its host metric's
wall time measured where the count does not decide it (:meth:`PairedRule.host_needs_wall`).
Further looks, each on a fresh set of processes pooled into the first, follow while the
sequential rule cannot tell (:meth:`PairedRule.decide`, :mod:`attnkit_perf.decide.sequential`)
and the run's look budget and time budget allow (:func:`measure_looks`,
:mod:`attnkit_perf.run.time_budget`). Then the host metric gets more processes while it cannot
tell (:func:`attnkit_perf.measure.host.extend_host`), and a host slowdown is confirmed on
fresh processes of both sides (:func:`measure_paired`). The rule
(:class:`attnkit_perf.decide.paired_rule.PairedRule`) is asked here only, with what was
measured; the session never sees it. The run's session turns the outcome into the test's
verdict row."""

from __future__ import annotations

import time

from attnkit_perf.decide.gate import Decision
from attnkit_perf.decide.paired_rule import PairedRule
from attnkit_perf.decide.sequential import LookBudget
from attnkit_perf.measure.host import extend_host
from attnkit_perf.measure.paired_session import PairedSession, PairedSettings, SideResult
from attnkit_perf.measure.processes import WorkerError
from attnkit_perf.run.time_budget import RowClock


def _unsupported(results: dict[str, SideResult]) -> bool:
    return any(r.unsupported for r in results.values())


def _look(
    paired: PairedSession, rule: PairedRule, case: dict, settings: PairedSettings, host: bool, first: bool
) -> tuple[dict[str, SideResult], float]:
    """``(results, prepare_s)``: one look at ``case`` on the current workers. ``first``: the
    sides' fingerprints are taken, and where both run the same GPU work no pair is timed and
    only each side's first worker is prepared (unless the host metric's wall time needs every
    worker); else ``settings.pairs_per_look`` pairs. ``host``: then the host work count, and the
    wall time where the count does not decide. ``settings.time_all`` takes neither fingerprints
    nor counts: every pair and the wall time are measured. ``prepare_s``: the seconds spent preparing the
    workers (building, compiling or loading kernels, warming up) before the first pair. A side
    that cannot run the case is returned unsupported, with nothing measured; so is the base
    when one of its workers fails (:meth:`PairedSession.failed`)."""
    start = time.perf_counter()
    prepare_s = 0.0
    try:
        prepared = paired.prepare(case, fingerprint=first and not settings.time_all)
        if not prepared.built:
            return prepared.results, prepare_s
        results = prepared.results
        identical = first and not _unsupported(results) and rule.same_work(results)
        if not identical:
            paired.prepare_others(prepared)
        prepare_s = time.perf_counter() - start
        try:
            if _unsupported(results):
                return results, prepare_s
            if not identical:
                paired.measure_pairs(prepared, settings.pairs_per_look, settings.rounds_per_block)
            if host:
                if not settings.time_all:
                    paired.count_host(prepared)
                if rule.host_needs_wall(results):  # always, uncounted
                    paired.time_host(prepared, settings)
            return results, prepare_s
        finally:
            paired.release()
    except WorkerError as err:
        # A failure before the first pair: every second so far went into preparing.
        return paired.failed(err), prepare_s or time.perf_counter() - start


def measure_looks(
    paired: PairedSession,
    rule: PairedRule,
    case: dict,
    settings: PairedSettings,
    host: bool,
    budget: LookBudget | None = None,
    earlier: tuple = (),
    clock: RowClock | None = None,
) -> tuple[dict[str, SideResult], dict[str, float]]:
    """``(results, seconds)``: ``case`` measured in looks of ``settings.pairs_per_look`` pairs,
    the first on the current workers (:func:`_look`), each further one on a fresh set
    (:meth:`PairedSession.restart`) pooled into ``results``, while the rule is inconclusive and
    ``budget`` (default: the plan's looks) allows. ``settings.budget_s`` caps the time spent
    measuring, never before the second look (a slowdown needs two sets); ``clock``, the row's
    share of the run's time budget, is asked before each further look and told what each look
    took (``clock.cut`` then says whether it stopped the row). ``seconds``: "prepare" and
    "measure" of the first look, "looks" of the others (restarts, preparation and pairs)."""
    budget = budget or LookBudget(rule.plan, bank=rule.plan.looks)
    start = time.perf_counter()
    results, prepare_s = _look(paired, rule, case, settings, host, first=True)
    seconds = {"prepare": prepare_s, "measure": time.perf_counter() - start}
    if clock is not None:
        clock.record("first", seconds["measure"])
    looks = 1
    if not _unsupported(results):
        while not rule.decide(results, *earlier).settled and budget.may_look(looks):
            if looks >= 2 and time.perf_counter() - start > settings.budget_s:
                break
            if clock is not None and not clock.may_look():
                break
            began = time.perf_counter()
            paired.restart()
            fresh, _ = _look(paired, rule, case, settings, host=False, first=False)
            took = time.perf_counter() - began
            seconds["looks"] = seconds.get("looks", 0.0) + took
            if clock is not None:
                clock.record("look", took)
            if _unsupported(fresh):
                break  # a fresh base worker failed: the evidence so far stands
            for side, result in fresh.items():
                results[side].pool_look(result)
            looks += 1
        budget.settle(looks)
    return results, seconds


def measure_paired(
    paired: PairedSession,
    rule: PairedRule,
    case: dict,
    settings: PairedSettings,
    host: bool,
    confirm: bool,
    budget: LookBudget | None = None,
    clock: RowClock | None = None,
) -> tuple[Decision | None, list[dict], dict[str, float]]:
    """``(decision, measurements, seconds)`` for ``case`` (:meth:`BenchCase.as_dict`).

    ``decision`` is None when neither side runs the case; ``measurements``: the measurement (its
    looks pooled), then the host metric's confirmation where there was one; ``seconds``: where the gate's own
    time went: "measure" is the first look, its "prepare" included, "looks" the further ones; a
    host suspect adds "restart" (fresh workers) and "confirm"; more processes for the host
    metric add "host_restart" and "host_more" (a confirmation's with the prefix "confirm_").
    ``clock``: the row's share of the run's time budget (:func:`measure_looks`)."""
    results, seconds = measure_looks(paired, rule, case, settings, host, budget, clock=clock)
    measurements = [results]
    decision = rule.unsupported(results)
    if decision is not None or results["head"].unsupported:
        return decision, measurements, seconds
    if host:
        seconds.update(extend_host(paired, case, settings, results, rule.host_wants_more))
    first = rule.decide_all(results)
    decision = rule.join(*first, results)
    if rule.any_slower(*first) and confirm:
        start = time.perf_counter()
        paired.restart()
        seconds["restart"] = time.perf_counter() - start
        again = paired.measure_host(case, settings)
        seconds["confirm"] = time.perf_counter() - start - seconds["restart"]
        more = extend_host(paired, case, settings, again, rule.host_wants_more)
        seconds.update({f"confirm_{step}": s for step, s in more.items()})
        decision = rule.join(*rule.confirm_all(first, again, results), results)
        measurements.append(again)
    return decision, measurements, seconds
