"""Write a noise file from the verdicts of A/A runs (the gate on unchanged code).

    python -m attnkit_perf.commands.noise VERDICT.json [VERDICT.json ...] --out FILE

What the file holds: :mod:`attnkit_perf.formats.noise`; how the gate uses it:
:mod:`attnkit_perf.decide.noise`; ``.ci/aa-noise.sh`` runs the whole procedure. Exit status 2,
naming the file, when a verdict is unreadable.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from attnkit_perf.decide import gate
from attnkit_perf.decide.noise import SD_CONFIDENCE, sd_upper_bound
from attnkit_perf.formats.noise import build
from attnkit_perf.formats.schema import FormatError, validate
from attnkit_perf.formats.verdict import VerdictDocument


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_perf.commands.noise", description=__doc__.split("\n")[0]
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
    sds = sorted(
        ((e["log_ratio_sd"], len(e["ratios"]), n) for n, e in doc["benchmarks"].items()), reverse=True
    )
    # The paired gate's default multiple for this many benchmarks (slowdowns confirmed).
    k = gate.noise_z(gate.per_benchmark_alpha(gate.Thresholds(), len(sds)), confirmed=True)
    print(f"wrote {out}: {len(sds)} benchmarks from {doc['runs']} runs; noisiest:")
    for sd, runs, name in sds[:5]:
        bound = sd_upper_bound(sd, runs)
        print(
            f"  {name}: sd {sd:.4f}, {SD_CONFIDENCE:.0%} bound {bound:.4f} "
            f"(paired threshold at k={k:.2f}: {math.expm1(k * bound):.3%})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
