"""The code on each side of a comparison: the folders a side imports from, the digest that names
that code, and the paired session that runs both sides.

In attnkit's own repository (or outside a git checkout) the code compared is attnkit: a side is
the ``src`` folder of a commit or checkout, its digest that of its ``attnkit`` package. In any
other repository (:mod:`attnkit_perf.measure.repo`) it is the repository's import roots, over the
installed attnkit on both sides, and the backends the run names that are not attnkit's own are
the ones each side must import from its own roots. Paired mode, stored mode's adjudication and
bisect all build their sides here, so the three compare the same code.
"""

from __future__ import annotations

from pathlib import Path

from attnkit_perf.measure.checkout import materialise_base, materialise_roots
from attnkit_perf.measure.machine import source_digest
from attnkit_perf.measure.paired_session import PairedSession
from attnkit_perf.measure.processes import ANSWER_TIMEOUT_S
from attnkit_perf.measure.repo import Repository, checkout_of
from attnkit_perf.run.backend_choice import external_backends


def is_external(repository: Repository | None) -> bool:
    """Whether the code compared is a repository other than attnkit's (its backends)."""
    return repository is not None and not repository.own


def materialise(
    ref: str, repository: Repository | None, rootpath: Path, dest: Path
) -> tuple[list[Path], str]:
    """``(import roots, commit or checkout label)`` of the side named by ``ref``: a git ref of the
    repository (extracted into ``dest``) or the path of another checkout. Raises
    :class:`attnkit_perf.measure.checkout.BaseError` with the reason when it cannot."""
    if not is_external(repository):
        src, label = materialise_base(ref, Path(rootpath), dest)
        return [src], label
    return materialise_roots(ref, repository.top, dest, repository.roots)


def code_digest(roots: list[Path], repository: Repository | None) -> str:
    """The digest of the code a side with import ``roots`` runs: its attnkit package, or (in
    another repository) every root."""
    external = is_external(repository)
    return "+".join(source_digest(Path(r) if external else Path(r) / "attnkit") for r in roots)


def working_tree_roots(repository: Repository | None) -> list[Path]:
    """The import roots of the code this process runs: the working tree's, or (in attnkit's own
    repository) the folder the imported attnkit comes from."""
    if is_external(repository):
        return repository.paths()
    import attnkit

    return [Path(attnkit.__file__).resolve().parent.parent]


def open_paired(
    base: list[Path],
    head: list[Path],
    commits: dict[str, str | None],
    repository: Repository | None,
    backends: list[str] | None,
    *,
    shard: int | None = None,
    answer_timeout_s: float = ANSWER_TIMEOUT_S,
) -> PairedSession:
    """Worker processes of both sides: ``base`` and ``head`` import roots (from
    :func:`materialise` or :func:`working_tree_roots`)."""
    import attnkit_perf

    checked, checkouts = None, None
    if is_external(repository):
        first = repository.roots[0]
        checked = external_backends(backends)
        checkouts = {"base": checkout_of(base[0], first), "head": checkout_of(head[0], first)}
    return PairedSession(
        base,
        head,
        Path(attnkit_perf.__file__).parent,
        commits,
        shard=shard,
        answer_timeout_s=answer_timeout_s,
        checked_backends=checked,
        checkouts=checkouts,
    )
