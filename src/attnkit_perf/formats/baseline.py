"""The baseline store: one pytest-benchmark JSON per GPU model, ``baselines/<gpu_key>/baseline.json``.

The file is exactly what ``pytest --benchmark-json`` writes, per-round samples included, so
``pytest-benchmark compare`` reads it; ``machine_info["attnkit"]`` holds the provenance of
:func:`attnkit_perf.measure.machine.provenance`. It is validated against ``schemas/baseline.schema.json``
before use. Record or refresh this GPU's baseline (after an intended slowdown, or when the grid
changes) with :data:`RECORD_COMMAND`.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnkit_perf.formats.schema import FormatError, read_json, validate

BASELINE_FILE = "baseline.json"
RECORD_COMMAND = (
    "pytest tests/perf --attnkit-record   (one machine; recordings of several machines pooled: "
    "bash .ci/record-baseline.sh, tox -e baseline)"
)
#: The timing protocol of a baseline that names none (``machine_info["attnkit"]["timing"]``,
#: :data:`attnkit_perf.measure.timing.TIMING_PROTOCOL`): recorded before protocols were named,
#: with an L2 flush that wrote zeros.
UNNAMED_TIMING_PROTOCOL = "flush-by-zeroing"


def baseline_path(root: Path | str, key: str) -> Path:
    return Path(root) / key / BASELINE_FILE


def missing_message(root: Path | str, key: str, command: str = RECORD_COMMAND) -> str:
    return (
        f"no perf baseline for GPU {key!r} (looked for {baseline_path(root, key)}). Record one on "
        f"this GPU model with: {command}; or compare with a base commit on this GPU: "
        "--attnkit-base=REF"
    )


def load_baseline(
    path: Path | str,
    expected_key: str | None,
    allow_other_gpu: bool = False,
    timing_protocol: str | None = None,
) -> dict:
    """Read and validate a baseline file; raise :class:`FormatError` saying why it cannot be used
    (missing, not JSON, not a baseline, recorded on another GPU model unless allowed, or timed
    with another protocol than ``timing_protocol``: one that is not this run's measures the same
    code at another time, e.g. with a flush's write-back inside every call)."""
    data = read_json(path, "baseline")
    validate("baseline", data, f"baseline {path}")
    recorded = recorded_gpu_key(data)
    if expected_key is not None and recorded != expected_key and not allow_other_gpu:
        raise FormatError(
            f"baseline {path} was recorded on {recorded!r}, this run is on {expected_key!r}: timings "
            "of another GPU model are not comparable (pass --attnkit-allow-other-gpu to compare anyway)"
        )
    protocol = recorded_timing_protocol(data)
    if timing_protocol is not None and protocol != timing_protocol:
        raise FormatError(
            f"baseline {path} was timed with the {protocol!r} protocol, this run times with "
            f"{timing_protocol!r}: the same code measures differently under the two"
        )
    return data


def recorded_gpu_key(run: dict) -> str | None:
    return ((run.get("machine_info") or {}).get("attnkit") or {}).get("gpu_key")


def recorded_timing_protocol(run: dict) -> str:
    """The timing protocol a run names (``machine_info["attnkit"]["timing"]``); a run that names
    none was timed before protocols were named, with the zeroing flush."""
    return ((run.get("machine_info") or {}).get("attnkit") or {}).get("timing") or UNNAMED_TIMING_PROTOCOL


def save_baseline(run: dict, path: Path | str) -> Path:
    validate("baseline", run, "the run being recorded")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n", encoding="utf8")
    return path
