"""The perf report: a Markdown verdict people read in a PR, and plots of where time and memory go.

    python -m attnkit.bench.report --verdict verdict.json --benchmarks benchmarks.json --out-dir DIR

writes into DIR:

* ``report.md``  — header with the GPU and the provenance of both runs, the overall verdict, the
  benchmarks that need attention, then one table per group (peers that differ only in backend);
* ``summary.md`` — the same without image links, for ``$GITHUB_STEP_SUMMARY`` (which cannot show
  files from the job's artifacts);
* ``tflops.png``, ``memory.png``, ``speedup.png`` — when matplotlib (extra ``report``) is
  installed; without it the Markdown says the plots were skipped.

``--verdict`` is optional: without it the report describes one run (for example a freshly
recorded baseline) with no comparison. The report never decides pass or fail — the gate does;
it exits 0 whenever it could write its files.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from attnkit.bench.cases import BenchCase
from attnkit.bench.report_data import (
    VERDICT_ORDER,
    CaseKey,
    Comparison,
    Measurement,
    RunInfo,
    Verdict,
    load_benchmarks,
    load_verdict,
)

VERDICT_LABELS = {
    "slower": "🔴 slower",
    "more-memory": "🟠 more memory",
    "faster": "🟢 faster",
    "new": "🆕 new",
    "missing": "⚪ missing",
    "same": "same",
}

#: Provenance rows and the machine_info keys that may hold each (first found wins). The perf
#: suite stores them under machine_info["attnkit"] (attnkit.bench.machine.provenance).
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


# ---- formatting -------------------------------------------------------------------------------


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


def format_evidence(c: Comparison) -> str:
    """The gate's evidence (a dict in ``attnkit-perf-verdict/1``) as one readable phrase."""
    if isinstance(c.evidence, str):
        return c.evidence or {"new": "not in the baseline", "missing": "not run now"}.get(c.verdict, "—")
    ev = c.evidence
    parts = []
    p_key = "p_faster" if c.verdict == "faster" else "p_slower"
    if ev.get(p_key) is not None and c.verdict in ("slower", "faster"):
        parts.append(f"Mann-Whitney p={ev[p_key]:.1e}")
    if ev.get("ratio_ci99") and c.verdict in ("slower", "faster"):
        low, high = ev["ratio_ci99"]
        parts.append(f"99% CI {low:.3f}–{high:.3f}×")
    if ev.get("confirm"):
        parts.append(f"re-measured {ev['confirm']['ratio']:.3f}× (p={ev['confirm']['p_slower']:.1e})")
    if ev.get("memory_growth_bytes") is not None:
        parts.append(f"peak +{format_bytes(ev['memory_growth_bytes'])}")
    if not parts:
        return {"new": "not in the baseline", "missing": "not run now"}.get(c.verdict, "—")
    return "; ".join(parts)


