"""The perf report: a Markdown verdict people read in a PR, and plots of where time and memory go.

    python -m attnkit_perf.report --verdict verdict.json [--benchmarks run.json] --out-dir DIR

writes into DIR:

* ``report.md``  — header with the GPU and the provenance of both runs, the overall verdict, the
  benchmarks that need attention, then one table per group (peers that differ only in backend);
* ``summary.md`` — the same without image links, for ``$GITHUB_STEP_SUMMARY`` (which cannot show
  files from the job's artifacts);
* ``tflops.png``, ``memory.png``, ``speedup.png`` — when matplotlib (extra ``report``) is
  installed; without it the Markdown says the plots were skipped.

Either input may be left out: without ``--verdict`` the report describes one run (for example a
freshly recorded baseline); without ``--benchmarks`` (paired mode writes none) the plots use the
verdict's head side. Both are validated against the gate's JSON Schemas; an input that fails is
named with the reason and the command exits 2. The report never decides pass or fail — the
gate does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

from attnkit_perf.decide.out_of_time import undecided_heading
from attnkit_perf.formats.schema import FormatError
from attnkit_perf.formats.verdict import OUTCOMES, BenchmarkVerdict, VerdictDocument
from attnkit_perf.history.links import history_link
from attnkit_perf.measure.cases import BenchCase
from attnkit_perf.report.data import (
    CaseKey,
    Measurement,
    RunInfo,
    case_key,
    load_benchmarks,
    measurements_from_verdict,
)
from attnkit_perf.report.formatting import (
    VERDICT_LABELS,
    format_bytes,
    format_ms,
    format_ratio,
    format_tflops,
)
from attnkit_perf.report.formatting import (
    table as _table,
)
from attnkit_perf.report.host import host_lines

#: Where the published performance history lives, for the link to the base (docs/HISTORY.md).
HISTORY_URL_ENV = "ATTNKIT_HISTORY_URL"


#: Provenance rows and the machine_info keys that may hold each (first found wins). The perf
#: suite stores them under machine_info["attnkit"] (attnkit_perf.measure.machine.provenance).
PROVENANCE_KEYS = {
    "GPU": ("device_name", "gpu_name", "gpu_key"),
    "compute capability": ("capability", "compute_capability"),
    "SMs": ("sm_count", "multi_processor_count", "multiprocessor_count"),
    "driver": ("driver", "driver_version", "nvidia_driver"),
    "CUDA": ("cuda", "cuda_version"),
    "cuDNN": ("cudnn", "cudnn_version"),
    "torch": ("torch", "torch_version"),
    "triton": ("triton", "triton_version"),
}
#: Provenance rows whose difference between baseline and now makes timings less comparable.
VERSION_ROWS = ("GPU", "driver", "CUDA", "cuDNN", "torch", "triton")

PLOT_FILES = {
    "tflops.png": "TFLOP/s vs sequence length, per backend",
    "memory.png": "Peak memory vs sequence length, per backend (log scale)",
    "speedup.png": "Triton speed-up over SDPA-flash and SDPA-cuDNN",
}


# ---- provenance -------------------------------------------------------------------------------


def _flatten(info: dict) -> dict:
    """machine_info with nested blocks lifted to the top; the perf suite's own block
    (``machine_info["attnkit"]``) wins over pytest-benchmark's (``cpu`` and the like)."""
    flat = {}
    nested = [v for k, v in info.items() if isinstance(v, dict) and k != "attnkit"]
    for block in [*nested, info.get("attnkit") or {}]:
        flat.update(block)
    flat.update({k: v for k, v in info.items() if not isinstance(v, dict)})
    return flat


def provenance(run: RunInfo) -> dict[str, str]:
    """Label -> value for the header table; unknown fields read as "—"."""
    flat = _flatten(run.machine_info)
    rows = {}
    for label, keys in PROVENANCE_KEYS.items():
        rows[label] = next((str(flat[k]) for k in keys if flat.get(k) not in (None, "")), "—")
    commit = run.commit_info or {}
    commit_id = str(commit.get("id") or flat.get("commit") or "")
    label = commit_id[:10] or "—"
    if commit.get("branch"):
        label += f" ({commit['branch']})"
    if commit.get("dirty"):
        label += ", uncommitted changes"
    rows["commit"] = label
    rows["recorded"] = run.datetime or "—"
    return rows


def _side_info(side: dict) -> RunInfo:
    return RunInfo({"attnkit": side.get("provenance") or {}}, {}, side.get("datetime"))


