"""The performance grid of the Triton path against SDPA's flash and cuDNN backends.

    python -m attnkit_tools.pages.grid --out docs/<gpu>/PERFORMANCE.md --json grid.json       # on a GPU
    python -m attnkit_tools.pages.grid --render grid.json --out docs/<gpu>/PERFORMANCE.md     # anywhere
    python -m attnkit_tools.pages.grid --head-dims 64 --passes fwd --json d64.json   # a part, then
    python -m attnkit_tools.pages.grid --render d64.json d128.json --out docs/<gpu>/PERFORMANCE.md

bf16, B=4, H*D=2048, N in 1024..16384, D in {64, 128}, causal and not, forward and backward:
every cell times triton, sdpa-flash, sdpa-cudnn and flex (FlexAttention, compiled) side by side in
one run, with
the gate's timing protocol (:func:`attnkit_perf.bench.median_time_s`: warm-up, L2
flushed, CUDA events, median) on random
inputs, through :func:`attnkit_perf.bench.build_runner` so every provider is timed the same
way. Prints TFLOP/s and the ratios to both peers, and writes a Markdown report with provenance,
the floor the Triton path is held to (forward >= 1.2x sdpa-flash, backward >= 1.0x, at
N >= 2048) and a plot. ``--render`` writes the report and plot again from saved ``--json``
files (several: the parts of one grid measured apart, on one machine and commit), without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch

from attnkit_perf.bench import BenchCase, build_runner, median_time_s, provenance
from attnkit_tools.pages.provenance import produced_by, provenance_table, require_cuda

PROVIDERS = ("triton", "sdpa-flash", "sdpa-cudnn", "flex")
SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
PASSES = ("fwd", "bwd")
#: The floor: triton / sdpa-flash per pass, required at N >= FLOOR_FROM (below it both paths
#: are short enough that launch overheads, not the kernels, set the ratio).
FLOOR = {"fwd": 1.2, "bwd": 1.0}
FLOOR_FROM = 2048


@contextlib.contextmanager
def _compiled_peer(provider: str):
    """How a torch.compile'd peer (flex) is timed cell by cell. Its compiled function is reset
    first: forty cells of new shapes and grad modes would pass dynamo's recompile limit and fall
    back to the unfused reference. Buffer donation is off: the ``bwd`` pass re-runs the backward
    of one retained graph, which donated buffers refuse (donation saves memory, not kernel time)."""
    if provider != "flex":
        yield
        return
    import torch._dynamo
    import torch._functorch.config

    torch._dynamo.reset()
    with torch._functorch.config.patch(donated_buffer=False):
        yield


def measure(seq_lens=SEQ_LENS, head_dims=HEAD_DIMS, log=print, on_row=None, passes=PASSES) -> list[dict]:
    """The grid's rows; ``on_row(rows)`` after each (a run stopped midway keeps what it measured)."""
    rows = []
    for head_dim in head_dims:
        for pass_name in passes:
            for causal in (False, True):
                for n in seq_lens:
                    row = {"D": head_dim, "pass": pass_name, "causal": causal, "N": n}
                    for provider in PROVIDERS:
                        case = BenchCase(
                            provider, pass_name, 4, 2048 // head_dim, 2048 // head_dim, n, head_dim, causal
                        )
                        try:
                            with _compiled_peer(provider):
                                ms = 1e3 * median_time_s(build_runner(case, "cuda"), torch.device("cuda"))
                            row[provider] = case.flops / (ms * 1e-3) / 1e12
                        except Exception as err:  # a peer that cannot run a cell is reported, not fatal
                            row[provider] = None
                            log(f"  {case.name}: {type(err).__name__}: {err}")
                    torch.cuda.empty_cache()
                    rows.append(row)
                    log(format_row(row))
                    if on_row:
                        on_row(rows)
    return rows


def _ratio(row, peer):
    return row["triton"] / row[peer] if row.get("triton") and row.get(peer) else None


