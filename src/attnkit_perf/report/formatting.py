"""Cells of the report's Markdown tables: times, bytes, ratios, outcomes."""

from __future__ import annotations

VERDICT_LABELS = {
    "slower": "🔴 slower",
    "more-memory": "🟠 more memory",
    "kept-memory": "🟠 keeps more memory",
    "inconclusive": "🟡 inconclusive",
    "unfinished": "⏱️ unfinished",
    "not-reached": "⏱️ not reached",
    "faster": "🟢 faster",
    "new": "🆕 new",
    "missing": "⚪ missing",
    "same": "same",
}


def format_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    return f"{ms * 1e3:.1f} µs" if ms < 0.1 else f"{ms:.3f} ms" if ms < 10 else f"{ms:.1f} ms"


def format_bytes(n: int | None) -> str:
    if n is None:
        return "—"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_ratio(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.3f}×"


def format_tflops(tflops: float | None) -> str:
    if tflops is None:
        return "—"
    return f"{tflops:.1f}" if tflops >= 10 else f"{tflops:.3g}"


def _cell(text: str) -> str:
    """A Markdown table cell: pipes and newlines would break the row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines
