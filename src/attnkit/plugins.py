"""Backends of installed packages: the ``attnkit.backends`` entry-point group.

A package registers its kernel by declaring, in its ``pyproject.toml``::

    [project.entry-points."attnkit.backends"]
    mykernel = "my_package.attnkit_backend:backend"

The value names an object that is one of:

* an :class:`attnkit.Backend` (a module constant);
* a function of no arguments returning a :class:`~attnkit.Backend`, a list of them, or None
  after calling :func:`attnkit.register_backend` itself.

The group is loaded lazily and once per process, by the first registry lookup that needs it
(:func:`attnkit.backend_names`, :func:`attnkit.available_backends`, or a name attnkit does not
know): pytest, paired-mode worker processes and tools all see the same backends, and a program
that only uses attnkit's own backends never imports a plugin.

Each entry point loads on its own: a broken one (an import that fails, an object of the wrong
kind, a name taken twice) never stops the others nor a run that does not use it. It is one
:class:`BackendEntryPointWarning` line when the group is read, and a
:class:`BackendEntryPointError` naming the entry point and its distribution whenever its backend
is asked for. A broken entry point registers nothing, so its backend is known by the entry
point's key: name the key after the backend it registers (``mykernel = ...`` registering
``"mykernel"``).
"""

from __future__ import annotations

import importlib.metadata
import warnings
from collections.abc import Callable

#: The entry-point group installed packages declare their backends in.
ENTRY_POINT_GROUP = "attnkit.backends"


class BackendEntryPointError(RuntimeError):
    """An ``attnkit.backends`` entry point could not be loaded; the message names it."""


class BackendEntryPointWarning(UserWarning):
    """An ``attnkit.backends`` entry point is broken; backends that are not its still run."""


#: False until the group was read; the entry points that failed, by key (the backend they name).
_read = False
_broken: dict[str, BackendEntryPointError] = {}


def load_entry_points(backend_type: type, register: Callable) -> None:
    """Register the Backends (objects of ``backend_type``, :class:`attnkit.Backend`) of every
    installed ``attnkit.backends`` entry point with ``register`` (the registry's door; the
    registry calls this), once per process. A broken entry point is kept in
    :func:`broken_entry_points` and warned about in one line; the others still register."""
    global _read
    if _read:
        return
    _read = True  # set first: a plugin that looks up backends while loading does not recurse
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            _load(entry, backend_type, register)
        except BackendEntryPointError as err:
            _broken[entry.name] = err
            warnings.warn(
                f"{err} (it registered nothing; other backends are unaffected)",
                BackendEntryPointWarning,
                stacklevel=2,
            )


def broken_entry_points() -> dict[str, BackendEntryPointError]:
    """The entry points that failed to load, by key, each with the error naming it."""
    return dict(_broken)


def reset() -> None:
    """Forget that the group was read (for tests that install entry points on the fly)."""
    global _read
    _read = False
    _broken.clear()


def _where(entry: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    package = f"distribution {dist.name!r}" if dist is not None else "an unnamed distribution"
    return f"{ENTRY_POINT_GROUP} entry point {entry.name!r} = {entry.value!r} of {package}"


def _load(entry: importlib.metadata.EntryPoint, backend_type: type, register: Callable) -> None:
    try:
        target = entry.load()
    except Exception as err:
        raise BackendEntryPointError(f"{_where(entry)}: importing it failed: {err!r}") from err
    try:
        # A Backend is data (not callable); anything else callable is a function making them.
        made = target() if callable(target) else target
    except Exception as err:
        raise BackendEntryPointError(f"{_where(entry)}: calling it failed: {err!r}") from err
    backends = [] if made is None else made if isinstance(made, (list, tuple)) else [made]
    if not all(isinstance(backend, backend_type) for backend in backends):
        raise BackendEntryPointError(
            f"{_where(entry)}: expected an attnkit.Backend, a function returning one (or a list of "
            f"them), or a function that calls attnkit.register_backend and returns None; got {made!r}"
        )
    for backend in backends:
        try:
            register(backend)
        except ValueError as err:  # a name already registered
            raise BackendEntryPointError(f"{_where(entry)}: {err}") from err
