"""The base side of paired mode: a git ref or another checkout, as the folders to import from."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path


class BaseError(Exception):
    """The base cannot be built; the message says what was asked and why it failed."""


def _git(repo: Path, *args: str, binary: bool = False):
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    if result.returncode != 0:
        raise BaseError(f"git {' '.join(args)} failed in {repo}: {result.stderr.decode().strip()}")
    return result.stdout if binary else result.stdout.decode().strip()


def materialise_base(ref: str, repo: Path, dest: Path) -> tuple[Path, str]:
    """``(src folder, commit or path label)`` of attnkit's own base named by ``ref``: the path
    of another checkout (its ``src/attnkit`` is used in place), or a git ref of ``repo`` (its
    ``src/`` tree is extracted into ``dest``, untouched by the working tree)."""
    paths, label = materialise_roots(ref, repo, dest, ("src",), package="attnkit")
    return paths[0], label


def materialise_roots(
    ref: str, repo: Path, dest: Path, roots: tuple[str, ...], package: str | None = None
) -> tuple[list[Path], str]:
    """``(import root folders, commit or path label)`` of the base named by ``ref``.

    ``ref`` is the path of another checkout (its ``roots`` are used in place), or a git ref of
    ``repo`` (its ``roots`` are extracted into ``dest``, untouched by the working tree).
    ``package``: a package the first root must hold (attnkit, when attnkit itself is compared).
    """
    path = Path(ref)
    if path.is_dir():
        folders = [(path / root).resolve() for root in roots]
        if package is not None and not (folders[0] / package / "__init__.py").is_file():
            raise BaseError(f"--attnkit-base={ref}: the folder has no {roots[0]}/{package} package")
        absent = [root for root, folder in zip(roots, folders, strict=True) if not folder.is_dir()]
        if absent:
            raise BaseError(f"--attnkit-base={ref}: the folder has no import root {', '.join(absent)}")
        return folders, f"checkout {path.resolve()}"
    try:
        commit = _git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}")
    except BaseError as err:
        raise BaseError(f"--attnkit-base={ref}: neither a folder nor a commit of {repo} ({err})") from err
    for root in roots:
        if root != "." and _git(repo, "ls-tree", "-d", "--name-only", commit, root) != root:
            raise BaseError(
                f"--attnkit-base={ref} ({commit[:12]}): the import root {root!r} is not a folder at that "
                f"commit of {repo} (the roots are [tool.attnkit] src of its pyproject.toml; they must "
                "exist on both sides of the comparison)"
            )
    archive = _git(repo, "archive", "--format=tar", commit, *roots, binary=True)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    folders = [(dest / root).resolve() for root in roots]
    if package is not None and not (folders[0] / package / "__init__.py").is_file():
        raise BaseError(f"--attnkit-base={ref} ({commit}) has no {roots[0]}/{package} package")
    return folders, commit
