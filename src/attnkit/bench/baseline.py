"""The baseline store: one pytest-benchmark JSON per GPU model, ``baselines/<gpu_key>/baseline.json``.

The file is exactly what ``pytest --benchmark-json`` writes (per-round samples included), so
``pytest-benchmark compare baselines/<gpu_key>/baseline.json`` reads it; its
``machine_info["attnkit"]`` holds the provenance of :func:`attnkit.bench.machine.provenance`.

Record or refresh this GPU's baseline (after an intended slowdown, or when shapes change)::

    python -m attnkit.bench.baseline record    # = pytest tests/perf/test_attention_perf.py --attnkit-record
    python -m attnkit.bench.baseline show              # what the stored baseline was recorded on
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from attnkit.bench.machine import gpu_key

BASELINE_FILE = "baseline.json"
RECORD_COMMAND = "python -m attnkit.bench.baseline record"


class BaselineError(Exception):
    """A baseline that cannot be used; the message says why and what to do."""


def baseline_path(root: Path | str, key: str) -> Path:
    return Path(root) / key / BASELINE_FILE


def missing_message(root: Path | str, key: str) -> str:
    return (
        f"no perf baseline for GPU {key!r} (looked for {baseline_path(root, key)}); "
        f"nothing was compared. Record one on this GPU with: {RECORD_COMMAND}"
    )


def load_baseline(path: Path | str, expected_key: str | None, allow_other_gpu: bool = False) -> dict:
    """Read and check a baseline file.

    Raises BaselineError when it is missing, is not JSON, is not a pytest-benchmark run, or was
    recorded on another GPU model (unless ``allow_other_gpu``): a baseline from another GPU is
    never used silently.
    """
    path = Path(path)
    if not path.is_file():
        raise BaselineError(f"baseline file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BaselineError(
            f"baseline {path} is not readable JSON ({err}); re-record it with: {RECORD_COMMAND}"
        ) from err
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise BaselineError(f"baseline {path} is not a pytest-benchmark run: it has no 'benchmarks' list")
    for bench in data["benchmarks"]:
        if not isinstance(bench, dict) or "fullname" not in bench or "data" not in bench.get("stats", {}):
            raise BaselineError(
                f"baseline {path} lacks per-round samples (stats.data) for "
                f"{bench.get('fullname', '?') if isinstance(bench, dict) else bench!r}; "
                f"re-record it with: {RECORD_COMMAND}"
            )
    recorded_key = recorded_gpu_key(data)
    if expected_key is not None and recorded_key != expected_key and not allow_other_gpu:
        raise BaselineError(
            f"baseline {path} was recorded on {recorded_key!r}, this run is on {expected_key!r}: "
            "timings of another GPU model are not comparable (pass --attnkit-allow-other-gpu to "
            "compare anyway)"
        )
    return data


def recorded_gpu_key(run: dict) -> str | None:
    return (run.get("machine_info") or {}).get("attnkit", {}).get("gpu_key")


def save_baseline(run: dict, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run, indent=2, sort_keys=True) + "\n", encoding="utf8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit.bench.baseline", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    record = sub.add_parser("record", help="run tests/perf and store the result as this GPU's baseline")
    record.add_argument("--dir", default="baselines", help="baseline root (default: baselines)")
    record.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    show = sub.add_parser("show", help="print the provenance of this GPU's baseline")
    show.add_argument("--dir", default="baselines")
    args = parser.parse_args(argv)
    if args.command == "record":
        cmd = [sys.executable, "-m", "pytest", "tests/perf/test_attention_perf.py", "--attnkit-record"]
        cmd.append(f"--attnkit-baseline-dir={args.dir}")
        return subprocess.call([*cmd, *args.pytest_args])
    path = baseline_path(args.dir, gpu_key())
    try:
        data = load_baseline(path, gpu_key())
    except BaselineError as err:
        print(err, file=sys.stderr)
        return 1
    print(json.dumps(data["machine_info"].get("attnkit", {}), indent=2))
    print(f"{len(data['benchmarks'])} benchmarks, recorded {data.get('datetime')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
