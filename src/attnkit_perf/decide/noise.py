"""A/A noise: how far a benchmark's ratio moves between runs of unchanged code.

``python -m attnkit_perf.decide.noise VERDICT.json [VERDICT.json ...] --out FILE`` reads the
verdicts of N runs of the gate on unchanged code (paired mode with the base equal to the head,
or stored mode against the committed baseline) and writes, per benchmark, the ratios seen and
the standard deviation of their logarithm (format ``attnkit-perf-noise/1``, schema
``schemas/noise.schema.json``). The gate then holds each benchmark to
``max(practical threshold, k x sd)``, ``k`` from the benchmark's share of the false-alarm budget
(:func:`attnkit_perf.decide.gate.benchmark_threshold`, :func:`attnkit_perf.decide.gate.noise_z`)
and lists the benchmarks whose noise keeps them from being guarded at the practical threshold.
``.ci/aa-noise.sh`` runs the whole procedure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from attnkit_perf.decide import gate
from attnkit_perf.decide.formats import FormatError, read_json, validate
from attnkit_perf.decide.verdict import VerdictDocument

FORMAT = "attnkit-perf-noise/1"


def noise_file(root: Path | str, key: str, mode: str) -> Path:
    return Path(root) / key / f"noise-{mode}.json"


def build(docs: list[VerdictDocument]) -> dict:
    """The noise document of several A/A verdicts of one mode and GPU model."""
    modes = {d.mode for d in docs}
    keys = {(d.head.get("provenance") or {}).get("gpu_key") for d in docs}
    if len(docs) < 2 or len(modes) != 1 or len(keys) != 1:
        raise FormatError(
            f"A/A noise needs >= 2 verdicts of one mode and one GPU model; got {len(docs)} verdicts, "
            f"modes {sorted(modes)}, GPU keys {sorted(map(str, keys))}"
        )
    for i, doc in enumerate(docs, 1):
        base_code = (doc.base.get("provenance") or {}).get("source")
        head_code = (doc.head.get("provenance") or {}).get("source")
        if base_code and head_code and base_code != head_code:
            # A change's verdict taken for A/A noise would raise thresholds by its own effect.
            raise FormatError(
                f"verdict {i} of {len(docs)} compares different code (base source {base_code}, head "
                f"source {head_code}): A/A noise needs runs of unchanged code"
            )
    ratios: dict[str, list[float]] = {}
    for doc in docs:
        for row in doc.benchmarks:
            if row.ratio is not None and row.ratio > 0 and math.isfinite(row.ratio):
                ratios.setdefault(row.name, []).append(row.ratio)
    benchmarks = {
        name: {"log_ratio_sd": float(np.std(np.log(values), ddof=1)), "ratios": values}
        for name, values in sorted(ratios.items())
        if len(values) >= 2
    }
    return {
        "format": FORMAT,
        "gpu_key": keys.pop(),
        "mode": modes.pop(),
        "runs": len(docs),
        "provenance": docs[-1].head.get("provenance") or {},
        "benchmarks": benchmarks,
    }


def load_noise(path: Path | str, expected_key: str, mode: str) -> dict[str, float]:
    """``{benchmark name: log-ratio sd}`` from a noise file, validated."""
    data = read_json(path, "A/A noise")
    validate("noise", data, f"A/A noise {path}")
    if data["gpu_key"] != expected_key or data["mode"] != mode:
        raise FormatError(
            f"A/A noise {path} is for {data['gpu_key']!r} in {data['mode']} mode; this run is "
            f"{expected_key!r} in {mode} mode"
        )
    return {name: entry["log_ratio_sd"] for name, entry in data["benchmarks"].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_perf.decide.noise", description=__doc__.split("\n")[0]
    )
    parser.add_argument("verdicts", nargs="+", help="verdict JSON files of A/A runs")
    parser.add_argument(
        "--out", required=True, help="noise file to write (baselines/<gpu_key>/noise-<mode>.json)"
    )
    args = parser.parse_args(argv)
    try:
        doc = build([VerdictDocument.read(p) for p in args.verdicts])
        validate("noise", doc, "the noise file being written")
    except FormatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf8")
    sds = sorted(((e["log_ratio_sd"], n) for n, e in doc["benchmarks"].items()), reverse=True)
    # The paired gate's default multiple for this many benchmarks (slowdowns confirmed).
    k = gate.noise_z(gate.per_benchmark_alpha(gate.Thresholds(), len(sds)), confirmed=True)
    print(f"wrote {out}: {len(sds)} benchmarks from {doc['runs']} runs; noisiest:")
    for sd, name in sds[:5]:
        print(f"  {name}: sd {sd:.4f} (paired threshold at k={k:.2f}: {math.expm1(k * sd):.3%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
