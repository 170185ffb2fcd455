"""One command that re-records a GPU model's stored baseline and its noise files for the whole grid
(host-shape rows included), the machine's GPUs sharing the work:

    bash .ci/refresh-baselines.sh                        # every visible GPU; writes baselines/<gpu_key>/
    bash .ci/refresh-baselines.sh --gpus 0,1,2,3 --recordings 2 --aa-runs 2
    bash .ci/refresh-baselines.sh --cpu 2 --out build/try -- -k "naive and fwd"   # dry run, no GPU

(the script runs ``python -m attnkit_tools.gate.baselines --tests tests/perf ...`` from the checkout's
root: the baseline keeps the names that ``pytest tests/perf --benchmark-compare`` looks up).

It writes, under ``--out`` (default ``baselines``), ``<gpu_key>/baseline.json`` and
``noise-stored.json`` (``--recordings`` stored-mode recordings pooled:
:mod:`attnkit_perf.decide.pooled`) and ``noise-paired.json`` (``--aa-runs`` paired runs of this
tree against a copy of itself: :mod:`attnkit_perf.formats.noise`).

**How the GPUs share it.** Every recording and every A/A run is split over the GPUs with the
gate's own sharding (``--attnkit-shard=I/N``, :mod:`attnkit_perf.run.shards`: balanced by expected
cost, host rows heavier): one pytest process per GPU (``CUDA_VISIBLE_DEVICES``), the machine's
cores divided between them (``taskset``; each process's paired workers pin to the last core of
its share). The parts are then joined: a recording's parts into one recording (their
benchmarks side by side; each benchmark carries its own calibration), an A/A run's verdicts by
``python -m attnkit_perf.report merge`` (which refuses parts of different runs).

**A refresh cut short resumes.** With ``--work DIR`` kept from a run that stopped (a job's time
limit, a lost machine), each recording and each A/A run already joined there is kept, once it is
shown to be of this tree's code (its ``source`` digest; pooling refuses parts of another GPU
model); the rest are measured. A recording or A/A run that stopped half-way is measured again
whole.

**Checked before it reports success**: every file validates against its schema (the gate's own
readers load it, as a run would), the baseline and the paired noise cover every row of the
grid, and nothing is
written into ``--out`` until every part has succeeded. A host-timed row's wall-time entry
``NAME@host`` is written where the A/A runs timed its host metric: on unchanged code the host
work count decides that metric with no wall time (:mod:`attnkit_perf.decide.host`), so
a row without the entry keeps the default host threshold when a count grows. ``--cpu N`` runs
the same path with N slots on the CPU smoke grid (``--attnkit-allow-cpu``), for trying the
command without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from attnkit_perf.bench import cpu_suite_cases, gpu_suite_cases, source_digest, visible_gpus
from attnkit_perf.commands import noise as noise_command
from attnkit_perf.commands import pool as pool_command
from attnkit_perf.decide.merge import merge_verdicts
from attnkit_perf.decide.noise import noise_sigmas
from attnkit_perf.formats.baseline import load_baseline
from attnkit_perf.formats.noise import host_noise_name, read_noise
from attnkit_perf.formats.schema import FormatError, read_json, validate
from attnkit_perf.formats.spread import SPREAD_FILE
from attnkit_perf.formats.verdict import VerdictDocument


class BaselineError(RuntimeError):
    """A step failed; the message names it and where its log is."""


@dataclass(frozen=True)
class Slot:
    """One pytest process's share of the machine: a GPU (None on the CPU) and its cores."""

    gpu: str | None
    cores: tuple[int, ...]


def split_cores(cores: list[int], parts: int) -> list[tuple[int, ...]]:
    """``cores`` cut into ``parts`` contiguous shares as equal as they go (each at least one)."""
    if parts < 1 or len(cores) < parts:
        raise BaselineError(
            f"{parts} processes need at least {parts} cores; this process may use {len(cores)}"
        )
    size, extra = divmod(len(cores), parts)
    shares, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        shares.append(tuple(cores[start:end]))
        start = end
    return shares


