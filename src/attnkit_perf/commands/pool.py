"""Pool several recordings of one GPU model into its baseline and their spread.

    python -m attnkit_perf.commands.pool A.json B.json [...] --out baselines/<gpu_key>/baseline.json

Writes the pooled baseline (``--out``) and the spread beside it (``noise-stored.json``); what
pooling does and why: :mod:`attnkit_perf.decide.pooled`. Exit status 2, naming the file, when a
recording is unreadable or the recordings cannot be pooled.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnkit_perf.decide.pooled import merge, pool_note, spread_sigmas
from attnkit_perf.formats.baseline import save_baseline
from attnkit_perf.formats.schema import FormatError, read_json
from attnkit_perf.formats.spread import SPREAD_FILE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_perf.commands.pool", description=__doc__.split("\n")[0]
    )
    parser.add_argument("recordings", nargs="+", help="pytest-benchmark JSON of perf-suite runs (>= 2)")
    parser.add_argument(
        "--out", required=True, help="pooled baseline to write (baselines/<gpu_key>/baseline.json)"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        runs = [read_json(p, "recording") for p in args.recordings]
        baseline, spread = merge(runs, [Path(p).name for p in args.recordings])
    except FormatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    save_baseline(baseline, out)
    spread_path = out.parent / SPREAD_FILE
    spread_path.write_text(json.dumps(spread, indent=1) + "\n", encoding="utf8")
    count = len(baseline["benchmarks"])
    print(f"wrote {out} ({count} benchmarks, {len(runs)} recordings, pool {spread['pool']})")
    widest = sorted(
        ((e["log_sd"], n, len(e["log_offsets"])) for n, e in spread["benchmarks"].items()), reverse=True
    )
    sigmas = spread_sigmas(spread)
    print(f"wrote {spread_path}: {len(widest)} benchmarks with a spread; {pool_note(spread)}; widest:")
    for sd, name, n in widest[:5]:
        print(f"  {name}: sd {sd:.4f} over {n} recordings, allowed sigma {sigmas[name]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
