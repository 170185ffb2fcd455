"""Baselines pooled from several recordings, and the spread between them (``noise-stored.json``).

    python -m attnkit_perf.commands.pool A.json B.json [...] --out baselines/<gpu_key>/baseline.json

A *recording* is the pytest-benchmark JSON of one perf-suite run on one machine (``pytest
tests/perf --attnkit-record --benchmark-json=A.json``), best one per machine of the GPU model,
at least one fresh process each. One recording cannot tell its machine's offset from the code's
speed: compared against it, another machine reads its own offset as a change (an unchanged graph
replay read x1.15 on two fresh H200s against a one-machine baseline, x0.998 in paired mode).
Pooling writes two files:

* the **pooled baseline** (``--out``): a baseline like any other (``schemas/baseline.schema.json``,
  what ``pytest-benchmark compare`` reads), each benchmark's samples those of every recording,
  each recording's first divided by its own calibration drift against the pooled calibration
  (the per-kernel median of the recordings'), with the drift kind stored mode applies
  (:func:`attnkit_perf.decide.drift.drift_kind`); ``machine_info["attnkit"]["pooled"]`` names
  the pool (``id``, ``recordings``);
* the **spread** (``noise-stored.json`` beside it, format ``attnkit-perf-stored-spread/1``,
  :mod:`attnkit_perf.formats.spread`): per benchmark, each recording's median after that
  correction as a log offset from their mean, and the standard deviation of those offsets; the
  pool's id, every recording's provenance and calibration, and the timing protocol.

Stored mode holds each benchmark to ``max(practical threshold, k x sigma)`` (the rule of A/A
noise, :func:`attnkit_perf.decide.gate.benchmark_threshold`), where ``sigma`` is an upper bound
on how far one more machine lies from the recordings' mean (:func:`sigma_bound`: the one-sided
90% chi-square upper bound on the spread's sigma, :func:`attnkit_perf.decide.noise.sd_upper_bound`,
times ``sqrt(1 + 1/n)`` because this run is one more machine compared with the mean of ``n``).
A benchmark's own spread has ``n - 1`` degrees of freedom, and few recordings buy an absurd bound
(x9.7 the sd from 2: thresholds of x5 on benchmarks that moved 5% between two machines). So the
spread is **pooled over the benchmarks of one timing kind** (:func:`timing_kind`: ``gpu`` or
``latency``, :mod:`attnkit_perf.decide.drift`), whose machine offsets come from the same
hardware: their variances weighted by degrees of freedom, whose sum the bound then uses (17
benchmarks of 2 recordings: 17 degrees of freedom, x1.3). A benchmark's own bound joins in only
with :data:`MIN_OWN_RECORDINGS` recordings or more, and the larger of the two is kept, so a
benchmark that machines move more than its kind still gets its own wider threshold.
Benchmarks host-bound in every recording form a kind of their own (``host``), never pooled with
the others: their time is not compared across machines (:func:`attnkit_perf.decide.host.
stored_exempt`), and where this run measures one GPU-bound its time kind's pool holds it. A
spread file of another pool (the baseline re-recorded since) is set aside with a loud note, like
a missing one.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path

from attnkit_perf.decide.drift import drift_for, drift_kind, latency_bound, run_calibration
from attnkit_perf.decide.noise import SD_CONFIDENCE, sd_upper_bound
from attnkit_perf.formats.baseline import recorded_gpu_key, recorded_timing_protocol
from attnkit_perf.formats.schema import FormatError, validate
from attnkit_perf.formats.spread import FORMAT, POOL_COMMAND, pool_of

#: Software that must match between pooled recordings (the driver may differ between machines:
#: that is part of what the spread measures).
SAME_SOFTWARE = ("torch", "cuda", "triton", "cudnn")


#: Recordings a benchmark needs before its own spread bounds its threshold (beside its kind's).
MIN_OWN_RECORDINGS = 5


def sigma_bound(log_sd: float, recordings: int, dof: int | None = None) -> float:
    """The log-ratio sigma stored mode allows a benchmark of ``recordings`` recordings whose
    spread ``log_sd`` has ``dof`` degrees of freedom (its own: ``recordings - 1``; pooled over
    its kind: more) (module docstring)."""
    dof = recordings - 1 if dof is None else dof
    return sd_upper_bound(log_sd, dof + 1) * math.sqrt(1.0 + 1.0 / recordings)


def timing_kind(entry: dict, launch_ms: float | None) -> str:
    """The kind whose pooled spread bounds a benchmark's time: ``latency`` when its median
    (of the recordings') is set by fixed latencies, else ``gpu``; a benchmark host-bound in the
    recordings is held by the pool of the kind its GPU time has."""
    non_host = {k for k in entry["kinds"] if k != "host"}
    if len(non_host) == 1:
        return non_host.pop()
    return "latency" if latency_bound(statistics.median(entry["medians_ms"]) / 1e3, launch_ms) else "gpu"


#: A benchmark whose spread is more than this many times its kind's median spread is left out of
#: the kind's pool: one unstable recording (a clock change, a warm-up caught) must not loosen
#: every other benchmark's threshold. It is still held to the pool's bound (its own, from two or
#: three recordings, would leave it unguarded); the verdict's note names it, and a stored
#: "slower" is adjudicated by paired mode before it fails.
OUTLIER_SPREAD = 3.0


def _uniform(benchmarks: dict):
    """(kind, entry) of the entries whose recordings all agree on their drift kind, n >= 2."""
    for name, entry in benchmarks.items():
        kinds = set(entry["kinds"])
        if len(kinds) == 1 and len(entry["log_offsets"]) >= 2:
            yield name, kinds.pop(), entry


def pool_outliers(benchmarks: dict) -> set[str]:
    """The benchmarks left out of their kind's pool (:data:`OUTLIER_SPREAD`)."""
    by_kind: dict[str, list[tuple[str, float]]] = {}
    for name, kind, entry in _uniform(benchmarks):
        by_kind.setdefault(kind, []).append((name, entry["log_sd"]))
    out = set()
    for members in by_kind.values():
        typical = statistics.median(sd for _, sd in members)
        out |= {name for name, sd in members if sd > OUTLIER_SPREAD * typical}
    return out


def kind_pools(benchmarks: dict) -> dict[str, tuple[float, int, int]]:
    """``{kind: (pooled log sd, degrees of freedom, benchmarks)}`` over the spread file's entries
    whose recordings all agree on their drift kind, outliers left out (:func:`pool_outliers`):
    each benchmark's variance weighted by its ``n - 1`` degrees of freedom (the pooled variance
    of a one-way layout)."""
    outliers = pool_outliers(benchmarks)
    sums: dict[str, list[float]] = {}
    for name, kind, entry in _uniform(benchmarks):
        if name in outliers:
            continue
        n = len(entry["log_offsets"])
        acc = sums.setdefault(kind, [0.0, 0, 0])
        acc[0] += (n - 1) * entry["log_sd"] ** 2
        acc[1] += n - 1
        acc[2] += 1
    return {kind: (math.sqrt(ss / dof), dof, count) for kind, (ss, dof, count) in sums.items()}


def spread_sigmas(document: dict) -> dict[str, float]:
    """Each benchmark's allowed sigma from a spread document: its timing kind's pooled bound and,
    with :data:`MIN_OWN_RECORDINGS` recordings or more, its own, the larger of the two (module
    docstring). A kind with no pool falls back to the benchmark's own bound."""
    pools = kind_pools(document["benchmarks"])
    launch_ms = (document.get("calibration") or {}).get("launch_ms")
    sigmas = {}
    for name, entry in document["benchmarks"].items():
        n = len(entry["log_offsets"])
        own = sigma_bound(entry["log_sd"], n)
        pool = pools.get(timing_kind(entry, launch_ms))
        if pool is None:
            sigmas[name] = own
            continue
        bound = sigma_bound(pool[0], n, dof=pool[1])
        sigmas[name] = max(bound, own) if n >= MIN_OWN_RECORDINGS else bound
    return sigmas


def pool_note(document: dict) -> str:
    """What the pools are, for the verdict's notes."""
    pools = kind_pools(document["benchmarks"])
    parts = [
        f"{kind}: sd {sd:.4f} over {count} benchmarks, {dof} degrees of freedom"
        + (" (time not compared across machines)" if kind == "host" else "")
        for kind, (sd, dof, count) in sorted(pools.items())
    ]
    if not parts:
        return "no kind has a pooled spread"
    outliers = sorted(pool_outliers(document["benchmarks"]))
    left_out = (
        f"; left out of their pools, recordings {OUTLIER_SPREAD:g}x more apart than their kind's "
        f"median (re-record them): {', '.join(outliers)}"
        if outliers
        else ""
    )
    return "spread pooled by kind: " + "; ".join(parts) + left_out


def _provenance(run: dict) -> dict:
    return (run.get("machine_info") or {}).get("attnkit") or {}


def check_recordings(runs: list[dict], labels: list[str]) -> None:
    """Raise :class:`FormatError` unless ``runs`` are >= 2 valid recordings of one GPU model,
    timing protocol, code and software, none of them already a pool."""
    if len(runs) < 2:
        raise FormatError(f"pooling needs >= 2 recordings, got {len(runs)}")
    for run, label in zip(runs, labels, strict=True):
        validate("baseline", run, f"recording {label}")
        if _provenance(run).get("pooled"):
            raise FormatError(
                f"recording {label} is already a pooled baseline: pool the recordings themselves"
            )
    fields = {
        "GPU model": [recorded_gpu_key(r) for r in runs],
        "timing protocol": [recorded_timing_protocol(r) for r in runs],
        # The code measured: a change's effect taken for spread would raise thresholds by it.
        "source digest": [_provenance(r).get("source") for r in runs],
        **{key: [_provenance(r).get(key) for r in runs] for key in SAME_SOFTWARE},
    }
    for what, values in fields.items():
        if len(set(values)) > 1:
            listed = ", ".join(f"{label}: {value}" for label, value in zip(labels, values, strict=True))
            raise FormatError(f"recordings differ in {what} ({listed}): pool recordings of one setup only")


def _median(values) -> float | None:
    values = [float(v) for v in values or ()]
    median = statistics.median(values) if values else math.nan
    return median if math.isfinite(median) and median > 0 else None


def _stats(samples: list[float]) -> dict:
    """pytest-benchmark's statistics of the pooled samples (what ``compare`` shows)."""
    from pytest_benchmark.stats import Stats

    stats = Stats()
    for sample in samples:
        stats.update(sample)
    return {**stats.as_dict(), "iterations": 1, "data": samples}


def merge(runs: list[dict], labels: list[str]) -> tuple[dict, dict]:
    """``(pooled baseline, spread document)`` of the recordings ``runs`` (module docstring)."""
    check_recordings(runs, labels)
    calibrations = [run_calibration(r) for r in runs]
    keys = sorted(set().union(*calibrations))
    pooled_cal = {k: statistics.median([c[k] for c in calibrations if k in c]) for k in keys}
    entries: dict[str, list[tuple[int, dict]]] = {}
    for i, run in enumerate(runs):
        for bench in run["benchmarks"]:
            entries.setdefault(bench["fullname"], []).append((i, bench))
    benchmarks, spread = [], {}
    for fullname, found in entries.items():
        samples, medians, kinds = [], [], []
        for i, bench in found:
            info = bench["extra_info"]
            data = [float(s) for s in bench["stats"]["data"]]
            median = _median(data)
            kind = drift_kind(bool(info.get("host_bound")), median, pooled_cal, calibrations[i])
            # The drift of the recording's machine against the pool's calibration, divided out as
            # stored mode divides this run's: every recording then speaks for the pooled machine.
            drift = drift_for(pooled_cal, calibrations[i], kind)
            samples += [s / drift for s in data]
            kinds.append(kind)
            if median is not None:
                medians.append(median / drift)
        first = found[0][1]
        infos = [bench["extra_info"] for _, bench in found]
        peaks = [x.get("peak_bytes") for x in infos if x.get("peak_bytes") is not None]
        kept = [x.get("kept_bytes") for x in infos if x.get("kept_bytes") is not None]
        shares = [x.get("host_share") for x in infos if x.get("host_share") is not None]
        info = {k: v for k, v in first["extra_info"].items() if k != "confirm"}
        info.update(
            calibration=pooled_cal,
            recordings=len(found),
            # The exemption of a host-bound "slower" needs the baseline host-bound: in every recording.
            host_bound=all(x.get("host_bound") for x in infos)
            if all("host_bound" in x for x in infos)
            else None,
            host_share=statistics.median(shares) if shares else None,
            # A peak one recording reached is the code's own: a run reaching it has not grown.
            peak_bytes=max(peaks) if peaks else None,
            # Likewise the memory a call keeps (every recording's reading is validated >= 0).
            kept_bytes=max(kept) if kept else None,
        )
        benchmarks.append({**first, "extra_info": info, "stats": _stats(samples)})
        if len(medians) >= 2:
            logs = [math.log(m) for m in medians]
            centre = statistics.fmean(logs)
            spread[info.get("name") or fullname] = {
                "log_sd": statistics.stdev(logs),
                "log_offsets": [x - centre for x in logs],
                "medians_ms": [m * 1e3 for m in medians],
                "kinds": kinds,
            }
    pool_id = _pool_id(benchmarks)
    provenance = {**_provenance(runs[0]), "pooled": {"id": pool_id, "recordings": len(runs)}}
    baseline = {
        **runs[0],
        "machine_info": {**runs[0]["machine_info"], "attnkit": provenance},
        "datetime": max(str(r.get("datetime") or "") for r in runs) or runs[0].get("datetime"),
        "benchmarks": benchmarks,
    }
    document = {
        "format": FORMAT,
        "gpu_key": recorded_gpu_key(runs[0]),
        "timing": recorded_timing_protocol(runs[0]),
        "pool": pool_id,
        "confidence": SD_CONFIDENCE,
        "provenance": provenance,
        "calibration": pooled_cal,
        "recordings": [
            {
                "label": label,
                "datetime": run.get("datetime"),
                "provenance": _provenance(run),
                "calibration": cal,
            }
            for run, label, cal in zip(runs, labels, calibrations, strict=True)
        ],
        "benchmarks": spread,
    }
    validate("baseline", baseline, "the pooled baseline")
    validate("noise-stored", document, "the spread being written")
    return baseline, document


def _pool_id(benchmarks: list[dict]) -> str:
    """A digest of the pooled samples: the spread file names the baseline it belongs to."""
    digest = hashlib.sha256()
    for bench in sorted(benchmarks, key=lambda b: b["fullname"]):
        digest.update(json.dumps([bench["fullname"], bench["stats"]["data"]]).encode())
    return digest.hexdigest()[:16]


def spread_bounds(
    document: dict, path: Path | str, baseline: dict | None
) -> tuple[dict[str, float], list[str]]:
    """``({benchmark: sigma bound}, notes)`` from a spread document
    (:func:`attnkit_perf.formats.spread.read_spread`) at ``path``; set aside with a WARNING note
    when it belongs to another pool than ``baseline``."""
    pool = pool_of(baseline or {})
    if pool != document["pool"]:
        return {}, [
            f"WARNING: stored spread {path} belongs to pool {document['pool']}, the baseline is "
            f"{'pool ' + pool if pool else 'a single recording'}: not used, every benchmark held to "
            f"the practical threshold (pool the recordings again: {POOL_COMMAND})"
        ]
    sigmas = spread_sigmas(document)
    notes = [
        f"stored spread from {path}: {len(document['recordings'])} recordings pooled, "
        f"{len(sigmas)} benchmarks with a spread; {pool_note(document)}"
    ]
    names = {
        (b.get("extra_info") or {}).get("name") or b["fullname"]
        for b in (baseline or {}).get("benchmarks", [])
    }
    lacking = sorted(names - set(sigmas))
    if lacking:
        notes.append(
            f"WARNING: stored spread {path} has no spread for {len(lacking)} benchmarks of the "
            "baseline (recorded once: held to the practical threshold): " + ", ".join(lacking)
        )
    return sigmas, notes