def make_slots(gpus: list[str] | None, cpu_slots: int | None) -> list[Slot]:
    """One slot per GPU, or ``cpu_slots`` slots on the CPU."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    if cpu_slots is not None:
        if cpu_slots < 1:
            raise BaselineError(f"--cpu: at least 1 slot, got {cpu_slots}")
        # A shared CPU may have fewer cores than slots: then they share them.
        shares = split_cores(cores, cpu_slots) if len(cores) >= cpu_slots else [tuple(cores)] * cpu_slots
        return [Slot(None, share) for share in shares]
    gpus = gpus if gpus is not None else visible_gpus()
    if not gpus:
        raise BaselineError("no GPU visible (CUDA_VISIBLE_DEVICES, torch.cuda): use --cpu N for a dry run")
    return [Slot(gpu, share) for gpu, share in zip(gpus, split_cores(cores, len(gpus)), strict=True)]


def _command(slot: Slot, tests: str, args: list[str]) -> list[str]:
    pytest = [sys.executable, "-m", "pytest", tests, "-q", "-p", "no:cacheprovider", *args]
    if slot.cores and shutil.which("taskset"):
        return ["taskset", "-c", ",".join(map(str, slot.cores)), *pytest]
    return pytest


def run_parts(
    label: str, slots: list[Slot], tests: str, args_for, work: Path, env: dict, ok_codes=(0,)
) -> list[float]:
    """Run one pytest process per slot at once (``args_for(i, slot)``: its arguments); raise
    :class:`BaselineError` naming the log of any that exits outside ``ok_codes``. Returns the
    seconds each took."""
    started = []
    for i, slot in enumerate(slots):
        log = work / f"{label}-{i + 1}.log"
        slot_env = dict(env)
        if slot.gpu is not None:
            slot_env["CUDA_VISIBLE_DEVICES"] = slot.gpu
        with open(log, "w", encoding="utf8") as out:
            proc = subprocess.Popen(
                _command(slot, tests, args_for(i, slot)), stdout=out, stderr=subprocess.STDOUT, env=slot_env
            )
        started.append((proc, log, time.perf_counter()))
    ended: dict[int, float] = {}
    while len(ended) < len(started):  # each part's own time, whichever ends first
        for i, (proc, _, _) in enumerate(started):
            if i not in ended and proc.poll() is not None:
                ended[i] = time.perf_counter()
        time.sleep(0.2)
    failed, seconds = [], []
    for i, (proc, log, start) in enumerate(started):
        seconds.append(ended[i] - start)
        if proc.returncode not in ok_codes:
            failed.append(f"{log} (exit {proc.returncode})")
    if failed:
        raise BaselineError(f"{label}: a part failed, see " + ", ".join(failed))
    return seconds


def join_recordings(parts: list[dict]) -> dict:
    """The parts of one recording split over slots, as one recording: the first part's run
    information, every part's benchmarks (each carries its own calibration)."""
    keys = {json.dumps(p["machine_info"]["attnkit"].get("gpu_key")) for p in parts}
    sources = {p["machine_info"]["attnkit"].get("source") for p in parts}
    if len(keys) != 1 or len(sources) != 1:
        raise BaselineError(f"the parts of one recording differ in GPU model {keys} or code {sources}")
    names = [b["fullname"] for p in parts for b in p["benchmarks"]]
    if len(names) != len(set(names)):
        raise BaselineError("the parts of one recording measured a benchmark twice")
    return {**parts[0], "benchmarks": [b for p in parts for b in p["benchmarks"]]}


def grid_names(cpu: bool) -> tuple[set[str], set[str]]:
    """``(every row of the grid, the host-timed ones)``: the CPU smoke grid times every row's
    host metric, the GPU grid its ``-loop`` rows."""
    cases = cpu_suite_cases() if cpu else gpu_suite_cases()
    return {c.name for c in cases}, {c.name for c in cases if cpu or c.host_timed}


def check_outputs(folder: Path, key: str, selected: set[str], hosted: set[str]) -> list[str]:
    """Load the written files as the gate does (schemas, GPU model, protocol) and return what the
    ``selected`` rows lack: empty when the baseline and the paired noise cover them all."""
    baseline = load_baseline(folder / "baseline.json", key)
    validate("noise-stored", read_json(folder / SPREAD_FILE, "stored spread"), "the stored spread")
    sds = noise_sigmas(read_noise(folder / "noise-paired.json", key, "paired"))
    recorded = {b["extra_info"]["name"] for b in baseline["benchmarks"]}
    lacking = [f"baseline lacks {n}" for n in sorted(selected - recorded)]
    lacking += [f"noise-paired lacks {n}" for n in sorted(selected - set(sds))]
    # NAME@host only of host-timed rows (it is absent where the count decided the host metric).
    foreign = {n for n in sds if n.endswith("@host")} - {host_noise_name(n) for n in selected & hosted}
    lacking += [f"noise-paired has {n}, of no host-timed row measured" for n in sorted(foreign)]
    return lacking


