"""The true effect of a code change, measured independently of the gate: ``triton.testing.do_bench``
medians of the same cases under two source trees, in alternating fresh processes (A B A B ...).

    python -m attnkit_tools.gate.ab_dobench --base BASE_SRC --head HEAD_SRC --match triton \\
        --rounds 3 --out ab.json

``BASE_SRC``/``HEAD_SRC`` are ``src`` folders (each holding ``attnkit``); cases are the perf
grid's (:func:`attnkit_perf.bench.gpu_suite_cases`) whose name contains every
``--match`` word. A ``loop`` case (the per-call cost guards) is timed as what it guards
instead, by the host's clock: the wall time per call of calls back to back, the median of 15
loops of at least 20 ms after half a second of calls (:func:`_loop_ms`; do_bench flushes the
L2 before each call, which hides up to a flush's worth of host time: the cost those cases exist
to see). Prints, per case, the median of the head/base
ratios over the rounds, and writes every time to ``--out`` after each round (a run stopped by a
time limit keeps the rounds it finished)
(``schemas/true-effect.schema.json``; :func:`read_effects` reads it back). This is the
yardstick the gate's verification compares with (:mod:`attnkit_tools.gate.detection`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from attnkit_perf.formats.schema import read_json, validate

FORMAT = "attnkit-true-effect/1"


def _side_main(names: list[str]) -> None:
    """In a side's process: do_bench every named case, print {name: ms} as JSON."""
    import torch
    from triton.testing import do_bench

    from attnkit.errors import UnsupportedProblemError
    from attnkit_perf.bench import build_runner, gpu_suite_cases

    cases = {c.name: c for c in gpu_suite_cases()}
    times = {}
    for name in names:
        try:
            runner = build_runner(cases[name], "cuda")
            if cases[name].flushed:
                times[name] = do_bench(runner, warmup=25, rep=200, return_mode="median")
            else:
                times[name] = _loop_ms(runner)
        except UnsupportedProblemError:
            times[name] = None
        torch.cuda.empty_cache()
    print(json.dumps(times))


def _loop_ms(runner, sync=None, warmup_s: float = 0.5, loop_s: float = 0.02, loops: int = 15) -> float:
    """Wall milliseconds per call of calls back to back (synchronised at both ends), the median
    of ``loops`` loops of at least ``loop_s`` seconds each, after ``warmup_s`` seconds of calls.
    A loop case's call takes 10-50 us, so a fixed 8 loops of 200 calls last about 30 ms in all,
    too short for the clocks to leave an idle state or for one slow loop to be
    outvoted: on an H200 one case's rounds then read from x0.46 to x1.77 head/base on a change
    of 3 us a call. ``sync`` (default ``torch.cuda.synchronize``) waits for the device."""
    import time

    if sync is None:
        import torch

        sync = torch.cuda.synchronize

    def timed(calls: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            runner()
        sync()
        return time.perf_counter() - start

    calls, spent = 1, 0.0
    while spent < warmup_s:  # doubling: also finds how many calls fill a loop
        spent += timed(calls)
        calls *= 2
    per_call = max(timed(calls) / calls, 1e-9)
    calls = max(1, int(loop_s / per_call))
    return statistics.median(timed(calls) / calls * 1e3 for _ in range(loops))


def _run_side(src: Path, names: list[str]) -> dict:
    import attnkit_perf

    env = dict(os.environ)
    perf_parent = str(Path(attnkit_perf.__file__).resolve().parent.parent)
    # The side's src first (its attnkit), then this tree for attnkit_perf and attnkit_tools, then
    # the caller's own path (site folders holding this tool's needs, such as jsonschema).
    inherited = [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]
    env["PYTHONPATH"] = os.pathsep.join([str(src), perf_parent, *inherited])
    out = subprocess.run(
        [sys.executable, "-m", "attnkit_tools.gate.ab_dobench", "--side", *names],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"the side at {src} failed (status {out.returncode}):\n{tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    summary = __doc__.splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m attnkit_tools.gate.ab_dobench", description=summary)
    parser.add_argument("--side", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--base", type=Path, help="base src folder")
    parser.add_argument("--head", type=Path, help="head src folder")
    parser.add_argument("--match", nargs="*", default=[], help="words every case name must contain")
    parser.add_argument("--rounds", type=int, default=3, help="alternating A/B rounds (fresh processes)")
    parser.add_argument("--out", help="JSON file for every time")
    args = parser.parse_args(argv)
    if args.side:
        _side_main(args.side)
        return 0
    if not (args.base and args.head):
        parser.error("--base and --head are required")
    if args.rounds < 1:
        parser.error(f"--rounds: expected 1 or more, got {args.rounds}")
    from attnkit_perf.bench import gpu_suite_cases, provenance

    names = [c.name for c in gpu_suite_cases() if all(w in c.name for w in args.match)]
    if not names:  # else each side would be started with nothing to time
        parser.error(f"no case of the perf grid contains every --match word {args.match}")
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    made = provenance() if args.out else None
    for round_ in range(1, args.rounds + 1):
        for side, src in (("base", args.base), ("head", args.head)):
            runs[side].append(_run_side(src, names))
        # Written after every round: a run stopped by a time limit keeps the rounds it finished.
        rows = _rows(names, runs)
        print(f"round {round_} of {args.rounds} done", file=sys.stderr, flush=True)
        if args.out:
            _write(args.out, made, rows, runs)
    for row in rows:
        each = " ".join(f"{r:.3f}" for r in row["ratios"])
        print(f"{row['name']:60s} head/base {row['ratio']:.4f}  ({each})")
    return 0


def _rows(names: list[str], runs: dict[str, list[dict]]) -> list[dict]:
    """Per case timed on both sides: the head/base ratio of each round, and their median."""
    rows = []
    for name in names:
        ratios = [
            h[name] / b[name] for b, h in zip(runs["base"], runs["head"], strict=True) if b[name] and h[name]
        ]
        if ratios:
            rows.append({"name": name, "ratio": statistics.median(ratios), "ratios": ratios})
    return rows


def _write(path: str, made: dict, rows: list[dict], runs: dict[str, list[dict]]) -> None:
    document = {"format": FORMAT, "provenance": made, "rows": rows, "runs": runs}
    validate("true-effect", document, path)
    Path(path).write_text(json.dumps(document, indent=1))


def read_effects(path: Path | str) -> dict[str, float]:
    """``{benchmark name: head/base ratio}`` from a file this tool wrote; :class:`FormatError`
    (naming the file and the field) when it is not one."""
    document = read_json(path, "true-effect")
    validate("true-effect", document, str(path))
    return {row["name"]: row["ratio"] for row in document["rows"]}


if __name__ == "__main__":
    raise SystemExit(main())
