"""The repository a perf run gates: the git checkout pytest runs in, and where its code is imported
from.

Paired mode compares two commits of that repository. Its **import roots** are the folders its
packages are imported from, relative to the repository's top, read from its ``pyproject.toml``::

    [tool.attnkit]
    src = ["src"]        # default: ["src"] when the repository has a src/ folder, else ["."]

A worker of either side puts that side's roots first on its ``PYTHONPATH``. In attnkit's own
repository (one of its roots holds the attnkit package) the comparison is of attnkit itself;
in any other repository both sides run the installed attnkit and the comparison is of the
repository's own code, e.g. a package registering a backend through an entry point.
"""

from __future__ import annotations

import importlib.machinery
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli where the standard library has no tomllib
    import tomli as tomllib

#: The key of the import roots, under ``[tool.attnkit]`` of the repository's pyproject.toml.
ROOTS_KEY = "src"


class RepositoryError(Exception):
    """The repository's configuration cannot be used; the message says where and why."""


@dataclass(frozen=True)
class Repository:
    """``top``: the git checkout's top folder; ``roots``: the import roots, relative to it (as
    POSIX paths, the form ``git archive`` takes); ``own``: whether it is attnkit's own."""

    top: Path
    roots: tuple[str, ...]
    own: bool

    def paths(self, checkout: Path | None = None) -> list[Path]:
        """The import roots as folders of ``checkout`` (default: this working tree)."""
        base = self.top if checkout is None else Path(checkout)
        return [(base / root).resolve() for root in self.roots]

    def describe_roots(self) -> str:
        return ", ".join(repr(r) for r in self.roots)


def git_top(folder: Path) -> Path | None:
    """The top folder of the git checkout holding ``folder``, or None outside one."""
    try:
        result = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return None
    return Path(result.stdout.strip()).resolve() if result.returncode == 0 else None


def import_roots(top: Path) -> tuple[str, ...]:
    """The import roots configured in ``top/pyproject.toml``, else the default; each checked to
    be a relative folder of the working tree."""
    pyproject = top / "pyproject.toml"
    configured = None
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf8"))
        except tomllib.TOMLDecodeError as err:
            raise RepositoryError(f"{pyproject} is not valid TOML: {err}") from err
        configured = data.get("tool", {}).get("attnkit", {}).get(ROOTS_KEY)
    where = f"[tool.attnkit] {ROOTS_KEY} in {pyproject}"
    if configured is None:
        return ("src",) if (top / "src").is_dir() else (".",)
    if not isinstance(configured, list) or not configured or not all(isinstance(r, str) for r in configured):
        raise RepositoryError(
            f'{where}: expected a non-empty list of folders, e.g. ["src"]; got {configured!r}'
        )
    roots = []
    for root in configured:
        path = PurePosixPath(root)
        if path.is_absolute() or ".." in path.parts:
            raise RepositoryError(f"{where}: {root!r} must be a folder inside the repository")
        if not (top / path).is_dir():
            raise RepositoryError(f"{where} names {root!r}, which is not a folder of {top}")
        roots.append(str(path))
    return tuple(dict.fromkeys(roots))


def find_repository(rootpath: Path, invocation_dir: Path) -> Repository | None:
    """The git repository of pytest's rootdir (else of the current folder), with its import
    roots; None outside any git checkout (the run then compares attnkit's own source, as
    imported). It is attnkit's own when one of its roots holds the attnkit package (the code
    compared is then attnkit, wherever this process imports it from: a copy of the checkout)."""
    top = git_top(rootpath) or git_top(invocation_dir)
    if top is None:
        return None
    roots = import_roots(top)
    own = any((path / "attnkit" / "__init__.py").is_file() for path in Repository(top, roots, False).paths())
    return Repository(top, roots, own)


def module_origin(module: str, paths: list[Path]) -> Path | None:
    """Where the top-level package (or module) of ``module`` is found in ``paths``, searched in
    order as the import system would, or None when none of them holds it."""
    top = module.split(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(top, [str(p) for p in paths])
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(spec.origin).resolve() if spec.origin else None


def checkout_of(folder: Path | str, root: str) -> Path:
    """The checkout folder that holds import root ``root`` (relative) at ``folder``."""
    depth = len(PurePosixPath(root).parts)  # "." has none
    return Path(folder).parents[depth - 1] if depth else Path(folder)


def is_under(path: Path | str, folders: list[Path]) -> bool:
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(folder) for folder in folders)


def backends_absent(side: str, roots: list[Path], found: dict, checked: tuple[str, ...]) -> dict[str, str]:
    """Which of the ``checked`` backends a side of paired mode does not have (-> why), from what
    its worker ``found`` (``{"found": {name: {"module", "file"}}}`` or ``{"error": why}``);
    :class:`RepositoryError` when it imported one it has from outside its ``roots``."""
    roots = [Path(r).resolve() for r in roots]
    if "error" in found:
        if side == "head":
            raise RepositoryError(f"could not load the backends: {found['error']}")
        return dict.fromkeys(
            checked, f"its backends do not load there ({found['error'].strip().splitlines()[-1]})"
        )
    absent = {}
    for name, where in found["found"].items():
        module, file = where.get("module"), where.get("file")
        if file is not None and is_under(file, roots):
            continue
        held = module_origin(module, roots) if module else None
        if held is None and side == "base":
            absent[name] = f"its module {module} is not in the base's import roots"
            continue
        why = (
            f"another copy shadows the side's source ({held} holds it): an earlier sys.path entry "
            "or import hook wins over PYTHONPATH; install the package editable (pip install -e .)"
            if held is not None
            else "the module is not in the repository's import roots: check [tool.attnkit] src in "
            "its pyproject.toml, or name this repository's backends with --attnkit-backend"
        )
        raise RepositoryError(
            f"imported backend {name!r} (module {module}) from {file}, not from this side's import "
            f"roots {', '.join(map(str, roots))}: {why}"
        )
    return absent
