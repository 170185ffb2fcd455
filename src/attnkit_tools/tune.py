"""Tune the Triton kernels on this GPU and write the config table.

    python -m attnkit_tools.tune --out src/attnkit/triton/configs/<gpu_key>.json

For each shape family (16-bit inputs; head dims 64 and 128; causal or not) and each of the three
kernels (forward, dK/dV, dQ), every candidate tile config is compiled, checked against the
float64 oracle by attnkit.testing's tolerance rule (forward and backward on N = 300, M = 333),
and timed alone with the gate's timing protocol (:func:`attnkit_perf.measure.timing.median_time_s`:
flushed L2, CUDA events, median) at a representative shape (B=4, H*D=2048, N=4096). The
fastest correct one is kept. The table records
provenance (GPU, driver, CUDA, torch, triton, commit) and every timing, so a reader can see what
was compared. Families absent from the table use :func:`attnkit.triton.config.default_config`.

``--kernels fwd`` re-tunes only the forward (after a forward-only change); the other kernels keep
their entries from the existing table, whose provenance is kept as ``previous_provenance``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from attnkit.device import gpu_key
from attnkit.inputs import check_inputs
from attnkit.triton.config import AttentionConfig, KernelConfig, default_config, family_key
from attnkit.triton.launch import LaunchSetup, attention_forward, bwd_dkdv, bwd_dq, bwd_preprocess
from attnkit_perf.machine import provenance
from attnkit_perf.measure.timing import median_time_s

#: (block_m, block_n, num_warps, num_stages) tried per kernel. block_m is the query tile,
#: block_n the key tile, in every kernel.
CANDIDATES = {
    "fwd": [
        (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (128, 128, 4, 3),
        (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3)],
    "dkdv": [
        (32, 64, 8, 2), (16, 64, 4, 2), (32, 128, 8, 2), (64, 128, 8, 2),
        (64, 64, 8, 2), (32, 64, 4, 3)],
    "dq": [
        (64, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 2), (128, 64, 8, 2),
        (128, 128, 8, 2), (64, 64, 4, 3)],
}  # fmt: skip

FAMILIES = [(torch.bfloat16, d, causal) for d in (64, 128) for causal in (False, True)]


def _inputs(dtype, head_dim, causal, seq_len, batch=4):
    heads = 2048 // head_dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, heads, seq_len, head_dim)
    q, k, v, do = (torch.randn(shape, generator=gen, device="cuda", dtype=dtype) for _ in range(4))
    return q, k, v, do, check_inputs(q, k, v, causal, None)


def tune_family(dtype, head_dim, causal, seq_len, log, kernels=tuple(CANDIDATES)) -> tuple[dict, dict]:
    """Tune ``kernels`` of one family; returns ({kernel: KernelConfig}, {kernel: {label: ms}})."""
    q, k, v, do, problem = _inputs(dtype, head_dim, causal, seq_len)
    base = default_config(dtype, head_dim, head_dim)
    ref_setup = LaunchSetup.build(problem, base)
    ref_out, lse = attention_forward(q, k, v, ref_setup)
    delta = bwd_preprocess(ref_setup, ref_out, do)
    runners = {
        "fwd": lambda s: attention_forward(q, k, v, s)[0],
        "dkdv": lambda s: bwd_dkdv(s, q, k, v, do, lse, delta),
        "dq": lambda s: bwd_dq(s, q, k, v, do, lse, delta),
    }
    best, timings = {}, {}
    for kernel in kernels:
        candidates = CANDIDATES[kernel]
        timings[kernel] = {}
        for bm, bn, warps, stages in candidates:
            cfg = KernelConfig(bm, bn, warps, stages)
            setup = LaunchSetup.build(problem, dataclasses.replace(base, **{kernel: cfg}))
            label = f"{bm}x{bn}-w{warps}-s{stages}"
            try:
                runners[kernel](setup)  # compiles; out of resources raises here
                torch.cuda.synchronize()
            except Exception as err:  # out of shared memory / registers: not a candidate here
                timings[kernel][label] = f"failed: {type(err).__name__}"
                continue
            wrong = outside_tolerance_rule(dtype, head_dim, causal, setup.config)
            if wrong:
                timings[kernel][label] = f"wrong: {wrong}"
                continue
            ms = 1e3 * median_time_s(
                lambda s=setup, f=runners[kernel]: f(s), torch.device("cuda"), budget_s=0.05
            )
            timings[kernel][label] = round(ms, 4)
            if kernel not in best or ms < best[kernel][1]:
                best[kernel] = (cfg, ms)
            log(f"  {kernel:5s} {label:18s} {ms:.3f} ms")
    chosen = {name: best.get(name, (getattr(base, name), 0))[0] for name in kernels}
    return chosen, timings


def outside_tolerance_rule(dtype, head_dim, causal, config: AttentionConfig) -> str:
    """'' if the kernels with ``config`` pass attnkit.testing's tolerance rule (the one every test
    uses) against the float64 oracle, forward and backward, on a small problem whose lengths
    cross partial blocks (N = 300, M = 333, GQA); else the failed quantities."""
    from attnkit.testing import compare_to_reference, make_tensor
    from attnkit.triton import triton_attention

    gen = torch.Generator().manual_seed(0)
    kw = {"dtype": dtype, "device": "cuda", "generator": gen}
    q = make_tensor((1, 4, 300, head_dim), **kw)
    k, v = (make_tensor((1, 2, 333, head_dim), **kw) for _ in range(2))
    grad_out = torch.randn(q.shape, generator=gen).to(q)

    def run(a, b, c):
        return triton_attention(a, b, c, check_inputs(a, b, c, causal, None), config)

    checks = compare_to_reference(run, q, k, v, causal=causal, scale=None, grad_out=grad_out)
    return "; ".join(c.describe() for c in checks if not c.ok)


def _previous_table(path: str, kernels: list[str]) -> dict:
    """The existing table at ``path`` when only some kernels are re-tuned, else {}."""
    if set(kernels) == set(CANDIDATES):
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise SystemExit(
            f"--kernels {' '.join(kernels)}: the others come from {path}, which does not exist"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnkit_tools.tune", description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="JSON table to write (default: configs/<gpu_key>.json)")
    parser.add_argument("--seq-len", type=int, default=4096, help="sequence length tuned at")
    parser.add_argument(
        "--kernels",
        nargs="+",
        choices=list(CANDIDATES),
        default=list(CANDIDATES),
        help="kernels to tune; the others keep their entries (and timings) from the existing table",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    out = args.out or f"src/attnkit/triton/configs/{gpu_key(device)}.json"
    previous = _previous_table(out, args.kernels)
    table = {"gpu_key": gpu_key(device), "provenance": provenance(device), "seq_len": args.seq_len}
    table["kernels_tuned"] = args.kernels
    if previous:
        # Kernels not re-tuned keep the configs (and evidence) of the run that chose them.
        table["previous_provenance"] = previous.get("provenance")
    table["families"], table["timings_ms"] = {}, {}
    for dtype, head_dim, causal in FAMILIES:
        key = family_key(dtype, head_dim, head_dim, causal)
        print(f"{key}:", flush=True)
        chosen, timings = tune_family(
            dtype, head_dim, causal, args.seq_len, lambda s: print(s, flush=True), args.kernels
        )
        entry = dict(previous.get("families", {}).get(key, {}))
        entry.update({name: dataclasses.asdict(cfg) for name, cfg in chosen.items()})
        AttentionConfig.from_dict(entry)  # every kernel must have a config
        table["families"][key] = entry
        table["timings_ms"][key] = {**previous.get("timings_ms", {}).get(key, {}), **timings}
        # Written after every family, so an interrupted run still leaves what it finished.
        with open(out, "w") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
        print(f"{key}: chosen {entry}; wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
