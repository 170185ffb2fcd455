"""Regenerate every generated page of the GPU this runs on, in one command.

    python -m attnkit_tools.pages.regenerate             # every page, over every visible GPU
    python -m attnkit_tools.pages.regenerate --dry-run   # the plan: commands, GPUs, estimated time
    python -m attnkit_tools.pages.regenerate --smoke --saved DIR --docs OUT   # CPU: tiny inputs

Pages go to ``docs/<gpu_key>/`` (:func:`attnkit.device.gpu_key`): PERFORMANCE (the grid, with
its plot), AUTO and AUTO_CHECK (the auto table, written to ``src/attnkit/auto_tables/<gpu_key>.json``,
and the check of ``auto`` against the fastest path), DECODE, PROFILE (Nsight Compute: skipped
with the reason when ``ncu`` is not installed), PER_CALL and YARDSTICK. Each tool's raw
measurement is kept in ``docs/<gpu_key>/data/`` so a page renders again without a GPU (the
tools' ``--render`` / ``--from-json``); ncu's counters, which are large, and the yardstick's
samples, which no tool renders from, stay in a scratch directory. Each page heads itself with
its command and provenance (GPU, driver, CUDA, torch, triton, commit), without scratch paths
(:mod:`attnkit_tools.pages.provenance`).

Every job is a sequence of tool commands (``python -m attnkit_tools.<tool> ...``) run as
subprocesses of this one, with the checkout's ``src`` first on ``PYTHONPATH``. Jobs are spread
over the visible GPUs, one job per GPU at a time (``CUDA_VISIBLE_DEVICES``) and the CPU cores
split between them (each job's processes pinned to its share, so host timings do not compete),
longest first by :data:`ESTIMATE_S` (estimated from sizes and budgets), respecting the order
AUTO before AUTO_CHECK (the check reads the table just written) and the grid's four parts
(head dim x pass) before its page. ``--deadline-s`` stops every job still running then
(default 540 s: a command limit of 10 minutes with a minute to spare) and says which pages did
not finish; the rest are written.

``--smoke`` runs the same scheduler, subprocesses and page checks on the CPU
(``TRITON_INTERPRET=1``): the tools that measure on a CPU run their measuring path at tiny sizes
(per_call, yardstick); the CUDA-only ones (grid, auto_table, decode_table) render their page
from saved measurements (``--saved DIR``: the JSONs those tools write, and a packaged auto
table), and the profile is skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path

from attnkit_tools.pages.gpu_jobs import Job, Step, run_jobs, simulate

REPO = Path(__file__).resolve().parents[3]

#: The pages this command writes, by file name under ``docs/<gpu_key>/``.
PAGES = (
    "PERFORMANCE.md",
    "AUTO.md",
    "AUTO_CHECK.md",
    "DECODE.md",
    "PROFILE.md",
    "PER_CALL.md",
    "YARDSTICK.md",
)

#: The grid's parts, one GPU each: (head dim, pass); the page renders from all of them.
GRID_PARTS = {f"grid-d{d}-{p}": (d, p) for d in (64, 128) for p in ("fwd", "bwd")}

#: The profile's lengths: the shortest and the longest of the tool's default, where kernels
#: set the time (two thirds of its cases, for the time limit).
PROFILE_SEQ_LENS = "4096,16384"

#: Estimated seconds of each job on one H200 (fresh Triton cache), from its sizes and budget
#: (not measured: the first run's log gives each job's time):
#: grid part (a head dim and a pass): 5 N x 2 causal x 4 providers = 40 timings of ~0.4 s
#: (budget 0.2 s, warm-up, 16K backward ~30 ms x 10 rounds), compiling the Triton kernels
#: (~40 s) and flex once per cell (10 compiles, ~8 s each; the backward's longer);
#: auto: 20 cells x 2 passes x 4 paths x 3 rounds x ~0.2 s plus compiles; the check (2 rounds)
#: times ``auto`` too; decode: 4 table rows and 9 contexts x 4 paths, eager and graph;
#: per_call: the fast path's build (~60 s), 5 sizes x 2 passes x ~12 rows x 3 loops of 40-200
#: calls, the paired calls and the profiler; yardstick: 8 problems x 2 seeds x 3 dtypes x every
#: path, forward and backward against float64; profile: 32 cases, ~100 kernels replayed ~15
#: times each by ncu.
ESTIMATE_S = {
    "grid-d64-fwd": 150,
    "grid-d64-bwd": 180,
    "grid-d128-fwd": 150,
    "grid-d128-bwd": 180,
    "performance": 10,
    "auto": 200,
    "auto_check": 170,
    "decode": 120,
    "profile": 220,
    "per_call": 150,
    "yardstick": 150,
}


#: ncu's options for ``attnkit_tools.pages.profile run`` (its docstring): clocks as they run, only the
#: profiled call's kernels, raw CSV of the sections the summary reads.
NCU_ARGS = (
    "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "raw",
    "--section", "SpeedOfLight", "--section", "Occupancy", "--section", "LaunchStats",
    "--section", "WarpStateStats", "--section", "ComputeWorkloadAnalysis",
)  # fmt: skip


def plan_jobs(
    docs: Path, key: str, scratch: Path, smoke: bool = False, saved: Path | None = None
) -> list[Job]:
    """The jobs writing every page of GPU ``key`` under ``docs/<key>/`` (module docstring);
    with ``smoke``, the CUDA-only tools render from the saved measurements in ``saved``
    (``grid_*.json``, ``auto_check_*.json``, ``decode_*.json``, as those tools write them)."""
    out = docs / key
    data = out / "data"
    auto_table = REPO / "src" / "attnkit" / "auto_tables" / f"{key}.json"
    if smoke and saved is None:
        raise ValueError("saved: a smoke run renders the CUDA-only pages from saved measurements")

    def tool(*argv, **kw) -> Step:
        return Step(tuple(str(a) for a in argv), **kw)

    if smoke:  # the CPU: render the CUDA-only tools' pages from saved measurements
        grids = sorted(saved.glob("grid_*.json")) or [_one(saved, "grid_*.json")]
        grid_parts = {
            name: [tool("pages.grid", "--render", grids[i % len(grids)], "--out", scratch / f"{name}.md")]
            for i, name in enumerate(GRID_PARTS)
        }
        performance = tool("pages.grid", "--render", grids[0], "--out", out / "PERFORMANCE.md")
        packaged = sorted((REPO / "src" / "attnkit" / "auto_tables").glob("*.json"))[0]
        auto = [tool("tune.auto_table", "--render", packaged, "--md", out / "AUTO.md")]
        auto_check = [
            tool(
                "tune.auto_table", "--render", _one(saved, "auto_check_*.json"), "--md", out / "AUTO_CHECK.md"
            )
        ]
        decode = [
            tool("pages.decode_table", "--from-json", _one(saved, "decode_*.json"), "--md", out / "DECODE.md")
        ]
        per_call = [
            tool(
                "pages.per_call", "--device", "cpu", "--sizes", "B1-H1-N8-D16", "--calls", "4",
                "--repeats", "1", "--paired-calls", "8",
                "--out", data / "per_call.json", "--md", out / "PER_CALL.md",
            )
        ]  # fmt: skip
        yardstick = [
            tool(
                "pages.yardstick", "--device", "cpu", "--seeds", "1", "--backends", "tiled",
                "--doc", out / "YARDSTICK.md", "--out", scratch / "yardstick.json",
            )
        ]  # fmt: skip
        profile: list[Step] = []
        profile_skip = "the CPU smoke run has no Nsight Compute"
    else:
        grid_parts = {
            name: [
                tool("pages.grid", "--head-dims", d, "--passes", pass_name, "--json", data / f"{name}.json")
            ]
            for name, (d, pass_name) in GRID_PARTS.items()
        }
        performance = tool(
            "pages.grid",
            "--render",
            *(data / f"{name}.json" for name in GRID_PARTS),
            "--out",
            out / "PERFORMANCE.md",
        )
        auto = [tool("tune.auto_table", "--out", auto_table, "--md", out / "AUTO.md")]
        auto_check = [
            tool(
                "tune.auto_table",
                "--verify",
                "--rounds",
                "2",
                "--out",
                data / "auto_check.json",
                "--md",
                out / "AUTO_CHECK.md",
            )
        ]
        decode = [tool("pages.decode_table", "--out", data / "decode.json", "--md", out / "DECODE.md")]
        per_call = [
            Step(("fastpath", "build"), module="attnkit", optional=True),
            tool(
                "pages.per_call",
                "--repeats",
                "3",
                "--out",
                data / "per_call.json",
                "--md",
                out / "PER_CALL.md",
            ),
        ]
        yardstick = [
            tool(
                "pages.yardstick", "--device", "cuda", "--seeds", "2",
                "--doc", out / "YARDSTICK.md", "--out", scratch / "yardstick.json",
            )
        ]  # fmt: skip
        cases, counters = scratch / "profile_cases.json", scratch / "profile_counters.csv"
        ncu = shutil.which("ncu") or "ncu"
        profile = [
            tool("pages.profile", "list", "--cases", cases, "--seq-lens", PROFILE_SEQ_LENS),
            Step(
                (
                    str(ncu),
                    *NCU_ARGS,
                    sys.executable,
                    "-m",
                    "attnkit_tools.pages.profile",
                    "run",
                    "--seq-lens",
                    PROFILE_SEQ_LENS,
                ),
                module=None,
                stdout=counters,
            ),
            tool("pages.profile", "summarize", counters, "--cases", cases, "--out", out / "PROFILE.md"),
        ]
        profile_skip = None if shutil.which("ncu") else "ncu (Nsight Compute) is not installed here"
    jobs = [
        *(Job(name, tuple(steps)) for name, steps in grid_parts.items()),
        Job("performance", (performance,), ("PERFORMANCE.md",), after=tuple(grid_parts), gpu=False),
        Job("auto", tuple(auto), ("AUTO.md",)),
        Job("auto_check", tuple(auto_check), ("AUTO_CHECK.md",), after=("auto",)),
        Job("decode", tuple(decode), ("DECODE.md",)),
        Job("profile", tuple(profile), ("PROFILE.md",), skip_reason=profile_skip),
        Job("per_call", tuple(per_call), ("PER_CALL.md",)),
        Job("yardstick", tuple(yardstick), ("YARDSTICK.md",)),
    ]
    return [dataclasses.replace(job, estimate_s=ESTIMATE_S[job.name]) for job in jobs]


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if not found:
        raise SystemExit(f"--saved {folder}: no {pattern} there to render from")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.pages.regenerate", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--docs", type=Path, default=REPO / "docs", help="pages go to DOCS/<gpu_key>/")
    parser.add_argument("--gpus", type=int, help="GPUs to spread the jobs over (default: every visible one)")
    parser.add_argument("--only", nargs="+", choices=list(ESTIMATE_S), help="run these jobs alone")
    parser.add_argument("--deadline-s", type=float, default=540.0, help="stop what still runs then")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the commands; run nothing")
    parser.add_argument("--smoke", action="store_true", help="the CPU run (module docstring)")
    parser.add_argument(
        "--saved",
        type=Path,
        help="with --smoke: a folder of saved grid, auto check and decode JSONs to render",
    )
    args = parser.parse_args(argv)
    import torch

    from attnkit.device import gpu_key

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
    }
    if args.smoke and args.saved is None:
        parser.error("--smoke renders the CUDA-only pages from saved measurements: give --saved DIR")
    if args.smoke:
        key, slots = gpu_key("cpu"), ["", ""]
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    else:
        if not torch.cuda.is_available() and not args.dry_run:
            raise SystemExit(
                "pages measures on CUDA GPUs and none is visible (--smoke --saved DIR renders them on the "
                "CPU from a folder of saved measurements)"
            )
        count = torch.cuda.device_count() if torch.cuda.is_available() else 4
        models = {gpu_key(f"cuda:{i}") for i in range(torch.cuda.device_count())}
        if len(models) > 1:
            raise SystemExit(f"the visible GPUs are of several models {sorted(models)}: pages are per model")
        key = models.pop() if models else "<gpu_key>"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(count)]
        slots = ids[: args.gpus or len(ids)]
    scratch = Path(tempfile.mkdtemp(prefix="attnkit-pages-"))
    jobs = plan_jobs(args.docs.resolve(), key, scratch, smoke=args.smoke, saved=args.saved)
    if args.only:
        jobs = [dataclasses.replace(j, after=tuple(a for a in j.after if a in args.only)) for j in jobs]
        jobs = [j for j in jobs if j.name in args.only]
    placed, total = simulate(jobs, len(slots))
    print(f"pages of {key} into {args.docs / key}; {len(slots)} GPU(s); estimated {total:.0f} s on an H200")
    for job in jobs:
        where = placed.get(job.name)
        when = (
            f"GPU slot {where[0]}, {where[1]:.0f}-{where[2]:.0f} s" if where and where[0] is not None
            else (f"CPU, {where[1]:.0f} s" if where else f"skipped: {job.skip_reason}")
        )  # fmt: skip
        print(f"  {job.name} ({when})")
        for step in job.steps:
            redirect = f" > {step.stdout}" if step.stdout else ""
            print(f"    {' '.join(step.command())}{redirect}")
    if args.dry_run:
        shutil.rmtree(scratch)
        return 0
    (args.docs / key / "data").mkdir(parents=True, exist_ok=True)
    status = run_jobs(jobs, slots, env, args.deadline_s, scratch, cwd=REPO)
    for name, verdict in status.items():
        print(f"  {name}: {verdict}")
    missing = [
        page for job in jobs if status.get(job.name) == "ok" for page in job.pages
        if not (args.docs / key / page).exists()
    ]  # fmt: skip
    if missing:
        print(f"finished, but these pages were not written: {missing}")
    # A job the plan skipped (no ncu here) is said above; anything else unfinished is a failure.
    planned_skips = {job.name for job in jobs if job.skip_reason}
    finished = all(verdict == "ok" or name in planned_skips for name, verdict in status.items())
    if finished and not missing:
        shutil.rmtree(scratch)  # the jobs' logs matter only when one failed
        return 0
    print(f"logs kept in {scratch}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
