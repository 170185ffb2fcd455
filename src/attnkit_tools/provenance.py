"""What every generated page carries: the command that wrote it and the machine it ran on.

A page in docs/ is trusted only as far as it says how to reproduce it, so each tool that writes
one heads it with :func:`produced_by` and :func:`provenance_table` (GPU, driver, CUDA, torch,
triton, commit: :func:`attnkit_perf.measure.machine.provenance`'s keys).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

import torch


def produced_by(module: str, argv: Sequence[str]) -> str:
    """``python -m attnkit_tools.<module> <argv>``, quoted for a shell, as a page states it."""
    return shlex.join(["python", "-m", f"attnkit_tools.{module}", *argv])


def provenance_table(info: dict) -> list[str]:
    """The provenance as a two-column Markdown table, one key a row, in ``info``'s order."""
    return ["| | |", "| --- | --- |", *(f"| {key} | {value} |" for key, value in info.items())]


def require_cuda(tool: str) -> None:
    """Stop with a message naming ``tool`` when no CUDA GPU is visible: its figures are GPU
    timings, and a CPU run would write a page of numbers that mean nothing."""
    if not torch.cuda.is_available():
        raise SystemExit(
            f"{tool} times kernels on a CUDA GPU, and none is visible here "
            "(torch.cuda.is_available() is False): run it on a GPU machine"
        )
