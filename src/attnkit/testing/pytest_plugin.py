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

import pytest
import torch

from attnkit.registry import backend_names, default_device, unavailable_reason

#: (test id, backend, reason) of every problem a backend declined in this run.
DECLINED: list[tuple[str, str, str]] = []


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
    if not DECLINED:
        return
    terminalreporter.section("attnkit: declined problems")
    reasons: dict[tuple[str, str], list[str]] = {}
    for test, backend, reason in DECLINED:
        reasons.setdefault((backend, reason), []).append(test)
    for (backend, reason), tests in sorted(reasons.items()):
        terminalreporter.write_line(f"{backend}: {len(tests)} problem(s) declined: {reason}")