def format_row(row: dict) -> str:
    cells = "  ".join(f"{p} {row[p]:6.1f}" if row.get(p) else f"{p}    n/a" for p in PROVIDERS)
    ratios = [f"{r:5.2f}x" if r else "  n/a" for r in (_ratio(row, "sdpa-flash"), _ratio(row, "sdpa-cudnn"))]
    mask = "causal" if row["causal"] else "full"
    return (
        f"D={row['D']:3d} {row['pass']} {mask:6s} N={row['N']:5d}  {cells} TFLOP/s  "
        f"triton vs flash {ratios[0]}  vs cudnn {ratios[1]}"
    )


def meets_floor(row: dict) -> bool | None:
    if row["N"] < FLOOR_FROM:
        return None
    ratio = _ratio(row, "sdpa-flash")
    return ratio is not None and ratio >= FLOOR[row["pass"]]


def report(rows: list[dict], info: dict, plot_name: str | None, out: str = "PERFORMANCE.md") -> str:
    lines = [
        "# Performance of the Triton path",
        "",
        f"Produced by `{produced_by('pages.grid', ['--out', out])}`. bf16, B=4, H*D=2048, "
        "TFLOP/s = 4*B*H*N^2*D (halved when causal, x2.5 for the backward alone), "
        "median of the gate's timing protocol (L2 flushed, CUDA events), random inputs, all "
        "providers timed in one run (flex: FlexAttention, compiled).",
        "",
        *provenance_table(info),
        "",
        f"Each cell: triton TFLOP/s (x sdpa-flash, x sdpa-cudnn). Floor: forward >= "
        f"{FLOOR['fwd']}x and backward >= {FLOOR['bwd']}x sdpa-flash at N >= {FLOOR_FROM}; "
        "a cell below it is marked **(below floor)**.",
        "",
        "| D | pass | causal | " + " | ".join(f"N={n}" for n in SEQ_LENS) + " |",
        "|---|---|---|" + "---|" * len(SEQ_LENS),
    ]
    keys = sorted(
        {(r["D"], r["pass"], r["causal"]) for r in rows}, key=lambda k: (k[0], PASSES.index(k[1]), k[2])
    )
    for d, pass_name, causal in keys:
        cells = []
        for n in SEQ_LENS:
            row = next(
                (r for r in rows if (r["D"], r["pass"], r["causal"], r["N"]) == (d, pass_name, causal, n)),
                None,
            )
            if row is None or not row.get("triton"):
                cells.append("n/a")
                continue
            flash, cudnn = _ratio(row, "sdpa-flash"), _ratio(row, "sdpa-cudnn")
            text = (
                f"{row['triton']:.0f} ({flash:.2f}x, {cudnn:.2f}x)"
                if flash and cudnn
                else f"{row['triton']:.0f}"
            )
            if meets_floor(row) is False:
                text += " **(below floor)**"
            cells.append(text)
        lines.append(f"| {d} | {pass_name} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
    short = [r for r in rows if meets_floor(r) is False]
    lines += ["", f"Cells below the floor: {len(short)} of {sum(meets_floor(r) is not None for r in rows)}."]
    peers = [p for p in PROVIDERS[1:] if any(r.get(p) for r in rows)]
    lines += ["", f"Peers (TFLOP/s, {' / '.join(peers)}), same run:", ""]
    lines += ["| D | pass | causal | " + " | ".join(f"N={n}" for n in SEQ_LENS) + " |"]
    lines += ["|---|---|---|" + "---|" * len(SEQ_LENS)]
    for d, pass_name, causal in keys:
        cells = []
        for n in SEQ_LENS:
            row = next(
                (r for r in rows if (r["D"], r["pass"], r["causal"], r["N"]) == (d, pass_name, causal, n)), {}
            )
            cells.append("/".join(f"{row[p]:.0f}" if row.get(p) else "n/a" for p in peers))
        lines.append(f"| {d} | {pass_name} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
    if plot_name:
        lines += ["", f"![TFLOP/s by sequence length]({plot_name})"]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(18, 8), sharex=True)
    for i, d in enumerate(HEAD_DIMS):
        for j, (pass_name, causal) in enumerate([(p, c) for p in PASSES for c in (False, True)]):
            ax = axes[i][j]
            sel = [r for r in rows if (r["D"], r["pass"], r["causal"]) == (d, pass_name, causal)]
            for provider in PROVIDERS:
                pts = [(r["N"], r[provider]) for r in sel if r.get(provider)]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=provider)
            ax.set_xscale("log", base=2)
            ax.set_title(f"D={d} {pass_name} {'causal' if causal else 'full'}")
            ax.set_xlabel("N")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def write_report(rows: list[dict], info: dict, out: Path) -> None:
    """The Markdown report at ``out`` and, where matplotlib is installed, its plot beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_path = out.with_name("performance.png")
    try:
        plot(rows, plot_path)
    except ImportError:
        plot_path = None
    out.write_text(report(rows, info, plot_path.name if plot_path else None, str(out)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.pages.grid", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", help="Markdown report to write (docs/<gpu>/PERFORMANCE.md)")
    parser.add_argument("--json", help="also write the raw rows here")
    parser.add_argument(
        "--render", metavar="FILE.json", nargs="+", help="write the report from these saved rows; no GPU"
    )
    parser.add_argument(
        "--head-dims",
        type=int,
        nargs="+",
        default=list(HEAD_DIMS),
        help="head dims to measure (default: %(default)s)",
    )
    parser.add_argument(
        "--passes",
        nargs="+",
        choices=PASSES,
        default=list(PASSES),
        help="passes to measure (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.render:
        if not args.out:
            parser.error("--render writes a report: give --out")
        rows, info = [], None
        for path in args.render:
            saved = json.loads(Path(path).read_text())
            missing = {"provenance", "rows"} - set(saved)
            if missing:
                parser.error(f"{path} is not a saved grid (--json): it has no {sorted(missing)}")
            if info is not None and _run_of(saved["provenance"]) != _run_of(info):
                parser.error(f"{path} was measured on another GPU or commit than {args.render[0]}")
            info = info or saved["provenance"]
            rows += saved["rows"]
        write_report(_in_grid_order(rows), info, Path(args.out))
        print(f"wrote {args.out}")
        return 0
    if not args.out and not args.json:
        parser.error("give --out (the report) or --json (the rows), or both")
    unknown = sorted(set(args.head_dims) - set(HEAD_DIMS))
    if unknown:
        parser.error(f"--head-dims: {unknown} not in the grid's {list(HEAD_DIMS)}")
    require_cuda("attnkit_tools.pages.grid")
    info = provenance(torch.device("cuda"))
    print(" | ".join(f"{k}: {v}" for k, v in info.items()), flush=True)

    def save(rows):
        if args.json:
            Path(args.json).write_text(json.dumps({"provenance": info, "rows": rows}, indent=1))

    rows = measure(
        head_dims=args.head_dims, passes=args.passes, log=lambda s: print(s, flush=True), on_row=save
    )
    if args.out:
        write_report(rows, info, Path(args.out))
        print(f"wrote {args.out}")
    return 0


def _run_of(info: dict) -> tuple:
    """What the parts of one grid share: the machine's model and the commit measured."""
    return info.get("device_name"), info.get("commit")


def _in_grid_order(rows: list[dict]) -> list[dict]:
    """Rows in :func:`measure`'s order (head dim, pass, causal, N), whichever part they came from."""
    return sorted(rows, key=lambda r: (HEAD_DIMS.index(r["D"]), PASSES.index(r["pass"]), r["causal"], r["N"]))


if __name__ == "__main__":
    raise SystemExit(main())
