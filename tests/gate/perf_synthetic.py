"""Synthetic measurements for testing the gate without a GPU (a helper module, not a test module).

Noise models, from published GPU benchmarking studies and H100 measurements of this grid
(docs/PERF_GATE.md):

* **stored mode** (:func:`noisy_samples`): each round has a multiplicative jitter with a CV of
  2-5%, 1% of rounds are outliers 1.2-3x slower (a preempted launch, a clock dip), and each
  measurement as a whole is shifted by a "session" factor (clock and power state while it ran)
  with a standard deviation of ``session_sd``.
* **paired mode** (:func:`paired_blocks`): a block's median carries a log-normal noise of
  ``block_sd`` (0.5-1% on the H100), and each of a side's worker processes a fixed log offset
  of ``process_sd`` (~0.3%: its allocation addresses, its code's placement; 0.5-1% seen for
  backward kernels); pair ``i`` runs on process ``i % PROCESSES_PER_SIDE`` of each side, as
  :mod:`attnkit_perf.measure.paired_session` schedules it (:func:`processes` labels the pairs so).

:data:`SYNTHETIC_SUITE` is a pytest-benchmark suite whose samples the test controls exactly (a
virtual clock), for driving the plugin end to end through pytester.
"""

from __future__ import annotations

import numpy as np

from attnkit_perf.measure.cases import BenchCase
from attnkit_perf.measure.paired_session import PROCESSES_PER_SIDE
from attnkit_perf.measure.timing import TIMING_PROTOCOL

#: The GPU key the synthetic runs claim (the spelling of attnkit.device.gpu_key).
H100_KEY = "nvidia-h100-80gb-hbm3"
#: The shape of every synthetic benchmark: the CPU smoke grid's first shape.
SHAPE = {
    "batch": 1,
    "q_heads": 2,
    "kv_heads": 2,
    "seq_len": 128,
    "head_dim": 32,
    "causal": True,
    "dtype": "fp32",
}


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


def paired_blocks(
    rng: np.random.Generator,
    pairs: int,
    ratio: float = 1.0,
    block_sd: float = 0.0075,
    process_sd: float = 0.003,
    median_s: float = 1e-3,
) -> tuple[list[float], list[float]]:
    """``(base blocks, head blocks)`` of one benchmark measured in ``pairs`` pairs, the head's
    true time ``ratio`` times the base's."""
    offsets = {side: rng.normal(0.0, process_sd, PROCESSES_PER_SIDE) for side in ("base", "head")}
    process = np.arange(pairs) % PROCESSES_PER_SIDE
    base = median_s * np.exp(offsets["base"][process] + rng.normal(0.0, block_sd, pairs))
    head = median_s * ratio * np.exp(offsets["head"][process] + rng.normal(0.0, block_sd, pairs))
    return [float(x) for x in base], [float(x) for x in head]


def processes(pairs: int) -> list[int]:
    """The worker process pairing of each of ``pairs`` pairs, as paired mode schedules them."""
    return [i % PROCESSES_PER_SIDE for i in range(pairs)]


def case_for(backend: str, pass_name: str = "fwd") -> BenchCase:
    return BenchCase(backend=backend, pass_name=pass_name, **SHAPE)


def bench_entry(
    backend: str,
    samples,
    peak_bytes: int | None = 10 * 2**20,
    calibration: dict | None = None,
    confirm: dict | None = None,
) -> dict:
    """One benchmark as pytest-benchmark's JSON has it, with the perf suite's extra_info."""
    case = case_for(backend)
    extra = {
        "name": case.name,
        "backend": backend,
        "pass": "fwd",
        "shape": dict(SHAPE),
        "peak_bytes": peak_bytes,
        "min_bytes": case.min_bytes,
        "calibration": calibration or {},
    }
    if confirm is not None:
        extra["confirm"] = confirm
    return {
        "fullname": f"tests/perf/test_attention_perf.py::test_fwd[{case.name}]",
        "name": f"test_fwd[{case.name}]",
        "group": case.group,
        "extra_info": extra,
        "stats": {"data": samples, "median": float(np.median(samples)) if len(samples) else None},
    }


def run_json(benchmarks: list[dict], gpu_key: str = H100_KEY) -> dict:
    """A pytest-benchmark run (what a baseline file holds)."""
    return {
        "machine_info": {
            "node": "synthetic",
            "attnkit": {
                "gpu_key": gpu_key,
                "device_name": "NVIDIA H100 80GB HBM3",
                "torch": "2.11.0",
                "timing": TIMING_PROTOCOL,
            },
        },
        "commit_info": {"id": "a" * 40, "branch": "main", "dirty": False},
        "benchmarks": benchmarks,
        "datetime": "2026-11-22T00:00:00",
        "version": "5.3.1",
    }


