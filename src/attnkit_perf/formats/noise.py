"""The A/A noise file: how far each benchmark's ratio moved between runs of unchanged code.

``python -m attnkit_perf.commands.noise VERDICT.json [VERDICT.json ...] --out FILE`` reads the
verdicts of N runs of the gate on unchanged code (paired mode with the base equal to the head,
or stored mode against the committed baseline) and writes, per benchmark, the ratios seen and
the standard deviation of their logarithm (the host metric's ratio of a benchmark under
:func:`host_noise_name`; format ``attnkit-perf-noise/1``, schema ``schemas/noise.schema.json``).
How the gate turns that sd into a threshold: :mod:`attnkit_perf.decide.noise`.

A noise file describes one measurement: it is refused when it names another timing protocol
than the run's, and the run lists loudly the benchmarks it holds that the grid no longer has
(stale) and those of the run it lacks (held to the practical threshold):
:func:`coverage_notes`. ``.ci/aa-noise.sh`` runs the whole procedure.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attnkit_perf.formats.schema import FormatError, read_json, validate
from attnkit_perf.formats.verdict import VerdictDocument

FORMAT = "attnkit-perf-noise/1"
#: How a noise file is regenerated, as the refusals and notes say.
REGENERATE = ".ci/aa-noise.sh on this GPU model"


def host_noise_name(name: str) -> str:
    """The name under which the A/A noise file holds benchmark ``name``'s host metric."""
    return f"{name}@host"


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
            # The host metric's A/A ratio, a benchmark of its own (host_noise_name).
            host = (row.host or {}).get("ratio")
            if host is not None and host > 0 and math.isfinite(host):
                ratios.setdefault(host_noise_name(row.name), []).append(host)
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


def read_noise(path: Path | str, expected_key: str, mode: str, timing_protocol: str | None = None) -> dict:
    """The noise document at ``path``, validated; refused (:class:`FormatError`) when it is for
    another GPU model or mode, or names another timing protocol than ``timing_protocol``."""
    data = read_json(path, "A/A noise")
    validate("noise", data, f"A/A noise {path}")
    if data["gpu_key"] != expected_key or data["mode"] != mode:
        raise FormatError(
            f"A/A noise {path} is for {data['gpu_key']!r} in {data['mode']} mode; this run is "
            f"{expected_key!r} in {mode} mode"
        )
    protocol = noise_protocol(data)
    if timing_protocol is not None and protocol is not None and protocol != timing_protocol:
        raise FormatError(
            f"A/A noise {path} was measured with the {protocol!r} timing protocol, this run times "
            f"with {timing_protocol!r}: regenerate it ({REGENERATE})"
        )
    return data


def noise_protocol(data: dict) -> str | None:
    """The timing protocol a noise file's runs used (their provenance's ``timing``), or None
    for a file that names none (written before protocols were recorded with noise)."""
    return (data.get("provenance") or {}).get("timing")


def coverage_notes(path, noise_names, grid_names, run_names, protocol: str | None) -> list[str]:
    """Loud notes on a noise file that does not describe this run: no timing protocol named,
    names the grid no longer has (stale), and benchmarks of this run it lacks (each held to the
    practical threshold, whatever its real noise)."""
    notes = []
    if protocol is None:
        notes.append(
            f"WARNING: A/A noise {path} names no timing protocol: it may predate the current one "
            f"(regenerate it: {REGENERATE})"
        )
    stale = sorted(set(noise_names) - set(grid_names))
    missing = sorted(set(run_names) - set(noise_names))
    if stale:
        notes.append(
            f"WARNING: A/A noise {path} holds {len(stale)} benchmarks the grid no longer has "
            f"(stale; regenerate it: {REGENERATE}): " + ", ".join(stale)
        )
    if missing:
        notes.append(
            f"WARNING: A/A noise {path} lacks {len(missing)} benchmarks of this run (held to the "
            f"practical threshold without their noise; regenerate it: {REGENERATE}): " + ", ".join(missing)
        )
    return notes
