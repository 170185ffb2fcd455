"""Time and peak memory of the tiled path against sdpa-math and naive, forward + backward.

B=1, H=16, D=128, causal, bf16, N = 1K..8K. Time: median of CUDA-event timings of one
forward+backward step; peak: the gate's ``peak_extra_bytes`` (beyond what was live before the
step). The issue's target: tiled <= 3x sdpa-math at N=4096, and tiled's peak growing ~2x per
doubling of N (O(N)).

Usage (on a GPU): ``PYTHONPATH=src python tools/tiled_scaling.py --out tiled.json``
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from attnkit import attention
from attnkit.inputs import check_inputs
from attnkit.tiled import tile_shape
from attnkit_perf.measure.timing import peak_extra_bytes

BACKENDS = ("tiled", "sdpa-math", "naive")


def _step(backend, n, heads=16, d=128):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
        for _ in range(3)
    )
    grad = torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    return (q, k, v), lambda: torch.autograd.grad(
        attention(q, k, v, causal=True, backend=backend), (q, k, v), grad
    )


def measure(backend: str, n: int, repeats: int) -> dict:
    inputs, step = _step(backend, n)
    step()  # warm-up: allocator pools, kernel selection
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    peak = peak_extra_bytes(step, torch.device("cuda"))
    row = {"backend": backend, "n": n, "ms": statistics.median(times), "peak_extra_mb": peak / 2**20}
    if backend == "tiled":
        row["tile"] = tile_shape(check_inputs(*inputs, True, None))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="1024,2048,4096,8192")
    args = parser.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        for backend in BACKENDS:
            try:
                rows.append(measure(backend, n, args.repeats))
            except torch.OutOfMemoryError as err:
                rows.append({"backend": backend, "n": n, "error": str(err).splitlines()[0]})
            torch.cuda.empty_cache()
    print(f"{'N':>6} {'backend':<10} {'ms':>9} {'peak MB':>9}  tile")
    for r in rows:
        if "error" in r:
            print(f"{r['n']:>6} {r['backend']:<10} error: {r['error']}")
        else:
            print(
                f"{r['n']:>6} {r['backend']:<10} {r['ms']:9.2f} {r['peak_extra_mb']:9.1f}  "
                f"{r.get('tile', '')}"
            )
    by = {(r["backend"], r["n"]): r for r in rows if "ms" in r}
    for n in sorted({r["n"] for r in rows}):
        if ("tiled", n) in by and ("sdpa-math", n) in by:
            ratio = by["tiled", n]["ms"] / by["sdpa-math", n]["ms"]
            verdict = ("PASS" if ratio <= 3 else "FAIL") if n == 4096 else "info"
            print(f"{verdict} N={n}: tiled / sdpa-math = {ratio:.2f}x (target <= 3x at 4096)")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
