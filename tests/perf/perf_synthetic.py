"""Synthetic pytest-benchmark runs for testing the gate without a GPU.

Noise model, from ANCHORS.md and our H100 measurements (docs/PERF_GATE.md): each repetition
has a multiplicative jitter with a CV of 2-5%, 1% of repetitions are outliers 1.2-3x slower
(a preempted launch, a clock dip), and each measurement as a whole is shifted by a
"session" factor (clock and power state while it ran) with a standard deviation of
``session_sd``.
"""

from __future__ import annotations

import numpy as np


def noisy_samples(
    rng: np.random.Generator,
    median_s: float,
    rounds: int = 60,
    cv: float = 0.03,
    outlier_rate: float = 0.01,
    session_sd: float = 0.0,
    scale: float = 1.0,
) -> list[float]:
    session = float(np.exp(rng.normal(0.0, session_sd))) if session_sd else 1.0
    samples = median_s * scale * session * (1.0 + cv * rng.standard_normal(rounds))
    outliers = rng.random(rounds) < outlier_rate
    samples[outliers] *= rng.uniform(1.2, 3.0, outliers.sum())
    return [float(s) for s in np.maximum(samples, median_s * 0.01)]


def bench_entry(
    fullname: str,
    samples: list[float],
    peak_bytes: int | None = 10 * 2**20,
    calibration: dict | None = None,
    confirm: dict | None = None,
    backend: str = "sdpa-flash",
) -> dict:
    """One benchmark as pytest-benchmark's JSON has it, with the perf suite's extra_info."""
    extra = {
        "name": fullname.split("::")[-1],
        "backend": backend,
        "pass": "fwd",
        "shape": {"batch": 1, "q_heads": 1, "kv_heads": 1, "seq_len": 128, "head_dim": 64},
        "peak_bytes": peak_bytes,
        "calibration": calibration or {},
    }
    if confirm is not None:
        extra["confirm"] = confirm
    return {
        "fullname": fullname,
        "name": fullname.split("::")[-1],
        "group": "synthetic",
        "extra_info": extra,
        "stats": {"data": samples, "median": float(np.median(samples))},
    }


def run_json(benchmarks: list[dict], gpu_key: str = "NVIDIA_H100_80GB_HBM3") -> dict:
    return {
        "machine_info": {"attnkit": {"gpu_key": gpu_key, "torch": "2.11.0", "triton": "3.6.0"}},
        "commit_info": {},
        "benchmarks": benchmarks,
        "datetime": "2026-11-22T00:00:00",
        "version": "5.3.0",
    }
