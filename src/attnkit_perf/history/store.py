"""Read the history store: every run file validated, grouped per GPU model into one series per
benchmark, ordered by commit date (then by when the run was recorded)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from attnkit_perf.formats.schema import FormatError, read_json, validate
from attnkit_perf.history.record import SCHEMA, HistoryError

#: Provenance that changes kernel speed without a commit; a step that coincides with a change
#: of one of these is shown with it.
VERSION_KEYS = ("torch", "triton", "cuda", "driver", "timing")


@dataclass(frozen=True)
class Point:
    """One benchmark in one run: the median per call and its round-to-round spread (ms)."""

    commit: str
    commit_date: str
    recorded: str
    median_ms: float
    q1_ms: float
    q3_ms: float
    peak_bytes: int | None
    tflops: float | None
    versions: tuple[tuple[str, str | None], ...]

    @property
    def short(self) -> str:
        return self.commit[:7]


@dataclass
class Series:
    """One benchmark on one GPU model, oldest commit first."""

    name: str
    backend: str
    pass_name: str
    clock: str
    points: list[Point] = field(default_factory=list)

    @property
    def medians(self) -> list[float]:
        return [p.median_ms for p in self.points]


@dataclass
class GpuHistory:
    """Every run of one GPU model, oldest commit first, and its series by benchmark name."""

    gpu_key: str
    device_name: str | None
    runs: list[dict]
    series: dict[str, Series]


def _run_files(store: Path) -> list[Path]:
    if not store.is_dir():
        raise HistoryError(f"history store {store} is not a directory")
    return sorted(p for p in store.glob("*/*.json") if p.is_file())


def load_runs(store: Path | str) -> list[dict]:
    """Every run in the store, validated; a file in the wrong GPU folder is an error."""
    runs = []
    for path in _run_files(Path(store)):
        try:
            run = read_json(path, "history run")
            validate(SCHEMA, run, f"history run {path}")
        except FormatError as err:
            raise HistoryError(str(err)) from err
        if run["machine"]["gpu_key"] != path.parent.name:
            raise HistoryError(
                f"history run {path} was recorded on {run['machine']['gpu_key']!r} but lies in the "
                f"folder of {path.parent.name!r}"
            )
        runs.append(run)
    return runs


def _point(run: dict, bench: dict) -> Point:
    machine = run["machine"]
    return Point(
        commit=run["commit"],
        commit_date=run["commit_date"],
        recorded=run["recorded"],
        median_ms=bench["median_ms"],
        q1_ms=bench["q1_ms"],
        q3_ms=bench["q3_ms"],
        peak_bytes=bench.get("peak_bytes"),
        tflops=bench.get("tflops"),
        versions=tuple((key, machine.get(key)) for key in VERSION_KEYS),
    )


def gpu_histories(runs: list[dict]) -> dict[str, GpuHistory]:
    """``{gpu_key: GpuHistory}``, keys sorted. Commit dates compare as instants (the store
    writes UTC), and a commit's runs keep the order they were recorded in."""
    histories: dict[str, GpuHistory] = {}
    ordered = sorted(runs, key=lambda r: (r["commit_date"], r["recorded"], r["commit"]))
    for run in ordered:
        key = run["machine"]["gpu_key"]
        history = histories.setdefault(key, GpuHistory(key, run["machine"].get("device_name"), [], {}))
        history.runs.append(run)
        for bench in run["benchmarks"]:
            series = history.series.setdefault(
                bench["name"], Series(bench["name"], bench["backend"], bench["pass"], bench["clock"])
            )
            series.points.append(_point(run, bench))
    return dict(sorted(histories.items()))


def load_store(store: Path | str) -> dict[str, GpuHistory]:
    histories = gpu_histories(load_runs(store))
    if not histories:
        raise HistoryError(f"history store {store} holds no runs (<gpu_key>/<run>.json)")
    return histories
