"""One benchmark through paired mode, in order: measured on both sides until the rule settles
it (:class:`attnkit_perf.decide.paired_rule.PairedRule`), the host metric on more processes while it
cannot tell (:func:`attnkit_perf.measure.host_rounds.extend_host`; no wall time at all where the
host work count decided it), and a slowdown of either metric confirmed on fresh processes of
both sides. The session turns the outcome into the
test's verdict row."""

from __future__ import annotations

import time

from attnkit_perf.decide.gate import Decision
from attnkit_perf.decide.paired_rule import PairedRule
from attnkit_perf.measure.host_rounds import extend_host
from attnkit_perf.measure.paired_session import PairedSession, PairedSettings


def measure_paired(
    paired: PairedSession, rule: PairedRule, case: dict, settings: PairedSettings, host: bool, confirm: bool
) -> tuple[Decision | None, list[dict], dict[str, float]]:
    """``(decision, measurements, seconds)`` for ``case`` (:meth:`BenchCase.as_dict`).

    ``decision`` is None when neither side runs the case; ``measurements``: the confirmation
    first where there was one, then the first measurement; ``seconds``: where the gate's own
    time went: "measure" is the first measurement, its "prepare" included; a suspect adds
    "restart" (fresh workers) and "confirm"; more processes for the host metric add
    "host_restart" and "host_more" (a confirmation's with the prefix "confirm_")."""
    start = time.perf_counter()
    results = paired.measure(
        case, settings, lambda r: rule.decide(r).settled, host=host, host_wall=rule.host_needs_wall
    )
    seconds = {"prepare": paired.last_prepare_s, "measure": time.perf_counter() - start}
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
        settled = lambda r: rule.decide(r, results).settled
        again = paired.measure(case, settings, settled, host=host, host_wall=rule.host_needs_wall)
        seconds["confirm"] = time.perf_counter() - start - seconds["restart"]
        if host:
            more = extend_host(paired, case, settings, again, rule.host_wants_more)
            seconds.update({f"confirm_{step}": s for step, s in more.items()})
        decision = rule.join(*rule.confirm_all(first, again, results), again)
        measurements.insert(0, again)
    return decision, measurements, seconds
