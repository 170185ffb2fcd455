"""Decode / KV-cache throughput on one GPU: a table of decode shapes, and tokens/s against
context length, side by side with SDPA.

    python -m attnkit_tools.pages.decode_table --out decode.json --md docs/<gpu>/DECODE.md \\
        [--sweep] [--sweep-paged]
    python -m attnkit_tools.pages.decode_table --from-json decode.json --md docs/<gpu>/DECODE.md   # no GPU

Shapes: Hq 32, Hkv 8, D 128, bf16, causal (bottom-right). Every time is the median of the
gate's timing protocol (:func:`attnkit_perf.bench.median_time_s`: L2 flushed before
each call, CUDA events), in one process. Columns marked "graph" replay the call from a CUDA
graph: the kernels' own time, as a serving loop that captures its decode step sees it; the
others are eager calls, whose host work can outlast a short kernel. GB/s is the bytes of K and
V read (B x Hkv x M x D x 2 tensors x 2 bytes) over the time; "% copy" divides it by this
device's measured copy bandwidth (bytes read + written by a 1 GiB device-to-device copy over
its time). ``--sweep`` also times split-KV configs (graph replays) over :data:`SWEEP_SHAPES`
and prints the one closest to the best on every shape (to update
``attnkit.triton.decode.DEFAULT_DECODE_CONFIG``); ``--sweep-paged`` does the same through a
shuffled block table (``DEFAULT_PAGED_DECODE_CONFIG``). Markdown on stdout, JSON to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import sys

import torch

import attnkit
from attnkit.inputs import check_inputs
from attnkit.triton.decode import DecodeConfig, decode_config, decode_forward
from attnkit_perf.bench import captured, median_time_s, provenance
from attnkit_tools.pages.provenance import produced_by, provenance_table, require_cuda, saved_command
from attnkit_tools.tune.ranking import time_over_best

HQ, HKV, D, DTYPE = 32, 8, 128, torch.bfloat16
#: (B, N, M) of the table: decode steps of a batch and of one long sequence, and a short
#: speculative block of 16 queries.
TABLE_ROWS = [(8, 1, 4096), (8, 1, 32768), (1, 1, 131072), (4, 16, 16384)]
CONTEXTS = [512 * 2**i for i in range(9)]  # 512 .. 128K
SDPA = ("sdpa-flash", "sdpa-cudnn")
#: Also timed causal against non-causal in the table rows (causal should cost at most 1.2x).
SDPA_ALL = (*SDPA, "sdpa-efficient", "sdpa")
PAGE = 256  # block size of the paged cache (FlashAttention-2's paged KV granularity)


def median_us(fn) -> float:
    return median_time_s(fn, torch.device("cuda"), budget_s=0.1) * 1e6


def graph_us(fn) -> float:
    """``fn`` captured in a CUDA graph, the replay timed: no host work inside the interval."""
    return median_us(captured(fn))


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy, counting bytes read and written."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (median_us(lambda: dst.copy_(src)) * 1e3)


def kv_bytes(batch: int, kv_len: int) -> int:
    return batch * HKV * kv_len * D * 2 * DTYPE.itemsize


def operands(batch: int, q_len: int, kv_len: int):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, HQ, q_len, D, device="cuda", dtype=DTYPE, generator=gen)
    k, v = (torch.randn(batch, HKV, kv_len, D, device="cuda", dtype=DTYPE, generator=gen) for _ in range(2))
    return q, k, v


def paged_copy(k: torch.Tensor, v: torch.Tensor):
    """The same cache as a shuffled paged pool: (num_blocks, Hkv, PAGE, D) and a (B, M/PAGE) table."""
    batch, _, kv_len, _ = k.shape
    per_seq = -(-kv_len // PAGE)
    perm = torch.randperm(batch * per_seq, device="cuda")
    table = perm.reshape(batch, per_seq).to(torch.int32)
    pools = []
    for x in (k, v):
        padded = torch.nn.functional.pad(x, (0, 0, 0, per_seq * PAGE - kv_len))
        blocks = padded.reshape(batch, HKV, per_seq, PAGE, D).permute(0, 2, 1, 3, 4).reshape(-1, HKV, PAGE, D)
        pool = torch.empty_like(blocks)
        pool[perm] = blocks
        pools.append(pool)
    return pools[0], pools[1], table


def time_row(batch: int, q_len: int, kv_len: int, copy_gbs: float) -> dict:
    q, k, v = operands(batch, q_len, kv_len)
    nbytes = kv_bytes(batch, kv_len)
    row = {"B": batch, "N": q_len, "M": kv_len, "kv_bytes": nbytes, "times_us": {}}
    for name, causal in itertools.product(("triton", *SDPA_ALL), (True, False)):
        label = f"{name}{'' if causal else ' non-causal'}"
        if attnkit.unavailable_reason(name) is not None:
            continue
        try:
            with torch.no_grad():
                row["times_us"][label] = median_us(
                    lambda n=name, c=causal: attnkit.attention(q, k, v, causal=c, backend=n)
                )
        except attnkit.UnsupportedProblemError as err:
            row["times_us"][label] = None
            row.setdefault("errors", {})[label] = str(err)[:200]
    with torch.no_grad():
        row["times_us"]["triton graph"] = graph_us(
            lambda: attnkit.attention(q, k, v, causal=True, backend="triton")
        )
    # Kernel-level paged vs contiguous (same split-KV launcher, no argument checks, replayed).
    problem = check_inputs(q, k, v, True, None)
    seqlens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    k_pool, v_pool, table = paged_copy(k, v)
    paged_problem = dataclasses.replace(problem, kv_len=table.shape[1] * PAGE)
    contiguous = decode_forward(q, k, v, problem, seqlens=seqlens)[0]
    paged = decode_forward(q, k_pool, v_pool, paged_problem, seqlens=seqlens, block_table=table)[0]
    row["paged_max_abs_diff"] = (contiguous.float() - paged.float()).abs().max().item()
    row["times_us"]["triton contiguous cache graph"] = graph_us(
        lambda: decode_forward(q, k, v, problem, seqlens=seqlens)
    )
    row["times_us"]["triton paged cache graph"] = graph_us(
        lambda: decode_forward(q, k_pool, v_pool, paged_problem, seqlens=seqlens, block_table=table)
    )
    with torch.no_grad():
        reference = attnkit.attention(
            q, k, v, causal=True, backend="sdpa-math" if kv_len <= 4096 else "sdpa-flash"
        )
        row["triton_max_abs_diff"] = (
            (attnkit.attention(q, k, v, causal=True, backend="triton").float() - reference.float())
            .abs()
            .max()
            .item()
        )
    row["gbs"] = {key: (nbytes / (t * 1e3) if t else None) for key, t in row["times_us"].items()}
    row["pct_copy"] = {key: (100 * g / copy_gbs if g else None) for key, g in row["gbs"].items()}
    return row


def tokens_per_second(batch: int = 8) -> list[dict]:
    """Decode (N = 1, causal) tokens/s of a batch of ``batch`` sequences against context length,
    each path called eagerly and replayed from a CUDA graph (a short context's kernels take less
    time than an eager call's host work)."""
    rows = []
    for kv_len in CONTEXTS:
        q, k, v = operands(batch, 1, kv_len)
        entry = {"M": kv_len, "tokens_per_s": {}}
        for name, how in itertools.product(("triton", *SDPA), ("eager", "graph")):
            if attnkit.unavailable_reason(name) is not None:
                continue

            def step(n=name, q=q, k=k, v=v):
                with torch.no_grad():
                    return attnkit.attention(q, k, v, causal=True, backend=n)

            label = name if how == "eager" else f"{name} graph"
            try:
                us = median_us(step) if how == "eager" else graph_us(step)
            except RuntimeError as err:  # a path that cannot be captured: named, not timed
                entry.setdefault("errors", {})[label] = str(err)[:200]
                entry["tokens_per_s"][label] = None
                continue
            entry["tokens_per_s"][label] = batch / (us * 1e-6)
        rows.append(entry)
    return rows


#: (B, N, M) of the sweep: the decode range (B 1..8, N 1..16, M 4K..128K), corners and middle.
SWEEP_SHAPES = [
    (1, 1, 4096), (8, 1, 4096), (1, 1, 131072), (8, 1, 32768), (2, 1, 16384),
    (4, 16, 16384), (1, 16, 65536), (8, 16, 4096),
]  # fmt: skip
SWEEP_GRID = {
    "block_n": (32, 64, 128),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4),
    "programs_per_sm": (2, 4, 8),
}


