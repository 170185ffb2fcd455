"""A synthetic performance history (a helper module, not a test module).

:func:`planted_store` records ``commits`` synthetic perf-suite runs, one per commit a day apart,
through the real ``record`` path into a history store. Each run's median carries a seeded
log-normal run-to-run noise of ``run_sd`` (0.4%: the median, over the grid, of the A/A standard
deviation in the committed H100 noise file, baselines/nvidia-h100-80gb-hbm3/noise-paired.json),
its rounds a 2% jitter around that median. Planted:

* :data:`STEP`: one 4% step at commit :data:`STEP_AT`;
* :data:`DRIFT`: a slow drift, three 1.5% steps at :data:`DRIFT_AT` (4.6% in all, no single step
  above the 3% step threshold: only the drift rule can see it);
* :data:`FLAT`: unchanged benchmarks.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from attnkit_perf.history.record import record

GPU_KEY = "nvidia-h100-80gb-hbm3"
STEP = "fwd[triton-bf16-B4-H16-N4096-D128-causal]"
DRIFT = "bwd[triton-bf16-B4-H16-N4096-D128-causal]"
FLAT = ("fwd[sdpa-flash-bf16-B4-H16-N4096-D128-causal]", "fwd+bwd[tiled-bf16-B4-H16-N4096-D128-causal]")
STEP_AT = 18
DRIFT_AT = (12, 16, 20)
#: Median per call (s) of each benchmark before anything was planted.
BASE_S = {STEP: 2.1e-3, DRIFT: 6.4e-3, FLAT[0]: 1.9e-3, FLAT[1]: 9.5e-3}
SHAPE = {"batch": 4, "q_heads": 16, "kv_heads": 16, "seq_len": 4096, "head_dim": 128, "causal": True}
START = datetime(2026, 9, 1, 12, 0, tzinfo=timezone.utc)


def commit_sha(index: int) -> str:
    """A made-up 40-digit commit id per index (the store never asks git when told the date)."""
    return f"{index:04x}".ljust(40, "a")


def planted_factor(name: str, index: int) -> float:
    if name == STEP:
        return 1.04 if index >= STEP_AT else 1.0
    if name == DRIFT:
        return 1.015 ** sum(index >= at for at in DRIFT_AT)
    return 1.0


def synthetic_run(index: int, rng: np.random.Generator, run_sd: float = 0.004, rounds: int = 20) -> dict:
    """A pytest-benchmark JSON of the perf suite at commit ``index`` (seconds per call)."""
    benchmarks = []
    for name, base in BASE_S.items():
        median = base * planted_factor(name, index) * float(np.exp(rng.normal(0.0, run_sd)))
        jitter = 0.02 * rng.standard_normal(rounds)
        # Centred, so the rounds' median is the run's median: the run-to-run noise is run_sd.
        data = (median * (1.0 + jitter - np.median(jitter))).tolist()
        pass_name, rest = name.split("[")
        benchmarks.append(
            {
                "fullname": f"tests/perf/test_attention_perf.py::test_{pass_name}[{rest}",
                "group": f"{pass_name} bf16-B4-H16-N4096-D128-causal",
                "stats": {"data": data},
                "extra_info": {
                    "name": name,
                    "backend": rest.split("-bf16")[0],
                    "pass": pass_name,
                    "shape": {**SHAPE, "dtype": "bf16"},
                    "timer": "cuda-events+l2-flush",
                    "peak_bytes": 64 * 2**20,
                    "tflops": 1.0e-3 / median,
                    "host_share": 0.0,
                    "host_bound": False,
                    "calibration": {"matmul_ms": 0.175, "copy_ms": 0.176, "host_ms": 3.6},
                },
            }
        )
    return {
        "machine_info": {
            "attnkit": {
                "gpu_key": GPU_KEY,
                "device_name": "NVIDIA H100 80GB HBM3",
                "torch": "2.11.0+cu130" if index < 25 else "2.12.0+cu130",
                "triton": "3.6.0",
                "cuda": "13.0",
                "driver": "580.159.04",
                "commit": commit_sha(index),
                "timing": "flush-by-read",
            }
        },
        "commit_info": {"id": commit_sha(index), "dirty": False, "branch": "main"},
        "datetime": (START + timedelta(days=index, hours=3)).isoformat(),
        "benchmarks": benchmarks,
    }


def planted_store(store: Path, commits: int = 36, seed: int = 20261127) -> list[str]:
    """Record ``commits`` synthetic runs into ``store``; return their commit ids, oldest first."""
    rng = np.random.default_rng(seed)
    scratch = store.parent / f"{store.name}-results"
    scratch.mkdir(parents=True, exist_ok=True)
    shas = []
    for index in range(commits):
        results = scratch / f"run-{index}.json"
        results.write_text(json.dumps(synthetic_run(index, rng)), encoding="utf8")
        date = (START + timedelta(days=index)).isoformat()
        record(results, store, repo=scratch, commit=commit_sha(index), commit_date=date)
        shas.append(commit_sha(index))
    return shas
