"""Paired mode's first question for a benchmark: does the head run the very same GPU work as the
base? The fingerprints (:mod:`attnkit_perf.measure.fingerprint`) of one call on each side are
compared launch by launch; both sides run in one environment, so identical launches of identical
binaries are the same GPU time, and the row needs no timing.

* **identical**: the same launches in the same order (kind, name, grid, block, shared memory,
  registers; a copy's or fill's bytes), and each Triton or Gluon kernel among them with the same
  binaries on both sides. A host-timed row is still decided on its host work
  (:mod:`attnkit_perf.decide.host`) and memory on its own rule: identity speaks for the GPU
  time alone.
* **differs**: the first difference is named (a kernel added or gone, another grid, another
  binary), and the row is timed as before.
* **unknown**: a side has no fingerprint (no CUDA device, a trace with no GPU work): timed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from attnkit_perf.decide.gate import Decision


@dataclass(frozen=True)
class Identity:
    """The two sides' fingerprints compared: ``outcome`` one of identical, differs, unknown."""

    outcome: str
    reason: str
    launches: int = 0

    @property
    def identical(self) -> bool:
        return self.outcome == "identical"


def compare_fingerprints(base: Mapping | None, head: Mapping | None) -> Identity:
    """The comparison of the base's and the head's fingerprint (module docstring)."""
    if not base or not head:
        missing = " and ".join(side for side, f in (("base", base), ("head", head)) if not f)
        return Identity("unknown", f"no launch fingerprint on the {missing} side")
    base_launches, head_launches = base["launches"], head["launches"]
    for i, (was, now) in enumerate(zip(base_launches, head_launches, strict=False)):
        if list(was) != list(now):
            return Identity("differs", f"launch {i + 1} differs: {_describe(was)} -> {_describe(now)}")
    if len(base_launches) != len(head_launches):
        longer, side = (
            (head_launches, "head") if len(head_launches) > len(base_launches) else (base_launches, "base")
        )
        extra = longer[min(len(base_launches), len(head_launches))]
        return Identity(
            "differs",
            f"{len(base_launches)} -> {len(head_launches)} launches (first only on the {side}: "
            f"{_describe(extra)})",
        )
    base_bins, head_bins = base.get("binaries", {}), head.get("binaries", {})
    for name in sorted(set(base_bins) | set(head_bins)):
        was, now = set(base_bins.get(name, ())), set(head_bins.get(name, ()))
        if was != now:
            # The digests are every binary of that name the side's process holds, so a
            # specialisation compiled for another row on one side only also shows here.
            return Identity(
                "differs",
                f"kernel {name}: other binaries on the head (the processes hold {len(was)} on the "
                f"base, {len(now)} on the head; {len(was - now)} only on the base, {len(now - was)} "
                "only on the head)",
            )
    kernels = sum(1 for kind, _, _ in head_launches if kind == "kernel")
    return Identity(
        "identical",
        f"identical GPU work on both sides ({kernels} kernel launches, {len(head_bins)} compiled "
        "binaries compared): not timed",
        launches=len(head_launches),
    )


def identity_decision(identity: Identity) -> Decision:
    """The GPU time's decision of a row whose fingerprints are identical: same, no ratio."""
    return Decision("same", reason=identity.reason, extra={"identity": identity.outcome})


def _describe(launch) -> str:
    kind, name, shape = launch
    shown = ", ".join(f"{key} {value}" for key, value in shape.items())
    return f"{kind} {name}" + (f" ({shown})" if shown else "")
