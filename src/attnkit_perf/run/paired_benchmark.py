"""One benchmark through paired mode, in order: its GPU time measured in looks, each a set of
fresh processes, until the sequential rule settles it or the run's look budget or time budget
says stop (:func:`measure_looks`; :mod:`attnkit_perf.decide.sequential`,
:mod:`attnkit_perf.run.time_budget`), the host metric on more
processes while it cannot tell (:func:`attnkit_perf.measure.host.extend_host`; no wall
time at all where the host work count decided it), and a host slowdown confirmed on fresh
processes of both sides. The session turns the outcome into the
test's verdict row."""

from __future__ import annotations

import dataclasses
import time

from attnkit_perf.decide.gate import Decision
from attnkit_perf.decide.paired_rule import PairedRule
from attnkit_perf.decide.sequential import LookBudget
from attnkit_perf.measure.host import extend_host
from attnkit_perf.measure.paired_session import PairedSession, PairedSettings, SideResult
from attnkit_perf.run.time_budget import RowClock


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
    the first on the current workers (with the host work count when ``host``, and the host
    metric's wall time where the count does not decide it), each further one on a
    fresh set (:meth:`PairedSession.restart`) pooled into ``results``, while the rule is
    inconclusive and ``budget`` (default: the plan's looks) allows. ``settings.budget_s`` caps
    the time spent measuring, never before the second look (a slowdown needs two sets);
    ``clock``, the row's share of the run's time budget, is asked before each further look and
    told what each look took (``clock.cut`` then says whether it stopped the row).
    ``seconds``: "prepare" and "measure" of the first look, "looks" of the others (restarts,
    preparation and pairs)."""
    budget = budget or LookBudget(rule.plan, bank=rule.plan.looks)
    one = dataclasses.replace(
        settings,
        min_pairs=settings.pairs_per_look,
        step_pairs=settings.pairs_per_look,
        max_pairs=settings.pairs_per_look,
    )
    start = time.perf_counter()
    results = paired.measure(
        case, one, lambda r: True, host=host, host_wall=rule.host_needs_wall, same_work=rule.same_work
    )
    seconds = {"prepare": paired.last_prepare_s, "measure": time.perf_counter() - start}
    if clock is not None:
        clock.record("first", seconds["measure"])
    looks = 1
    if not any(r.unsupported for r in results.values()):
        while not rule.decide(results, *earlier).settled and budget.may_look(looks):
            if looks >= 2 and time.perf_counter() - start > settings.budget_s:
                break
            if clock is not None and not clock.may_look():
                break
            began = time.perf_counter()
            paired.restart()
            fresh = paired.measure(case, one, lambda r: True)
            took = time.perf_counter() - began
            seconds["looks"] = seconds.get("looks", 0.0) + took
            if clock is not None:
                clock.record("look", took)
            if any(r.unsupported for r in fresh.values()):
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