#: A pytest-benchmark suite driven by the JSON in ``$ATTNKIT_SYNTH_SPEC``: ``names`` (each the
#: backend of one benchmark), ``scale`` and ``peak`` per name, ``seed``, ``jitter``, ``interrupt``
#: (names whose benchmark ends the session as Ctrl-C or SIGINT would), ``raise`` (names whose
#: benchmark raises), ``declined`` (names skipped as this checkout's unavailable backend, as
#: tests/perf marks them). Time moves only when a synthetic kernel "runs", so the samples are
#: exactly the spec's.
SYNTHETIC_SUITE = """
import json, os
import numpy as np
import pytest

from attnkit_perf.measure.cases import BenchCase

SPEC = json.loads(os.environ["ATTNKIT_SYNTH_SPEC"])
SHAPE = SPEC["shape"]


class VirtualClock:
    now = 0.0


def virtual_clock():
    return VirtualClock.now


def _param(name):
    if name not in SPEC.get("declined", ()):
        return name
    why = f"backend {name!r} is unavailable here"
    return pytest.param(name, marks=[pytest.mark.skip(reason=why), pytest.mark.attnkit_declined(why)])


@pytest.mark.parametrize("name", [_param(n) for n in SPEC["names"]])
@pytest.mark.benchmark(timer=virtual_clock)
def test_synthetic(benchmark, attnkit_perf, name):
    # attnkit_perf (requested, not called) marks this test as one of the run's benchmarks
    case = BenchCase(backend=name, pass_name="fwd", **SHAPE)
    if name in SPEC.get("raise", ()):
        raise RuntimeError(f"{name} broke")
    if name in SPEC.get("interrupt", ()):  # a job's time limit (SIGINT) reaching this benchmark
        pytest.exit("interrupted by the job's time limit", returncode=pytest.ExitCode.INTERRUPTED)
    rng = np.random.default_rng([SPEC["seed"], sum(map(ord, name))])
    median = 1e-3 * SPEC["scale"].get(name, 1.0)
    jitter = SPEC["jitter"]
    durations = iter(median * (1 + rng.uniform(-jitter, jitter, 1000)))

    def kernel():
        VirtualClock.now += next(durations)

    benchmark.extra_info.update(
        name=case.name, backend=name, shape=SHAPE, min_bytes=case.min_bytes, tflops=1.0,
        peak_bytes=SPEC["peak"].get(name, 8 * 2**20), calibration=SPEC.get("calibration", {}),
    )
    benchmark.extra_info["pass"] = "fwd"
    benchmark.pedantic(kernel, rounds=60, iterations=1)
"""

#: pytest-benchmark's own machine and commit probes (py-cpuinfo, git) cost ~1 s per run.
FAST_PROBES = """
def pytest_benchmark_generate_machine_info(config):
    return {"node": "synthetic"}


def pytest_benchmark_generate_commit_info(config):
    return {"id": "synthetic"}
"""


def look_blocks(
    rng: np.random.Generator,
    pairs: int,
    ratio: float = 1.0,
    process_sd: float = 0.015,
    cv: float = 0.03,
    rounds: int = 3,
    outlier_rate: float = 0.02,
) -> tuple[list[float], list[float]]:
    """``(base blocks, head blocks)`` of one look: ``pairs`` pairs on a fresh set of
    :data:`PROCESSES_PER_SIDE` processes per side, the head's true time ``ratio`` times the
    base's. Each process pairing carries a log offset of sd ``process_sd`` (heavy-tailed:
    Student t with 5 degrees of freedom, rescaled), each round a jitter of ``cv`` with
    ``outlier_rate`` of rounds 1.2-3x slow; a block is the median of its ``rounds``."""
    offset = process_sd * rng.standard_t(5, PROCESSES_PER_SIDE) / np.sqrt(5 / 3)
    process = np.arange(pairs) % PROCESSES_PER_SIDE

    def blocks(scale):
        values = 1.0 + cv * rng.standard_normal((pairs, rounds))
        slow = rng.random((pairs, rounds)) < outlier_rate
        values[slow] *= rng.uniform(1.2, 3.0, slow.sum())
        return 1e-3 * scale * np.median(np.maximum(values, 0.01), axis=1)

    base = blocks(1.0)
    head = blocks(ratio) * np.exp(offset[process])
    return [float(x) for x in base], [float(x) for x in head]