def _provenance_lines(
    verdict: VerdictDocument | None, now: RunInfo, history_url: str | None = None
) -> list[str]:
    if verdict is None:
        return _table(["", "this run"], [[label, value] for label, value in provenance(now).items()])
    base_rows, now_rows = provenance(_side_info(verdict.base)), provenance(_side_info(verdict.head))
    lines = _table(["", "base", "head"], [[k, base_rows[k], now_rows[k]] for k in now_rows])
    lines += ["", f"Mode: **{verdict.mode}** — {verdict.base['label']} against {verdict.head['label']}."]
    link = history_link(verdict, history_url) if history_url else None
    if link:
        lines.append(f"The base in the performance history: {link}")
    t = verdict.thresholds
    lines.append(
        f"Slower means at least {t['slower']:.1%} slower (more where A/A noise requires) and significant "
        f"with a run-wide false-alarm budget of {t['run_alpha']}; memory fails past "
        f"max({t['memory_rel']:.0%}, {format_bytes(t['memory_abs_bytes'])})."
    )
    lines += [f"- {note}" for note in verdict.notes]
    changed = list(verdict.version_differences)
    if changed:
        lines += [
            "",
            f"> ⚠️ The baseline was recorded with a different {', '.join(changed)}: a verdict may "
            "reflect the software stack rather than this change. Refresh the baseline if the "
            "new stack is intended (docs/CI.md).",
        ]
    return lines


# ---- Markdown ---------------------------------------------------------------------------------


def _peak_cell(peak: int | None, baseline_peak: int | None, floor: int | None) -> str:
    """Peak memory now, its change against the baseline, and how far above the pass's floor."""
    text = format_bytes(peak)
    if peak is not None and baseline_peak and peak != baseline_peak:
        text += f" ({(peak - baseline_peak) / baseline_peak:+.1%})"
    if peak is not None and floor:
        text += f", {peak / floor:.1f}× floor"
    return text


def _key(c: BenchmarkVerdict) -> CaseKey:
    return case_key(c.backend, c.pass_name, c.shape)


def _verdict_lines(verdict: VerdictDocument, floors: dict[CaseKey, int | None]) -> list[str]:
    counts = verdict.counts()
    failed = not verdict.passed
    headline = "❌ FAIL" if failed else "✅ PASS"
    if not verdict.complete:
        headline = "⚠️ INCOMPLETE (the run stopped before its end; not a pass)"
    tally = " · ".join(f"{n} {VERDICT_LABELS.get(v, v)}" for v, n in counts.items())
    count = len(verdict.benchmarks)
    lines = [f"**Verdict: {headline}** — {count} benchmark{'' if count == 1 else 's'}: {tally}.", ""]
    if verdict.undecided:
        heading = undecided_heading(len(verdict.undecided), (verdict.time_budget or {}).get("seconds"))
        consequence = (
            "they fail the run (`--attnkit-out-of-time=fail`)"
            if "not-reached" in verdict.failing_outcomes
            else "they do not fail the run; they are measured where there is no budget (nightly)"
        )
        names = ", ".join(f"`{name}`" for name in verdict.undecided)
        lines += [f"**⏱️ {heading}**; {consequence}: {names}.", ""]
    attention = [c for c in verdict.benchmarks if c.outcome != "same"]
    if attention:
        rank = {v: i for i, v in enumerate(OUTCOMES)}
        attention.sort(key=lambda c: (rank.get(c.outcome, len(rank)), c.name))
        lines += ["### Needs attention", ""]
        rows = [
            [
                f"`{c.name}`",
                format_ms(c.base_median_ms),
                format_ms(c.head_median_ms),
                format_ratio(c.ratio),
                VERDICT_LABELS.get(c.outcome, c.outcome),
                _peak_cell(c.head_peak_bytes, c.base_peak_bytes, floors.get(_key(c))),
                c.reason + (" (host-bound)" if c.host_bound else ""),
            ]
            for c in attention
        ]
        lines += _table(["benchmark", "base", "head", "ratio", "outcome", "peak memory", "evidence"], rows)
        lines.append("")
        if any(c.outcome == "inconclusive" for c in attention):
            lines += [
                "Inconclusive: measured to the budget and still unclear — neither a slowdown nor its "
                "absence is shown. Re-run, or raise `--attnkit-budget-s`.",
                "",
            ]
        if any(c.outcome == "faster" for c in attention) and not failed and verdict.mode == "stored":
            lines += ["Faster benchmarks: refresh the baseline so the gate guards the new speed.", ""]
    return lines


def _comparison_row(c: BenchmarkVerdict, floors: dict[CaseKey, int | None]) -> list[str]:
    return [
        f"`{c.name}`",
        format_ms(c.base_median_ms),
        format_ms(c.head_median_ms),
        format_ratio(c.ratio),
        VERDICT_LABELS.get(c.outcome, c.outcome),
        format_tflops(c.tflops),
        _peak_cell(c.head_peak_bytes, c.base_peak_bytes, floors.get(_key(c))),
    ]


def _measurement_row(m: Measurement) -> list[str]:
    return [
        f"`{m.name}`",
        format_ms(m.median_ms),
        format_tflops(m.tflops),
        _peak_cell(m.peak_bytes, None, m.min_bytes),
    ]


