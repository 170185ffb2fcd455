"""Backends of installed packages: the ``attnkit.backends`` entry-point group.

A package registers its kernel by declaring, in its ``pyproject.toml``::

    [project.entry-points."attnkit.backends"]
    mykernel = "my_package.attnkit_backend:backend"

The value names an object that is one of:

* a :class:`BackendSpec` (a module constant);
* a function of no arguments returning a :class:`BackendSpec`, a list of them, or None after
  calling :func:`attnkit.register_backend` itself.

The group is loaded lazily and once per process, by the first registry lookup that needs it
(:func:`attnkit.backend_names`, :func:`attnkit.available_backends`, or a name attnkit does not
know): pytest, paired-mode worker processes and tools all see the same backends, and a program
that only uses attnkit's own backends never imports a plugin. A broken entry point (an import
that fails, an object of the wrong kind, a name taken twice) raises
:class:`BackendEntryPointError` naming the distribution and the entry, on that lookup and every
later one: a plugin is never silently absent.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, fields

#: The entry-point group installed packages declare their backends in.
ENTRY_POINT_GROUP = "attnkit.backends"


class BackendEntryPointError(RuntimeError):
    """An ``attnkit.backends`` entry point could not be loaded; the message names it."""


@dataclass(frozen=True)
class BackendSpec:
    """A backend as data: the arguments of :func:`attnkit.register_backend` (see there).

    ``fn(q, k, v, *, causal, scale, window)`` maps q (B, Hq, N, D), k (B, Hkv, M, D),
    v (B, Hkv, M, Dv) to the (B, Hq, N, Dv) output; ``supports(problem)`` returns None or the
    reason it declines an :class:`~attnkit.AttentionProblem`. ``dispatch_boundaries`` (a tuple
    of :class:`~attnkit.DispatchBoundary`), ``deterministic`` and ``batch_invariant`` declare
    what the installed suite checks beyond the oracle (see :func:`attnkit.register_backend`).
    """

    name: str
    fn: Callable
    supports: Callable | None = None
    description: str = ""
    forward_only: bool = False
    dispatch_boundaries: tuple = ()
    deterministic: bool = False
    batch_invariant: bool = False


#: None until the group was read; then the error it raised, or True.
_state: BackendEntryPointError | bool | None = None


def load_entry_points(register: Callable) -> None:
    """Register every installed ``attnkit.backends`` entry point with ``register`` (the registry's
    :func:`~attnkit.registry.register_backend`, which calls this), once per process; raise
    :class:`BackendEntryPointError` for a broken one (again on every later call)."""
    global _state
    if _state is None:
        _state = True  # set first: a plugin that looks up backends while loading does not recurse
        try:
            for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                _load(entry, register)
        except BackendEntryPointError as err:
            _state = err
    if isinstance(_state, BackendEntryPointError):
        raise _state


def reset() -> None:
    """Forget that the group was read (for tests that install entry points on the fly)."""
    global _state
    _state = None


def _where(entry: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    package = f"distribution {dist.name!r}" if dist is not None else "an unnamed distribution"
    return f"{ENTRY_POINT_GROUP} entry point {entry.name!r} = {entry.value!r} of {package}"


def _load(entry: importlib.metadata.EntryPoint, register: Callable) -> None:
    try:
        target = entry.load()
    except Exception as err:
        raise BackendEntryPointError(f"{_where(entry)}: importing it failed: {err!r}") from err
    try:
        made = target if isinstance(target, BackendSpec) or not callable(target) else target()
    except Exception as err:
        raise BackendEntryPointError(f"{_where(entry)}: calling it failed: {err!r}") from err
    specs = made if isinstance(made, (list, tuple)) else [made]
    if made is None:
        specs = []
    wrong = [x for x in specs if not isinstance(x, BackendSpec)]
    if wrong:
        raise BackendEntryPointError(
            f"{_where(entry)}: expected a BackendSpec, a function returning one (or a list of them), "
            f"or a function that calls attnkit.register_backend and returns None; got {made!r}"
        )
    for spec in specs:
        try:
            # Field by field, not asdict(): that would turn nested DispatchBoundary objects into dicts.
            register(**{f.name: getattr(spec, f.name) for f in fields(spec)})
        except (TypeError, ValueError) as err:
            raise BackendEntryPointError(f"{_where(entry)}: {err}") from err
