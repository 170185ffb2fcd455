"""Tune the Triton kernels on this GPU and write the config table.

    python -m attnkit_tools.tune.configs --out src/attnkit/triton/configs/<gpu_key>.json

For each shape family (16-bit inputs; head dims 64 and 128; causal or not) and each of the three
kernels (forward, dK/dV, dQ), every candidate tile config is compiled, checked against the
float64 oracle by attnkit.testing's tolerance rule (forward and backward on N = 300, M = 333,
through the same addressing, TMA descriptors or pointers, as the timed run), and timed alone
with the gate's timing protocol (:func:`attnkit_perf.bench.median_time_s`: flushed L2,
CUDA events, median) at the grid's shapes (B=4, H*D=2048) at several sequence lengths
(``--seq-lens``, default 1024, 4096 and 16384: the fastest tile at one length need not be
at another). The candidate kept is the correct one with the smallest geometric mean, over the
lengths, of its time divided by the best candidate's time at that length: the config closest
to the best at every length, not the fastest at one. The table records provenance (GPU,
driver, CUDA, torch, triton, commit) and every timing, so a reader can see what was compared.
Families absent from the table use :func:`attnkit.triton.config.default_config`.

Compiling dominates a tuning run (hundreds of specialisations, seconds each), and timing must
run alone: ``--jobs`` worker processes first compile and check every candidate in parallel
(Triton's on-disk cache keeps the binaries), then this process times them one at a time.

``--kernels fwd`` re-tunes only the forward (after a forward-only change); the other kernels keep
their entries from the existing table, whose provenance is kept as ``previous_provenance``.

The table's ``gluon`` section (the Gluon Hopper kernels' tiles and routed cells,
:mod:`attnkit_tools.tune.gluon`) is kept as it is by a Triton tuning run; ``--gluon`` measures
it on this GPU (and leaves the Triton families as they are), the forward's and the backward's
cells (``--passes``) of every cell or of some (``--cells``: one process a GPU can measure a
cell each); ``--gluon-carry-over TABLE`` copies another GPU's section, saying so in its
provenance, until this GPU measures its own; ``--gluon-recorded-backward`` writes the Gluon
backward's cells recorded on the GPU they were measured on
(:data:`attnkit_tools.tune.gluon.RECORDED_BACKWARD`) into that GPU's table, until it measures
them with ``--gluon --passes backward``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import torch

from attnkit.device import gpu_key
from attnkit.inputs import check_inputs
from attnkit.triton.config import AttentionConfig, KernelConfig, default_config, family_key
from attnkit.triton.gluon.config import PASSES, cell_key, parse_cell
from attnkit.triton.launch import LaunchSetup, attention_forward, bwd_dkdv, bwd_dq, bwd_preprocess
from attnkit_perf.bench import median_time_s, provenance
from attnkit_tools.pages.provenance import require_cuda
from attnkit_tools.tune.gluon import CELLS as GLUON_CELLS
from attnkit_tools.tune.gluon import (
    carried_section,
    measure_section,
    merge_measured,
    recorded_backward,
    write_families,
    write_section,
)
from attnkit_tools.tune.ranking import time_over_best, tuning_inputs

#: (block_m, block_n, num_warps, num_stages) tried per kernel. block_m is the query tile,
#: block_n the key tile, in every kernel. Candidates that cannot fit (shared memory) fail to
#: compile and are recorded as such; on sm_90 at D = 128 the dK/dV candidates with 4 warps
#: and 64 key rows or more spill registers (ptxas), which only the timing can weigh. 32 x 128
#: with 4 warps gave the fastest backward at D = 64 without a mask on the H200 (N >= 4096).
CANDIDATES = {
    "fwd": [
        (64, 64, 4, 3), (64, 64, 4, 4), (64, 32, 4, 4), (64, 128, 4, 2), (64, 128, 4, 3),
        (128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 4, 3), (128, 128, 8, 2),
        (128, 128, 8, 3)],
    "dkdv": [
        (16, 64, 4, 3), (32, 64, 4, 2), (32, 64, 4, 3), (32, 64, 4, 4), (64, 64, 4, 2),
        (64, 64, 8, 3), (32, 128, 8, 2), (32, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 3),
        (32, 128, 4, 3), (32, 128, 4, 4)],
    "dq": [
        (64, 32, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 2), (64, 128, 4, 3),
        (128, 32, 8, 2), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3)],
}  # fmt: skip

FAMILIES = [(torch.bfloat16, d, causal) for d in (64, 128) for causal in (False, True)]


class _Family:
    """One family's inputs at one sequence length, with the forward's log-sum-exp and the
    backward's row sums from the default config: ``runner(kernel, setup)`` launches one kernel
    of a candidate's setup on them."""

    def __init__(self, dtype, head_dim, causal, seq_len) -> None:
        self.q, self.k, self.v, self.do, self.problem = tuning_inputs(dtype, head_dim, causal, seq_len)
        self.base = default_config(dtype, head_dim, head_dim)
        ref_setup = LaunchSetup.build(self.problem, self.base)
        out, self.lse = attention_forward(self.q, self.k, self.v, ref_setup)
        self.delta = bwd_preprocess(ref_setup, out, self.do)
        self.tma = ref_setup.use_tma(self.k, self.v)

    def setup(self, kernel: str, cfg: KernelConfig) -> LaunchSetup:
        return LaunchSetup.build(self.problem, dataclasses.replace(self.base, **{kernel: cfg}))

    def runner(self, kernel: str, setup: LaunchSetup):
        q, k, v, do, lse, delta = self.q, self.k, self.v, self.do, self.lse, self.delta
        return {
            "fwd": lambda: attention_forward(q, k, v, setup)[0],
            "dkdv": lambda: bwd_dkdv(setup, q, k, v, do, lse, delta),
            "dq": lambda: bwd_dq(setup, q, k, v, do, lse, delta),
        }[kernel]


