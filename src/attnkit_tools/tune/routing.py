"""Where a Gluon cell is routed, decided as a user's call runs: :func:`attnkit.attention` on the
Triton path, timed with and without the Gluon kernels.

The candidates of a cell are compared by their launchers alone (:mod:`attnkit_tools.tune.gluon`):
they share one host path, so that comparison is fair among them. The plain kernels run behind
a bound launch instead, the Gluon kernels behind Python-built TMA descriptors and Triton's JIT
launcher, and a backward call goes through autograd. Which is faster at a length is therefore
decided here, on the perf grid's own runners (:func:`attnkit_perf.measure.cases.build_runner`:
the forward as inference, the backward alone as autograd runs it), timed with the gate's
protocol (:func:`attnkit_perf.bench.median_time_s`):

* the plain side: ``$ATTNKIT_GLUON=0``;
* the Gluon side: ``$ATTNKIT_TRITON_CONFIG`` naming a trial copy of the table in which every
  measured cell runs its kept candidate from the shortest routing length on
  (:func:`trial_table`).

Each side runs in fresh processes, ``plain, gluon`` alternating for ``rounds`` rounds
(:data:`ROUNDS`), every process timing every (pass, cell, N) of the run. A cell's pass is routed
from the smallest N from which the Gluon side was faster in every round, at that N and at every
longer one (:func:`routed_from_rounds`); a cell faster in two rounds of three at some length is
not routed there.

    python -m attnkit_tools.tune.routing --side JOBS --expect gluon   # one side (the tuner starts it)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence

#: Alternating rounds of fresh processes per side.
ROUNDS = 3
#: Seconds of timed rounds per point (:func:`attnkit_perf.bench.median_time_s`'s budget).
BUDGET_S = 0.1
#: Seconds a side's process may take (about 20 points at two cells; a hung launch must not hang
#: the tuner).
SIDE_TIMEOUT_S = 1200
#: The environment of each side (beside ``$ATTNKIT_TRITON_CONFIG``, the trial table).
SIDES = {"plain": {"ATTNKIT_GLUON": "0"}, "gluon": {"ATTNKIT_GLUON": "1"}}

Job = tuple[str, int, bool, int]  # (pass, head dim, causal, N)
Times = dict[str, dict[str, dict[int, float]]]  # pass -> cell -> N -> ms


def routed_from(gluon_ms: Mapping[int, float], plain_ms: Mapping[int, float]) -> int | None:
    """The smallest N from which the Gluon kernel was faster than the plain one at that N and
    every longer N timed (a cell's pass is routed from there on), or None: slower at the longest."""
    start = None
    for n in sorted(gluon_ms, reverse=True):
        if gluon_ms[n] >= plain_ms[n]:
            break
        start = n
    return start


def routed_from_rounds(
    gluon: Sequence[Mapping[int, float]], plain: Sequence[Mapping[int, float]]
) -> int | None:
    """:func:`routed_from` over rounds: a length counts as faster when the Gluon side was faster
    than the plain side in every round (``gluon[r][N] < plain[r][N]``), i.e. when its largest
    time-over-plain of the rounds is below 1."""
    if len(gluon) != len(plain) or not gluon:
        raise ValueError(
            f"expected as many rounds of each side (at least one), got {len(gluon)} and {len(plain)}"
        )
    worst = {n: max(g[n] / p[n] for g, p in zip(gluon, plain, strict=True)) for n in plain[0]}
    return routed_from(worst, dict.fromkeys(worst, 1.0))


def trial_table(table: Mapping, measured: Mapping, shortest: int) -> dict:
    """A copy of ``table`` (a whole config table, its Triton families included) whose Gluon
    section runs the configs of ``measured`` (:func:`attnkit_tools.tune.gluon.measure_section`)
    in each of their cells from ``shortest`` on, for every pass measured."""
    from attnkit.triton.gluon.config import PASSES, SECTION

    trial = copy.deepcopy(dict(table))
    section = trial.setdefault(SECTION, {})
    for pass_name in PASSES:
        if pass_name not in measured:
            continue
        section.setdefault(pass_name, {}).update(measured[pass_name])
        section.setdefault("routed", {}).setdefault(pass_name, {}).update(
            dict.fromkeys(measured[pass_name], shortest)
        )
    return trial


def jobs_of(measured: Mapping, seq_lens: Sequence[int]) -> list[Job]:
    """(pass, head dim, causal, N) of every cell and pass of ``measured`` with a kept config."""
    from attnkit.triton.gluon.config import PASSES, parse_cell

    return [
        (pass_name, *parse_cell(key), n)
        for pass_name in PASSES
        for key in measured.get(pass_name, {})
        for n in seq_lens
    ]


def run_side(side: str, jobs: list[Job], table_path: str) -> Times:
    """One fresh process of ``side`` (:data:`SIDES`) timing ``jobs`` through
    :func:`attnkit.attention` with the table at ``table_path``; its times."""
    env = {**os.environ, **SIDES[side], "ATTNKIT_TRITON_CONFIG": table_path}
    command = [
        sys.executable,
        "-m",
        "attnkit_tools.tune.routing",
        "--side",
        json.dumps(jobs),
        "--expect",
        side,
    ]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, timeout=SIDE_TIMEOUT_S
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"the {side} side's process failed (exit {done.returncode}, {len(lines)} lines out):\n"
            f"{done.stderr[-3000:]}"
        )
    times = json.loads(lines[-1])
    return {
        p: {c: {int(n): ms for n, ms in per_n.items()} for c, per_n in cells.items()}
        for p, cells in times.items()
    }


