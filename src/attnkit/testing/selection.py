"""Which backends and which device a test run covers, and where it keeps what was declined: the
parts of attnkit's pytest plugin (:mod:`attnkit_pytest`) that the suite's conftests call too."""

from __future__ import annotations

import pytest

from attnkit.device import test_device  # noqa: F401  (the suites' conftests import it from here)
from attnkit.plugins import broken_entry_points
from attnkit.registry import backend_names

#: Where a run keeps (test id, backend, message) of every problem a backend declined.
DECLINED = pytest.StashKey[list]()


def selected_backends(config: pytest.Config) -> list[str]:
    """The names given with --attnkit-backend, checked against the registry; else every name."""
    return named_backends(config) or backend_names()


def named_backends(config: pytest.Config) -> list[str]:
    """The names given with --attnkit-backend (once each, in order), each checked to be
    registered (a :class:`pytest.UsageError` naming the unknown ones); empty when none is."""
    chosen = list(dict.fromkeys(config.getoption("attnkit_backend", default=[]) or []))
    if not chosen:
        return []
    known = backend_names()
    unknown = [name for name in chosen if name not in known]
    broken = broken_entry_points()
    for name in unknown:
        if name in broken:  # the plugin that would register it is installed but broken: say so
            raise pytest.UsageError(f"--attnkit-backend {name}: {broken[name]}")
    if unknown:
        raise pytest.UsageError(
            f"--attnkit-backend: {', '.join(map(repr, unknown))} is not registered; registered: "
            f"{', '.join(known)} (a plugin registers through the attnkit.backends entry point)"
        )
    return chosen