def _label(cfg: KernelConfig) -> str:
    return f"{cfg.block_m}x{cfg.block_n}-w{cfg.num_warps}-s{cfg.num_stages}"


_WORKER_FAMILIES: dict = {}


def _prepare(job) -> str:
    """In a worker process: compile one candidate at the tuned shape (by running it once) and
    check it against the oracle. '' when usable, else 'failed: ...' or 'wrong: ...'."""
    dtype, head_dim, causal, seq_len, kernel, cfg = job
    key = (dtype, head_dim, causal, seq_len)
    if key not in _WORKER_FAMILIES:
        _WORKER_FAMILIES.clear()  # one family's inputs at a time
        _WORKER_FAMILIES[key] = _Family(dtype, head_dim, causal, seq_len)
    family = _WORKER_FAMILIES[key]
    setup = family.setup(kernel, cfg)
    try:
        family.runner(kernel, setup)()  # compiles; out of resources raises here
        torch.cuda.synchronize()
    except Exception as err:  # out of shared memory / registers: not a candidate here
        return f"failed: {type(err).__name__}"
    wrong = outside_tolerance_rule(dtype, head_dim, causal, setup.config, family.tma)
    return f"wrong: {wrong}" if wrong else ""


def prepare_all(jobs: list, workers: int, log) -> dict:
    """{job: '' or why not} for every (dtype, head_dim, causal, seq_len, kernel, cfg) job,
    compiled and checked by ``workers`` processes (in this process when ``workers`` <= 1)."""
    if workers <= 1:
        return {job: _prepare(job) for job in jobs}
    # The jobs come family by family, so a worker rarely rebuilds a family's inputs.
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        verdicts = dict(zip(jobs, pool.map(_prepare, jobs, chunksize=1), strict=True))
    log(f"compiled and checked {len(jobs)} candidates with {workers} workers")
    return verdicts


