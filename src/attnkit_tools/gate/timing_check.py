"""Checks of the timing protocol, run on a GPU: ``python -m attnkit_tools.gate.timing_check OUT.json``.

1. Agreement: for each case, the median of the suite's protocol (:mod:`attnkit_perf.bench`)
   against ``triton.testing.do_bench``'s median, measured alternately (A B A B) so slow drift
   cancels. The suite's medians should agree within ~5% for kernels over 50 us.
2. Noise: a few kernels measured back to back many times, each time preceded by the
   calibration kernels, to see how much a median moves between measurements and how much of
   that the calibration explains (CV raw vs CV divided by the calibration drift).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from attnkit_perf.bench import (
    BenchCase,
    L2Flusher,
    build_runner,
    measure_calibration,
    measure_samples,
    warm_up_and_plan,
)
from attnkit_tools.pages.provenance import require_cuda

AGREEMENT_CASES = [
    BenchCase("sdpa-flash", "fwd", 4, 16, 16, 4096, 128, True),
    BenchCase("sdpa-cudnn", "fwd", 4, 16, 16, 4096, 128, True),
    BenchCase("sdpa-efficient", "fwd", 4, 16, 16, 4096, 128, True),
    BenchCase("sdpa-flash", "fwd", 16, 16, 16, 1024, 128, True),
    BenchCase("sdpa-flash", "fwd", 8, 32, 32, 2048, 64, False),
    BenchCase("sdpa-flash", "bwd", 4, 16, 16, 4096, 128, True),
    BenchCase("sdpa-cudnn", "bwd", 1, 16, 16, 16384, 128, True),
    BenchCase("sdpa-flash", "fwd", 1, 4, 4, 1024, 64, True),
]
NOISE_CASES = [AGREEMENT_CASES[0], AGREEMENT_CASES[1], AGREEMENT_CASES[5]]


def _cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.mean(values)


def agreement(device, flusher) -> list[dict]:
    from triton.testing import do_bench

    rows = []
    for case in AGREEMENT_CASES:
        runner = build_runner(case, device)
        warm_up_and_plan(runner, device, flusher, budget_s=0.0, min_rounds=1, max_rounds=1)
        ours, theirs = [], []
        for _ in range(2):
            plan = warm_up_and_plan(runner, device, flusher, budget_s=0.15, min_rounds=20, max_rounds=100)
            samples = measure_samples(runner, device, plan.rounds, flusher, plan.reps)
            ours.append(statistics.median(samples) * 1e3)
            theirs.append(do_bench(runner, warmup=25, rep=100, return_mode="median"))
        row = {"case": case.name, "ours_ms": ours, "do_bench_ms": theirs}
        row["ratio"] = statistics.median(ours) / statistics.median(theirs)
        rows.append(row)
        print(f"{case.name:60s} ours {row['ours_ms']} do_bench {row['do_bench_ms']} ratio {row['ratio']:.3f}")
    return rows


def noise(device, flusher, repeats: int = 8) -> list[dict]:
    rows = []
    for case in NOISE_CASES:
        runner = build_runner(case, device)
        warm_up_and_plan(runner, device, flusher, budget_s=0.0, min_rounds=1, max_rounds=1)
        medians, calibrations = [], []
        for _ in range(repeats):
            calibrations.append(measure_calibration(device, flusher=flusher))
            plan = warm_up_and_plan(runner, device, flusher, budget_s=0.15, min_rounds=20, max_rounds=100)
            samples = measure_samples(runner, device, plan.rounds, flusher, plan.reps)
            medians.append(statistics.median(samples) * 1e3)
        matmul = [c["matmul_ms"] for c in calibrations]
        copy = [c["copy_ms"] for c in calibrations]
        geo = [(m * c) ** 0.5 for m, c in zip(matmul, copy, strict=True)]
        row = {
            "case": case.name,
            "medians_ms": medians,
            "calibrations": calibrations,
            "cv_raw": _cv(medians),
            "cv_by_matmul": _cv([t / m for t, m in zip(medians, matmul, strict=True)]),
            "cv_by_copy": _cv([t / c for t, c in zip(medians, copy, strict=True)]),
            "cv_by_geomean": _cv([t / g for t, g in zip(medians, geo, strict=True)]),
            "cv_matmul": _cv(matmul),
            "cv_copy": _cv(copy),
        }
        rows.append(row)
        print({k: v for k, v in row.items() if k.startswith(("case", "cv"))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.gate.timing_check",
        description="Check the timing protocol on this GPU: agreement with do_bench, and noise.",
    )
    parser.add_argument("out", help="JSON file to write the agreement and noise measurements to")
    args = parser.parse_args(argv)
    require_cuda("attnkit_tools.gate.timing_check")
    device = torch.device("cuda")
    flusher = L2Flusher(device)
    result = {"agreement": agreement(device, flusher), "noise": noise(device, flusher)}
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
