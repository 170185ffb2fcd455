"""The spread between pooled recordings: ``noise-stored.json`` beside a pooled baseline.

Format ``attnkit-perf-stored-spread/1``, schema ``schemas/noise-stored.schema.json``: per
benchmark, each recording's median (corrected for its machine's drift) as a log offset from their
mean, and the standard deviation of those offsets; the pool's id (the pooled baseline's
``machine_info["attnkit"]["pooled"]["id"]``), every recording's provenance and calibration, and
the timing protocol. How it is written and what the gate makes of it:
:mod:`attnkit_perf.decide.pooled`.
"""

from __future__ import annotations

from pathlib import Path

from attnkit_perf.formats.schema import FormatError, read_json, validate

FORMAT = "attnkit-perf-stored-spread/1"
SPREAD_FILE = "noise-stored.json"
POOL_COMMAND = "python -m attnkit_perf.commands.pool RECORDING.json RECORDING.json ... --out BASELINE"


def pool_of(baseline: dict) -> str | None:
    """The id of the pool a baseline was pooled as, or None for a single recording."""
    provenance = (baseline.get("machine_info") or {}).get("attnkit") or {}
    return (provenance.get("pooled") or {}).get("id")


def read_spread(path: Path | str, key: str, timing_protocol: str | None) -> dict:
    """The spread document at ``path``, validated; refused (:class:`FormatError`) for another GPU
    model or timing protocol."""
    data = read_json(path, "stored spread")
    validate("noise-stored", data, f"stored spread {path}")
    if data["gpu_key"] != key:
        raise FormatError(f"stored spread {path} is for {data['gpu_key']!r}; this run is {key!r}")
    if timing_protocol is not None and data["timing"] != timing_protocol:
        raise FormatError(
            f"stored spread {path} was measured with the {data['timing']!r} timing protocol, this run "
            f"times with {timing_protocol!r}: record and pool again ({POOL_COMMAND})"
        )
    return data


def missing_note(path: Path | str) -> str:
    return (
        f"WARNING: no spread between recordings for this baseline ({path}): one machine's offset is "
        "taken for the code's speed, every benchmark held to the practical threshold. Record on "
        f"several machines of this model and pool them: {POOL_COMMAND}"
    )


def is_spread(path: Path | str) -> bool:
    """Whether ``path`` holds a spread file (rather than an A/A noise file of stored mode)."""
    return read_json(path, "stored noise").get("format") == FORMAT
