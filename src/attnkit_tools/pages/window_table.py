"""Sliding-window (local) attention against full causal and the SDPA paths that take a mask.

Shapes: B=1, H=16, D=128, bf16, causal with window (1024, 0), N = 4K .. 64K. Per N and pass
(fwd, bwd): Triton windowed, Triton full causal (no window), and the SDPA paths that take the
window as a mask (``sdpa-efficient``, ``sdpa`` = PyTorch's choice), side by side in one process.
Every time is :func:`attnkit_perf.bench.median_time_s` (the gate's timing path: L2
flushed, warm-up, rounds) of the case's :func:`attnkit_perf.bench.build_runner`, so the
cells are the perf grid's ``-W1024`` cases at other lengths. The checks:

1. windowed Triton fwd and bwd grow linearly in N: time / N, normalised to the smallest N, ~1;
2. at the largest N, windowed Triton fwd >= 5x faster than full causal Triton, and >= 1.5x
   faster than the fastest SDPA path that takes the mask.

An SDPA cell whose mask would not fit is skipped with the reason (the mask is a (N, M) bool,
which PyTorch turns into a (N, M) additive mask in q's dtype: 12 GB at 64K, more for the
backward); an out-of-memory error or a kernel that declines is recorded the same way.

    python -m attnkit_tools.pages.window_table --out window/                        # on a GPU, ~2-3 min
    TRITON_INTERPRET=1 python -m attnkit_tools.pages.window_table --out /tmp/w --smoke   # CPU pipeline

Writes ``window_table.json`` (provenance, every cell, the checks) and ``window_table.md`` under
--out, and prints the Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import attnkit
from attnkit.errors import UnsupportedProblemError
from attnkit_perf.bench import DTYPES, BenchCase, build_runner, median_time_s, provenance
from attnkit_tools.pages.provenance import produced_by, provenance_table

WINDOW = (1024, 0)
SIZES = (4096, 8192, 16384, 32768, 65536)
HEADS, HEAD_DIM, DTYPE = 16, 128, "bf16"
#: (label, backend, windowed): the columns of the table.
VARIANTS = (
    ("triton window", "triton", True),
    ("triton causal", "triton", False),
    ("sdpa-efficient window", "sdpa-efficient", True),
    ("sdpa window", "sdpa", True),
)
PASSES = ("fwd", "bwd")
#: Of the free GPU memory, the most a mask and its additive copy may take (the rest: operands,
#: gradients, the kernels' workspaces).
_MASK_MEMORY_FRACTION = 0.5
#: The targets at the largest N: what a window must buy over full causal and over a mask.
TARGET_VS_CAUSAL, TARGET_VS_SDPA = 5.0, 1.5


def _case(backend: str, pass_name: str, n: int, windowed: bool, shape: dict) -> BenchCase:
    return BenchCase(
        backend, pass_name, 1, shape["heads"], shape["heads"], n, shape["head_dim"], True,
        shape["dtype"], None, shape["window"] if windowed else None,
    )  # fmt: skip


def _mask_skip_reason(case: BenchCase, device: torch.device) -> str | None:
    """Why an SDPA cell would not fit: its (N, M) bool mask plus the additive copy PyTorch makes
    in q's dtype, against a share of the free memory (twice that for the backward)."""
    if device.type != "cuda" or not case.backend.startswith("sdpa"):
        return None
    item = torch.finfo(DTYPES[case.dtype]).bits // 8
    need = case.seq_len * case.keys * (1 + item) * (2 if case.pass_name == "bwd" else 1)
    free, _ = torch.cuda.mem_get_info(device)
    if need > _MASK_MEMORY_FRACTION * free:
        share = f"{_MASK_MEMORY_FRACTION:.0%} of {free / 2**30:.1f} GiB free"
        return f"mask needs ~{need / 2**30:.1f} GiB, more than {share}"
    return None


def time_cell(case: BenchCase, device: torch.device, budget_s: float) -> dict:
    cell = {"backend": case.backend, "pass": case.pass_name, "N": case.seq_len, "window": case.window}
    reason = _mask_skip_reason(case, device)
    if reason is None:
        try:
            seconds = median_time_s(build_runner(case, device), device, budget_s=budget_s)
        except UnsupportedProblemError as err:
            reason = f"declined: {str(err).splitlines()[0]}"
        except torch.OutOfMemoryError as err:
            reason = f"out of memory: {str(err).splitlines()[0]}"
        else:
            cell.update(ms=seconds * 1e3, tflops=case.flops / seconds / 1e12)
    if reason is not None:
        cell["skipped"] = reason
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return cell


