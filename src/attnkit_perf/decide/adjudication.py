"""Adjudication: a stored "slower" re-decided by paired mode against the baseline's own commit
before it fails (:mod:`attnkit_perf.run.stored_recheck` measures it).

Stored mode compares this machine with another at another time: whatever the two machines
differ by that the calibration does not divide out reads as a change of the code, and
re-measuring on this machine against the same baseline confirms it again. Paired mode measures
the baseline's code and this checkout on the same GPU in the same job, so the machine is the
same on both sides. When the baseline's provenance names a commit that this repository holds
and whose code is the code the baseline recorded (its ``source`` digest), the suspect is
measured in paired mode, held to the stored threshold (the question stored mode asked, with
better evidence), and paired mode's outcome is the row's; the reason says which mode decided.
When the source is not available the stored decision stands, and the reason says why.
"""

from __future__ import annotations

from collections.abc import Mapping

from attnkit_perf.decide.gate import Decision


def source_problem(provenance: Mapping) -> str | None:
    """Why the baseline's code cannot be rebuilt from its provenance alone, or None."""
    commit = provenance.get("commit")
    if not commit:
        return "the baseline names no commit"
    if str(commit).endswith("+dirty"):
        return f"the baseline was recorded from a tree with local changes ({commit})"
    return None


def _ratio(d: Decision) -> str:
    return "x-" if d.ratio is None else f"x{d.ratio:.4f}"


def adjudicated(stored: Decision, paired: Decision, commit: str) -> Decision:
    """The row of a stored ``slower`` that paired mode against ``commit`` re-measured: paired
    mode's outcome and evidence; the stored one kept in ``extra["adjudication"]``."""
    reason = (
        f"adjudicated by paired vs {commit[:12]}: {_ratio(paired)}, {paired.outcome} ({paired.reason}); "
        f"stored said {_ratio(stored)}, {stored.outcome} ({stored.reason})"
    )
    decision = Decision(
        paired.outcome,
        ratio=paired.ratio,
        ci=paired.ci,
        p=paired.p,
        threshold=paired.threshold,
        alpha=paired.alpha,
        reason=reason,
        extra=dict(stored.extra),
    )
    decision.extra["adjudication"] = {
        "mode": "paired",
        "commit": commit,
        "outcome": paired.outcome,
        "paired": dict(paired.extra),
        "stored": {
            "outcome": stored.outcome,
            "ratio": stored.ratio,
            "ci": None if stored.ci is None else list(stored.ci),
        },
    }
    return decision


def kept(stored: Decision, why: str) -> Decision:
    """A stored ``slower`` that could not be adjudicated: it stands, and says why."""
    stored.reason = f"{stored.reason}; not adjudicated by paired mode ({why}): the stored decision stands"
    stored.extra["adjudication"] = {"mode": None, "why": why}
    return stored