def tune_family(
    dtype, head_dim, causal, seq_lens, log, kernels=tuple(CANDIDATES), verdicts=None
) -> tuple[dict, dict]:
    """Tune ``kernels`` of one family; returns ({kernel: KernelConfig}, {kernel: {label:
    {seq_len: ms} or why not}}). ``verdicts`` (from :func:`prepare_all`, prepared at
    ``seq_lens[0]``) says which candidates compiled and passed the check; without it each
    candidate is prepared here first."""
    usable, timings = {}, {}
    for kernel in kernels:
        usable[kernel], timings[kernel] = [], {}
        for candidate in CANDIDATES[kernel]:
            cfg = KernelConfig(*candidate)
            job = (dtype, head_dim, causal, seq_lens[0], kernel, cfg)
            verdict = verdicts[job] if verdicts is not None else _prepare(job)
            timings[kernel][_label(cfg)] = verdict or {}
            if verdict:
                log(f"  {kernel:5s} {_label(cfg):18s} {verdict[:100]}")
            else:
                usable[kernel].append(cfg)
    for seq_len in seq_lens:
        family = _Family(dtype, head_dim, causal, seq_len)  # one length's inputs at a time
        for kernel in kernels:
            for cfg in usable[kernel]:
                run = family.runner(kernel, family.setup(kernel, cfg))
                ms = 1e3 * median_time_s(run, torch.device("cuda"), budget_s=0.05)
                timings[kernel][_label(cfg)][str(seq_len)] = round(ms, 4)
                log(f"  {kernel:5s} {_label(cfg):18s} N={seq_len:<6d} {ms:.3f} ms")
        del family
    default = default_config(dtype, head_dim, head_dim)
    chosen = {
        kernel: closest_to_best(usable[kernel], timings[kernel], seq_lens) or getattr(default, kernel)
        for kernel in kernels
    }
    return chosen, timings


def closest_to_best(configs: list[KernelConfig], timings: dict, seq_lens) -> KernelConfig | None:
    """The config whose times, each divided by the best time at its length, have the smallest
    geometric mean over ``seq_lens`` (:func:`time_over_best`); None when there is none."""
    if not configs:
        return None
    scores = time_over_best({cfg: {n: timings[_label(cfg)][str(n)] for n in seq_lens} for cfg in configs})
    return min(configs, key=scores.__getitem__)


def outside_tolerance_rule(dtype, head_dim, causal, config: AttentionConfig, tma: bool = False) -> str:
    """'' if the kernels with ``config`` pass attnkit.testing's tolerance rule (the one every test
    uses) against the float64 oracle, forward and backward, on a small problem whose lengths
    cross partial blocks (N = 300, M = 333, GQA), through TMA descriptors or pointers as
    ``tma`` says; else the failed quantities."""
    from attnkit.flash_autograd import flash_attention
    from attnkit.testing import compare_to_reference, make_tensor
    from attnkit.triton import TritonImplementation

    gen = torch.Generator().manual_seed(0)
    kw = {"dtype": dtype, "device": "cuda", "generator": gen}
    q = make_tensor((1, 4, 300, head_dim), **kw)
    k, v = (make_tensor((1, 2, 333, head_dim), **kw) for _ in range(2))
    grad_out = torch.randn(q.shape, generator=gen).to(q)
    implementation = TritonImplementation(config, tma=tma)

    def run(a, b, c):
        return flash_attention(implementation, a, b, c, check_inputs(a, b, c, causal, None))

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