def sweep(copy_gbs: float, paged: bool = False) -> list[dict]:
    """Every split-KV config of :data:`SWEEP_GRID` on every shape of :data:`SWEEP_SHAPES`, from CUDA
    graph replays, reading a contiguous cache or (``paged``) the same keys through a shuffled
    block table of :data:`PAGE`-key pages; sorted by the geometric mean over the shapes of time
    / the best time on that shape (the config closest to the best everywhere first). Each entry
    also holds its lowest % of copy bandwidth over the shapes."""
    results, times = [], {}
    runs = {}
    for shape in SWEEP_SHAPES:
        q, k, v = operands(*shape)
        problem = check_inputs(q, k, v, True, None)
        if paged:
            k_pool, v_pool, table = paged_copy(k, v)
            seqlens = torch.full((shape[0],), shape[2], dtype=torch.int32, device="cuda")
            problem = dataclasses.replace(problem, kv_len=table.shape[1] * PAGE)
            runs[shape] = functools.partial(
                decode_forward, q, k_pool, v_pool, problem, seqlens=seqlens, block_table=table
            )
        else:
            runs[shape] = functools.partial(decode_forward, q, k, v, problem)
    base = decode_config(paged)
    for values in itertools.product(*SWEEP_GRID.values()):
        config = dataclasses.replace(base, **dict(zip(SWEEP_GRID, values, strict=True)))
        try:
            per_shape = {
                shape: graph_us(functools.partial(run, config=config)) for shape, run in runs.items()
            }
        except Exception as err:  # a config that does not compile is skipped, named
            print(f"skipped {config}: {type(err).__name__}: {str(err)[:120]}", file=sys.stderr)
            continue
        times[config] = per_shape
    scores = time_over_best(times)
    for config, per_shape in times.items():
        pct = [100 * kv_bytes(s[0], s[2]) / (per_shape[s] * 1e3) / copy_gbs for s in SWEEP_SHAPES]
        results.append({
            "config": dataclasses.asdict(config),
            "geomean_time_over_best": scores[config],
            "min_pct_copy": min(pct),
            "times_us": {f"B{b} N{n} M{m}": per_shape[(b, n, m)] for b, n, m in SWEEP_SHAPES},
            "pct_copy": {f"B{b} N{n} M{m}": p for (b, n, m), p in zip(SWEEP_SHAPES, pct, strict=True)},
        })  # fmt: skip
    return sorted(results, key=lambda r: r["geomean_time_over_best"])