def measure_routing(
    table: Mapping,
    measured: Mapping,
    seq_lens: Sequence[int],
    log: Callable[[str], None],
    rounds: int = ROUNDS,
    side_runner: Callable[[str, list[Job], str], Times] | None = None,
) -> tuple[dict, dict]:
    """``(routed, timings)`` of the cells and passes of ``measured`` (module docstring): routed
    = {pass: {cell: N}} (a cell not routed is absent), timings = {pass: {cell: {side: {N:
    [ms of each round]}}}}. ``table``: the table the run writes into (its families are what
    the plain side runs). ``side_runner``: :func:`run_side` unless given."""
    side_runner = side_runner or run_side
    jobs = jobs_of(measured, seq_lens)
    if not jobs:
        return {}, {}
    times: dict[str, list[Times]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="attnkit-routing-") as scratch:
        trial = os.path.join(scratch, "trial.json")
        with open(trial, "w") as f:
            json.dump(trial_table(table, measured, min(seq_lens)), f)
        for i in range(rounds):
            for side in SIDES:  # plain, then gluon: each round alternates them
                times[side].append(side_runner(side, jobs, trial))
                log(f"  routing round {i + 1}/{rounds}: {side} side timed {len(jobs)} points")
    routed: dict = {}
    timings: dict = {}
    for pass_name, cell in sorted({(job[0], _cell(job)) for job in jobs}):
        per_side = {side: [t[pass_name][cell] for t in times[side]] for side in SIDES}
        start = routed_from_rounds(per_side["gluon"], per_side["plain"])
        if start is not None:
            routed.setdefault(pass_name, {})[cell] = start
        timings.setdefault(pass_name, {})[cell] = {
            side: {str(n): [round(r[n], 4) for r in per_side[side]] for n in seq_lens} for side in SIDES
        }
        for n in seq_lens:
            ratios = " ".join(
                f"{g[n] / p[n]:.3f}" for g, p in zip(per_side["gluon"], per_side["plain"], strict=True)
            )
            log(f"  {pass_name} {cell} N={n:<6d} gluon / plain through attention(): {ratios}")
        log(f"{pass_name} {cell}: " + (f"routed from N={start}" if start else "not routed"))
    return routed, timings


def _cell(job: Job) -> str:
    from attnkit.triton.gluon.config import cell_key

    return cell_key(job[1], job[2])


def side_times(
    jobs: list[Job], budget_s: float = BUDGET_S, device: str = "cuda", expect: str | None = None
) -> Times:
    """In a side's process: the median ms of each job's perf-grid runner on ``device`` (bf16,
    H*D = 2048; the tuner's batches: :func:`attnkit_tools.tune.ranking.backward_batch` for the
    backward, 4 for the forward). ``expect`` (``"plain"`` or ``"gluon"``): the kind of kernel
    each job's pass must be planned on here, checked before it is timed: a side that silently
    ran the other kernel (its switch, its table, the size floor) would make the two sides
    compare a kernel with itself."""
    import dataclasses

    import torch

    from attnkit.triton.plan import plan_kernels
    from attnkit_perf.bench import BenchCase, build_runner, median_time_s
    from attnkit_tools.tune.ranking import backward_batch

    device = torch.device(device)
    times: Times = {}
    for pass_name, head_dim, causal, n in jobs:
        heads = 2048 // head_dim
        batch = 4 if pass_name == "forward" else backward_batch(n)
        name = "fwd" if pass_name == "forward" else "bwd"
        case = BenchCase("triton", name, batch, heads, heads, n, head_dim, causal)
        cell = _cell((pass_name, head_dim, causal, n))
        if expect is not None:
            plan = plan_kernels(dataclasses.replace(case.problem, device=device))
            planned = getattr(plan, pass_name)
            if planned != expect:
                raise RuntimeError(
                    f"{pass_name} {cell} N={n}: the {expect} side would run the {planned} kernel "
                    "here, so its times would not compare the two"
                )
        runner = build_runner(case, device)
        times.setdefault(pass_name, {}).setdefault(cell, {})[n] = 1e3 * median_time_s(
            runner, device, budget_s
        )
        del runner
        torch.cuda.empty_cache()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.tune.routing",
        description="One side's process of the Gluon routing decision (started by "
        "python -m attnkit_tools.tune.configs --gluon): times each job through attnkit.attention "
        "and prints {pass: {cell: {N: ms}}} as JSON.",
    )
    parser.add_argument(
        "--side", metavar="JOBS", required=True, help="JSON list of [pass, head dim, causal, N]"
    )
    parser.add_argument("--expect", choices=list(SIDES), help="the kind of kernel every job must run on")
    args = parser.parse_args(argv)
    from attnkit_tools.pages.provenance import require_cuda

    require_cuda("attnkit_tools.tune.routing")
    jobs = [(p, int(d), bool(c), int(n)) for p, d, c, n in json.loads(args.side)]
    print(json.dumps(side_times(jobs, expect=args.expect)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
