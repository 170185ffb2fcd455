"""Paired mode's worker processes seen from the controller: one process's pipe of requests and
answers with their timeouts (:class:`WorkerProcess`; the process's own side is
:mod:`attnkit_perf.measure.worker`), the error that names the side whose worker failed, and
where an xdist shard places its workers (which GPU, which core)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
from pathlib import Path


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (ids or UUIDs)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [x.strip() for x in listed.split(",") if x.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def shard_problem(shards: int, gpus: list[str]) -> str | None:
    """Why ``shards`` xdist workers cannot each measure on a GPU of their own, or None. Two
    shards on one GPU would time each other's kernels: refused, never measured."""
    if shards > len(gpus):
        return (
            f"paired mode gives each xdist worker a GPU of its own: {shards} workers asked for "
            f"(-n {shards}), {len(gpus)} GPU(s) visible ({','.join(gpus) or 'none'}); "
            f"use -n {max(1, len(gpus))} or fewer"
        )
    return None


def placement(shard: int | None, cores: list[int], gpus: list[str]) -> tuple[int | None, str | None]:
    """The core that shard ``shard``'s worker processes are pinned to (None: leave them be, one
    core only) and the GPU they see (None: the caller's own). Counting cores from the end keeps
    the shards' workers off the cores where the pytest processes usually start."""
    slot = shard or 0
    core = cores[-1 - slot % len(cores)] if len(cores) > 1 else None
    gpu = gpus[slot % len(gpus)] if shard is not None and gpus else None
    return core, gpu


class WorkerError(RuntimeError):
    """A worker process failed in a way that is not about the benchmark; ``side`` says whose."""

    def __init__(self, message: str, side: str | None = None) -> None:
        super().__init__(message)
        self.side = side


#: Seconds a worker may take to answer one request (a prepare that compiles a side's kernels
#: included) before it is taken for hung and killed: a deadlocked kernel must not hang the gate.
ANSWER_TIMEOUT_S = 600.0
#: A worker's first answer waits for its imports, which a loaded machine can slow to minutes.
STARTUP_TIMEOUT_S = 600.0


class WorkerProcess:
    """One worker process (:mod:`attnkit_perf.measure.worker`) and its pipe: one JSON request
    a line, one answer a line, each answer awaited at most ``timeout_s``."""

    def __init__(self, side: str, index: int, env: dict, cwd: Path, timeout_s: float) -> None:
        self.side = side
        self.label = f"{side}[{index}]"
        self.timeout_s = timeout_s
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "attnkit_perf.measure.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # a worker's warnings and crashes reach the log as they happen
            text=True,
            env=env,
            cwd=cwd,
        )

    def send(self, request: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            code = self.proc.wait()
            op = request.get("op")
            raise WorkerError(f"{self.label} worker exited (status {code}) before {op}", self.side) from None

    def receive(self, op: str) -> dict:
        # One request, one line: nothing waits in the pipe's Python buffer between answers, so
        # select on the descriptor says whether the answer has begun to arrive.
        timeout_s = max(self.timeout_s, STARTUP_TIMEOUT_S) if op == "identify" else self.timeout_s
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            self.proc.kill()
            self.proc.wait()
            raise WorkerError(
                f"{self.label} worker did not answer {op} within {timeout_s:g} s and was killed", self.side
            )
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise WorkerError(f"{self.label} worker exited (status {code}) during {op}", self.side)
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        self.send(request)
        return self.receive(request.get("op"))

    def hang_up(self) -> None:
        """Ask the worker to exit (its input ends) without waiting for it."""
        if not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):  # it is gone already
                self.proc.stdin.close()

    def close(self) -> None:
        self.hang_up()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
