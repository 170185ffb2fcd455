"""Measure one :class:`BenchCase` through pytest-benchmark, and re-measure it later.

``extra_info`` written for every benchmark (the verdict file and the report read these):

==================  =============================================================================
``name``            ``BenchCase.name``, e.g. ``fwd[sdpa-flash-bf16-B4-H16-N4096-D128-causal]``
``backend``         backend name
``pass``            ``fwd`` / ``bwd`` / ``fwd+bwd``
``shape``           ``{batch, q_heads, kv_heads, seq_len, head_dim, causal, dtype}``
``device``          ``cuda`` or ``cpu``
``timer``           ``cuda-events+l2-flush``, ``cuda-events`` (``loop``: no flush) or
                    ``perf_counter``
``tflops``          ``BenchCase.flops`` over the median round, in TFLOP/s
``kv_gbps``         ``BenchCase.kv_bytes`` over the median round, in GB/s (decode cases)
``peak_bytes``      bytes allocated beyond the inputs at the call's peak (None on the CPU; a
                    ``graph`` case: its peak while captured, a replay allocates nothing)
``kept_bytes``      bytes still allocated after repeated calls with their outputs dropped
                    (:func:`attnkit_perf.measure.host.kept_bytes`; None on the CPU)
``host``            the host metric, for ``loop`` cases on a GPU and every case on the CPU:
                    :func:`attnkit_perf.measure.host.host_per_call` (recorded, and compared in
                    paired mode only: hosts differ far more between machines than GPUs)
``host_count``      the host work of one call, counted where the host metric is measured:
                    :func:`attnkit_perf.measure.host.host_count` (compared in stored mode
                    within one environment: :mod:`attnkit_perf.decide.host`)
``min_bytes``       ``BenchCase.min_bytes``: what the pass must allocate at the least
``host_share``      share of the measured time in which the GPU waited for the host (GPU only;
                    :func:`attnkit_perf.measure.timing.host_share`)
``host_bound``      ``host_share >= HOST_BOUND_SHARE``: judged with the host calibration
``calibration``     ``{"matmul_ms", "copy_ms", "launch_ms", "host_ms"}`` measured just before it
``rounds``          rounds taken
``reps_per_round``  flushed repetitions per round (a sample is their mean)
``confirm``         present only for a benchmark re-measured as a suspect:
                    ``{"samples_s": [...], "calibration": {...}}``
==================  =============================================================================
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit_perf.decide.host import HOST_BOUND_SHARE
from attnkit_perf.measure.calibration import measure_calibration
from attnkit_perf.measure.cases import BenchCase, build_runner
from attnkit_perf.measure.host import build_measured, host_count, host_per_call, kept_bytes
from attnkit_perf.measure.timing import (
    L2Flusher,
    host_share,
    make_round,
    measure_samples,
    peak_extra_bytes,
    warm_up_and_plan,
)

Runner = Callable[[], object]
RunnerWrapper = Callable[[BenchCase, Runner], Runner]


@dataclass(frozen=True)
class MeasureSettings:
    """Time spent per benchmark. GPU defaults: rounds of ~5 ms (several flushed repetitions),
    ~0.15 s of them per benchmark, at least 20 rounds so the rank test has power (20 vs 20
    samples reach p < 0.001 for a clean shift), so the whole grid measures in under a minute."""

    budget_s: float = 0.15
    min_rounds: int = 20
    max_rounds: int = 100
    calibration_rounds: int = 5

    @classmethod
    def for_device(cls, device: torch.device, budget_s: float | None = None) -> MeasureSettings:
        if device.type == "cuda":
            return cls(budget_s=budget_s or cls.budget_s)
        # Host-timed CPU smoke cases: the pipeline is exercised, the numbers are not gated.
        return cls(budget_s=budget_s or 0.05, min_rounds=5, max_rounds=20, calibration_rounds=0)

    @property
    def calibration_reps(self) -> int:
        return 10


def _timer(device: torch.device, case: BenchCase) -> str:
    if device.type != "cuda":
        return "perf_counter"
    return "cuda-events+l2-flush" if case.flushed else "cuda-events"


def _identity(case: BenchCase, runner: Runner) -> Runner:
    return runner


class CaseMeasurer:
    """Holds the device, the L2 flush buffer and the settings shared by every benchmark."""

    def __init__(self, device: torch.device, settings: MeasureSettings) -> None:
        self.device = device
        self.settings = settings
        self.flusher = L2Flusher(device)
        self._keep_cache = L2Flusher(device, evict=False)

    def between_calls(self, case: BenchCase) -> L2Flusher:
        """What runs before each timed call of ``case``: an L2 flush, or nothing (``loop``)."""
        return self.flusher if case.flushed else self._keep_cache

    def calibrate(self) -> dict:
        if not self.settings.calibration_rounds:
            return {}
        return measure_calibration(
            self.device, self.settings.calibration_rounds, self.flusher, self.settings.calibration_reps
        )

    def benchmark_case(self, benchmark, case: BenchCase, wrap: RunnerWrapper = _identity) -> None:
        """Time ``case`` with pytest-benchmark's ``pedantic`` mode and fill ``extra_info``.

        Raises whatever the backend raises for an unsupported problem (the caller skips).
        """
        built = build_measured(case, self.device)
        runner = wrap(case, built.runner)
        # Read first: its calls are the runner's first (a cache they fill counts).
        kept = kept_bytes(runner, self.device, built.before_calls)
        between = self.between_calls(case)
        plan = warm_up_and_plan(
            runner,
            self.device,
            between,
            budget_s=self.settings.budget_s,
            min_rounds=self.settings.min_rounds,
            max_rounds=self.settings.max_rounds,
        )
        peak = built.graph_peak if built.graph_peak is not None else peak_extra_bytes(runner, self.device)
        share = host_share(runner, self.device, plan.estimate_s, self.flusher, between)
        calibration = self.calibrate()
        benchmark.group = case.group
        benchmark.extra_info.update(
            name=case.name,
            backend=case.backend,
            shape=_shape(case),
            device=self.device.type,
            timer=_timer(self.device, case),
            peak_bytes=peak,
            kept_bytes=kept,
            min_bytes=case.min_bytes,
            host_share=share,
            host_bound=None if share is None else share >= HOST_BOUND_SHARE,
            calibration=calibration,
            rounds=plan.rounds,
            reps_per_round=plan.reps,
        )
        if case.host_timed or self.device.type != "cuda":
            benchmark.extra_info["host"] = host_per_call(runner, self.device)
            benchmark.extra_info["host_count"] = host_count(runner)
        benchmark.extra_info["pass"] = case.pass_name
        one_round = make_round(runner, self.device, between, plan.reps)
        benchmark.pedantic(one_round, rounds=plan.rounds, warmup_rounds=1, iterations=1)
        median = statistics.median(benchmark.stats.stats.data)
        benchmark.extra_info["tflops"] = case.flops / median / 1e12 if median > 0 else None
        # Memory-bound (decode) cases are read against bandwidth: bytes of K and V per second.
        benchmark.extra_info["kv_gbps"] = case.kv_bytes / median / 1e9 if median > 0 else None

    def remeasure(self, case: BenchCase, rounds: int, reps: int, wrap: RunnerWrapper = _identity) -> dict:
        """A second, independent measurement of a suspect: fresh inputs, fresh calibration,
        the same protocol. Returned as ``extra_info["confirm"]``."""
        runner = wrap(case, build_runner(case, self.device, seed=1))
        between = self.between_calls(case)
        warm_up_and_plan(runner, self.device, between, budget_s=0.0, min_rounds=1, max_rounds=1)
        calibration = self.calibrate()
        samples = measure_samples(runner, self.device, rounds, between, reps)
        return {"samples_s": samples, "calibration": calibration}


def _shape(case: BenchCase) -> dict:
    shape = case.as_dict()
    del shape["backend"], shape["pass_name"]
    return shape
