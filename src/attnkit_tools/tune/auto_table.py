"""The dispatch table ``backend="auto"`` reads (:mod:`attnkit.auto`), measured on this GPU.

    python -m attnkit_tools.tune.auto_table --out src/attnkit/auto_tables/<gpu_key>.json \\
        --md docs/<gpu>/AUTO.md
    python -m attnkit_tools.tune.auto_table --verify --out verify.json --md docs/<gpu>/AUTO_CHECK.md

Every cell (bf16, B=4, H*D=2048, N in 1024..16384, D in {64, 128}, causal and not; inference
forward and a training step's forward and backward) times each path side by side in one process
with the gate's timing protocol (:func:`attnkit_perf.bench.median_time_s`), in
``--rounds`` interleaved rounds whose median is kept, so that a slow drift of the GPU's clock
does not favour whichever path ran first. The table keeps every path's time; ``auto`` tries
them fastest first. ``--verify`` times ``auto`` itself as one more provider beside the paths
(with the table that is installed) and reports, per cell, auto's time over the fastest path's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch

import attnkit
from attnkit.auto import TABLE_FORMAT, auto_order
from attnkit.device import gpu_key
from attnkit.inputs import check_inputs
from attnkit_perf.bench import BenchCase, build_runner, median_time_s, provenance
from attnkit_tools.pages.provenance import require_cuda

PATHS = ("triton", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
PASSES = ("fwd", "fwd+bwd")
#: ``auto`` is within this factor of the fastest path in a cell, or the cell is reported.
TOLERANCE = 1.03


def cells(head_dims=HEAD_DIMS, seq_lens=SEQ_LENS):
    """(head_dim, causal, seq_len, pass) of every cell, in measuring order."""
    return [(d, c, n, p) for d in head_dims for p in PASSES for c in (False, True) for n in seq_lens]


def _case(provider: str, head_dim: int, causal: bool, seq_len: int, pass_name: str) -> BenchCase:
    heads = 2048 // head_dim
    return BenchCase(provider, pass_name, 4, heads, heads, seq_len, head_dim, causal)


def measure_cell(cell, providers, rounds: int, budget_s: float, log=print) -> dict[str, float | None]:
    """Median over ``rounds`` interleaved rounds of each provider's median ms in ``cell``; None
    for a provider that cannot run it (its reason is logged)."""
    runners, times = {}, {}
    for provider in providers:
        try:  # built and called once: a path that declines the cell raises here, untimed
            runner = build_runner(_case(provider, *cell), "cuda")
            runner()
        except (ValueError, NotImplementedError, RuntimeError) as err:
            log(f"  {provider} {cell}: {type(err).__name__}: {err}")
        else:
            runners[provider], times[provider] = runner, []
    device = torch.device("cuda")
    for _ in range(rounds):
        for provider, runner in runners.items():
            times[provider].append(1e3 * median_time_s(runner, device, budget_s=budget_s))
    runners.clear()
    torch.cuda.empty_cache()
    return {p: (statistics.median(times[p]) if p in times else None) for p in providers}


def build_table(measured: list[tuple[tuple, dict]], providers, seq_lens, info: dict) -> dict:
    """The JSON :class:`attnkit.auto.AutoTable` reads: each cell's times and its fastest path."""
    rows = []
    for (head_dim, causal, seq_len, pass_name), ms in measured:
        ran = {p: t for p, t in ms.items() if t is not None}
        rows.append(
            {
                "head_dim": head_dim,
                "causal": causal,
                "seq_len": seq_len,
                "pass": pass_name,
                "ms": ms,
                "fastest": min(ran, key=ran.__getitem__) if ran else None,
            }
        )
    return {
        "format": TABLE_FORMAT,
        "gpu_key": info.get("gpu_key"),
        "provenance": info,
        "dtype": "bf16",
        "paths": list(providers),
        "seq_lens": list(seq_lens),
        "cells": rows,
    }


