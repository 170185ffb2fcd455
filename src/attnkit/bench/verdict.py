"""The verdict file and the gate's terminal table.

Format ``attnkit-perf-verdict/1`` (written by ``--attnkit-verdict-json PATH``; read by
``attnkit.bench.report`` together with the run's pytest-benchmark JSON). Stable: fields are
only ever added.

.. code-block:: text

    {
      "format": "attnkit-perf-verdict/1",
      "passed": bool,                      # false iff some benchmark is slower / more-memory
      "thresholds": {slower, faster, alpha, memory_rel, memory_abs_bytes, normalise},
      "drift": float,                      # calibration now / baseline; now samples divided by it
      "version_differences": {key: [baseline, now]},   # torch/cuda/triton/cudnn/driver
      "baseline": {"path", "datetime", "commit_info", "machine_info"},
      "now": {"datetime", "commit_info", "machine_info"},
      "counts": {verdict: n},
      "benchmarks": [
        {
          "name": "fwd[sdpa-flash-bf16-B4-H16-N4096-D128-causal]",   # BenchCase.name
          "fullname": pytest node id (the key matched between runs),
          "group", "backend", "pass", "shape": {batch, q_heads, kv_heads, seq_len, head_dim,
                                                causal, dtype},
          "verdict": "same" | "slower" | "faster" | "more-memory" | "new" | "missing",
          "baseline_median_ms", "now_median_ms",        # raw medians (now not drift-corrected)
          "ratio",                                      # drift-corrected median ratio now/baseline
          "evidence": {"drift", "p_slower", "p_faster", "ratio_ci99": [lo, hi],
                       "confirm": null | {"ratio", "p_slower"},
                       "memory_growth_bytes"?, "also_more_memory"?},
          "baseline_peak_bytes", "now_peak_bytes", "tflops"
        }, ...
      ]
    }

``machine_info["attnkit"]`` holds GPU name, capability, SM count, driver, CUDA, cuDNN, torch,
triton and commit (:func:`attnkit.bench.machine.provenance`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from attnkit.bench.gate import FAILING, VERDICTS, Thresholds, Verdict

FORMAT = "attnkit-perf-verdict/1"


def _run_header(run: dict) -> dict:
    return {key: run.get(key) for key in ("datetime", "commit_info", "machine_info")}


def build_verdict_document(
    verdicts: list[Verdict],
    thresholds: Thresholds,
    drift: float,
    baseline_run: dict,
    baseline_path: str,
    now_run: dict,
    version_differences: dict,
) -> dict:
    return {
        "format": FORMAT,
        "passed": not any(v.failed for v in verdicts),
        "thresholds": asdict(thresholds),
        "drift": drift,
        "version_differences": {k: list(v) for k, v in version_differences.items()},
        "baseline": {"path": baseline_path, **_run_header(baseline_run)},
        "now": _run_header(now_run),
        "counts": dict(Counter(v.verdict for v in verdicts)),
        "benchmarks": [v.as_dict() for v in verdicts],
    }


def write_verdict_json(document: dict, path: Path | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf8")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _evidence(v: Verdict) -> str:
    ev = v.evidence
    if v.verdict == "more-memory":
        return f"peak {v.baseline_peak_bytes} -> {v.now_peak_bytes} B (+{ev['memory_growth_bytes']} B)"
    if "p_slower" not in ev:
        return ""
    p = ev["p_slower"] if v.verdict != "faster" else ev["p_faster"]
    text = f"p={p:.1e} ci99=[{ev['ratio_ci99'][0]:.3f},{ev['ratio_ci99'][1]:.3f}]"
    if ev.get("confirm"):
        text += f" re-measured x{ev['confirm']['ratio']:.3f} p={ev['confirm']['p_slower']:.1e}"
    if ev.get("also_more_memory"):
        text += f" +{ev['memory_growth_bytes']} B peak"
    return text


def format_table(verdicts: list[Verdict], kinds: tuple[str, ...]) -> list[str]:
    """Rows of the verdicts of the given kinds: name, baseline ms, now ms, ratio, evidence."""
    rows = [v for v in verdicts if v.verdict in kinds]
    if not rows:
        return []
    width = max(len(v.name) for v in rows)
    lines = [f"{'benchmark':<{width}}  {'verdict':<11} {'base ms':>9} {'now ms':>9} {'ratio':>6}  evidence"]
    for v in rows:
        ratio = "-" if v.ratio is None else f"{v.ratio:.3f}"
        lines.append(
            f"{v.name:<{width}}  {v.verdict:<11} {_ms(v.baseline_median_ms):>9} "
            f"{_ms(v.now_median_ms):>9} {ratio:>6}  {_evidence(v)}"
        )
    return lines


def summary_line(verdicts: list[Verdict]) -> str:
    counts = Counter(v.verdict for v in verdicts)
    parts = ", ".join(f"{counts[k]} {k}" for k in VERDICTS)
    failed = sum(counts[k] for k in FAILING)
    return f"attnkit perf gate: {'FAILED' if failed else 'passed'} ({parts})"
