"""Record one perf-suite run into the history store.

The input is the pytest-benchmark JSON the perf suite writes (``pytest tests/perf
--benchmark-json=run.json``, plain, stored or record mode: the same file a baseline is): it holds
every round's time, the case description in ``extra_info`` and the provenance in
``machine_info["attnkit"]``. The verdict JSON is not used: it keeps only medians, and a plain or
record run writes none.

One run becomes one file, ``<gpu_key>/<commit date>-<sha12>-<recorded>.json`` in format
``attnkit-perf-history/1`` (``formats/schemas/history-run.schema.json``): appends from two jobs
never touch the same file, so the store's branch merges without conflicts.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from attnkit_perf.formats.schema import FormatError, read_json, validate

FORMAT = "attnkit-perf-history/1"
SCHEMA = "history-run"
#: Provenance copied from ``machine_info["attnkit"]`` into ``machine``.
MACHINE_KEYS = (
    "gpu_key",
    "device_name",
    "capability",
    "driver",
    "cuda",
    "cudnn",
    "torch",
    "triton",
    "timing",
)


class HistoryError(Exception):
    """A run cannot be recorded, or the store cannot be read."""


def _git(repo: Path | str, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _utc(stamp: str) -> datetime:
    """An ISO-8601 time as an aware UTC datetime (a naive one is taken as UTC)."""
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except (TypeError, ValueError) as err:
        raise HistoryError(f"{stamp!r} is not an ISO-8601 time ({err})") from err
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def _iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_commit(
    run: dict, repo: Path | str, commit: str | None, commit_date: str | None
) -> tuple[str, str]:
    """``(full sha, commit date ISO UTC)`` of the code a run measured.

    The commit is ``commit`` if given, else the gate's provenance (``machine_info.attnkit.commit``,
    which honours ``$ATTNKIT_COMMIT`` for a copied tree), else pytest-benchmark's
    ``commit_info.id``. A ``+dirty`` commit is refused: the history is of commits, and local
    changes have none. The date is ``commit_date`` if given, else the committer date from git in
    ``repo``, else ``commit_info.time`` when that names the same commit."""
    info = run.get("commit_info") or {}
    sha = commit or ((run.get("machine_info") or {}).get("attnkit") or {}).get("commit") or info.get("id")
    if not sha:
        raise HistoryError("the run names no commit: pass --commit SHA (and --commit-date)")
    if sha.endswith("+dirty") or (sha == info.get("id") and info.get("dirty") and not commit):
        raise HistoryError(
            f"the run measured a checkout with local changes ({sha}): only committed code is recorded; "
            "pass --commit SHA to name the commit it measured if the changes did not touch the code"
        )
    full = _git(repo, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}")
    same_as_info = bool(info.get("id")) and (info["id"].startswith(sha) or sha.startswith(info["id"]))
    sha = full or (info["id"] if same_as_info and len(info["id"]) > len(sha) else sha)
    if commit_date is None:
        commit_date = _git(repo, "show", "-s", "--format=%cI", sha) if full else None
    if commit_date is None and same_as_info:
        commit_date = info.get("time")
    if commit_date is None:
        raise HistoryError(
            f"no date for commit {sha}: it is not in the git repository {repo} and the run's "
            "commit_info is of another commit; pass --commit-date"
        )
    return sha.lower(), _iso(_utc(commit_date))


def _benchmark(bench: dict) -> dict:
    info = bench.get("extra_info") or {}
    data = [float(x) * 1e3 for x in bench["stats"]["data"]]
    q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive") if len(data) > 1 else data * 3
    timer = str(info.get("timer") or bench.get("options", {}).get("timer") or "")
    return {
        "name": info.get("name") or bench["fullname"],
        "group": bench.get("group"),
        "backend": info["backend"],
        "pass": info["pass"],
        "shape": info.get("shape") or {},
        # The suite times CUDA events on a GPU and the host clock on the CPU smoke grid.
        "clock": "gpu" if timer.startswith("cuda") else "host",
        "median_ms": statistics.median(data),
        "q1_ms": q1,
        "q3_ms": q3,
        "min_ms": min(data),
        "rounds": len(data),
        "host_share": info.get("host_share"),
        "host_bound": info.get("host_bound"),
        "peak_bytes": info.get("peak_bytes"),
        "tflops": info.get("tflops"),
    }


def _calibration(run: dict) -> dict:
    """Per calibration kernel, the median over the run's benchmarks (the gate's drift yardstick)."""
    per_key: dict[str, list[float]] = {}
    for bench in run["benchmarks"]:
        for key, value in ((bench.get("extra_info") or {}).get("calibration") or {}).items():
            per_key.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in sorted(per_key.items())}


def history_entry(
    run: dict,
    repo: Path | str = ".",
    commit: str | None = None,
    commit_date: str | None = None,
    where: str = "run",
) -> dict:
    """The history record of a pytest-benchmark run (validated against the baseline schema
    first, so a file that is not a perf-suite run is rejected before anything is written)."""
    validate("baseline", run, where)
    sha, date = resolve_commit(run, repo, commit, commit_date)
    provenance = run["machine_info"]["attnkit"]
    recorded = _iso(_utc(run["datetime"])) if run.get("datetime") else _iso(datetime.now(timezone.utc))
    entry = {
        "format": FORMAT,
        "commit": sha,
        "commit_date": date,
        "recorded": recorded,
        "branch": (run.get("commit_info") or {}).get("branch"),
        "source": provenance.get("source"),
        "machine": {key: provenance.get(key) for key in MACHINE_KEYS if key in provenance},
        "calibration": _calibration(run),
        "benchmarks": [_benchmark(b) for b in run["benchmarks"]],
    }
    validate(SCHEMA, entry, f"the history record of {where}")
    return entry


def entry_path(store: Path | str, entry: dict) -> Path:
    """``<store>/<gpu_key>/<commit date>-<sha12>-<recorded>.json``: sorts by commit date, and two
    runs of one commit (or on two machines of one model) get two files."""
    compact = lambda stamp: _utc(stamp).strftime("%Y%m%dT%H%M%SZ")
    name = f"{compact(entry['commit_date'])}-{entry['commit'][:12]}-{compact(entry['recorded'])}.json"
    return Path(store) / entry["machine"]["gpu_key"] / name


def record(
    results: Path | str,
    store: Path | str,
    repo: Path | str = ".",
    commit: str | None = None,
    commit_date: str | None = None,
) -> Path:
    """Append the run in ``results`` to ``store``; return the file written. A run already in the
    store (same file name) is an error, not a silent overwrite."""
    try:
        entry = history_entry(read_json(results, "results"), repo, commit, commit_date, f"results {results}")
    except FormatError as err:
        raise HistoryError(str(err)) from err
    path = entry_path(store, entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x", encoding="utf8") as out:
            out.write(json.dumps(entry, indent=1, sort_keys=True, allow_nan=False) + "\n")
    except FileExistsError as err:
        raise HistoryError(f"{path} already exists: this run is already recorded") from err
    return path
