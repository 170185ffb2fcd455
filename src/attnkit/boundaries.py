"""Dispatch boundaries: the sizes at which a backend switches code paths, declared so that the
installed suite tests both sides of each (:mod:`attnkit.suite.test_scale`).

A kernel library rarely runs one kernel: FlashAttention-3 splits the keys for decode shapes,
FlashInfer picks a scheduler by batch size, attnkit's ``triton`` runs a Gluon forward from
N = 4096 and a split-KV forward for few queries over many keys. A bug on one side of such a
switch is invisible to tests drawn on the other. A backend declares each switch as a
:class:`DispatchBoundary`: the quantity that decides (:data:`AXES`), the first value on the far
side, and the problem around it (the other fields that must hold for that switch to apply); the
suite then runs the problem just below, at, and just above the value, judged by the tolerance
rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: The quantities a boundary may be declared over, and how the suite moves a problem along each.
AXES = {
    "q_len": "N, queries per head",
    "kv_len": "M, keys per head",
    "seq_len": "N = M, both together",
    "head_dim": "D = Dv",
    "batch_heads": "B * Hq, moved through B",
    "scores": "B * Hq * N * M, moved through M",
}

#: The fields of :class:`~attnkit.inputs.AttentionProblem` a drawn problem sets directly (scale
#: and window come from the call's arguments, the device from its tensors); the suite's
#: strategies (:func:`attnkit.testing.strategies.attention_problem`) take the same.
SHAPE_FIELDS = (
    "batch",
    "q_heads",
    "kv_heads",
    "q_len",
    "kv_len",
    "head_dim",
    "value_dim",
    "causal",
    "dtype",
)
#: The fields of the problem around a boundary: the shape, and ``window`` a (left, right) pair.
PROBLEM_FIELDS = (*SHAPE_FIELDS, "window")


@dataclass(frozen=True)
class DispatchBoundary:
    """One size at which a backend switches code paths.

    Args:
        name: what switches, in words (shown in the test's failure), e.g.
            ``"Gluon forward from N = 4096 (D=128, not causal)"``.
        axis: the deciding quantity, a key of :data:`AXES`.
        at: the first value of ``axis`` on the far side: the backend takes one path at
            ``at - 1`` and the other at ``at``.
        problem: the other fields of the problem for which this switch applies (some of
            :data:`PROBLEM_FIELDS`; unnamed ones take the suite's defaults: B = Hq = Hkv = 1,
            D = 64, not causal, float16). The axis' own field, if given, is overridden.
    """

    name: str
    axis: str
    at: int
    problem: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise TypeError(f"DispatchBoundary name: expected a non-empty str, got {self.name!r}")
        if self.axis not in AXES:
            raise ValueError(
                f"DispatchBoundary {self.name!r}: axis must be one of {list(AXES)}, got {self.axis!r}"
            )
        if isinstance(self.at, bool) or not isinstance(self.at, int) or self.at < 2:
            raise ValueError(f"DispatchBoundary {self.name!r}: at must be an int >= 2, got {self.at!r}")
        unknown = set(self.problem) - set(PROBLEM_FIELDS)
        if unknown:
            raise ValueError(
                f"DispatchBoundary {self.name!r}: problem has unknown fields {sorted(unknown)}; "
                f"expected some of {PROBLEM_FIELDS}"
            )
        object.__setattr__(self, "problem", MappingProxyType(dict(self.problem)))


def check_boundaries(owner: str, boundaries) -> tuple[DispatchBoundary, ...]:
    """``boundaries`` as a tuple, each checked to be a :class:`DispatchBoundary` (a TypeError
    naming ``owner`` otherwise)."""
    items = tuple(boundaries or ())
    wrong = [b for b in items if not isinstance(b, DispatchBoundary)]
    if wrong:
        raise TypeError(
            f"{owner}: dispatch_boundaries must hold attnkit.DispatchBoundary objects, got {wrong[0]!r}"
        )
    return items
