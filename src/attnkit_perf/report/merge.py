"""``python -m attnkit_perf.report merge PART.json... --out verdict.json``: the verdicts of a grid
split over runners (``--attnkit-shard=I/N``) joined into one (:mod:`attnkit_perf.decide.merge`),
written and summarised. Exit 0 when the merged verdict passed, 1 when it failed (a part failed,
is missing or incomplete, ran on another GPU model or compared other commits, or a row is in two
parts), 2 when a part cannot be read."""

from __future__ import annotations

import argparse
import sys

from attnkit_perf.decide.merge import merge_verdicts
from attnkit_perf.formats.schema import FormatError
from attnkit_perf.formats.verdict import VerdictDocument
from attnkit_perf.report.terminal import summary_line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_perf.report merge", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("parts", nargs="+", metavar="PART.json", help="the shards' verdict files")
    parser.add_argument("--out", required=True, help="where to write the merged verdict")
    args = parser.parse_args(argv)
    try:
        parts = [(path, VerdictDocument.read(path)) for path in args.parts]
    except FormatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    merged = merge_verdicts(parts)
    merged.write(args.out)
    for note in merged.notes:
        if note.startswith("MERGE FAILED"):
            print(note, file=sys.stderr)
    print(f"wrote {args.out}: {summary_line(merged)}")
    return 0 if merged.passed else 1
