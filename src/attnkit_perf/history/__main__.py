"""``python -m attnkit_perf.history {record,publish,regressions}`` (docs/HISTORY.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit_perf.history.record import HistoryError, record


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_perf.history",
        description="The benchmarks' history across commits: record runs into a store, publish "
        "the static site, list the regressions it shows (docs/HISTORY.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="append runs (pytest-benchmark JSON of tests/perf) to the store")
    rec.add_argument("--results", required=True, nargs="+", type=Path, help="pytest --benchmark-json file(s)")
    rec.add_argument("--store", required=True, type=Path, help="the history store folder")
    rec.add_argument(
        "--repo", default=".", type=Path, help="git checkout that holds the commits (default: .)"
    )
    rec.add_argument("--commit", help="the commit the run measured (default: the run's provenance)")
    rec.add_argument("--commit-date", help="its committer date, ISO 8601 (default: from git)")
    for name, helps in (
        ("publish", "build the static site"),
        ("regressions", "list the steps and drifts the site would show"),
    ):
        cmd = sub.add_parser(name, help=helps)
        cmd.add_argument("--store", required=True, type=Path, help="the history store folder")
        cmd.add_argument(
            "--rule", type=Path, help="detection rule JSON (default: the packaged detection.json)"
        )
        if name == "publish":
            cmd.add_argument("--out", required=True, type=Path, help="site folder to write")
            cmd.add_argument("--repo", default=".", type=Path, help="checkout whose origin gives the links")
            cmd.add_argument(
                "--commit-url", help="commit URL template with {sha} (default: origin on GitHub)"
            )
            cmd.add_argument("--compare-url", help="comparison URL template with {good} and {bad}")
    return parser


def _publish(args: argparse.Namespace, rule) -> None:
    from attnkit_perf.history.links import CommitLinks, default_links
    from attnkit_perf.history.site import publish

    links = default_links(args.repo)
    if args.commit_url is not None or args.compare_url is not None:
        links = CommitLinks(args.commit_url or "", args.compare_url or "")
    print(f"wrote {publish(args.store, args.out, links, rule)}")


def _regressions(args: argparse.Namespace, rule) -> None:
    from attnkit_perf.history.site import analyse_store, findings_json

    _, analysed = analyse_store(args.store, rule)
    found = findings_json(analysed)
    for f in found:
        state = "" if f["persists"] else " (recovered)"
        print(f"{f['gpu_key']}  {f['benchmark']}  {f['kind']} {f['change']:+.1%}{state}\n    {f['bisect']}")
    print(f"{len(found)} findings")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "record":
            for results in args.results:
                path = record(results, args.store, args.repo, args.commit, args.commit_date)
                print(f"recorded {results} as {path}")
            return 0
        from attnkit_perf.history.detect import Rule

        rule = Rule.load(args.rule)
        (_publish if args.command == "publish" else _regressions)(args, rule)
    except (HistoryError, ValueError, OSError) as err:
        print(f"attnkit_perf.history: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
