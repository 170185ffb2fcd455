"""Hardware counters of the Triton kernels and cuDNN's side by side, through Nsight Compute.

    python -m attnkit_tools.pages.profile list --cases cases.json
    ncu --clock-control none --profile-from-start off --csv --page raw \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section ComputeWorkloadAnalysis \\
        python -m attnkit_tools.pages.profile run > counters.csv
    python -m attnkit_tools.pages.profile summarize counters.csv --cases cases.json \\
        --out docs/<gpu>/PROFILE.md

Each case is a path x pass x head dim x causal x sequence length at the grid's shape (B=4,
H*D=2048, bf16). ``--seq-lens`` defaults to the long lengths where the kernels, not launches,
set the time (4096, 8192, 16384); ``list`` and ``run`` must be given the same.

* ``list`` (not under ncu) writes the machine's provenance and the cases in order, each with
  the kernels one call launches (torch.profiler).
* ``run`` (under ncu) warms each call up, then runs it once between ``cudaProfilerStart`` and
  ``cudaProfilerStop``, so ncu (``--profile-from-start off``) profiles exactly that call's
  kernels. Listing and profiling are two processes because ncu and torch.profiler both
  subscribe to CUPTI.
* ``summarize`` maps ncu's rows back to the cases by that order and writes the provenance,
  then per kernel: duration, achieved and theoretical occupancy, registers, shared memory, the
  SM's and memory's throughput, the tensor pipe's utilisation and the top stall reasons per
  issued instruction; then per cell, both paths side by side (:func:`cell_table`).

Durations are ncu's (each kernel replayed alone, caches flushed), not the grid's timing.
Nothing is timed here, and clocks stay as they are (``--clock-control none``).
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import sys
from pathlib import Path

PASSES = ("fwd", "bwd")
PATHS = ("triton", "sdpa-cudnn")
HEAD_DIMS = (64, 128)
SEQ_LENS = (4096, 8192, 16384)
BATCH, MODEL_DIM = 4, 2048


def _case_name(path: str, pass_name: str, head_dim: int, causal: bool, seq_len: int) -> str:
    return f"{pass_name}[{path}-D{head_dim}-{'causal' if causal else 'full'}-N{seq_len}]"


def _cell_of(case: str) -> tuple[str, str]:
    """(cell, path) of a case name: ``fwd[triton-D64-full-N4096]`` -> ``(fwd D64 full N4096, triton)``."""
    pass_name, inside = case.rstrip("]").split("[")
    path, head_dim, mask, seq_len = inside.rsplit("-", 3)
    return f"{pass_name} {head_dim} {mask} {seq_len}", path


def run(cases_out: str | None, seq_lens=SEQ_LENS) -> int:
    """Each case once under the profiler range; with ``cases_out``, instead list each case's
    kernels (torch.profiler) into that file."""
    import torch

    from attnkit_perf.bench import BenchCase, build_runner

    cases = []
    for pass_name, head_dim, causal, seq_len, path in itertools.product(
        PASSES, HEAD_DIMS, (False, True), seq_lens, PATHS
    ):
        heads = MODEL_DIM // head_dim
        # The grid's cases and calls: a forward with no gradient, or the backward alone.
        case = BenchCase(path, pass_name, BATCH, heads, heads, seq_len, head_dim, causal)
        call = build_runner(case, "cuda")
        for _ in range(3):  # compile, fill the host caches
            call()
        torch.cuda.synchronize()
        name = _case_name(path, pass_name, head_dim, causal, seq_len)
        if cases_out is None:
            torch.cuda.profiler.start()
            call()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            continue
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        # ncu profiles kernels only, not the runtime's memsets and copies.
        kernels = [
            e.name
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memset", "Memcpy"))
        ]
        cases.append({"case": name, "kernels": kernels})
        print(f"{name}: {len(kernels)} kernels: {kernels}", file=sys.stderr)
    if cases_out is not None:
        from attnkit_perf.bench import provenance

        with open(cases_out, "w") as f:
            json.dump({"provenance": provenance(torch.device("cuda")), "cases": cases}, f, indent=1)
    return 0


#: (column in ncu's raw page, label): what the summary shows of each kernel.
COLUMNS = [
    ("gpu__time_duration.sum", "us"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occ %"),
    ("sm__maximum_warps_per_active_cycle_pct", "theoretical occ %"),
    ("launch__registers_per_thread", "regs"),
    ("launch__shared_mem_per_block", "smem/block"),
    ("launch__grid_size", "grid"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM %"),
    ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "mem %"),
    # Hopper: cycles the tensor pipe was busy (any MMA), and warpgroup MMA issue rate.
    ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe %"),
    ("sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active", "wgmma issue %"),
]
_STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


#: Matrix products per query-key tile in each path's pass: the Triton backward recomputes the
#: scores and dP in its dQ pass (two passes, no atomics: deterministic), cuDNN's does not.
MATMULS = {("fwd", "triton"): 2, ("fwd", "sdpa-cudnn"): 2, ("bwd", "triton"): 7, ("bwd", "sdpa-cudnn"): 5}


def _kernel_rows(counters_csv: str, cases_json: str) -> list[dict]:
    """One dict per profiled kernel, in order: its case, name, the :data:`COLUMNS` values (as
    ncu printed them; ``us`` converted to microseconds) and its stall reasons ranked."""
    with open(counters_csv) as f:
        text = f.read()
    # ncu prints its own lines (==PROF== ...) and the program's stderr around the CSV.
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, units, data = rows[0], rows[1], rows[2:]
    cases = _read_cases(cases_json)["cases"]
    owners = [c["case"] for c in cases for _ in c["kernels"]]
    if len(owners) != len(data):
        raise SystemExit(
            f"{counters_csv}: {len(data)} profiled kernels, but {cases_json} lists {len(owners)}: "
            "the rows cannot be matched to the cases"
        )
    index = {name: i for i, name in enumerate(header)}
    stalls = [name for name in header if name.startswith(_STALL[0]) and name.endswith(_STALL[1])]
    kernels = []
    for owner, row in zip(owners, data, strict=True):
        kernel = {"case": owner, "kernel": row[index["Kernel Name"]] if "Kernel Name" in index else "?"}
        for column, label in COLUMNS:
            value = row[index[column]] if column in index else ""
            if column == "gpu__time_duration.sum" and column in index:
                scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "msecond": 1e3, "ms": 1e3}.get(
                    units[index[column]]
                )
                number = _number(value)
                value = f"{number * scale:.1f}" if scale and number is not None else value
            kernel[label] = value
        kernel["stalls"] = sorted(
            ((_number(row[index[s]]) or 0.0, s[len(_STALL[0]) : -len(_STALL[1])]) for s in stalls),
            reverse=True,
        )
        kernels.append(kernel)
    return kernels


def _read_cases(cases_json: str) -> dict:
    """``list``'s file: ``{"provenance": ..., "cases": [...]}`` (a bare list of cases, as
    written before provenance was, reads with provenance None)."""
    with open(cases_json) as f:
        data = json.load(f)
    return {"provenance": None, "cases": data} if isinstance(data, list) else data


def _stalls(kernel: dict, top: int) -> str:
    return ", ".join(f"{reason} {value:.2f}" for value, reason in kernel["stalls"][:top])


def cell_table(kernels: list[dict]) -> str:
    """Per cell, Triton and cuDNN side by side: summed kernel time, cuDNN's time over Triton's
    (Triton's speed as a fraction of cuDNN's), that ratio per matrix product (x :data:`MATMULS`),
    the tensor pipe's utilisation weighted by kernel time, and the longest kernel's achieved
    occupancy, registers and top stalls."""
    by_cell: dict[str, dict[str, list[dict]]] = {}
    for kernel in kernels:
        cell, path = _cell_of(kernel["case"])
        by_cell.setdefault(cell, {}).setdefault(path, []).append(kernel)
    out = [
        "| cell | triton us | cuDNN us | triton speed / cuDNN | per matmul | tensor pipe % (triton / cuDNN) "
        "| main kernel occ % (t / c) | regs (t / c) | triton's top stalls | cuDNN's top stalls |",
        "|---" * 10 + "|",
    ]
    for cell, paths in by_cell.items():
        if set(paths) != set(PATHS):
            continue
        pass_name = cell.split()[0]
        figures = {}
        for path, group in paths.items():
            times = [_number(k["us"]) or 0.0 for k in group]
            total = sum(times)
            pipe = sum(t * (_number(k["tensor pipe %"]) or 0.0) for t, k in zip(times, group, strict=True))
            main = group[times.index(max(times))]
            figures[path] = (total, pipe / total if total else 0.0, main)
        (t_us, t_pipe, t_main), (c_us, c_pipe, c_main) = figures["triton"], figures["sdpa-cudnn"]
        speed = c_us / t_us if t_us else float("nan")
        per_matmul = speed * MATMULS[(pass_name, "triton")] / MATMULS[(pass_name, "sdpa-cudnn")]
        out.append(
            f"| {cell} | {t_us:.0f} | {c_us:.0f} | {speed:.2f} | {per_matmul:.2f} "
            f"| {t_pipe:.0f} / {c_pipe:.0f} "
            f"| {t_main['achieved occ %']} / {c_main['achieved occ %']} "
            f"| {t_main['regs']} / {c_main['regs']} | {_stalls(t_main, 3)} | {_stalls(c_main, 3)} |"
        )
    return "\n".join(out)


def summarize(counters_csv: str, cases_json: str) -> str:
    kernels = _kernel_rows(counters_csv, cases_json)
    info = _read_cases(cases_json)["provenance"] or {}
    out = [
        "# Triton against cuDNN under Nsight Compute",
        "",
        "Produced by `python -m attnkit_tools.pages.profile` (list, run under ncu, summarize; see its "
        "docstring). bf16, B=4, H*D=2048, one call of each case; durations are ncu's (each kernel "
        "replayed alone, caches flushed, clocks not locked), so they read higher than "
        "the grid's timings (PERFORMANCE.md).",
        "",
        "| | |",
        "| --- | --- |",
        *(f"| {key} | {value} |" for key, value in info.items()),
        "",
        "## Per cell",
        "",
        "Triton's speed / cuDNN's is cuDNN's summed kernel time over Triton's; per matmul multiplies "
        "it by the ratio of their matrix products per tile (2 / 2 forward; 7 / 5 backward, where "
        "Triton's deterministic two-pass design recomputes the scores and dP for dQ). Tensor pipe "
        "is weighted by kernel time; occupancy, registers and stalls (warps per issued "
        "instruction) are those of each path's longest kernel.",
        "",
        cell_table(kernels),
        "",
        "## Per kernel",
        "",
    ]
    out += [
        "| case | kernel | "
        + " | ".join(label for _, label in COLUMNS)
        + " | top stalls (warps per issue) |",
        "|---" * (len(COLUMNS) + 3) + "|",
    ]
    for kernel in kernels:
        cells = " | ".join(kernel[label] for _, label in COLUMNS)
        out.append(f"| {kernel['case']} | {kernel['kernel'][:48]} | {cells} | {_stalls(kernel, 4)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.pages.profile", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    running = sub.add_parser("run", help="run each case once between cudaProfilerStart/Stop (under ncu)")
    listing = sub.add_parser("list", help="write the cases and each one's kernels (not under ncu)")
    listing.add_argument("--cases", default="cases.json", help="JSON file to write")
    for command in (running, listing):
        command.add_argument(
            "--seq-lens", default=",".join(map(str, SEQ_LENS)), help="comma-separated N (default %(default)s)"
        )
    summary = sub.add_parser("summarize", help="a markdown table from ncu's raw CSV")
    summary.add_argument("counters", help="ncu --csv --page raw output")
    summary.add_argument("--cases", default="cases.json")
    summary.add_argument("--out", help="write the report here (default: print it)")
    args = parser.parse_args(argv)
    if args.command in ("run", "list"):
        seq_lens = tuple(int(n) for n in args.seq_lens.split(","))
        return run(args.cases if args.command == "list" else None, seq_lens)
    report = summarize(args.counters, args.cases)
    if args.out:
        Path(args.out).write_text(report)
    else:
        print(report, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
