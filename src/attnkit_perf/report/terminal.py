"""A verdict in the terminal: the table of the benchmarks that need attention and the one line
that says whether the gate passed (written by the plugin at the end of a run); a run its time
budget cut names the rows it did not decide on that line too."""

from __future__ import annotations

from attnkit_perf.decide.out_of_time import undecided_line
from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def format_table(rows: list[BenchmarkVerdict]) -> list[str]:
    """Lines of a table: name, outcome, base ms, head ms, ratio, threshold, reason."""
    if not rows:
        return []
    width = max(len(r.name) for r in rows)
    lines = [f"{'benchmark':<{width}}  {'outcome':<12} {'base ms':>9} {'head ms':>9} {'ratio':>7}  evidence"]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.4f}"
        host = " [host-bound]" if r.host_bound else ""
        lines.append(
            f"{r.name:<{width}}  {r.outcome:<12} {_ms(r.base_median_ms):>9} {_ms(r.head_median_ms):>9} "
            f"{ratio:>7}  {r.reason}{host}"
        )
    return lines


def summary_line(doc: VerdictDocument) -> str:
    line = _outcome_line(doc)
    budget = (doc.time_budget or {}).get("seconds")
    undecided = undecided_line(doc.benchmarks, budget)
    if undecided is None:
        return line
    return f"{line}; {undecided}"


def _outcome_line(doc: VerdictDocument) -> str:
    counts = doc.counts()
    parts = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no benchmark"
    if not doc.complete:
        return f"attnkit perf gate ({doc.mode}): INCOMPLETE, the run did not finish ({parts} so far)"
    if doc.nothing_affected:
        return (
            f"attnkit perf gate ({doc.mode}): passed, nothing to compare: the diff reaches no benchmark's "
            "code (every row deselected, see 'python -m attnkit_perf.select')"
        )
    if not doc.compared:
        return (
            f"attnkit perf gate ({doc.mode}): FAILED, nothing compared: no benchmark was measured on "
            f"both sides ({parts})"
        )
    return f"attnkit perf gate ({doc.mode}): {'passed' if doc.passed else 'FAILED'} ({parts})"
