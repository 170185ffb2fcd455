"""Hardware counters of the Triton kernels and cuDNN's side by side, through Nsight Compute.

    python3 tools/profile_attention.py list --cases cases.json
    ncu --clock-control none --profile-from-start off --csv --page raw \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section ComputeWorkloadAnalysis \\
        python3 tools/profile_attention.py run > counters.csv
    python3 tools/profile_attention.py summarize counters.csv --cases cases.json > counters.md

Each case is a path x pass x head dim x causal at the grid's shape (B=4, H*D=2048, N=4096,
bf16). ``list`` (without ncu) writes the cases in order with the kernels one call of each
launches (torch.profiler); ``run`` (under ncu) warms each call up, then runs it once between
``cudaProfilerStart`` and ``cudaProfilerStop``, so ncu (``--profile-from-start off``) profiles
exactly that call's kernels. They are two processes because ncu and torch.profiler both
subscribe to CUPTI. ``summarize`` maps ncu's rows back to the cases by that order and prints,
per kernel: duration, achieved and theoretical occupancy, registers, shared memory, the SM's and
memory's throughput, the tensor pipe's utilisation, and the top stall reasons per issued
instruction. Nothing is timed here; clocks stay as they are (``--clock-control none``).
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import sys

PASSES = ("fwd", "bwd")
PATHS = ("triton", "sdpa-cudnn")
HEAD_DIMS = (64, 128)
SEQ_LEN, BATCH, MODEL_DIM = 4096, 4, 2048


def _case_name(path: str, pass_name: str, head_dim: int, causal: bool) -> str:
    return f"{pass_name}[{path}-D{head_dim}-{'causal' if causal else 'full'}]"


def run(cases_out: str | None) -> int:
    """Each case once under the profiler range; with ``cases_out``, instead list each case's
    kernels (torch.profiler) into that file."""
    import torch

    import attnkit

    cases = []
    for pass_name, head_dim, causal, path in itertools.product(PASSES, HEAD_DIMS, (False, True), PATHS):
        gen = torch.Generator(device="cuda").manual_seed(0)
        shape = (BATCH, MODEL_DIM // head_dim, SEQ_LEN, head_dim)
        q, k, v, grad = (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)
        )
        for x in (q, k, v):
            x.requires_grad_(pass_name == "bwd")

        def forward(q=q, k=k, v=v, causal=causal, path=path):
            return attnkit.attention(q, k, v, causal=causal, backend=path)

        if pass_name == "fwd":
            call = torch.no_grad()(forward)
        else:
            out = forward()
            call = lambda out=out, q=q, k=k, v=v, grad=grad: torch.autograd.grad(
                out, (q, k, v), grad, retain_graph=True
            )
        for _ in range(3):  # compile, fill the host caches
            call()
        torch.cuda.synchronize()
        name = _case_name(path, pass_name, head_dim, causal)
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
        with open(cases_out, "w") as f:
            json.dump(cases, f, indent=1)
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


def summarize(counters_csv: str, cases_json: str) -> str:
    with open(counters_csv) as f:
        text = f.read()
    # ncu prints its own lines (==PROF== ...) and the program's stderr around the CSV.
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, units, data = rows[0], rows[1], rows[2:]
    with open(cases_json) as f:
        cases = json.load(f)
    owners = [c["case"] for c in cases for _ in c["kernels"]]
    if len(owners) != len(data):
        raise SystemExit(
            f"{counters_csv}: {len(data)} profiled kernels, but {cases_json} lists {len(owners)}: "
            "the rows cannot be matched to the cases"
        )
    index = {name: i for i, name in enumerate(header)}
    stalls = [name for name in header if name.startswith(_STALL[0]) and name.endswith(_STALL[1])]
    out = [
        "| case | kernel | "
        + " | ".join(label for _, label in COLUMNS)
        + " | top stalls (warps per issue) |",
        "|---" * (len(COLUMNS) + 3) + "|",
    ]
    for owner, row in zip(owners, data, strict=True):
        name = row[index["Kernel Name"]] if "Kernel Name" in index else "?"
        cells = []
        for column, _ in COLUMNS:
            value = row[index[column]] if column in index else ""
            if column == "gpu__time_duration.sum" and column in index:
                scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "msecond": 1e3, "ms": 1e3}.get(
                    units[index[column]]
                )
                number = _number(value)
                value = f"{number * scale:.1f}" if scale and number is not None else value
            cells.append(value)
        ranked = sorted(
            ((_number(row[index[s]]) or 0.0, s[len(_STALL[0]) : -len(_STALL[1])]) for s in stalls),
            reverse=True,
        )
        top = ", ".join(f"{reason} {value:.2f}" for value, reason in ranked[:4])
        out.append(f"| {owner} | {name[:48]} | " + " | ".join(cells) + f" | {top} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run each case once between cudaProfilerStart/Stop (under ncu)")
    listing = sub.add_parser("list", help="write the cases and each one's kernels (not under ncu)")
    listing.add_argument("--cases", default="cases.json", help="JSON file to write")
    summary = sub.add_parser("summarize", help="a markdown table from ncu's raw CSV")
    summary.add_argument("counters", help="ncu --csv --page raw output")
    summary.add_argument("--cases", default="cases.json")
    args = parser.parse_args(argv)
    if args.command in ("run", "list"):
        return run(args.cases if args.command == "list" else None)
    print(summarize(args.counters, args.cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
