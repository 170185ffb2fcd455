"""More processes for the host metric while its decision cannot tell (:func:`extend_host`).
Paired mode's session measures it on its workers (``PairedSession.measure_host``); the batch
timer itself runs in the workers (:mod:`attnkit_perf.measure.host`).

The process is the host metric's unit of replication (host time moves between processes far
more than between batches of one process), so the way to more evidence is more processes, not
more batches: while :func:`attnkit_perf.decide.host.decide_host` over the processes measured
says inconclusive, every worker is replaced by a fresh process, which measures the host metric
only, and its values join the earlier ones. The decision spends its level over the planned
looks (``PairedSettings.host_looks``), so looking again costs no false alarms.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnkit_perf.measure.paired_session import PairedSession, PairedSettings, SideResult


def extend_host(
    session: PairedSession,
    case: dict,
    settings: PairedSettings,
    results: dict[str, SideResult],
    wants_more: Callable[[dict[str, SideResult]], bool],
) -> dict[str, float]:
    """While ``wants_more(results)`` and fewer than ``settings.host_looks`` sets of processes
    have measured the host metric, replace every worker by a fresh process and pool its host
    metric into ``results``. Returns the seconds spent, ``{"host_restart", "host_more"}`` (a
    restart is process start, imports and identification; "host_more" the case's preparation
    on the fresh workers and their host rounds), empty when no more were needed."""
    done, spent = 1, {}
    while done < settings.host_looks and wants_more(results):
        start = time.perf_counter()
        session.restart()
        spent["host_restart"] = spent.get("host_restart", 0.0) + time.perf_counter() - start
        start = time.perf_counter()
        fresh = session.measure_host(case, settings)
        spent["host_more"] = spent.get("host_more", 0.0) + time.perf_counter() - start
        if any(r.unsupported or not r.host_per_call for r in fresh.values()):
            break  # a fresh base worker failed: the evidence so far stands
        for side, result in fresh.items():
            results[side].pool_host(result)
        done += 1
    return spent
