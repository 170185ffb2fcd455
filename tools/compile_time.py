"""Compile time of the Triton kernels per shape family: what a fresh machine pays per new
specialisation before the first launch (the correctness suite draws hundreds of them).

    PYTHONPATH=src python3 tools/compile_time.py --out compile_time.json [--tiles 64x64]

No GPU is needed: each kernel is compiled ahead of time for ``--arch`` (sm_90 by default) with
the ptxas that Triton bundles. For every case (dtype, head dim = value dim, causal) the forward,
dK/dV and dQ kernels are compiled once, in a fresh Triton cache, with the tiles that
:func:`attnkit.triton.config.default_config` gives (the config of every family that a GPU's
table does not list), or with ``--tiles BMxBN`` for all three kernels (4 warps, 2 stages).
Pointers are 16-byte aligned and strides are not specialised: the common compile of a new
layout. Prints a table; the JSON holds the seconds and the provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

# A fresh cache: a compile found in a warm one would take no time.
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnkit-compile-time-")

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from attnkit.triton.backward_kernels import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel
from attnkit.triton.config import KernelConfig, default_config, padded_dim
from attnkit.triton.forward_kernels import _attn_fwd_kernel
from attnkit.triton.launch import _DOT_PRECISION
from attnkit_perf.machine import provenance
from attnkit_perf.measure.cases import DTYPES

KERNELS = {"fwd": _attn_fwd_kernel, "dkdv": _attn_bwd_dkdv_kernel, "dq": _attn_bwd_dq_kernel}
#: Pointer arguments that always hold float32 (the log-sum-exp and the backward's row sums).
FLOAT32_POINTERS = {"LSE", "DELTA"}
FLOAT_SCALARS = {"qk_scale", "scale"}


def signature(kernel, dtype: str, constants: dict) -> tuple[dict, dict]:
    """Triton's signature of ``kernel``: upper-case parameters are pointers, the scales are
    floats, the other parameters int32; pointers are marked 16-byte aligned."""
    types, attrs = {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in constants:
            types[name] = "constexpr"
        elif name.isupper():
            types[name] = "*fp32" if name in FLOAT32_POINTERS else f"*{dtype}"
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            types[name] = "fp32" if name in FLOAT_SCALARS else "i32"
    return types, attrs


def compile_seconds(kernel, dtype: str, constants: dict, config: KernelConfig, target: GPUTarget) -> float:
    constants = {**constants, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n}
    if kernel is _attn_fwd_kernel:
        constants.update(TMA=False, NEGATE_Q=False, STORE_LSE=True)
    types, attrs = signature(kernel, dtype, constants)
    source = ASTSource(kernel, types, constexprs=constants, attrs=attrs)
    start = time.perf_counter()
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    triton.compile(source, target=target, options=options)
    return time.perf_counter() - start


def parse_tiles(text: str) -> KernelConfig:
    block_m, block_n = (int(x) for x in text.lower().split("x"))
    return KernelConfig(block_m, block_n, 4, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--dtypes", default="fp32,bf16", help=f"comma-separated subset of {list(DTYPES)}")
    parser.add_argument("--dims", default="16,40,64,128,256", help="head dims (value dim = head dim)")
    parser.add_argument("--tiles", default=None, help="BMxBN for every kernel instead of default_config's")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability to compile for")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    target = GPUTarget("cuda", args.arch, 32)
    rows = []
    print(f"{'dtype':6s} {'dim':>4s} {'kernel':6s} {'tiles':>7s} {'seconds':>8s}")
    for dtype in args.dtypes.split(","):
        for dim in (int(d) for d in args.dims.split(",")):
            configs = default_config(DTYPES[dtype], dim, dim)
            constants = dict(
                HEAD_DIM=dim, HEAD_PAD=padded_dim(dim), VALUE_DIM=dim, VALUE_PAD=padded_dim(dim),
                CAUSAL=args.causal, WINDOW=False, DOT_PRECISION=_DOT_PRECISION[DTYPES[dtype]],
            )  # fmt: skip
            for name, kernel in KERNELS.items():
                config = parse_tiles(args.tiles) if args.tiles else getattr(configs, name)
                seconds = compile_seconds(kernel, dtype, constants, config, target)
                tiles = f"{config.block_m}x{config.block_n}"
                print(f"{dtype:6s} {dim:4d} {name:6s} {tiles:>7s} {seconds:8.1f}", flush=True)
                row = {"dtype": dtype, "dim": dim, "kernel": name, "config": vars(config), "seconds": seconds}
                rows.append(row)
    with open(args.out, "w") as f:
        # The compile runs on the host CPU: its model and cores beside the usual provenance.
        host = {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
        doc = {"arch": args.arch, "causal": args.causal, "provenance": {**provenance(), **host}, "rows": rows}
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
