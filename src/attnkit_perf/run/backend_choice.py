"""Which backends a perf run times, and so which cases of :mod:`attnkit_perf.measure.cases`.

* ``--attnkit-backend NAME`` (repeatable): those registered backends; one of attnkit's grid keeps
  its standard cases (and benchmark names), any other one is timed on the standard shapes
  (:func:`attnkit_perf.measure.cases.backend_cases`).
* none, in a repository other than attnkit's: every backend that entry points register from
  that repository (their module lies in its import roots, :mod:`attnkit_perf.measure.repo`);
* none, in attnkit's own repository (or outside a git checkout): the standard grid.
"""

from __future__ import annotations

import pytest

from attnkit.builtins import builtin_names
from attnkit.registry import backend_names, get_backend
from attnkit.testing.selection import named_backends
from attnkit_perf.measure.cases import BenchCase, suite_cases
from attnkit_perf.measure.repo import Repository, module_origin


def grid_backends(config: pytest.Config, repository: Repository | None) -> list[str] | None:
    """The backends the run times (None: the standard grid); an unknown name, or a repository
    of another package that registers none, is a :class:`pytest.UsageError`."""
    named = named_backends(config)
    if named:
        return named
    if repository is None or repository.own:
        return None
    plugins = [name for name in backend_names() if name not in builtin_names()]
    paths = repository.paths()
    mine = [name for name in plugins if _module_in(get_backend(name).module, paths)]
    if not mine:
        elsewhere = f" (registered from elsewhere: {', '.join(plugins)})" if plugins else ""
        raise pytest.UsageError(
            f"attnkit perf gate: no backend of {repository.top} is registered{elsewhere}. Install "
            "the package that declares its attnkit.backends entry point (pip install -e .), check "
            "[tool.attnkit] src in its pyproject.toml (import roots: "
            f"{repository.describe_roots()}), or name backends with --attnkit-backend"
        )
    return mine


def _module_in(module: str | None, paths) -> bool:
    return module is not None and module_origin(module, paths) is not None


def grid_cases(backends: list[str] | None, gpu: bool) -> list[BenchCase]:
    """The cases of ``backends`` (None: the standard grid) on the GPU grid or the CPU smoke grid;
    a backend forward-only on the grid's device has no training passes."""
    device = "cuda" if gpu else "cpu"
    forward_only = frozenset(name for name in backends or () if get_backend(name).is_forward_only(device))
    return suite_cases(backends, gpu, forward_only)


def external_backends(backends: list[str] | None) -> tuple[str, ...]:
    """The backends of a run that are not attnkit's own: the code paired mode compares in a
    repository other than attnkit's."""
    return tuple(name for name in backends or () if name not in builtin_names())
