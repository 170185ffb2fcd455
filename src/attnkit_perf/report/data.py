"""What the report reads besides the verdict (:class:`attnkit_perf.formats.verdict.VerdictDocument`):
a pytest-benchmark JSON run, loaded into plain measurements that the Markdown and the plots
share. Rows are joined on the benchmark's case (backend, pass, shape), not on pytest's ids.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from attnkit_perf.formats.schema import read_json, validate
from attnkit_perf.formats.verdict import VerdictDocument

CaseKey = tuple[str, str, tuple[tuple[str, object], ...]]


def shape_from_json(shape: dict) -> dict:
    """A benchmark's shape as read from JSON, with its lists back as tuples: JSON has no tuples, so
    a window ``(left, right)`` comes back as a list, and the shape is part of hashed keys."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in shape.items()}


def case_key(backend: str, pass_name: str, shape: dict) -> CaseKey:
    """Join key of one benchmark; the shape dict may or may not repeat backend and pass."""
    dims = tuple(
        sorted((k, v) for k, v in shape_from_json(shape).items() if k not in ("backend", "pass_name", "pass"))
    )
    return backend, pass_name, dims


@dataclass(frozen=True)
class Measurement:
    """One benchmark of a pytest-benchmark run, with the extra_info the perf suite attaches."""

    name: str
    backend: str
    pass_name: str
    shape: dict
    median_ms: float
    tflops: float | None
    peak_bytes: int | None
    min_bytes: int | None

    @property
    def key(self) -> CaseKey:
        return case_key(self.backend, self.pass_name, self.shape)

    @property
    def seq_len(self) -> int:
        return int(self.shape["seq_len"])


@dataclass(frozen=True)
class RunInfo:
    """Provenance of one side: the machine and the commit that produced it."""

    machine_info: dict = field(default_factory=dict)
    commit_info: dict = field(default_factory=dict)
    datetime: str | None = None


def _optional_float(value) -> float | None:
    return None if value is None else float(value)


def _optional_int(value) -> int | None:
    return None if value is None else int(value)


def load_benchmarks(path: str | Path) -> tuple[RunInfo, list[Measurement]]:
    """Read a pytest-benchmark JSON run (``--benchmark-json`` or a stored baseline).

    Benchmarks without the perf suite's extra_info (backend, pass, shape) are not attention
    cases and are left out.
    """
    data = read_json(path, "benchmark JSON")
    validate("baseline", data, f"benchmark JSON {path}")
    run = RunInfo(data.get("machine_info", {}), data.get("commit_info", {}), data.get("datetime"))
    measurements = []
    for bench in data.get("benchmarks", []):
        extra = bench.get("extra_info", {})
        if not {"backend", "pass", "shape"} <= extra.keys():
            continue
        measurements.append(
            Measurement(
                name=extra.get("name") or bench["name"],
                backend=extra["backend"],
                pass_name=extra["pass"],
                shape=shape_from_json(extra["shape"]),
                median_ms=statistics.median(bench["stats"]["data"]) * 1e3,
                tflops=_optional_float(extra.get("tflops")),
                peak_bytes=_optional_int(extra.get("peak_bytes")),
                min_bytes=_optional_int(extra.get("min_bytes")),
            )
        )
    return run, measurements


def measurements_from_verdict(doc: VerdictDocument) -> list[Measurement]:
    """The head side of a verdict as measurements (paired mode writes no pytest-benchmark JSON)."""
    return [
        Measurement(
            name=row.name,
            backend=row.backend,
            pass_name=row.pass_name,
            shape=shape_from_json(row.shape),
            median_ms=row.head_median_ms,
            tflops=row.tflops,
            peak_bytes=row.head_peak_bytes,
            min_bytes=None,
        )
        for row in doc.benchmarks
        if row.head_median_ms is not None
    ]