def kept_part(path: Path, source: str) -> bool:
    """Whether ``path``, a joined recording or A/A verdict left in ``--work`` by an earlier run, can
    stand in this one: absent is False; of other code is refused, naming it. (Parts of another GPU
    model are refused where they are pooled.)"""
    if not path.is_file():
        return False
    data = read_json(path, "a part kept in --work")
    if "machine_info" in data:  # a recording (pytest-benchmark's format)
        info = data["machine_info"].get("attnkit") or {}
    else:  # an A/A verdict: the code under test is its head
        info = (data.get("head") or {}).get("provenance") or {}
    if info.get("source") != source:
        raise BaselineError(
            f"{path} measured code {info.get('source')} (on {info.get('gpu_key')}); this refresh "
            f"measures code {source}: remove it, or use another --work"
        )
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.gate.baselines", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--tests",
        required=True,
        help="the perf tests whose names the baseline keeps (a checkout's tests/perf)",
    )
    parser.add_argument("--gpus", help="comma-separated GPU ids (default: every visible GPU)")
    parser.add_argument("--cpu", type=int, metavar="N", help="dry run on the CPU smoke grid with N slots")
    parser.add_argument("--recordings", type=int, default=2, help="stored-mode recordings to pool (>= 2)")
    parser.add_argument("--aa-runs", type=int, default=2, help="paired A/A runs for the noise file (>= 2)")
    parser.add_argument("--out", default="baselines", help="baseline root to write <gpu_key>/ into")
    parser.add_argument(
        "--work",
        help="folder for the parts and logs (default: a new temporary one); the recordings and A/A "
        "runs an earlier refresh of the same code finished there are kept",
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments for every part")
    args = parser.parse_args(argv)
    if args.recordings < 2 or args.aa_runs < 2:
        parser.error(f"--recordings and --aa-runs: at least 2 each, got {args.recordings} and {args.aa_runs}")
    try:
        return _refresh(args)
    except (BaselineError, FormatError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _refresh(args) -> int:
    if not Path(args.tests).is_dir() or not Path("src").is_dir():
        raise BaselineError(
            f"--tests={args.tests}: run from the root of an attnkit checkout, naming its perf tests "
            f"(no {args.tests} or no src/ in {Path.cwd()})"
        )
    slots = make_slots(args.gpus.split(",") if args.gpus else None, args.cpu)
    work = Path(args.work or tempfile.mkdtemp(prefix="attnkit-baselines-"))
    work.mkdir(parents=True, exist_ok=True)
    cpu = args.cpu is not None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, ["src", os.environ.get("PYTHONPATH")]))}
    common = list(args.pytest_args)
    if cpu:
        env["ATTNKIT_TEST_DEVICE"] = "cpu"
        common.append("--attnkit-allow-cpu")
    count = len(slots)
    shard = lambda i: f"--attnkit-shard={i + 1}/{count}"
    print(f"{count} slots ({', '.join(s.gpu or 'cpu' for s in slots)}); parts and logs in {work}")
    began = time.perf_counter()

    source = source_digest(Path("src") / "attnkit")
    recordings = []
    for r in range(1, args.recordings + 1):
        scratch = work / f"scratch-{r}"
        path = work / f"recording-{r}.json"
        if kept_part(path, source):
            recordings.append(path)
            print(f"recording {r}: kept from {work} (an earlier refresh of this code)")
            continue

        def record(i, slot, r=r, scratch=scratch):
            part = work / f"recording-{r}-part{i + 1}.json"
            return [
                *common,
                shard(i),
                "--attnkit-record",
                f"--attnkit-baseline-dir={scratch}-{i}",
                f"--benchmark-json={part}",
            ]

        # pytest exits 5 when a slot's shard holds no row of the selection (a narrow -k).
        seconds = run_parts(f"recording-{r}", slots, args.tests, record, work, env, ok_codes=(0, 5))
        files = [work / f"recording-{r}-part{i + 1}.json" for i in range(count)]
        parts = [read_json(f, "recording part") for f in files if f.is_file()]
        if not parts:
            raise BaselineError(f"recording {r}: no part recorded anything, see {work}/recording-{r}-*.log")
        path.write_text(json.dumps(join_recordings(parts), indent=1) + "\n", encoding="utf8")
        recordings.append(path)
        measured = len(json.loads(path.read_text())["benchmarks"])
        print(f"recording {r}: {measured} benchmarks, slots {_span(seconds)}")

    base = work / "base"
    if base.exists() and source_digest(base / "src" / "attnkit") != source:
        shutil.rmtree(base)  # an earlier refresh's copy of other code: A/A compares this tree with itself
    if not base.exists():
        shutil.copytree("src", base / "src", ignore=shutil.ignore_patterns("__pycache__"))
    verdicts = []
    for a in range(1, args.aa_runs + 1):
        if kept_part(work / f"aa-{a}.json", source):
            verdicts.append(work / f"aa-{a}.json")
            print(f"A/A run {a}: kept from {work} (an earlier refresh of this code)")
            continue

        def aa(i, slot, a=a):
            part = work / f"aa-{a}-part{i + 1}.json"
            return [
                *common,
                shard(i),
                f"--attnkit-base={base}",
                "--attnkit-time-all",  # every row's ratio: no row decided by identical work
                "--attnkit-noise=none",
                f"--attnkit-verdict-json={part}",
            ]

        # An A/A row may read inconclusive (exit 1): the noise is in its ratio all the same; a
        # slot whose shard holds no row of the selection exits 5.
        seconds = run_parts(f"aa-{a}", slots, args.tests, aa, work, env, ok_codes=(0, 1, 5))
        parts = [
            (f"aa-{a}-part{i + 1}", VerdictDocument.read(work / f"aa-{a}-part{i + 1}.json"))
            for i in range(count)
        ]
        merged = merge_verdicts(parts)
        problems = [n for n in merged.notes if n.startswith("MERGE FAILED")]
        if problems:
            raise BaselineError(f"A/A run {a}: " + "; ".join(problems))
        path = merged.write(work / f"aa-{a}.json")
        verdicts.append(path)
        print(f"A/A run {a}: {merged.counts()}, slots {_span(seconds)}")

    staged = work / "out"
    code = pool_command.main([*map(str, recordings), "--out", str(staged / "baseline.json")])
    code = code or noise_command.main([*map(str, verdicts), "--out", str(staged / "noise-paired.json")])
    if code:
        raise BaselineError(f"pooling or the noise file failed (exit {code}); parts in {work}")
    key = read_json(recordings[0], "recording")["machine_info"]["attnkit"]["gpu_key"]
    every, hosted = grid_names(cpu)
    measured = [
        {b["extra_info"]["name"] for b in read_json(p, "recording")["benchmarks"]} for p in recordings
    ]
    if any(names != measured[0] for names in measured):
        raise BaselineError(
            "the recordings measured different rows: " + ", ".join(str(len(m)) for m in measured)
        )
    lacking = check_outputs(staged, key, measured[0], hosted)
    if lacking:
        raise BaselineError(f"{len(lacking)} rows not covered: " + "; ".join(lacking[:10]))
    unmeasured = sorted(every - measured[0])
    if unmeasured and not args.pytest_args:
        print(f"{len(unmeasured)} grid rows skipped here (their backend declines them on this machine):")
        for name in unmeasured:
            print(f"  {name}")
    target = Path(args.out) / key
    target.mkdir(parents=True, exist_ok=True)
    for name in ("baseline.json", SPREAD_FILE, "noise-paired.json"):
        shutil.copyfile(staged / name, target / name)
    print(
        f"wrote {target}/: baseline.json, {SPREAD_FILE}, noise-paired.json "
        f"({len(measured[0])} rows) in {time.perf_counter() - began:.0f} s"
    )
    return 0


def _span(seconds: list[float]) -> str:
    return f"{min(seconds):.0f}-{max(seconds):.0f} s"


if __name__ == "__main__":
    raise SystemExit(main())
