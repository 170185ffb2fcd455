"""Rows paired mode could not decide within its time budget (``--attnkit-time-budget``; the
bookkeeping of the budget is :mod:`attnkit_perf.run.time_budget`).

* **unfinished**: measured on both sides and cut before the sequential rule settled it. The row
  keeps what it measured (ratio, bounds, looks) and says how many of its planned looks it had.
* **not-reached**: never started: the budget was spent before its turn.

Neither is a verdict on the code: such a row runs again without a budget (the nightly run). They
pass the run under ``--attnkit-out-of-time=pass`` (a pull request whose change reaches more rows
than fit in its budget still gets an answer, on the rows it reaches most directly) and fail it
under ``fail``; either way the terminal summary, the verdict and the report name every one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from attnkit_perf.decide.gate import Decision
from attnkit_perf.formats.verdict import undecided

#: ``--attnkit-out-of-time`` values.
CHOICES = ("pass", "fail")


def unfinished(decision: Decision, why: str, looks: int, planned: int) -> Decision:
    """The row of ``decision`` (inconclusive after ``looks`` of its ``planned`` looks, the next
    one cut) as one the time budget left undecided; ``why``: what the budget had left against
    what the next look needed."""
    done = f"{looks} of {planned} looks"
    return dataclasses.replace(
        decision,
        outcome="unfinished",
        reason=f"not decided within the time budget: {done} ({why}); so far {decision.reason}",
        extra={**decision.extra, "out_of_time": why},
    )


def after_looks(decision: Decision, cut: str | None, looks: int, planned: int) -> Decision:
    """A row's decision once its looks ended: :func:`unfinished` when the time budget cut them
    (``cut``: why) while the row was still inconclusive; otherwise the decision stands (a
    slowdown, more memory or a settled time found before the cut is a verdict on the code)."""
    if cut is None or decision.outcome != "inconclusive":
        return decision
    return unfinished(decision, cut, looks, planned)


def not_reached(why: str) -> Decision:
    """The row of a benchmark the run did not start: its budget was spent (``why``)."""
    reason = f"not started within the time budget ({why})"
    return Decision("not-reached", reason=reason, extra={"out_of_time": why})


def undecided_heading(count: int, budget_s: float | None) -> str:
    """``"N rows not decided in the time budget of S s"``."""
    of = "" if budget_s is None else f" of {budget_s:g} s"
    return f"{count} {'row' if count == 1 else 'rows'} not decided in the time budget{of}"


def undecided_line(rows: Iterable, budget_s: float | None) -> str | None:
    """:func:`undecided_heading` and the rows' names, or None when every row was decided."""
    names = undecided(rows)
    if not names:
        return None
    return f"{undecided_heading(len(names), budget_s)}: {', '.join(names)}"
