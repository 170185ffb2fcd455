"""What the report reads: the gate's verdict JSON and a pytest-benchmark JSON run, loaded into
plain records that the Markdown and the plots share.

Both files are joined on the benchmark's case (backend, pass, shape) rather than on its name, so
the report does not depend on how pytest spells test ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

#: Verdicts that fail the gate; every other verdict is informational.
FAILING_VERDICTS = ("slower", "more-memory")
#: Order in which verdicts are counted and listed: what needs action first.
VERDICT_ORDER = ("slower", "more-memory", "faster", "new", "missing", "same")

CaseKey = tuple[str, str, tuple[tuple[str, object], ...]]


def case_key(backend: str, pass_name: str, shape: dict) -> CaseKey:
    """Join key of one benchmark; the shape dict may or may not repeat backend and pass."""
    dims = tuple(sorted((k, v) for k, v in shape.items() if k not in ("backend", "pass_name", "pass")))
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
class Comparison:
    """One row of the verdict: a benchmark's baseline against now. Times and bytes are None
    where a side does not have the benchmark (verdict ``new`` or ``missing``)."""

    name: str
    group: str
    backend: str
    pass_name: str
    shape: dict
    verdict: str
    evidence: dict | str
    baseline_median_ms: float | None
    now_median_ms: float | None
    ratio: float | None
    baseline_peak_bytes: int | None
    now_peak_bytes: int | None
    tflops: float | None

    @property
    def key(self) -> CaseKey:
        return case_key(self.backend, self.pass_name, self.shape)

    @property
    def fails(self) -> bool:
        return self.verdict in FAILING_VERDICTS


@dataclass(frozen=True)
class RunInfo:
    """Provenance of one run: the machine and the commit that produced it."""

    machine_info: dict = field(default_factory=dict)
    commit_info: dict = field(default_factory=dict)
    datetime: str | None = None


@dataclass(frozen=True)
class Verdict:
    """The verdict file (format ``attnkit-perf-verdict/1``, see :mod:`attnkit.bench.verdict`)."""

    baseline: RunInfo
    now: RunInfo
    comparisons: list[Comparison]
    #: the gate's own pass/fail; None in a file that does not state it
    passed: bool | None = None
    #: calibration drift (now / baseline) that the gate divided out of the current timings
    drift: float | None = None
    #: {"torch": [baseline, now], ...} for the versions that changed
    version_differences: dict = field(default_factory=dict)
    baseline_path: str | None = None

    @property
    def failed(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.fails]

    @property
    def gate_passed(self) -> bool:
        return self.passed if self.passed is not None else not self.failed

    def counts(self) -> dict[str, int]:
        """Benchmarks per verdict, in :data:`VERDICT_ORDER`, unknown verdicts last."""
        counts = {v: 0 for v in VERDICT_ORDER}
        for c in self.comparisons:
            counts[c.verdict] = counts.get(c.verdict, 0) + 1
        return {v: n for v, n in counts.items() if n}


def _read_json(path: str | Path, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise SystemExit(f"{what} {path}: no such file") from None
    except json.JSONDecodeError as err:
        raise SystemExit(f"{what} {path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise SystemExit(f"{what} {path}: expected a JSON object, got {type(data).__name__}")
    return data


def _optional_float(value) -> float | None:
    return None if value is None else float(value)


def _optional_int(value) -> int | None:
    return None if value is None else int(value)


def load_benchmarks(path: str | Path) -> tuple[RunInfo, list[Measurement]]:
    """Read a pytest-benchmark JSON run (``--benchmark-json`` or a stored baseline).

    Benchmarks without the perf suite's extra_info (backend, pass, shape) are not attention
    cases and are left out.
    """
    data = _read_json(path, "benchmark JSON")
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
                shape=dict(extra["shape"]),
                median_ms=float(bench["stats"]["median"]) * 1e3,
                tflops=_optional_float(extra.get("tflops")),
                peak_bytes=_optional_int(extra.get("peak_bytes")),
                min_bytes=_optional_int(extra.get("min_bytes")),
            )
        )
    return run, measurements


def load_verdict(path: str | Path) -> Verdict:
    """Read the gate's verdict JSON (written by the perf suite's ``--attnkit-verdict-json``)."""
    data = _read_json(path, "verdict JSON")

    def run_info(side: str) -> RunInfo:
        info = data.get(side) or {}
        return RunInfo(info.get("machine_info", {}), info.get("commit_info", {}), info.get("datetime"))

    comparisons = [
        Comparison(
            name=row["name"],
            group=row.get("group", ""),
            backend=row["backend"],
            pass_name=row["pass"],
            shape=dict(row.get("shape", {})),
            verdict=row["verdict"],
            evidence=row.get("evidence") or "",
            baseline_median_ms=_optional_float(row.get("baseline_median_ms")),
            now_median_ms=_optional_float(row.get("now_median_ms")),
            ratio=_optional_float(row.get("ratio")),
            baseline_peak_bytes=_optional_int(row.get("baseline_peak_bytes")),
            now_peak_bytes=_optional_int(row.get("now_peak_bytes")),
            tflops=_optional_float(row.get("tflops")),
        )
        for row in data.get("benchmarks", [])
    ]
    return Verdict(
        run_info("baseline"),
        run_info("now"),
        comparisons,
        passed=data.get("passed"),
        drift=_optional_float(data.get("drift")),
        version_differences=dict(data.get("version_differences") or {}),
        baseline_path=(data.get("baseline") or {}).get("path"),
    )
