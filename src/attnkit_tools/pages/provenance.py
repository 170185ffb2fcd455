"""What every generated page carries: the command that wrote it and the machine it ran on.

A page in docs/ is trusted only as far as it says how to reproduce it, so each tool that writes
one heads it with :func:`produced_by` and :func:`provenance_table` (GPU, driver, CUDA, torch,
triton, commit: :func:`attnkit_perf.bench.provenance`'s keys). A page names no scratch
path: an absolute path in its command or its provenance is written relative to the working
directory when it lies inside it, else as its file name (:func:`public_path`).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence

import torch


def public_path(text: str) -> str:
    """``text`` with every absolute path in it made public: relative to the working directory
    when inside it, else its file name (a scratch directory means nothing to a reader)."""
    here = os.getcwd()

    def shorten(match: re.Match) -> str:
        path = match.group(0)
        if path == here or path.startswith(here + os.sep):
            return os.path.relpath(path, here)
        return os.path.basename(path.rstrip(os.sep)) or path

    return _ABSOLUTE_PATH.sub(shorten, text)


#: An absolute POSIX path of two parts or more (``/tmp/w/x.json``), not a lone ``/`` or a ratio.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.+-]+/)+[\w.+-]*")


def produced_by(tool: str, argv: Sequence[str]) -> str:
    """``python -m attnkit_tools.<tool> <argv>`` (``tool`` as ``pages.grid``), quoted for a
    shell, as a page states it (scratch paths made public: :func:`public_path`)."""
    return public_path(shlex.join(["python", "-m", f"attnkit_tools.{tool}", *map(str, argv)]))


def restated(recorded: str, tool: str) -> str:
    """A saved measurement's ``recorded`` command (``python -m MODULE ARGS...``) as ``tool`` runs
    it now: the recorded arguments given to :func:`produced_by`. A page rendered again from a
    measurement names a command that still runs, even when the tool has moved since."""
    words = shlex.split(recorded)
    if len(words) < 3 or words[:2] != ["python", "-m"]:
        raise ValueError(f"a saved command is 'python -m MODULE ARGS...', not {recorded!r}")
    return produced_by(tool, words[3:])


def saved_command(saved: dict, tool: str, canonical: Sequence[str]) -> str:
    """The command a page rendered again from the measurement ``saved`` names: its recorded
    command as ``tool`` runs it now (:func:`restated`); a measurement saved without one was made
    by the canonical command, ``tool`` with the arguments ``canonical``."""
    if "command" in saved:
        return restated(saved["command"], tool)
    return produced_by(tool, canonical)


def provenance_table(info: dict) -> list[str]:
    """The provenance as a two-column Markdown table, one key a row, in ``info``'s order
    (scratch paths made public: :func:`public_path`)."""
    rows = (f"| {key} | {public_path(str(value))} |" for key, value in info.items())
    return ["| | |", "| --- | --- |", *rows]


def require_cuda(tool: str) -> None:
    """Stop with a message naming ``tool`` when no CUDA GPU is visible: its figures are GPU
    timings, and a CPU run would write a page of numbers that mean nothing."""
    if not torch.cuda.is_available():
        raise SystemExit(
            f"{tool} times kernels on a CUDA GPU, and none is visible here "
            "(torch.cuda.is_available() is False): run it on a GPU machine"
        )
