"""The report's host section: host work and host time per call beside the GPU time, and kept
memory."""

from __future__ import annotations

from attnkit_perf.formats.verdict import VerdictDocument
from attnkit_perf.report.formatting import VERDICT_LABELS, format_bytes, format_ratio, table


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} µs"


def _kept_cell(kept: dict | None) -> str:
    if not kept:
        return "-"
    base, head = kept["base_bytes"], kept["head_bytes"]
    return format_bytes(head) if base == head else f"{format_bytes(base)} → {format_bytes(head)}"


def _count_cell(count: dict | None) -> str:
    """Base -> head instructions / C calls per call, or the one reading where they are equal."""
    if not count or not count.get("head"):
        return "-"
    base, head = count.get("base"), count["head"]

    def shown(c: dict) -> str:
        return f"{c['instructions']} / {c['c_calls']}"

    if base is None:
        return f"? → {shown(head)}"
    return shown(head) if base == head else f"{shown(base)} → {shown(head)}"


def host_lines(verdict: VerdictDocument) -> list[str]:
    """The host metric beside the GPU time: host time per call measured without events, decided
    over worker processes, and the memory each call keeps."""
    rows = [c for c in verdict.benchmarks if c.host or c.kept]
    if not any(c.host for c in rows):
        return []
    cells = []
    for c in sorted(rows, key=lambda c: c.name):
        host = c.host or {}
        bounds = host.get("ci")
        count = host.get("count") or {}
        cells.append(
            [
                f"`{c.name}`",
                _count_cell(count),
                count.get("outcome") or "-",
                _us(host.get("base_us")),
                _us(host.get("head_us")),
                format_ratio(host.get("ratio")),
                "-" if not bounds else f"[{bounds[0]:.3f}, {bounds[1]:.3f}]",
                "-" if host.get("threshold") is None else f"{host['threshold']:.1%}",
                VERDICT_LABELS.get(host.get("outcome"), host.get("outcome") or "-"),
                format_ratio(c.ratio),
                _kept_cell(c.kept),
            ]
        )
    header = ["benchmark", "host work", "count", "host base", "host head", "host ratio", "bounds"]
    header += ["threshold", "host"]
    return [
        "### Host work and host time per call",
        "",
        "Host work: bytecode instructions / C calls of one call, counted (base → head where they "
        "differ); equal counts decide the host metric alone. Where the count grew or cannot speak "
        "for the row, wall time per call decides: batches of back-to-back calls from an empty queue "
        "(no CUDA event inside), one value per worker process, decided over the processes. Bounds: "
        'the lower one at the level a slowdown must clear, the upper one at the confidence that "same" '
        "needs. Beside it, the GPU time's ratio and the memory each call keeps after it returns.",
        "",
        *table([*header, "GPU ratio", "kept memory"], cells),
        "",
    ]
