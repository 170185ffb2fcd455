"""How the gate's verdict on a code change compares with the change's true effect.

    python -m attnkit_tools.gate.detection --effects ab.json --verdict verdict.json [--out table.md]

``ab.json`` comes from :mod:`attnkit_tools.gate.ab_dobench` (do_bench medians of base and head in
alternating fresh processes), ``verdict.json`` from a paired run of the same change. Per
benchmark found in both: the true effect, the gate's outcome and ratio; then, per band of true
effect, how many benchmarks the gate failed. A gate that works fails every benchmark well above
its threshold, none that the change leaves alone, and is free to call either way the ones near
the threshold. Exit 2 with one message when a file is missing or not of its format.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from attnkit_perf.formats.schema import FormatError
from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument
from attnkit_tools.gate.ab_dobench import read_effects

#: Bands of true effect (head/base), lower bounds; each band runs to the next one's.
BANDS = (0.0, 1.01, 1.02, 1.03, 1.05)


@dataclass(frozen=True)
class Row:
    """One benchmark: its true effect and the gate's verdict row on it."""

    true_ratio: float
    verdict: BenchmarkVerdict


def join(effects: dict[str, float], verdict: VerdictDocument) -> list[Row]:
    """The benchmarks that both files name, largest true effect first."""
    rows = [Row(effects[r.name], r) for r in verdict.benchmarks if r.name in effects]
    return sorted(rows, key=lambda r: -r.true_ratio)


def band_label(low: float, high: float | None) -> str:
    if low == 0.0:
        return f"< x{high:.2f}"
    return f">= x{low:.2f}" if high is None else f"x{low:.2f} - x{high:.2f}"


def bands(rows: list[Row]) -> list[tuple[str, int, int]]:
    """``(band, failed, benchmarks)`` for each band of true effect that holds a benchmark."""
    out = []
    for i, low in enumerate(BANDS):
        high = BANDS[i + 1] if i + 1 < len(BANDS) else None
        inside = [r for r in rows if r.true_ratio >= low and (high is None or r.true_ratio < high)]
        if inside:
            out.append((band_label(low, high), sum(r.verdict.failed for r in inside), len(inside)))
    return out


def render(rows: list[Row]) -> str:
    lines = [
        "| benchmark | true effect (ab_dobench) | gate | gate ratio | host-bound |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        v = r.verdict
        ratio = "" if v.ratio is None else f"x{v.ratio:.4f}"
        lines.append(f"| {v.name} | x{r.true_ratio:.4f} | {v.outcome} | {ratio} | {v.host_bound} |")
    lines += ["", "| true effect | failed by the gate |", "|---|---|"]
    lines += [f"| {label} | {failed} of {total} |" for label, failed, total in bands(rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.gate.detection", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--effects", required=True, help="attnkit_tools.gate.ab_dobench --out file")
    parser.add_argument("--verdict", required=True, help="the paired run's --attnkit-verdict-json file")
    parser.add_argument("--out", help="also write the tables here (Markdown)")
    args = parser.parse_args(argv)
    try:
        effects = read_effects(args.effects)
        verdict = VerdictDocument.read(args.verdict)
    except FormatError as err:
        print(f"detection: {err}", file=sys.stderr)
        return 2
    rows = join(effects, verdict)
    if not rows:
        print(f"detection: {args.effects} and {args.verdict} name no benchmark in common", file=sys.stderr)
        return 2
    text = render(rows)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
