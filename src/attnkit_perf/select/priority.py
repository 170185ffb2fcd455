"""In which order paired mode measures the rows it selected: the rows the diff reaches most
directly first, so that a run within a time budget (:mod:`attnkit_perf.run.time_budget`) spends
it where a change is likeliest to show.

Tiers, from a row's backend and pass and the :class:`~attnkit_perf.select.rules.Affected`
decision (None: no diff was decided, ``--attnkit-select=all`` or a base checkout):

0. **own code**: a changed file is its backend's own code for this pass, or a table entry the row
   reads (where the table is read entry by entry);
1. **host rows** (``loop``) when shared code changed, or when no diff was decided: shared code
   runs on every call, and a host row decides its host metric by counting host work, cheaply;
2. **the rest**: rows reached through shared code or through ``auto``'s dispatch, or rows of a
   backend the dependency map does not know.

Within a tier the run measures the cheapest rows first (the caller's cost estimate).
"""

from __future__ import annotations

from attnkit_perf.select.rules import BACKWARD_PASSES, Affected, reads_entry

#: Each tier's meaning, as the verdict row's evidence states it.
TIERS = (
    "its backend's own code or a table entry it reads changed",
    "a host row: shared code changed, and its host work count decides cheaply",
    "reached through shared code or dispatch",
)


def row_priority(decision: Affected | None, case) -> int:
    """The tier (index into :data:`TIERS`) of a perf ``case``
    (:class:`~attnkit_perf.measure.cases.BenchCase`) under ``decision``."""
    if decision is not None and _own_code(decision, case):
        return 0
    if case.host_timed and (decision is None or decision.everything):
        return 1
    return 2


def _own_code(decision: Affected, case) -> bool:
    """Whether a changed file the run's GPU model sees is ``case``'s backend's own code for its
    pass (not only reached through ``auto``'s dispatch), or a table entry the row reads."""
    for effect in decision.effects:
        if effect.kind != "backends" or not decision.applies(effect):
            continue
        passes = effect.backends.get(case.backend)
        if passes is None or (passes == "backward" and case.pass_name not in BACKWARD_PASSES):
            continue
        if effect.entries is None:
            return True
        for name in effect.entries:
            section, _, entry = name.rpartition("/")
            if reads_entry(decision.entry_rules[section], entry, case):
                return True
    return False