def table_pick(cell) -> str | None:
    """The path ``auto`` tries first in ``cell`` with the installed table (:mod:`attnkit.auto`)."""
    head_dim, causal, seq_len, pass_name = cell
    x = torch.empty(4, 2048 // head_dim, seq_len, head_dim, dtype=torch.bfloat16, device="meta")
    problem = dataclasses.replace(check_inputs(x, x, x, causal, None, None), device=torch.device("cuda"))
    return auto_order(problem, training=pass_name == "fwd+bwd")[0]


def verify_rows(measured: list[tuple[tuple, dict]], providers, picks: list[str | None]) -> list[dict]:
    """Per cell: the table's pick, the fastest path of this run, the pick's time over the
    fastest's (what the tolerance applies to), and ``auto`` timed itself over the fastest (the
    dispatch reaching the pick, with the run's noise)."""
    rows = []
    for (cell, ms), pick in zip(measured, picks, strict=True):
        paths = {p: ms[p] for p in providers if ms.get(p) is not None}
        fastest = min(paths, key=paths.__getitem__) if paths else None
        best = paths.get(fastest)
        rows.append(
            {
                "cell": list(cell),
                "ms": ms,
                "pick": pick,
                "fastest": fastest,
                "pick_ratio": paths[pick] / best if best and pick in paths else None,
                "auto_ratio": ms["auto"] / best if best and ms.get("auto") is not None else None,
            }
        )
    return rows


def _cell_label(head_dim, causal, seq_len, pass_name) -> str:
    return f"D={head_dim} {pass_name} {'causal' if causal else 'full'} N={seq_len}"


def _provenance_lines(info: dict) -> list[str]:
    keys = ("device_name", "driver", "cuda", "cudnn", "torch", "triton", "commit")
    return ["Provenance: " + ", ".join(f"{k} {info.get(k)}" for k in keys), ""]


def table_markdown(table: dict) -> str:
    """What ``auto`` picks per cell on this GPU, with each path's time as a ratio to it."""
    paths = table["paths"]
    lines = [
        f"# What `auto` picks on {table['provenance'].get('device_name', table['gpu_key'])}",
        "",
        "Generated by `python -m attnkit_tools.tune.auto_table` (bf16, B=4, H*D=2048, N = M, no window).",
        "Each cell: the path `auto` tries first, and every path's time over it (1.00 = the pick).",
        "Under `torch.use_deterministic_algorithms(True)` a training call (one that records a backward)",
        "runs only paths declared deterministic on its device (`attnkit.auto.deterministic_order`):",
        "never cuDNN, and with `warn_only=True` none of SDPA's fused kernels.",
        "",
        *_provenance_lines(table["provenance"]),
        "| cell | auto picks | " + " | ".join(paths) + " |",
        "|---|---|" + "---|" * len(paths),
    ]
    for row in table["cells"]:
        best = row["ms"].get(row["fastest"]) if row["fastest"] else None
        ratios = [
            f"{row['ms'][p] / best:.2f}" if best and row["ms"].get(p) is not None else "n/a" for p in paths
        ]
        cell = (row["head_dim"], row["causal"], row["seq_len"], row["pass"])
        lines.append(f"| {_cell_label(*cell)} | {row['fastest']} | " + " | ".join(ratios) + " |")
    return "\n".join(lines) + "\n"


def verify_markdown(rows: list[dict], info: dict) -> str:
    ratios = [r["pick_ratio"] for r in rows if r["pick_ratio"] is not None]
    outside = [r for r in rows if r["pick_ratio"] is None or r["pick_ratio"] > TOLERANCE]
    autos = [r["auto_ratio"] for r in rows if r["auto_ratio"] is not None]
    lines = [
        f"# `auto` against the fastest path on {info.get('device_name')}",
        "",
        "Generated by `python -m attnkit_tools.tune.auto_table --verify` (bf16, B=4, H*D=2048): every path",
        "and `auto` itself timed side by side in one process, interleaved rounds, after the table",
        "was written by an earlier run. *pick / fastest*: the time of the path the table makes",
        "`auto` try first over the fastest path of this run. *auto / fastest*: `auto` timed as a",
        "provider (the same kernels as its pick plus its dispatch, and this run's noise).",
        "",
        *_provenance_lines(info),
        f"Cells: {len(rows)}; pick / fastest: worst {max(ratios):.3f}; beyond x{TOLERANCE}: {len(outside)}"
        if ratios
        else f"Cells: {len(rows)}",
        f"auto / fastest: {min(autos):.3f} to {max(autos):.3f}" if autos else "",
        "",
        "| cell | auto's pick | fastest this run | pick / fastest | auto / fastest |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        pick, auto = (f"{r[k]:.3f}" if r[k] is not None else "n/a" for k in ("pick_ratio", "auto_ratio"))
        lines.append(f"| {_cell_label(*r['cell'])} | {r['pick']} | {r['fastest']} | {pick} | {auto} |")
    return "\n".join(lines) + "\n"


def _render(path: Path, md: Path | None) -> int:
    data = json.loads(path.read_text())
    text = verify_markdown(data["rows"], data["provenance"]) if "rows" in data else table_markdown(data)
    if md:
        md.write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.tune.auto_table", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, help="JSON: the table, or with --verify the check")
    parser.add_argument("--md", type=Path, help="also write the Markdown rendering here")
    parser.add_argument("--verify", action="store_true", help="time auto beside the paths instead")
    parser.add_argument("--render", type=Path, help="re-render --md from a JSON this tool wrote (no GPU)")
    parser.add_argument(
        "--paths", nargs="+", default=list(PATHS), help="paths to measure (default: %(default)s)"
    )
    parser.add_argument("--head-dims", nargs="+", type=int, default=list(HEAD_DIMS))
    parser.add_argument("--seq-lens", nargs="+", type=int, default=list(SEQ_LENS))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per cell (median kept)")
    parser.add_argument("--budget-s", type=float, default=0.1, help="timing budget per measurement")
    args = parser.parse_args(argv)
    if args.render is not None:
        return _render(args.render, args.md)
    if args.out is None:
        parser.error("--out is required unless --render is given")
    require_cuda("attnkit_tools.tune.auto_table")
    if args.rounds < 1:
        parser.error(f"--rounds: expected an int >= 1, got {args.rounds}")
    unknown = [p for p in args.paths if p not in attnkit.backend_names()]
    if unknown:
        parser.error(f"--paths: unknown backend(s) {unknown}; known: {attnkit.backend_names()}")
    providers = [p for p in args.paths if attnkit.unavailable_reason(p, "cuda") is None]
    info = provenance(torch.device("cuda"))
    info.setdefault("gpu_key", gpu_key("cuda"))
    measured_with = [*providers, "auto"] if args.verify else providers
    measured = []
    for cell in cells(args.head_dims, args.seq_lens):
        ms = measure_cell(cell, measured_with, args.rounds, args.budget_s)
        measured.append((cell, ms))
        print(_cell_label(*cell) + "  " + "  ".join(f"{p} {t:.3f}" for p, t in ms.items() if t), flush=True)
    if args.verify:
        rows = verify_rows(measured, providers, [table_pick(cell) for cell, _ in measured])
        args.out.write_text(json.dumps({"provenance": info, "rows": rows}, indent=1) + "\n")
        text = verify_markdown(rows, info)
    else:
        table = build_table(measured, providers, args.seq_lens, info)
        args.out.write_text(json.dumps(table, indent=1) + "\n")
        text = table_markdown(table)
    if args.md:
        args.md.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