def markdown(result: dict) -> str:
    """The tables of a result (what :func:`main` writes to --out): each row's times, the
    causal / non-causal ratios, and tokens/s against context length."""
    rows, tokens, copy_gbs = result["rows"], result["tokens"], result["copy_gbs"]
    labels = list(rows[0]["times_us"])
    lines = [
        f"Device: {result['provenance']['device_name']}; copy bandwidth {copy_gbs:.0f} GB/s; "
        f"Hq {HQ} Hkv {HKV} D {D} bf16.",
        "",
        "| shape | " + " | ".join(labels) + " |",
        "|---" * (len(labels) + 1) + "|",
    ]
    for row in rows:
        cells = []
        for key in labels:
            t = row["times_us"].get(key)
            cells.append(
                "n/a"
                if t is None
                else f"{t:.0f} us ({row['gbs'][key]:.0f} GB/s, {row['pct_copy'][key]:.0f}%)"
            )
        lines.append(f"| B{row['B']} N{row['N']} M{row['M']} | " + " | ".join(cells) + " |")
    lines += ["", "Causal / non-causal time (target <= 1.2):", ""]
    for row in rows:
        ratios = []
        for name in ("triton", *SDPA_ALL):
            causal, plain = row["times_us"].get(name), row["times_us"].get(f"{name} non-causal")
            if causal and plain:
                ratios.append(f"{name} {causal / plain:.2f}")
        paged = row["times_us"]["triton paged cache graph"]
        contiguous = row["times_us"]["triton contiguous cache graph"]
        lines.append(
            f"- B{row['B']} N{row['N']} M{row['M']}: " + ", ".join(ratios)
            + f"; paged / contiguous {paged / contiguous:.2f}"
            + f"; triton max |diff| {row['triton_max_abs_diff']:.2e}"
        )  # fmt: skip
    names = list(tokens[0]["tokens_per_s"])
    lines += ["", "Decode tokens/s (B 8, N 1, causal) against context length:", ""]
    lines += ["| context | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for entry in tokens:
        cells = " | ".join(
            "n/a" if entry["tokens_per_s"][n] is None else f"{entry['tokens_per_s'][n]:,.0f}" for n in names
        )
        lines.append(f"| {entry['M']} | {cells} |")
    return "\n".join(lines)


def page(result: dict, command: str) -> str:
    """The Markdown page: the command, the provenance, then :func:`markdown`'s tables."""
    header = [
        "# Decode and KV-cache attention",
        "",
        f"Produced by `{command}` (the module's docstring says how each figure is measured).",
        "",
        *provenance_table(result["provenance"]),
        "",
    ]
    return "\n".join(header) + "\n" + markdown(result) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.pages.decode_table", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", help="JSON file to write (required unless --from-json)")
    parser.add_argument("--md", help="also write the tables, with provenance, to this Markdown file")
    parser.add_argument("--from-json", help="render this saved result as --md instead of measuring")
    parser.add_argument("--sweep", action="store_true", help="also time split-KV tile configs")
    parser.add_argument(
        "--sweep-paged", action="store_true", help="also time split-KV tile configs through a block table"
    )
    args = parser.parse_args(argv)
    if args.from_json and not args.md:
        parser.error("--from-json renders a saved result: give --md")
    if not args.from_json and not args.out:
        parser.error("--out is required when measuring")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
        command = saved_command(result, "pages.decode_table", ["--out", "decode.json", "--md", args.md])
        with open(args.md, "w") as f:
            f.write(page(result, command))
        return 0
    require_cuda("attnkit_tools.pages.decode_table")
    copy_gbs = copy_bandwidth()
    rows = [time_row(b, n, m, copy_gbs) for b, n, m in TABLE_ROWS]
    tokens = tokens_per_second()
    info = provenance(torch.device("cuda"))
    command = produced_by("pages.decode_table", sys.argv[1:] if argv is None else argv)
    result = {"command": command, "provenance": info, "copy_gbs": copy_gbs, "rows": rows, "tokens": tokens}
    result["config"] = dataclasses.asdict(decode_config(paged=False))
    result["paged_config"] = dataclasses.asdict(decode_config(paged=True))
    sweeps = {"sweep": args.sweep, "sweep_paged": args.sweep_paged}
    for key in (key for key, wanted in sweeps.items() if wanted):
        result[key] = sweep(copy_gbs, paged=key == "sweep_paged")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(markdown(result))
    if args.md:
        with open(args.md, "w") as f:
            f.write(page(result, command))
    for key in (key for key in sweeps if result.get(key)):
        top = result[key][0]
        print(
            f"\n{key}: closest to the best on every shape: {DecodeConfig(**top['config'])} "
            f"(x{top['geomean_time_over_best']:.3f} of the best, lowest {top['min_pct_copy']:.0f}% of copy): "
            + ", ".join(f"{s} {p:.0f}%" for s, p in top["pct_copy"].items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
