"""Write a GPU model's test durations from the gate's own output.

    python -m attnkit_perf.commands.durations GATE_DIR [GATE_DIR ...] --out FILE

(FILE: ``baselines/<gpu_key>/test-durations.json``.)

Each GATE_DIR is a folder ``.ci/gpu-gate.sh`` wrote (one per shard, or whole runs): its
``correctness.xml`` gives each test's seconds and its ``verdict.json`` the provenance of the run
(GPU, driver, CUDA, torch, triton, commit). What the file holds and what reads it:
:mod:`attnkit_perf.formats.durations`. Exit status 2, naming the file, when a folder lacks either
file or they cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from attnkit_perf.formats.durations import build
from attnkit_perf.formats.schema import FormatError, validate
from attnkit_perf.formats.verdict import VerdictDocument


def node_id(classname: str, name: str, root: Path) -> str:
    """pytest's node id of a JUnit test case: ``tests.correctness.test_x`` (and a class after it,
    if any) back to ``tests/correctness/test_x.py``, the longest dotted prefix that is a file
    under ``root``."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        module = Path(*parts[:end]).with_suffix(".py")
        if (root / module).is_file():
            return "::".join([module.as_posix(), *parts[end:], name])
    raise FormatError(f"JUnit test {classname}::{name}: no module {'/'.join(parts)}.py under {root}")


def junit_durations(path: Path, root: Path) -> dict[str, float]:
    """Node id -> seconds of every test case in the JUnit file at ``path`` that ran (skips left out)."""
    try:
        cases = ET.parse(path).getroot().iter("testcase")
    except (OSError, ET.ParseError) as err:
        raise FormatError(f"{path}: not a readable JUnit file ({err})") from err
    return {
        node_id(case.get("classname", ""), case.get("name", ""), root): float(case.get("time") or 0.0)
        for case in cases
        if case.find("skipped") is None
    }


def read_gate_dir(folder: Path, root: Path) -> tuple[str, dict, dict[str, float]]:
    if not folder.is_dir():
        raise FormatError(f"{folder}: no such folder (expected one that .ci/gpu-gate.sh wrote)")
    for name in ("correctness.xml", "verdict.json"):
        if not (folder / name).is_file():
            raise FormatError(
                f"{folder}: no {name} (a folder .ci/gpu-gate.sh wrote holds correctness.xml and verdict.json)"
            )
    verdict = VerdictDocument.read(folder / "verdict.json")
    provenance = verdict.head.get("provenance")
    if not provenance:
        raise FormatError(f"{folder / 'verdict.json'}: no provenance of the run (head.provenance)")
    # A label of the run itself, not of the folder it was copied to.
    shard = f"shard {verdict.shard['index']}/{verdict.shard['count']} of " if verdict.shard else ""
    label = f"{shard}a {verdict.mode} gate run at {str(provenance.get('commit'))[:12]}"
    return label, provenance, junit_durations(folder / "correctness.xml", root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_perf.commands.durations", description=__doc__.split("\n")[0]
    )
    parser.add_argument("gate_dirs", nargs="+", type=Path, help="folders .ci/gpu-gate.sh wrote")
    parser.add_argument("--out", required=True, type=Path, help="baselines/<gpu_key>/test-durations.json")
    parser.add_argument(
        "--root", type=Path, default=Path.cwd(), help="the checkout the tests ran in (default: here)"
    )
    args = parser.parse_args(argv)
    try:
        doc = build([read_gate_dir(folder, args.root) for folder in args.gate_dirs])
        validate("test-durations", doc, "the test durations being written")
    except FormatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf8")
    seconds = sorted(doc["durations"].values(), reverse=True)
    print(
        f"wrote {args.out}: {len(seconds)} tests of {doc['gpu_key']}, {sum(seconds):.0f} s in all, "
        f"the longest {', '.join(f'{s:.0f}' for s in seconds[:5])} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
