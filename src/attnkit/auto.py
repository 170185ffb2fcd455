"""What ``backend="auto"`` tries first: the fastest measured path per problem class and GPU model.

Dispatch is data. ``auto_tables/<gpu_key>.json`` holds, per *cell* (16-bit dtype, head dim,
causal or not, sequence length, and whether the call is inference or a training step), each
path's measured time and the fastest; it is written by ``python -m attnkit_tools.tune.auto_table``
on that GPU and committed with its provenance. At plan time (once per call signature) a problem
that falls in a measured class gets its cell's paths, fastest first, ahead of the fallback
order (:func:`fallback_order`: the backends that declare an :attr:`~attnkit.Backend.auto_rank`,
lowest first; attnkit's own declare theirs in :mod:`attnkit.builtins`); every other problem, and
every device without a table, gets the fallback order alone. A path the table puts first still has
to accept the problem (its support checks): one that declines is skipped exactly as in the
fallback order.

Which class a problem falls in (:func:`cell_key`):

* 16-bit inputs (bf16 and fp16 share the bf16 measurements: the same kernels at the same
  speed), on a CUDA device whose model has a table;
* as many queries as keys and no sliding window (the measured grid: decode shapes and windows
  keep the fallback order, whose first path, Triton, reads only the visible keys);
* ``head_dim == value_dim`` equal to a measured head dim;
* the sequence length rounds down to the nearest measured length (below the shortest, the
  shortest);
* the pass: ``"fwd"`` for a call that records no backward, ``"fwd+bwd"`` for one that does (a
  training step's forward is chosen by the cost of the forward and backward together).

Under ``torch.use_deterministic_algorithms(True)`` a call that records a backward keeps, of
that order, only the paths whose backward is then deterministic on the call's device, as each
backend declares it (:func:`deterministic_order`), whatever the table says is fastest.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch

from attnkit.device import gpu_key
from attnkit.inputs import AttentionProblem
from attnkit.registry import get_backend, registered_backends

TABLE_DIR = Path(__file__).parent / "auto_tables"

#: Environment variable naming a JSON table to use instead of the packaged one.
TABLE_ENV = "ATTNKIT_AUTO_TABLE"

#: Version of the table format this module reads (``format`` in the JSON).
TABLE_FORMAT = 1

PASSES = ("fwd", "fwd+bwd")
_MEASURED_DTYPES = (torch.bfloat16, torch.float16)


def cell_key(problem: AttentionProblem, training: bool, seq_lens: tuple[int, ...]) -> tuple | None:
    """``(head_dim, causal, seq_len, pass)`` of the measured cell ``problem`` falls in, or None
    when it is outside the measured classes (see the module's docstring)."""
    if (
        problem.dtype not in _MEASURED_DTYPES
        or problem.q_len != problem.kv_len
        or problem.has_window
        or problem.head_dim != problem.value_dim
        or not seq_lens
    ):
        return None
    below = [n for n in seq_lens if n <= problem.q_len]
    seq_len = max(below) if below else min(seq_lens)
    return problem.head_dim, problem.causal, seq_len, "fwd+bwd" if training else "fwd"


class AutoTable:
    """One GPU model's measurements: each cell's paths, fastest first."""

    def __init__(self, data: dict, source: str) -> None:
        if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT or "cells" not in data:
            raise ValueError(
                f"{source}: not an auto table of format {TABLE_FORMAT} (expected keys 'format' and 'cells', "
                f"got {sorted(data) if isinstance(data, dict) else type(data).__name__})"
            )
        self.source = source
        self.gpu_key = data.get("gpu_key")
        self.provenance = data.get("provenance", {})
        self._order: dict[tuple, tuple[str, ...]] = {}
        for cell in data["cells"]:
            times = {name: ms for name, ms in cell["ms"].items() if ms is not None}
            key = (cell["head_dim"], cell["causal"], cell["seq_len"], cell["pass"])
            if cell["pass"] not in PASSES:
                raise ValueError(f"{source}: cell {key}: pass must be one of {PASSES}")
            self._order[key] = tuple(sorted(times, key=times.__getitem__))
        self.seq_lens = tuple(sorted({key[2] for key in self._order}))
        #: Every path some cell measured: what ``auto`` may take from this table.
        self.paths = frozenset(name for order in self._order.values() for name in order)

    def order(self, problem: AttentionProblem, training: bool) -> tuple[str, ...]:
        """The measured paths of ``problem``'s cell, fastest first; () outside the table."""
        key = cell_key(problem, training, self.seq_lens)
        return self._order.get(key, ()) if key is not None else ()


@functools.cache
def _load(path: str) -> AutoTable:
    with open(path) as f:
        return AutoTable(json.load(f), path)


def table_path(device: torch.device) -> Path | None:
    """The table for ``device``: $ATTNKIT_AUTO_TABLE if set, else the packaged one of its GPU
    model, else None (the CPU, or a GPU never measured)."""
    override = os.environ.get(TABLE_ENV)
    if override:
        return Path(override)
    if device.type != "cuda":
        return None
    path = TABLE_DIR / f"{gpu_key(device)}.json"
    return path if path.exists() else None


def fallback_order() -> tuple[str, ...]:
    """The backends ``auto`` tries where no measured cell decides, in order: every registered
    backend that declares an :attr:`~attnkit.Backend.auto_rank`, lowest rank first, equal ranks
    in the order they registered. It loads no entry point (an installed package's backend
    cannot declare a rank: :mod:`attnkit.registry`)."""
    ranked = [backend for backend in registered_backends() if backend.auto_rank is not None]
    return tuple(backend.name for backend in sorted(ranked, key=lambda backend: backend.auto_rank))


def auto_order(problem: AttentionProblem, training: bool) -> tuple[str, ...]:
    """The backends ``auto`` tries for ``problem``, in order: its measured cell's paths fastest
    first, then the rest of :func:`fallback_order`. Read once per call signature."""
    path = table_path(problem.device)
    measured = _load(str(path)).order(problem, training) if path is not None else ()
    return (*measured, *(name for name in fallback_order() if name not in measured))


def deterministic_order(
    order: tuple[str, ...], warn_only: bool, device: torch.device | str
) -> tuple[str, ...]:
    """The paths of ``order`` whose backward is deterministic on ``device`` under
    ``torch.use_deterministic_algorithms(True, warn_only=warn_only)``, in ``order``'s order, as
    each backend declares it (:meth:`attnkit.registry.Backend.is_deterministic`; attnkit's own in
    :mod:`attnkit.builtins`). With ``warn_only=True`` PyTorch only warns where it has no
    deterministic kernel, so the paths kept are those deterministic in every mode; with
    ``warn_only=False`` also those PyTorch then makes deterministic
    (``deterministic_when_enforced``). A path that declares neither (cuDNN's, flex, most plugins)
    is not known to be deterministic; a name not registered is left out."""
    kept = []
    for name in order:
        try:
            backend = get_backend(name)
        except ValueError:
            continue
        if backend.is_deterministic(device, enforced=not warn_only):
            kept.append(name)
    return tuple(kept)