def _existing_table(path: str) -> dict:
    """The table at ``path``, or {} if there is none yet."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def _log(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.tune.configs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", help="JSON table to write (default: configs/<gpu_key>.json)")
    parser.add_argument(
        "--seq-lens", type=int, nargs="+", default=[1024, 4096, 16384], help="sequence lengths tuned at"
    )
    parser.add_argument(
        "--kernels",
        nargs="+",
        choices=list(CANDIDATES),
        default=list(CANDIDATES),
        help="kernels to tune; the others keep their entries (and timings) from the existing table",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=max(1, min(16, (os.cpu_count() or 2) - 1)),
        help="worker processes that compile and check candidates before the timing (1: none)",
    )
    parser.add_argument(
        "--gluon",
        action="store_true",
        help="measure only the Gluon section (tiles and routed cells) into the existing table",
    )
    parser.add_argument(
        "--cells",
        nargs="+",
        choices=[cell_key(d, causal) for d, causal in GLUON_CELLS],
        help="with --gluon: measure only these cells (processes on other GPUs may measure the others)",
    )
    parser.add_argument(
        "--passes",
        nargs="+",
        choices=list(PASSES),
        default=list(PASSES),
        help="with --gluon: measure only these passes; the others keep their cells",
    )
    parser.add_argument(
        "--gluon-recorded-backward",
        action="store_true",
        help="write the Gluon backward's recorded cells into the table at --out, marked as recorded "
        "(only for the GPU they were measured on; no GPU needed)",
    )
    parser.add_argument(
        "--gluon-carry-over",
        metavar="TABLE",
        help="copy TABLE's Gluon section into the table at --out, marked as carried over (no GPU needed)",
    )
    args = parser.parse_args(argv)
    if args.gluon_carry_over:
        if not args.out:
            parser.error("--gluon-carry-over needs --out (the table to write into)")
        with open(args.gluon_carry_over) as f:
            source = json.load(f)
        target = _existing_table(args.out).get("gpu_key", "?")
        write_section(args.out, carried_section(source, args.gluon_carry_over, target))
        print(f"wrote the Gluon section of {args.gluon_carry_over} into {args.out}", flush=True)
        return 0
    if args.gluon_recorded_backward:
        if not args.out:
            parser.error("--gluon-recorded-backward needs --out (the table to write into)")
        merge_measured(args.out, recorded_backward(_existing_table(args.out).get("gpu_key", "?")))
        print(f"wrote the recorded Gluon backward cells into {args.out}", flush=True)
        return 0
    require_cuda("attnkit_tools.tune.configs")
    device = torch.device("cuda")
    out = args.out or f"src/attnkit/triton/configs/{gpu_key(device)}.json"
    if args.gluon:
        if "families" not in _existing_table(out):
            # The Gluon cells are routed against the plain kernels this table configures.
            raise SystemExit(
                f"tune --gluon: {out} holds no Triton table to measure the Gluon section against; "
                "run python -m attnkit_tools.tune.configs first"
            )
        cells = None if not args.cells else [parse_cell(key) for key in args.cells]
        measured = measure_section(args.seq_lens, _log, out, cells, workers=args.jobs, passes=args.passes)
        merge_measured(out, measured)
        print(f"wrote the measured Gluon cells into {out}", flush=True)
        return 0
    previous = _previous_table(out, args.kernels)
    table = {"gpu_key": gpu_key(device), "provenance": provenance(device), "seq_lens": args.seq_lens}
    table["kernels_tuned"] = args.kernels
    if previous:
        # Kernels not re-tuned keep the configs (and the provenance) of the run that chose them.
        table["previous_provenance"] = previous.get("provenance")
    table["families"], table["timings_ms"] = {}, {}
    jobs = [
        (dtype, head_dim, causal, args.seq_lens[0], kernel, KernelConfig(*candidate))
        for dtype, head_dim, causal in FAMILIES
        for kernel in args.kernels
        for candidate in CANDIDATES[kernel]
    ]
    verdicts = prepare_all(jobs, args.jobs, _log)
    for dtype, head_dim, causal in FAMILIES:
        key = family_key(dtype, head_dim, head_dim, causal)
        print(f"{key}:", flush=True)
        chosen, timings = tune_family(dtype, head_dim, causal, args.seq_lens, _log, args.kernels, verdicts)
        entry = dict(previous.get("families", {}).get(key, {}))
        entry.update({name: dataclasses.asdict(cfg) for name, cfg in chosen.items()})
        AttentionConfig.from_dict(entry)  # every kernel must have a config
        table["families"][key] = entry
        table["timings_ms"][key] = {**previous.get("timings_ms", {}).get(key, {}), **timings}
        # Written after every family, so an interrupted run still leaves what it finished; the
        # Gluon section as it is on disk then (``--gluon`` may be measuring it on another GPU).
        write_families(out, table)
        print(f"{key}: chosen {entry}; wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
