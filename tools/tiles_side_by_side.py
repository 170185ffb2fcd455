"""The Triton kernels of one problem under several tile configs, side by side in one process:
first-call time (compilation included), the median time of the forward, dK/dV and dQ kernels
with the gate's timing (:func:`attnkit_perf.measure.timing.median_time_s`: flushed L2, CUDA
events), and each config checked once against the float64 oracle by the tolerance rule
(``--check``; ``outside_tolerance`` in the JSON: "" within it, None not checked).

    PYTHONPATH=src python3 tools/tiles_side_by_side.py --dtype fp32 --tiles default,64x64 \
        --shapes B4-H32-N4096-D64,B4-H16-N4096-D128 --out tiles.json

``default`` is :func:`attnkit.triton.config.default_config`'s tiles for the shape; ``BMxBN``
uses that tile for all three kernels (4 warps, 2 stages). The configs run in alternating order
over ``--rounds`` rounds, so a drift of the GPU's clocks falls on every config alike. Prints
one line per config and round; the JSON holds every time and the provenance.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from attnkit.inputs import check_inputs
from attnkit.triton.config import AttentionConfig, KernelConfig, default_config
from attnkit.triton.launch import (
    LaunchSetup,
    attention_backward,
    attention_forward,
    bwd_dkdv,
    bwd_dq,
    bwd_preprocess,
)
from attnkit_perf.machine import provenance
from attnkit_perf.measure.cases import DTYPES
from attnkit_perf.measure.timing import median_time_s
from attnkit_tools.tune import outside_tolerance_rule


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """``B4-H16-N4096-D128`` -> (4, 16, 4096, 128)."""
    parts = dict((p[0], int(p[1:])) for p in text.split("-"))
    return parts["B"], parts["H"], parts["N"], parts["D"]


def parse_config(text: str, dtype: torch.dtype, dim: int) -> AttentionConfig:
    if text == "default":
        return default_config(dtype, dim, dim)
    block_m, block_n = (int(x) for x in text.lower().split("x"))
    tile = KernelConfig(block_m, block_n, 4, 2)
    return AttentionConfig(tile, tile, tile)


def time_kernels(setup: LaunchSetup, q, k, v, grad_out) -> dict:
    """First-call seconds (compilation included) of forward + backward, then each kernel's median
    milliseconds. q, k, v, grad_out: (B, H, N, D) on the GPU."""
    device = q.device
    start = time.perf_counter()
    out, lse = attention_forward(q, k, v, setup)
    attention_backward(grad_out, q, k, v, out, lse, setup)
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start
    delta = bwd_preprocess(setup, out, grad_out)  # the backward's row sums, for timing its kernels
    kernels = {
        "fwd_ms": lambda: attention_forward(q, k, v, setup),
        "dkdv_ms": lambda: bwd_dkdv(setup, q, k, v, grad_out, lse, delta),
        "dq_ms": lambda: bwd_dq(setup, q, k, v, grad_out, lse, delta),
    }
    return {"first_call_s": first_call_s, **{n: median_time_s(f, device) * 1e3 for n, f in kernels.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    parser.add_argument("--shapes", default="B4-H32-N4096-D64,B4-H16-N4096-D128")
    parser.add_argument("--tiles", default="default,64x64", help="comma-separated: default or BMxBN")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the configs, order alternating")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--check", choices=["all", "default", "none"], default="all",
        help="which configs the oracle checks (each check compiles its own shapes once)",
    )  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tiles_side_by_side.py times CUDA kernels: run it on a GPU")
    device, dtype = torch.device("cuda"), DTYPES[args.dtype]
    rows, checked = [], {}
    for shape_text in args.shapes.split(","):
        batch, heads, length, dim = parse_shape(shape_text)
        gen = torch.Generator(device=device).manual_seed(0)
        shape = (batch, heads, length, dim)
        q, k, v, grad_out = (torch.randn(shape, device=device, dtype=dtype, generator=gen) for _ in range(4))
        problem = check_inputs(q, k, v, args.causal, None)
        configs = [(text, parse_config(text, dtype, dim)) for text in args.tiles.split(",")]
        for round_index in range(args.rounds):
            for label, config in configs if round_index % 2 == 0 else configs[::-1]:
                times = time_kernels(LaunchSetup.build(problem, config), q, k, v, grad_out)
                key = (dim, config)
                if key not in checked:  # once per config
                    wanted = args.check == "all" or (args.check == "default" and label == "default")
                    checked[key] = outside_tolerance_rule(dtype, dim, args.causal, config) if wanted else None
                row = {
                    "shape": shape_text, "causal": args.causal, "dtype": args.dtype, "tiles": label,
                    "config": config.as_dict(), "round": round_index, **times,
                    "outside_tolerance": checked[key],
                }  # fmt: skip
                rows.append(row)
                verdict = {None: "not checked", "": "within tolerance"}.get(checked[key], checked[key])
                print(
                    f"{shape_text:18s} {label:8s} round {round_index}  first {times['first_call_s']:6.1f} s  "
                    f"fwd {times['fwd_ms']:8.3f}  dkdv {times['dkdv_ms']:8.3f}  dq {times['dq_ms']:8.3f} ms  "
                    f"{verdict}",
                    flush=True,
                )
                with open(args.out, "w") as f:  # after every row: a stopped run keeps what it measured
                    json.dump({"provenance": provenance(device), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
