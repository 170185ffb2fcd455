"""The files a diff touches: from a base commit to the working tree, committed, uncommitted and
untracked alike; a rename counts as both its old and its new path, a deletion as its path."""

from __future__ import annotations

import subprocess
from pathlib import Path


class ChangesError(RuntimeError):
    """git could not say what changed (no repository, unknown ref)."""


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ChangesError(f"git {' '.join(args)} in {root}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def changed_files(root: Path, base: str) -> list[str]:
    """Paths (relative to the repository root, sorted) that differ between commit ``base`` and
    the working tree, untracked files included (ignored ones not). The base itself, not its
    merge base with HEAD: paired mode measures the base's code against this tree, so every
    difference between the two counts (a PR's base is its merge base already)."""
    top = Path(_git(root, "rev-parse", "--show-toplevel").strip())
    since = _git(top, "rev-parse", "--verify", "--end-of-options", f"{base}^{{commit}}").strip()
    paths: set[str] = set()
    # -M: a rename is listed with both its paths (R100<TAB>old<TAB>new).
    for line in _git(top, "diff", "--name-status", "-M", since, "--").splitlines():
        _status, *names = line.split("\t")
        paths.update(names)
    paths.update(_git(top, "ls-files", "--others", "--exclude-standard").splitlines())
    return sorted(p for p in paths if p)


def text_at(root: Path, commit: str, path: str) -> str | None:
    """``path``'s text at ``commit``, or None where it did not exist there."""
    try:
        return _git(root, "show", f"{commit}:{path}")
    except ChangesError:
        return None
