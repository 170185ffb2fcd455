"""Jobs of tool commands spread over the GPUs of one machine, for
:mod:`attnkit_tools.pages.regenerate`: one job per GPU at a time (``CUDA_VISIBLE_DEVICES``), each on its
own share of the CPU cores, the longest chain first, a deadline that stops what still runs.

A :class:`Job` is :class:`Step` commands run in order; it may wait for other jobs (``after``)
and need no GPU (``gpu=False``: a page rendered from saved parts). :func:`simulate` is the same
schedule on the jobs' estimates, for a plan printed before anything runs.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of a job: ``python -m <module> <argv>`` (``module`` None: ``argv`` as it
    is); ``stdout``: a file its standard output goes to; ``optional``: a failure is logged, and
    the job goes on (the fast path's build: the page then says it is off)."""

    argv: tuple[str, ...]
    module: str | None = "attnkit_tools"
    stdout: Path | None = None
    optional: bool = False

    def command(self) -> list[str]:
        if self.module is None:
            return list(self.argv)
        tool, *rest = self.argv
        return [sys.executable, "-m", f"{self.module}.{tool}" if self.module else tool, *rest]


@dataclasses.dataclass(frozen=True)
class Job:
    """Commands run in order on one GPU (``gpu`` False: on no GPU, e.g. a page rendered from
    saved parts), after the jobs named in ``after``; writes ``pages``."""

    name: str
    steps: tuple[Step, ...]
    pages: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    gpu: bool = True
    skip_reason: str | None = None
    #: Seconds it is expected to take, for the order jobs start in (:func:`critical_path_s`).
    estimate_s: float = 60.0


def critical_path_s(jobs: list[Job]) -> dict[str, float]:
    """Each job's estimate plus the longest chain of jobs that wait for it: the order in which
    free GPUs take jobs (longest first), so that a chain such as auto -> auto_check starts early."""
    by_name = {job.name: job for job in jobs}
    waiting = {job.name: [j.name for j in jobs if job.name in j.after] for job in jobs}

    def chain(name: str) -> float:
        rest = max((chain(n) for n in waiting[name]), default=0.0)
        return (by_name[name].estimate_s if by_name[name].gpu else 0.0) + rest

    return {job.name: chain(job.name) for job in jobs}


def simulate(jobs: list[Job], gpus: int) -> tuple[dict[str, tuple[int | None, float, float]], float]:
    """The schedule :func:`run_jobs` makes if every job takes its ``estimate_s``: {job: (GPU or
    None, start s, end s)} and the total wall time."""
    priority = critical_path_s(jobs)
    free_at = [0.0] * gpus
    placed: dict[str, tuple[int | None, float, float]] = {}
    pending = [job for job in jobs if job.skip_reason is None]
    while pending:
        ready = [j for j in pending if all(a in placed for a in j.after)]
        job = max(ready, key=lambda j: priority[j.name])
        after = max((placed[a][2] for a in job.after), default=0.0)
        if job.gpu:
            gpu = min(range(gpus), key=lambda g: max(free_at[g], after))
            start = max(free_at[gpu], after)
            free_at[gpu] = start + job.estimate_s
            placed[job.name] = (gpu, start, free_at[gpu])
        else:
            placed[job.name] = (None, after, after + job.estimate_s)
        pending.remove(job)
    return placed, max((end for _, _, end in placed.values()), default=0.0)


@dataclasses.dataclass
class _Running:
    job: Job
    slot: int | None
    step: int
    process: subprocess.Popen
    started: float
    log: Path


def _core_shares(slots: int) -> list[set[int]]:
    cores = sorted(os.sched_getaffinity(0))
    size = max(1, len(cores) // max(1, slots))
    return [set(cores[i * size : (i + 1) * size]) or set(cores) for i in range(slots)]


def run_jobs(
    jobs: list[Job],
    slots: list[str],
    env: dict,
    deadline_s: float,
    logs: Path,
    log=print,
    cwd: Path | None = None,
) -> dict:
    """Run ``jobs`` over ``slots`` (CUDA_VISIBLE_DEVICES values, one job each at a time), each
    command in ``cwd`` with ``env``, its output in ``logs/<job>.log``; returns {job: "ok" |
    "failed: ..." | "skipped: ..." | "stopped: ..."}."""
    cores = _core_shares(len(slots))
    priority = critical_path_s(jobs)
    status: dict[str, str] = {j.name: f"skipped: {j.skip_reason}" for j in jobs if j.skip_reason}
    pending = [j for j in jobs if j.skip_reason is None]
    running: list[_Running] = []
    start = time.monotonic()

    def launch(job: Job, slot: int | None, step: int) -> _Running:
        command = job.steps[step]
        job_env = dict(env)
        if slot is not None:
            job_env["CUDA_VISIBLE_DEVICES"] = slots[slot]
        share = cores[slot] if slot is not None else set(os.sched_getaffinity(0))
        path = logs / f"{job.name}.log"
        with open(path, "a") as out:
            out.write(f"$ {' '.join(command.command())}\n")
            out.flush()
            stdout = open(command.stdout, "w") if command.stdout else out  # noqa: SIM115
            process = subprocess.Popen(
                command.command(),
                cwd=cwd,
                env=job_env,
                stdout=stdout,
                stderr=out,
                start_new_session=True,  # its own process group: stopped whole at the deadline
                preexec_fn=lambda: os.sched_setaffinity(0, share),
            )
            if command.stdout:
                stdout.close()
        where = f"GPU {slots[slot]}" if slot is not None else "CPU"
        log(f"[{time.monotonic() - start:6.0f} s] {job.name} step {step + 1}/{len(job.steps)} on {where}")
        return _Running(job, slot, step, process, time.monotonic(), path)

    while pending or running:
        busy = {r.slot for r in running}
        for job in sorted(pending, key=lambda j: -priority[j.name]):
            failed_before = [a for a in job.after if a in status and status[a] != "ok"]
            if failed_before:
                status[job.name] = f"skipped: {', '.join(failed_before)} did not finish"
                pending.remove(job)
                continue
            if not all(status.get(a) == "ok" for a in job.after):
                continue
            if not job.gpu:
                running.append(launch(job, None, 0))
                pending.remove(job)
                continue
            free = [s for s in range(len(slots)) if s not in busy]
            if free:
                running.append(launch(job, free[0], 0))
                busy.add(free[0])
                pending.remove(job)
        time.sleep(0.2)
        if time.monotonic() - start > deadline_s:
            for r in running:
                os.killpg(r.process.pid, signal.SIGTERM)
                r.process.wait()
                status[r.job.name] = f"stopped: still running at the {deadline_s:.0f} s deadline"
            for job in pending:
                status[job.name] = "stopped: not started by the deadline"
            break
        for r in list(running):
            rc = r.process.poll()
            if rc is None:
                continue
            running.remove(r)
            step = r.job.steps[r.step]
            if rc != 0 and not step.optional:
                status[r.job.name] = f"failed: step {r.step + 1} exited {rc} (log: {r.log})"
                continue
            if r.step + 1 < len(r.job.steps):
                running.append(launch(r.job, r.slot, r.step + 1))
            else:
                status[r.job.name] = "ok"
                log(f"[{time.monotonic() - start:6.0f} s] {r.job.name} done")
    return status