def _cell(text: str) -> str:
    """A Markdown table cell: pipes and newlines would break the row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


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


def _provenance_lines(verdict: Verdict | None, now: RunInfo) -> list[str]:
    if verdict is None:
        return _table(["", "this run"], [[label, value] for label, value in provenance(now).items()])
    base_rows, now_rows = provenance(verdict.baseline), provenance(verdict.now)
    lines = _table(["", "baseline", "now"], [[k, base_rows[k], now_rows[k]] for k in now_rows])
    lines.append("")
    if verdict.baseline_path:
        lines.append(f"Baseline: `{verdict.baseline_path}`.")
    if verdict.drift is not None:
        lines.append(
            f"Calibration drift {verdict.drift:.3f}× (this machine against the baseline's, measured "
            "on fixed matmul and copy kernels) is divided out of the ratios."
        )
    changed = list(verdict.version_differences) or [
        k for k in VERSION_ROWS if base_rows[k] != now_rows[k] and "—" not in (base_rows[k], now_rows[k])
    ]
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


def _verdict_lines(verdict: Verdict, floors: dict[CaseKey, int | None]) -> list[str]:
    counts = verdict.counts()
    failed = not verdict.gate_passed
    headline = "❌ FAIL" if failed else "✅ PASS"
    tally = " · ".join(f"{n} {VERDICT_LABELS.get(v, v)}" for v, n in counts.items())
    lines = [f"**Verdict: {headline}** — {len(verdict.comparisons)} benchmarks: {tally}.", ""]
    attention = [c for c in verdict.comparisons if c.verdict != "same"]
    if attention:
        rank = {v: i for i, v in enumerate(VERDICT_ORDER)}
        attention.sort(key=lambda c: (rank.get(c.verdict, len(rank)), c.name))
        lines += ["### Needs attention", ""]
        rows = [
            [
                f"`{c.name}`",
                format_ms(c.baseline_median_ms),
                format_ms(c.now_median_ms),
                format_ratio(c.ratio),
                VERDICT_LABELS.get(c.verdict, c.verdict),
                _peak_cell(c.now_peak_bytes, c.baseline_peak_bytes, floors.get(c.key)),
                format_evidence(c),
            ]
            for c in attention
        ]
        lines += _table(["benchmark", "baseline", "now", "ratio", "verdict", "peak memory", "evidence"], rows)
        lines.append("")
        if any(c.verdict == "faster" for c in attention) and not failed:
            lines += ["Faster benchmarks: refresh the baseline so the gate guards the new speed.", ""]
    return lines


def _comparison_row(c: Comparison, floors: dict[CaseKey, int | None]) -> list[str]:
    return [
        f"`{c.name}`",
        format_ms(c.baseline_median_ms),
        format_ms(c.now_median_ms),
        format_ratio(c.ratio),
        VERDICT_LABELS.get(c.verdict, c.verdict),
        format_tflops(c.tflops),
        _peak_cell(c.now_peak_bytes, c.baseline_peak_bytes, floors.get(c.key)),
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
    verdict: Verdict | None,
    measurements: list[Measurement],
    now: RunInfo,
    plots: list[str] | None,
    plots_skipped: str | None,
) -> str:
    """The whole report. ``plots`` are image files to link (None: link none, e.g. for the job
    summary); ``plots_skipped`` says why there are no plots, if so."""
    floors = {m.key: m.min_bytes for m in measurements}
    title = "attnkit perf gate" if verdict else "attnkit perf run"
    gpu = provenance(verdict.now if verdict else now)["GPU"]
    lines = [f"## {title} on {gpu}" if gpu != "—" else f"## {title}", ""]
    lines += _provenance_lines(verdict, now)
    lines.append("")
    if verdict:
        lines += _verdict_lines(verdict, floors)
    else:
        lines += [
            "_No verdict: this run was not compared with a baseline. To make it this GPU's "
            "baseline: `python -m attnkit.bench.baseline record` (docs/CI.md)._",
            "",
        ]
    if plots_skipped:
        lines += [f"_Plots skipped: {plots_skipped}_", ""]
    elif plots:
        lines += ["### Plots", ""]
        lines += [f"![{PLOT_FILES.get(p, p)}]({p})" for p in plots]
        lines.append("")
    lines += ["### All benchmarks by group", ""]
    if verdict:
        header = ["benchmark", "baseline", "now", "ratio", "verdict", "TFLOP/s", "peak memory"]
        groups: dict[str, list[list[str]]] = defaultdict(list)
        for c in sorted(verdict.comparisons, key=lambda c: (c.group, c.name)):
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


def write_report(verdict_path: str | None, benchmarks_path: str, out_dir: str | Path) -> Path:
    """Write report.md, summary.md and, with matplotlib, the plots into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now, measurements = load_benchmarks(benchmarks_path)
    verdict = load_verdict(verdict_path) if verdict_path else None
    try:
        from attnkit.bench import report_plots
    except ImportError as err:
        plots, skipped = [], f"matplotlib is not installed ({err.name}); `pip install attnkit[report]`."
    else:
        plots, skipped = report_plots.write_plots(measurements, out), None
        if not plots:
            skipped = "the benchmark JSON has no attention benchmarks with backend, pass and shape."
    report = out / "report.md"
    report.write_text(render_markdown(verdict, measurements, now, plots, skipped), encoding="utf-8")
    (out / "summary.md").write_text(
        render_markdown(verdict, measurements, now, None, skipped), encoding="utf-8"
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit.bench.report", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--benchmarks", required=True, help="pytest-benchmark JSON of the run to report")
    parser.add_argument("--verdict", help="the gate's verdict JSON comparing that run with its baseline")
    parser.add_argument("--out-dir", required=True, help="folder for report.md, summary.md and the plots")
    args = parser.parse_args(argv)
    write_report(args.verdict, args.benchmarks, args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
