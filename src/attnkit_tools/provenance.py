"""What every generated page carries: the command that wrote it and the machine it ran on.

A page in docs/ is trusted only as far as it says how to reproduce it, so each tool that writes
one heads it with :func:`produced_by` and :func:`provenance_table` (GPU, driver, CUDA, torch,
triton, commit: :func:`attnkit_perf.measure.machine.provenance`'s keys).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

import torch


def produced_by(module: str, argv: Sequence[str]) -> str:
    """``python -m attnkit_tools.<module> <argv>``, quoted for a shell, as a page states it: a
    path inside the working directory relative to it, any other absolute path (a scratch folder
    of the machine that ran it, ``/tmp/w/per_call.json``) by its file name alone."""
    return shlex.join(["python", "-m", f"attnkit_tools.{module}", *map(_portable_argument, argv)])


def provenance_table(info: dict) -> list[str]:
    """The provenance as a two-column Markdown table, one key a row, in ``info``'s order; absolute
    paths of the machine that ran it are shown by their file name."""
    return [
        "| | |",
        "| --- | --- |",
        *(f"| {key} | {without_local_paths(str(value))} |" for key, value in info.items()),
    ]


#: An absolute path of at least two parts, not inside a word (a URL's path is left alone).
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.+-]+/)+([\w.+-]+)")


def without_local_paths(text: str) -> str:
    """``text`` with each absolute path replaced by its last part."""
    return _ABSOLUTE_PATH.sub(lambda match: match.group(1), text)


def _portable_argument(argument: str) -> str:
    option, equals, value = argument.partition("=") if argument.startswith("--") else ("", "", argument)
    path = Path(value)
    if not path.is_absolute():
        return argument
    try:
        value = str(path.relative_to(Path.cwd()))
    except ValueError:  # outside the working directory: a scratch path of that machine
        value = path.name
    return f"{option}{equals}{value}"


def require_cuda(tool: str) -> None:
    """Stop with a message naming ``tool`` when no CUDA GPU is visible: its figures are GPU
    timings, and a CPU run would write a page of numbers that mean nothing."""
    if not torch.cuda.is_available():
        raise SystemExit(
            f"{tool} times kernels on a CUDA GPU, and none is visible here "
            "(torch.cuda.is_available() is False): run it on a GPU machine"
        )