def group_of(m: Measurement) -> str:
    """The group of a measurement: its pass and shape, named as :class:`BenchCase` names it."""
    try:
        return BenchCase(m.backend, m.pass_name, **m.shape).group
    except (TypeError, ValueError):
        dims = " ".join(f"{k}={v}" for k, v in sorted(m.shape.items()))
        return f"{m.pass_name} {dims}"


def render_markdown(
    verdict: VerdictDocument | None,
    measurements: list[Measurement],
    now: RunInfo,
    plots: list[str] | None,
    plots_skipped: str | None,
    history_url: str | None = None,
) -> str:
    """The whole report. ``plots`` are image files to link (None: link none, e.g. for the job
    summary); ``plots_skipped`` says why there are no plots, if so; ``history_url``, the
    published performance history (docs/HISTORY.md), whose page of the base the report links."""
    floors = {m.key: m.min_bytes for m in measurements}
    title = "attnkit perf gate" if verdict else "attnkit perf run"
    gpu = provenance(_side_info(verdict.head) if verdict else now)["GPU"]
    lines = [f"## {title} on {gpu}" if gpu != "—" else f"## {title}", ""]
    lines += _provenance_lines(verdict, now, history_url)
    lines.append("")
    if verdict:
        lines += _verdict_lines(verdict, floors)
    else:
        lines += [
            "_No verdict: this run was not compared. To make it this GPU model's baseline: "
            "`pytest tests/perf --attnkit-record` (docs/CI.md)._",
            "",
        ]
    if verdict:
        lines += host_lines(verdict)
    if plots_skipped:
        lines += [f"_Plots skipped: {plots_skipped}_", ""]
    elif plots:
        lines += ["### Plots", ""]
        lines += [f"![{PLOT_FILES.get(p, p)}]({p})" for p in plots]
        lines.append("")
    lines += ["### All benchmarks by group", ""]
    if verdict:
        header = ["benchmark", "base", "head", "ratio", "outcome", "TFLOP/s", "peak memory"]
        groups: dict[str, list[list[str]]] = defaultdict(list)
        for c in sorted(verdict.benchmarks, key=lambda c: (c.group, c.name)):
            groups[c.group].append(_comparison_row(c, floors))
    else:
        header = ["benchmark", "median", "TFLOP/s", "peak memory"]
        groups = defaultdict(list)
        for m in sorted(measurements, key=lambda m: (group_of(m), m.name)):
            groups[group_of(m)].append(_measurement_row(m))
    for group, rows in groups.items():
        lines += [f"#### {group or 'ungrouped'}", "", *_table(header, rows), ""]
    return "\n".join(lines).rstrip() + "\n"


# ---- command line -----------------------------------------------------------------------------


def write_report(
    verdict_path: str | None,
    benchmarks_path: str | None,
    out_dir: str | Path,
    history_url: str | None = None,
) -> list[Path]:
    """Write report.md, summary.md and, with matplotlib, the plots into ``out_dir``; returns the
    files written (``history_url``: see :func:`render_markdown`). Raises :class:`FormatError` for
    an input that cannot be read."""
    if not verdict_path and not benchmarks_path:
        raise FormatError("nothing to report: give --verdict, --benchmarks or both")
    verdict = VerdictDocument.read(verdict_path) if verdict_path else None
    if benchmarks_path:
        now, measurements = load_benchmarks(benchmarks_path)
    else:
        now, measurements = _side_info(verdict.head), measurements_from_verdict(verdict)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        from attnkit_perf.report import plots as report_plots
    except ImportError as err:
        plots, skipped = [], f"matplotlib is not installed ({err.name}); `pip install attnkit[report]`."
    else:
        plots, skipped = report_plots.write_plots(measurements, out), None
        if not plots:
            skipped = "no attention benchmarks with backend, pass and shape to plot."
    report = out / "report.md"
    report.write_text(
        render_markdown(verdict, measurements, now, plots, skipped, history_url), encoding="utf-8"
    )
    summary = out / "summary.md"
    summary.write_text(
        render_markdown(verdict, measurements, now, None, skipped, history_url), encoding="utf-8"
    )
    return [report, summary, *(out / p for p in plots)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_perf.report",
        description=__doc__.split("\n\n")[0],
        epilog="python -m attnkit_perf.report merge VERDICT... --out FILE merges the verdicts of a run "
        "split over runners into one (see merge --help).",
    )
    parser.add_argument("--benchmarks", help="pytest-benchmark JSON of the run (stored mode, record)")
    parser.add_argument("--verdict", help="the gate's verdict JSON")
    parser.add_argument("--out-dir", required=True, help="folder for report.md, summary.md and the plots")
    parser.add_argument(
        "--history-url",
        default=os.environ.get(HISTORY_URL_ENV) or None,
        help=f"the published performance history, to link the base's point (default: ${HISTORY_URL_ENV})",
    )
    args = parser.parse_args(argv)
    try:
        written = write_report(args.verdict, args.benchmarks, args.out_dir, args.history_url)
    except FormatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
