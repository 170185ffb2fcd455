"""The base side of paired mode: a git ref or another checkout, as a ``src`` folder to import."""

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
    """``(src folder, commit or path label)`` of the base named by ``ref``.

    ``ref`` is the path of another checkout (its ``src/attnkit`` is used in place), or a git ref
    of ``repo`` (its ``src/`` tree is extracted into ``dest``, untouched by the working tree).
    """
    path = Path(ref)
    if path.is_dir():
        src = path / "src"
        if not (src / "attnkit" / "__init__.py").is_file():
            raise BaseError(f"--attnkit-base={ref}: the folder has no src/attnkit package")
        return src.resolve(), f"checkout {path.resolve()}"
    try:
        commit = _git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}")
    except BaseError as err:
        raise BaseError(f"--attnkit-base={ref}: neither a folder nor a commit of {repo} ({err})") from err
    archive = _git(repo, "archive", "--format=tar", commit, "src", binary=True)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    src = dest / "src"
    if not (src / "attnkit" / "__init__.py").is_file():
        raise BaseError(f"--attnkit-base={ref} ({commit}) has no src/attnkit package")
    return src.resolve(), commit
