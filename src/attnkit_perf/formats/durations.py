"""How long each correctness test took on one GPU model: ``baselines/<gpu_key>/test-durations.json``.

Format ``attnkit-test-durations/1``, schema ``schemas/test-durations.schema.json``: pytest node id
-> seconds, with the runs it was read from (each one's label, provenance and test count). The
gate's correctness step splits its tests over runners by these costs (``--attnkit-shard``,
:mod:`attnkit_perf.run.shards`) instead of counting every test as one: on an H200 one flex test
took 225 s of a shard's 1854 s and another 0.1 s. Written from the gate's own output by
``python -m attnkit_perf.commands.durations``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from attnkit_perf.formats.schema import FormatError, read_json, validate

FORMAT = "attnkit-test-durations/1"
DURATIONS_FILE = "test-durations.json"


def durations_path(root: Path, key: str) -> Path:
    return Path(root) / key / DURATIONS_FILE


def build(parts: list[tuple[str, dict, dict[str, float]]]) -> dict:
    """The document of ``parts`` (label, provenance, node id -> seconds): one GPU model; a test
    timed in several parts keeps the median of its times."""
    keys = {provenance.get("gpu_key") for _, provenance, _ in parts}
    if len(keys) != 1 or None in keys:
        raise FormatError(f"test durations from different or unknown GPU models: {sorted(map(str, keys))}")
    times: dict[str, list[float]] = {}
    for _, _, durations in parts:
        for node, seconds in durations.items():
            times.setdefault(node, []).append(seconds)
    return {
        "format": FORMAT,
        "gpu_key": keys.pop(),
        "sources": [
            {"label": label, "provenance": provenance, "timed": len(durations)}
            for label, provenance, durations in parts
        ],
        "durations": {node: round(statistics.median(ts), 3) for node, ts in sorted(times.items())},
    }


def read_durations(path: Path, key: str) -> dict[str, float]:
    """Node id -> seconds of the file at ``path``, validated; refused for another GPU model."""
    data = read_json(path, "test durations")
    validate("test-durations", data, f"test durations {path}")
    if data["gpu_key"] != key:
        raise FormatError(f"test durations {path} are for {data['gpu_key']!r}; this run is {key!r}")
    return data["durations"]


def cost_by_node(durations: dict[str, float]) -> Callable[[str], float]:
    """A test's expected cost in seconds: its recorded time, else the median of the recorded ones
    (a new test is taken as typical); every test costs 1 when nothing is recorded."""
    if not durations:
        return lambda node: 1.0
    typical = statistics.median(durations.values())
    return lambda node: durations.get(node, typical)
