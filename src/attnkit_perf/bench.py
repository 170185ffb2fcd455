"""The bench layer's public door: what the gate times and how, for every program that times
attention the way the gate does (the installed perf tests, the tuners, the page generators, the
gate's own checks in :mod:`attnkit_tools`).

* cases: :class:`BenchCase` (a backend, a pass, a call mode and a shape, as plain data), the
  grids (:func:`gpu_suite_cases`, :func:`cpu_suite_cases`), :data:`DTYPES`, :data:`AUTO_BACKEND`;
* runners: :func:`build_runner` (a case as a zero-argument callable on fresh random inputs),
  :func:`make_inputs`, :func:`captured` (a call replayed from a CUDA graph);
* timing: :func:`median_time_s` (the one timing protocol: warm-up, L2 flushed, CUDA events,
  median), its parts (:class:`L2Flusher`, :func:`warm_up_and_plan`, :func:`measure_samples`,
  :func:`measure_calibration`), :func:`gpu_time_clock` (the protocol as pytest-benchmark's
  timer) and :func:`peak_extra_bytes`;
* the machine: :func:`provenance` (GPU, driver, CUDA, torch, triton, commit),
  :func:`source_digest` (the code digest a provenance holds) and :func:`visible_gpus`.

They live in :mod:`attnkit_perf.measure`, whose other modules (paired-mode workers, the host
metric) are the gate's own: a program outside the gate imports from here, so that the measuring
stage can be reshaped without breaking the tools that time with it.
"""

from __future__ import annotations

from attnkit_perf.measure.calibration import measure_calibration
from attnkit_perf.measure.cases import (
    AUTO_BACKEND,
    DTYPES,
    BenchCase,
    build_runner,
    captured,
    cpu_suite_cases,
    gpu_suite_cases,
    make_inputs,
)
from attnkit_perf.measure.machine import provenance, source_digest
from attnkit_perf.measure.processes import visible_gpus
from attnkit_perf.measure.timing import (
    L2Flusher,
    gpu_time_clock,
    measure_samples,
    median_time_s,
    peak_extra_bytes,
    warm_up_and_plan,
)

__all__ = [
    "AUTO_BACKEND",
    "DTYPES",
    "BenchCase",
    "L2Flusher",
    "build_runner",
    "captured",
    "cpu_suite_cases",
    "gpu_suite_cases",
    "gpu_time_clock",
    "make_inputs",
    "measure_calibration",
    "measure_samples",
    "median_time_s",
    "peak_extra_bytes",
    "provenance",
    "source_digest",
    "visible_gpus",
    "warm_up_and_plan",
]