def checks(cells: dict, sizes: list[int]) -> dict:
    """The checks' ratios from the timed cells, keyed ``(label, pass, N)`` (None where a cell
    is missing)."""

    def ms(label, pass_name, n):
        return cells.get((label, pass_name, n), {}).get("ms")

    first, last = sizes[0], sizes[-1]
    linear = {}
    for pass_name in PASSES:
        base = ms("triton window", pass_name, first)
        linear[pass_name] = {
            n: (ms("triton window", pass_name, n) / n) / (base / first)
            if base and ms("triton window", pass_name, n)
            else None
            for n in sizes
        }
    windowed, causal = ms("triton window", "fwd", last), ms("triton causal", "fwd", last)
    masked = [label for label, backend, windowed in VARIANTS if windowed and backend != "triton"]
    sdpa = [t for t in (ms(label, "fwd", last) for label in masked) if t]
    vs_causal = causal / windowed if windowed and causal else None
    vs_sdpa = min(sdpa) / windowed if windowed and sdpa else None
    return {
        "time_per_n_vs_smallest": linear,
        "largest_n": last,
        "fwd_speedup_vs_full_causal": vs_causal,
        "fwd_speedup_vs_fastest_sdpa_mask": vs_sdpa,
        "pass_vs_full_causal": vs_causal is not None and vs_causal >= TARGET_VS_CAUSAL,
        "pass_vs_sdpa": vs_sdpa is not None and vs_sdpa >= TARGET_VS_SDPA,
    }


def markdown(report: dict) -> str:
    prov, sizes, cells = report["provenance"], report["sizes"], report["cells"]
    shape = report["shape"]
    lines = [
        f"# Sliding-window attention: window {tuple(shape['window'])}, causal, B=1 H={shape['heads']} "
        f"D={shape['head_dim']} {shape['dtype']}",
        "",
        f"Produced by `{report['command']}` (the module's docstring says how each cell is timed). "
        "Median ms (TFLOP/s of the visible pairs).",
        "",
        *provenance_table(prov),
        "",
    ]
    by_key = {(c["label"], c["pass"], c["N"]): c for c in cells}
    for pass_name in PASSES:
        lines += [f"## {pass_name}", "", "| N | " + " | ".join(label for label, _, _ in VARIANTS) + " |"]
        lines.append("|---:|" + "---:|" * len(VARIANTS))
        for n in sizes:
            row = []
            for label, _, _ in VARIANTS:
                cell = by_key.get((label, pass_name, n), {})
                row.append(f"{cell['ms']:.3f} ({cell['tflops']:.0f})" if "ms" in cell else "skipped")
            lines.append(f"| {n} | " + " | ".join(row) + " |")
        lines.append("")
    found = report["checks"]
    lines += ["## Checks", "", "Windowed Triton time / N, normalised to the smallest N (linear: ~1):", ""]
    lines.append("| N | " + " | ".join(PASSES) + " |")
    lines.append("|---:|" + "---:|" * len(PASSES))
    for n in sizes:
        values = [found["time_per_n_vs_smallest"][p].get(n) for p in PASSES]
        lines.append(f"| {n} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in values) + " |")

    def ratio(value, target, passed):
        if value is None:
            return "not measured"
        return f"{value:.2f}x (target >= {target}x: {'PASS' if passed else 'FAIL'})"

    lines += [
        "",
        f"At N={found['largest_n']}, windowed Triton fwd vs full causal Triton: "
        + ratio(found["fwd_speedup_vs_full_causal"], TARGET_VS_CAUSAL, found["pass_vs_full_causal"]),
        f"At N={found['largest_n']}, windowed Triton fwd vs the fastest SDPA path with the mask: "
        + ratio(found["fwd_speedup_vs_fastest_sdpa_mask"], TARGET_VS_SDPA, found["pass_vs_sdpa"]),
        "",
    ]
    skipped = [c for c in cells if "skipped" in c]
    if skipped:
        lines += ["Skipped cells:", ""] + [
            f"- {c['label']} {c['pass']} N={c['N']}: {c['skipped']}" for c in skipped
        ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.pages.window_table", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", required=True, help="directory for window_table.json and window_table.md")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated N")
    parser.add_argument("--budget-s", type=float, default=0.2, help="timing budget per cell (median_time_s)")
    parser.add_argument(
        "--smoke", action="store_true",
        help="tiny fp32 shapes on the current device (the CPU: run the pipeline, not the numbers)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes takes comma-separated integers, not {args.sizes!r}")
    if not args.smoke and not torch.cuda.is_available():
        parser.error(
            "the window table times kernels on a CUDA GPU and none is visible here; "
            "--smoke runs the pipeline on tiny shapes instead"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = {"heads": HEADS, "head_dim": HEAD_DIM, "dtype": DTYPE, "window": WINDOW}
    sizes = args.sizes
    if args.smoke:
        shape = {"heads": 2, "head_dim": 16, "dtype": "fp32", "window": (16, 0)}
        sizes, args.budget_s = [64, 128], 0.01
    cells, by_key = [], {}
    for n in sizes:
        for pass_name in PASSES:
            for label, backend, windowed in VARIANTS:
                if backend not in attnkit.available_backends(device):
                    cell = {
                        "backend": backend,
                        "pass": pass_name,
                        "N": n,
                        "skipped": f"{backend} unavailable",
                    }
                else:
                    cell = time_cell(_case(backend, pass_name, n, windowed, shape), device, args.budget_s)
                cell["label"] = label
                cells.append(cell)
                by_key[label, pass_name, n] = cell
    report = {
        "command": produced_by("pages.window_table", sys.argv[1:] if argv is None else argv),
        "provenance": provenance(device),
        "shape": shape,
        "sizes": sizes,
        "cells": cells,
        "checks": checks(by_key, sizes),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "window_table.json").write_text(json.dumps(report, indent=1, default=str))
    text = markdown(report)
    (out / "window_table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
