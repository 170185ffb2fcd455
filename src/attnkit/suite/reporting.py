"""How a failing test of the installed suite is reported: one block per failing property, not a
traceback per example.

The suite's checks raise with everything a kernel author needs in the message: the problem, each
quantity's error against its bound, and the code that repeats the one failing call
(:func:`attnkit.suite.checks.reproducer`); hypothesis adds the falsifying example as a note.
The traceback around it is the suite's own code, the same for every failure, so under pytest's
default ``--tb=auto`` a failing check is reported as its message and notes alone; any explicit
``--tb`` style keeps pytest's report as it is. Registered by the suite's conftest."""

from __future__ import annotations

from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parent
#: The line that opens a check's reproducer (:func:`attnkit.suite.checks.reproducer`).
REPRODUCER = "Repeat this one call alone"


def compact_report(item: pytest.Item, excinfo: pytest.ExceptionInfo) -> str | None:
    """The failure of ``item`` as one block (its message and notes), or None where pytest's own
    report stays: another folder's test, an explicit ``--tb`` style, or an exception that is no
    failed check (an error in the backend itself keeps its traceback)."""
    if item.config.getoption("tbstyle", "auto") != "auto" or not item.path.is_relative_to(SUITE):
        return None
    if not excinfo.errisinstance((AssertionError, pytest.fail.Exception)):
        return None
    error = excinfo.value
    message = str(error.msg if isinstance(error, pytest.fail.Exception) else error).rstrip()
    # Hypothesis notes the falsifying example; a check that prints its own reproducer (the same
    # tensors, no hypothesis) says it better, so the notes are kept only where there is none.
    notes = [] if REPRODUCER in message else [str(note) for note in getattr(error, "__notes__", ())]
    where = f"{item.path.name}:{excinfo.traceback[-1].lineno + 1}" if excinfo.traceback else item.path.name
    return "\n".join([message, *notes, f"({where}; --tb=long shows the traceback)"])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed and call.when == "call" and call.excinfo is not None:
        compact = compact_report(item, call.excinfo)
        if compact is not None:
            report.longrepr = compact
    return report
