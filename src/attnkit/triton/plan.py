"""Which kernels run a problem on the Triton path, decided once per problem, here.

A :class:`KernelPlan` names the kind of kernel of each pass:

* forward: ``"split_kv"`` (the split-KV decode forward, :func:`attnkit.triton.decode.use_split_kv`),
  ``"gluon"`` (the warp-specialized Hopper forward, :func:`attnkit.triton.gluon.route.routed`),
  else ``"plain"`` (the fused FlashAttention-2 forward of :mod:`attnkit.triton.forward_kernels`);
* backward: ``"gluon"`` (the warp-specialized Hopper backward,
  :mod:`attnkit.triton.gluon.backward_launch`, where :func:`attnkit.triton.gluon.route.routed`
  accepts the problem's ``"backward"`` pass), else ``"plain"``
  (:mod:`attnkit.triton.backward_kernels`).

The rules are tried in order (:data:`FORWARD_KINDS`, :data:`BACKWARD_KINDS`); the first that
accepts the problem names the kind, and ``"plain"`` takes the rest. Adding a kind of kernel is
an entry there and a branch in :class:`attnkit.triton.PlannedKernels`, which runs what the plan
names. The Gluon backward, for example, is: its problem rule in
:data:`attnkit.triton.gluon.support.PASS_SUPPORT` (``"backward"``), ``"backward"`` in
:data:`attnkit.triton.gluon.config.PASSES` (its configs and routed cells in each GPU's table,
measured by ``python -m attnkit_tools.tune.configs --gluon --passes backward``),
``("gluon", partial(routed, pass_name="backward"))`` in :data:`BACKWARD_KINDS`, and
``PlannedKernels.backward`` launching it. A planned Gluon pass runs only on tensors the Gluon
layout rule accepts (:func:`attnkit.triton.gluon.support.layout_ok`; for the backward also a
contiguous log-sum-exp); other layouts run the plain kernels of the same problem.

Both backward kinds are deterministic (every gradient element written by one program, in a
fixed order, no atomics), so ``torch.use_deterministic_algorithms(True)`` excludes neither.

:func:`plan_kernels` is pure (the problem, the device's table, ``$ATTNKIT_GLUON``); the Triton
path asks it once per problem (:class:`attnkit.triton.PlannedKernels`, memoised, and carried by
the registry's :class:`~attnkit.prepared.PreparedRun` as its ``plan``), so a training call runs
the decision instead of making it again; :func:`attnkit.triton.forget_plans` makes a changed
switch or table take effect.

The thresholds the rules compare against live beside them and are importable from here, for
tests of the dispatch boundaries: :data:`SPLIT_KV_POLICY` (the split-KV rule's
:class:`~attnkit.triton.decode.DecodeConfig`), :data:`GLUON_MIN_SCORES` (the Gluon size floor)
and :func:`gluon_routed_cells` (a GPU's measured cells, from its config table).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from attnkit.inputs import AttentionProblem
from attnkit.triton.config import CONFIG_DIR
from attnkit.triton.decode import DEFAULT_DECODE_CONFIG, use_split_kv
from attnkit.triton.gluon.config import PASSES, device_section, packaged_section, routed_cells
from attnkit.triton.gluon.route import GLUON_MIN_SCORES, routed

#: The split-KV rule's policy (:func:`attnkit.triton.decode.use_split_kv`).
SPLIT_KV_POLICY = DEFAULT_DECODE_CONFIG
__all__ = [
    "BACKWARD_KINDS", "FORWARD_KINDS", "GLUON_MIN_SCORES", "PLAIN", "SPLIT_KV_POLICY", "KernelPlan",
    "gluon_routed_cells", "packaged_routed_cells", "plan_kernels",
]  # fmt: skip


def gluon_routed_cells(device: torch.device, pass_name: str = "forward") -> dict[tuple[int, bool], int]:
    """(head dim, causal) -> the smallest N whose ``pass_name`` runs on the Gluon kernel on
    ``device`` (its table's measured cells; {} off a GPU with a table)."""
    return routed_cells(device_section(device), pass_name)


def packaged_routed_cells() -> dict[tuple[str, int, bool], int]:
    """(pass, head dim, causal) -> the smallest N routed to a Gluon kernel on any GPU model whose
    table ships with attnkit: where some GPU switches kernels (the installed suite's dispatch
    boundaries, :func:`attnkit.triton.dispatch_boundaries`)."""
    cells: dict[tuple[str, int, bool], int] = {}
    for path in sorted(CONFIG_DIR.glob("*.json")):
        section = packaged_section(path.stem)
        for pass_name in PASSES:
            for (dim, causal), n in routed_cells(section, pass_name).items():
                key = (pass_name, dim, causal)
                cells[key] = min(n, cells.get(key, n))
    return cells


Rule = Callable[[AttentionProblem], bool]

#: Forward kinds other than ``"plain"``, in the order they are tried.
FORWARD_KINDS: tuple[tuple[str, Rule], ...] = (
    ("split_kv", use_split_kv),
    ("gluon", partial(routed, pass_name="forward")),
)
#: Backward kinds other than ``"plain"``, in the order they are tried.
BACKWARD_KINDS: tuple[tuple[str, Rule], ...] = (("gluon", partial(routed, pass_name="backward")),)

FORWARDS = ("plain", *(name for name, _ in FORWARD_KINDS))
BACKWARDS = ("plain", *(name for name, _ in BACKWARD_KINDS))


@dataclass(frozen=True)
class KernelPlan:
    """The kind of kernel each pass of one problem runs (module docstring)."""

    forward: str = "plain"
    backward: str = "plain"

    def __post_init__(self) -> None:
        if self.forward not in FORWARDS:
            raise ValueError(f"KernelPlan.forward: expected one of {FORWARDS}, got {self.forward!r}")
        if self.backward not in BACKWARDS:
            raise ValueError(f"KernelPlan.backward: expected one of {BACKWARDS}, got {self.backward!r}")


#: The plan of a run with an explicit tile config or TMA choice (a tuner's, a test's): the
#: plain kernels, which are what such a run times.
PLAIN = KernelPlan()


def plan_kernels(problem: AttentionProblem) -> KernelPlan:
    """The plan of ``problem`` (head dims as the kernels run them, :mod:`attnkit.triton.padding`)."""
    return KernelPlan(forward=_first(FORWARD_KINDS, problem), backward=_first(BACKWARD_KINDS, problem))


def _first(kinds: tuple[tuple[str, Rule], ...], problem: AttentionProblem) -> str:
    return next((name for name, rule in kinds if rule(problem)), "plain")
