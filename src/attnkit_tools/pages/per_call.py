"""Per-call cost of attnkit's paths against raw ``F.scaled_dot_product_attention``.

    python -m attnkit_tools.pages.per_call --out per_call.json --md docs/<gpu>/PER_CALL.md      # on a GPU
    python -m attnkit_tools.pages.per_call --from-json per_call.json --md docs/<gpu>/PER_CALL.md  # anywhere

For each path and size, forward and forward+backward, three figures per call:

* ``host_us``: host time of the call alone (calls issued back to back, no synchronisation
  inside the loop): what attnkit's Python layer and the launches cost;
* ``wall_us``: the same loop including the final synchronisation, per call: what a host-bound
  program sees (max of host and GPU time, roughly);
* ``gpu_us``: the summed device time of the kernels one call launches (torch.profiler).

Sizes (:data:`SIZES`): a tiny one (host cost alone, also on the CPU), a small problem, two
larger ones, and one decode step (B8 Hq32 Hkv8, one query against 4096 keys: the Triton path
runs it split-KV, two kernels; forward only). Causal is bottom-right; the raw rows pass
``is_causal`` only where N == M (for one query, bottom-right causal masks nothing, and
PyTorch's ``is_causal`` is top-left) and ``enable_gqa`` for Hq != Hkv.

Rows: ``triton``, each ``sdpa-*``, ``tiled`` (one size only), ``raw-sdpa`` (PyTorch picks),
``raw-<kernel>`` (the same kernel forced once, outside the loop: what forcing costs attnkit is
the difference to the ``sdpa-<kernel>`` row), and ``triton-op`` (the torch.library op called in
eager mode: the dispatcher's cost, the reason eager calls bypass it). The absolute rows are the
least of ``--repeats`` loops, measured one row after another, so a host that drifts between
rows moves them.

The targets (:mod:`attnkit_tools.pages.per_call_report`) compare each path with its raw counterpart
**paired, call by call**: the two calls alternate (A B, then B A), each timed alone on the host,
``--paired-calls`` of each, so a drifting host (clocks, neighbours) moves both sides of every
pair alike; the device is synchronised every 32 pairs, outside the timed calls, so a queue of
launches never fills and stalls the host. An A/A pair (raw SDPA against itself) shows the
method's own error.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import platform
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnkit
from attnkit_perf.bench import provenance
from attnkit_perf.decide.stats import median_interval
from attnkit_tools.pages.per_call_report import PAIRED, console_table, markdown, targets
from attnkit_tools.pages.provenance import produced_by, saved_command

SIZES = {  # name: (B, Hq, Hkv, N, M, D), causal, bf16
    # Host cost alone on any device: on the CPU even N=128 takes the kernels hundreds of
    # microseconds, which buries attnkit's own few (``--device cpu --sizes B1-H1-N8-D16``).
    "B1-H1-N8-D16": (1, 1, 1, 8, 8, 16),
    "B1-H8-N128-D64": (1, 8, 8, 128, 128, 64),
    "B4-H16-N1024-D128": (4, 16, 16, 1024, 1024, 128),
    "B16-H16-N1024-D128": (16, 16, 16, 1024, 1024, 128),
    "B8-Hq32-Hkv8-N1-M4096-D128": (8, 32, 8, 1, 4096, 128),
}
#: Sizes measured forward only (decode steps run without autograd).
FORWARD_ONLY = {"B8-Hq32-Hkv8-N1-M4096-D128"}
#: The one size that also times the tiled path (slow: a Python loop over tiles).
TILED_SIZE = "B1-H8-N128-D64"
RAW_KERNELS = {
    "raw-flash": SDPBackend.FLASH_ATTENTION,
    "raw-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "raw-cudnn": SDPBackend.CUDNN_ATTENTION,
    "raw-math": SDPBackend.MATH,
}


def paths(size_name: str, device: torch.device) -> dict:
    """name -> (function(q, k, v) -> out, context manager factory or None)."""
    _, hq, hkv, n, m, _ = SIZES[size_name]
    raw = functools.partial(F.scaled_dot_product_attention, is_causal=n == m, enable_gqa=hq != hkv)
    found = {}
    for name in ["triton", "sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"]:
        if name in attnkit.available_backends(device):
            found[name] = (lambda q, k, v, b=name: attnkit.attention(q, k, v, causal=True, backend=b), None)
    if size_name == TILED_SIZE:
        found["tiled"] = (lambda q, k, v: attnkit.attention(q, k, v, causal=True, backend="tiled"), None)
    if "triton" in found:
        found["triton-op"] = (
            lambda q, k, v: torch.ops.attnkit.flash_forward(q, k, v, True, q.shape[-1] ** -0.5, "triton")[0],
            None,
        )
    found["raw-sdpa"] = (raw, None)
    for name, kernel in RAW_KERNELS.items():
        found[name] = (raw, lambda kernel=kernel: sdpa_kernel([kernel]))
    return found


def _step(fn, q, k, v, grad):
    if grad is None:
        return lambda: fn(q, k, v)
    return lambda: fn(q, k, v).backward(grad)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _host_and_wall(step, calls: int, device: torch.device) -> tuple[float, float]:
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        step()
    issued = time.perf_counter()
    _sync(device)
    done = time.perf_counter()
    return (issued - start) / calls * 1e6, (done - start) / calls * 1e6


def _gpu_us(step, calls: int) -> float:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    total = 0.0
    for event in prof.key_averages():
        total += getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)
    return total / calls


def _context(ctx):
    return ctx() if ctx else contextlib.nullcontext()


def measure(size_name: str, calls: int, repeats: int, paired_calls: int, device: torch.device):
    """(rows, paired) of one size: one row per path (the least of ``repeats`` loops of
    ``calls``), and one paired comparison (``paired_calls`` calls a side) per
    :data:`~attnkit_tools.pages.per_call_report.PAIRED` entry whose both sides ran, after the A/A
    control."""
    b, hq, hkv, n, m, d = SIZES[size_name]
    gen = torch.Generator(device=device).manual_seed(0)
    rows, paired = [], []
    for pass_name in ("fwd",) if size_name in FORWARD_ONLY else ("fwd", "fwd+bwd"):
        backward = pass_name == "fwd+bwd"
        q, k, v = (
            torch.randn(*dims, device=device, dtype=torch.bfloat16, generator=gen).requires_grad_(backward)
            for dims in ((b, hq, n, d), (b, hkv, m, d), (b, hkv, m, d))
        )
        grad = (
            torch.randn(b, hq, n, d, device=device, dtype=torch.bfloat16, generator=gen) if backward else None
        )
        steps = {}
        for name, (fn, ctx) in paths(size_name, device).items():
            if backward and name == "triton-op":
                continue
            row = {"size": size_name, "pass": pass_name, "path": name}
            try:
                with _context(ctx):
                    step = _step(fn, q, k, v, grad)
                    for _ in range(10):  # compile, autotune caches, allocator pools
                        step()
                    samples = [_host_and_wall(step, calls, device) for _ in range(repeats)]
                    row["host_us"] = min(s[0] for s in samples)
                    row["wall_us"] = min(s[1] for s in samples)
                    row["gpu_us"] = (
                        _gpu_us(step, max(5, calls // 10)) if device.type == "cuda" else float("nan")
                    )
                steps[name] = (step, ctx)
            except (RuntimeError, NotImplementedError, ValueError) as err:
                row["error"] = str(err).splitlines()[0][:160]
                _sync(device)
            rows.append(row)
        pairs = [("raw-sdpa", "raw-sdpa"), *PAIRED.items()]
        for path, raw in pairs:
            if path in steps and raw in steps:
                paired.append(_pair(size_name, pass_name, path, raw, steps, paired_calls, device))
    return rows, paired


def _pair(size_name, pass_name, path, raw, steps, calls: int, device: torch.device) -> dict:
    """One paired comparison; both steps run inside the raw side's context (forcing its kernel;
    attnkit's forced paths set their own flags or call their kernel's op whatever the flags
    are, and ``sdpa`` and ``triton`` pair with ``raw-sdpa``, which has none)."""
    (path_step, _), (raw_step, ctx) = steps[path], steps[raw]
    with _context(ctx):
        a, b = interleaved(path_step, raw_step, calls, device)
    result = {"size": size_name, "pass": pass_name, "path": path, "raw": raw, "calls": calls}
    result["path_us"] = summary(a)
    result["raw_us"] = summary(b)
    result["extra_us"] = summary(a - b)
    result["ratio"] = summary(a / b)
    return result


def interleaved(a, b, calls: int, device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """Host us of each of ``calls`` calls of ``a`` and of ``b``, alternating one by one: A B,
    then B A. Synchronised every 32 pairs, outside the timed calls; the order after each
    synchronisation alternates too."""
    clock = time.perf_counter_ns
    times = np.empty((2, calls))
    for _ in range(20):
        a(), b()
    _sync(device)
    steps = (a, b)
    for i in range(calls):
        first, second = (0, 1) if (i + i // 32) % 2 == 0 else (1, 0)
        t0 = clock()
        steps[first]()
        t1 = clock()
        steps[second]()
        t2 = clock()
        times[first, i], times[second, i] = t1 - t0, t2 - t1
        if i % 32 == 31:
            _sync(device)
    _sync(device)
    return times[0] / 1e3, times[1] / 1e3


def summary(values: np.ndarray) -> dict:
    """The median of ``values`` with its 95% bootstrap interval."""
    low, high = median_interval(values, confidence=0.95)
    return {"median": float(np.median(values)), "low": low, "high": high}


def fast_path_status() -> tuple[bool | None, str]:
    """(whether the Triton path launches its kernels directly, skipping ``JITFunction.run``;
    the compiled call memo's status): what the host figures depend on besides the code. None
    and "no triton" where Triton is not installed; any other import error is raised, so a page
    never claims a missing fast path that merely moved."""
    if importlib.util.find_spec("triton") is None:
        return None, "no triton"
    from attnkit import fastpath
    from attnkit.triton.runtime import find_runtime

    return find_runtime() is not None, str(fastpath.status)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.pages.per_call", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", help="JSON file to write (required unless --from-json)")
    parser.add_argument("--md", help="Markdown page to write (docs/<gpu>/PER_CALL.md)")
    parser.add_argument("--from-json", help="render this saved report as --md instead of measuring")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=5, help="timed loops per row (the minimum is kept)")
    parser.add_argument(
        "--paired-calls",
        type=int,
        default=2000,
        help="calls of each side per paired target (a fifth above N=128)",
    )
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated subset of {list(SIZES)}")
    parser.add_argument(
        "--device",
        default="cuda",
        help="cuda (the measurement); on cpu only B1-H1-N8-D16 shows host cost (kernels dominate the rest)",
    )
    args = parser.parse_args(argv)
    if args.from_json and not args.md:
        parser.error("--from-json renders a saved report: give --md")
    if not args.from_json and not args.out:
        parser.error("--out is required when measuring")
    unknown = [s for s in args.sizes.split(",") if s not in SIZES]
    if unknown:
        parser.error(f"unknown --sizes {unknown}; known: {list(SIZES)}")
    return args


def run(args: argparse.Namespace) -> dict:
    """Measure every size of ``args.sizes``; the report :func:`markdown` renders."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "attnkit_tools.pages.per_call measures GPU launches and no CUDA GPU is visible here: "
            "run it on a GPU machine (or pass --device cpu for the host cost of B1-H1-N8-D16)"
        )
    rows, paired = [], []
    for size_name in args.sizes.split(","):
        small = SIZES[size_name][3] <= 128
        calls = args.calls if small else max(20, args.calls // 5)
        pairs = args.paired_calls if small else max(100, args.paired_calls // 5)
        size_rows, size_paired = measure(size_name, calls, args.repeats, pairs, device)
        rows += size_rows
        paired += size_paired
    direct, memo = fast_path_status()
    return {
        "provenance": provenance(device),
        "python": platform.python_version(),
        "direct_launches": direct,
        "fast_calls": memo,
        "rows": rows,
        "paired": paired,
        "targets": targets(paired),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            report = json.load(f)
        command = saved_command(report, "pages.per_call", ["--out", "per_call.json", "--md", args.md])
    else:
        report = run(args)
        command = produced_by("pages.per_call", sys.argv[1:] if argv is None else argv)
        report["command"] = command
        print(console_table(report["rows"]))
        print("\n".join(report["targets"]))
        print(f"Triton kernels launched directly: {report['direct_launches']}")
        print(f"compiled call memo: {report['fast_calls']}")
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(report, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
