"""attnkit's pytest plugin (the ``pytest11`` entry point ``attnkit.testing.pytest_plugin``).

It adds ``--attnkit-backend NAME`` (repeatable): the backends the correctness suite
(``pytest --pyargs attnkit.suite``) tests, every registered one when none is given. Tests ask
for the ``attnkit_backend`` fixture (parametrized over those names; a backend that cannot run
on the test device is a skip with its reason) and ``attnkit_device`` (``ATTNKIT_TEST_DEVICE``,
else CUDA when present, else the CPU). Problems a backend declines are listed at the end of the
run under "attnkit: declined problems". The plugin changes nothing in a run that uses none of
this.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

from attnkit.registry import backend_names, default_device, unavailable_reason

#: Where a run keeps (test id, backend, message) of every problem a backend declined.
DECLINED = pytest.StashKey[list]()
#: AttentionProblem.describe() inside a decline's message: the summary groups declines by the rest.
_PROBLEM = re.compile(r"B=\d+ Hq=\d+ .*? dtype=\w+( window=\([^)]*\))?")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnkit", "attnkit: attention backends under test")
    group.addoption(
        "--attnkit-backend",
        action="append",
        default=[],
        metavar="NAME",
        help="test this registered attention backend (repeatable; default: every registered one)",
    )


def selected_backends(config: pytest.Config) -> list[str]:
    """The names given with --attnkit-backend, checked against the registry; else every name."""
    chosen = config.getoption("attnkit_backend", default=[]) or []
    if not chosen:
        return backend_names()
    known = backend_names()
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise pytest.UsageError(
            f"--attnkit-backend: {', '.join(map(repr, unknown))} is not registered; registered: "
            f"{', '.join(known)} (a plugin registers through the attnkit.backends entry point)"
        )
    return list(dict.fromkeys(chosen))


def test_device() -> torch.device:
    """The device the suite runs on: ``ATTNKIT_TEST_DEVICE``, else CUDA when present, else CPU."""
    return torch.device(os.environ.get("ATTNKIT_TEST_DEVICE") or default_device())


test_device.__test__ = False  # a helper, not a test, although its name starts with "test"


def pytest_configure(config: pytest.Config) -> None:
    config.stash[DECLINED] = []
    if config.getoption("attnkit_backend", default=None):
        selected_backends(config)  # an unknown name is a usage error before collection


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "attnkit_backend" not in metafunc.fixturenames:
        return
    device = test_device()
    params = []
    for name in selected_backends(metafunc.config):
        reason = unavailable_reason(name, device)
        marks = [pytest.mark.skip(reason=f"{name} unavailable on {device}: {reason}")] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    metafunc.parametrize("attnkit_backend", params)


@pytest.fixture(scope="session")
def attnkit_device() -> torch.device:
    return test_device()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    declined = config.stash.get(DECLINED, [])
    if not declined:
        return
    terminalreporter.section("attnkit: declined problems")
    counts: dict[tuple[str, str], int] = {}
    for _test, backend, message in declined:
        key = (backend, _PROBLEM.sub("<problem>", message))
        counts[key] = counts.get(key, 0) + 1
    for (backend, reason), count in sorted(counts.items()):
        terminalreporter.write_line(f"{backend}: {count} problem(s) declined: {reason}")
