"""attnkit's pytest plugin (the ``pytest11`` entry point ``attnkit_pytest``).

It adds ``--attnkit-backend NAME`` (repeatable): the backends the correctness suite
(``pytest --pyargs attnkit.suite``) tests, every registered one when none is given. Tests ask
for the ``attnkit_backend`` fixture (parametrized over those names; a backend that cannot run
on the test device is a skip with its reason) and ``attnkit_device`` (``ATTNKIT_TEST_DEVICE``,
else CUDA when present, else the CPU). Problems a backend declines are listed at the end of the
run under "attnkit: declined problems", one line per backend and reason with a count. A run of
attnkit's installed tests leaves nothing in the folder it was started from but pytest's own
cache folder (``.pytest_cache``): pytest-benchmark's storage (which neither uses) goes there
unless ``--benchmark-storage`` is given, or under ``-p no:cacheprovider`` to a temporary folder
removed after the run; so does Inductor's compile cache. A broken ``attnkit.backends`` entry
point is a warning in the run's summary, and a usage error only when its backend is named; so is
a named backend that cannot run on the test device (each of its tests would be a skip, and a run
that tests nothing would pass). The plugin changes nothing in a run that uses none of this.

``pytest --pyargs attnkit_perf.suite`` (the installed perf gate) also needs the gate's plugin
(``attnkit_perf.plugin``, which needs the ``perf`` extras): this plugin loads it when that
package is named, early enough for pytest to know its options (``--attnkit-base``, ...).

It lives outside the ``attnkit`` package and imports it only inside its hooks: pytest imports
entry-point plugins before any conftest, and importing ``attnkit`` builds the Triton kernels,
which read ``TRITON_INTERPRET`` once, then. A conftest that sets the variable (this repository's
``tests/conftest.py`` does on a machine without CUDA) still comes first.
"""

from __future__ import annotations

import re
import sys

import pytest

#: AttentionProblem.describe() inside a decline's message: the summary groups declines by the rest.
_PROBLEM = re.compile(r"B=\d+ Hq=\d+ .*? dtype=\w+( window=\([^)]*\))?")
#: A number standing alone (a size in a kernel's message), not part of a name such as float16.
_NUMBER = re.compile(r"(?<![\w.])\d+(?!\w)")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnkit", "attnkit: attention backends under test")
    group.addoption(
        "--attnkit-backend",
        action="append",
        default=[],
        metavar="NAME",
        help="test this registered attention backend (repeatable; default: every registered one)",
    )


#: The installed perf grid: naming it with --pyargs loads the perf gate's plugin.
PERF_PACKAGE = "attnkit_perf.suite"
PERF_PLUGIN = "attnkit_perf.plugin"


def names_perf_package(arg: str) -> bool:
    """Whether a --pyargs argument names :data:`PERF_PACKAGE` or a module or test of it."""
    return _names_package(arg, PERF_PACKAGE)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args) -> None:
    # The last point before pytest parses the whole command line: a plugin registered now still
    # adds its options (pytest_addoption is historic).
    known = early_config.known_args_namespace
    if getattr(known, "pyargs", False) and any(names_perf_package(str(a)) for a in known.file_or_dir):
        early_config.pluginmanager.import_plugin(PERF_PLUGIN)


#: The installed correctness suite; with :data:`PERF_PACKAGE`, the tests attnkit installs: a
#: run of them keeps nothing in the user's folder but pytest's cache folder.
SUITE_PACKAGE = "attnkit.suite"
#: A warning torch gives about itself (see pytest_configure), as a ``filterwarnings`` line.
TORCH_JIT_DEPRECATION = "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning:torch.jit._script"
#: pytest-benchmark's default storage: ``.benchmarks/`` in the working directory, made by every run.
_DEFAULT_BENCHMARK_STORAGE = "file://./.benchmarks"


def runs_installed_tests(config: pytest.Config) -> bool:
    """Whether this run collects attnkit's installed tests (``pytest --pyargs attnkit.suite`` or
    ``attnkit_perf.suite``)."""
    return bool(config.getoption("pyargs", default=False)) and any(
        _names_package(str(arg), package) for arg in config.args for package in (SUITE_PACKAGE, PERF_PACKAGE)
    )


def _names_package(arg: str, package: str) -> bool:
    return arg.split("::")[0] == package or arg.startswith(package + ".")


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark opens its storage (its hook is trylast)
def pytest_configure(config: pytest.Config) -> None:
    if (
        runs_installed_tests(config)
        and getattr(config.option, "benchmark_storage", None) == _DEFAULT_BENCHMARK_STORAGE
        and not getattr(config.option, "benchmark_compare", False)
    ):
        # Neither reads pytest-benchmark's storage (the perf gate keeps its baselines itself), but
        # pytest-benchmark would still make .benchmarks/ where pytest was started. A
        # --benchmark-storage the user gives is kept, and so is the default under
        # --benchmark-compare: pytest-benchmark then names its storage relative to the working
        # directory, and fails on a folder outside it.
        config.option.benchmark_storage = "file://" + str(scratch_dir(config, "benchmarks"))
    if runs_installed_tests(config):
        # torch's own torch/utils/mkldnn.py calls the deprecated torch.jit.script_method when
        # torch.compile imports it; nothing of attnkit or of the kernel under test calls it.
        config.addinivalue_line("filterwarnings", TORCH_JIT_DEPRECATION)
        keep_compile_cache_in(scratch_dir(config, "torchinductor"))
    _check_named_backends(config)  # imports attnkit, and with it torch._dynamo: after the above


def keep_compile_cache_in(folder) -> None:
    """Inductor's compile cache in ``folder`` rather than torch's default, ``torchinductor_<user>``
    in the system's temporary folder, where it stays; and no precompiled C++ header, which torch
    keeps there whatever the cache variable says (the CPU kernels compile as fast without it).
    A value in the environment wins. Only before torch._dynamo is imported: torch then writes
    its default into the variable, and reads the header's setting once."""
    import os

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder))
    os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")


def scratch_dir(config: pytest.Config, name: str):
    """A folder for a tool's files during a run of the installed suite: in pytest's cache folder
    (``.pytest_cache``) when the cache is on, else a temporary folder removed after the run."""
    import shutil
    import tempfile
    from pathlib import Path

    cache = getattr(config, "cache", None)
    if cache is not None:
        return cache.mkdir(f"attnkit-{name}")
    path = Path(tempfile.mkdtemp(prefix=f"attnkit-{name}-"))
    config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
    return path


def _check_named_backends(config: pytest.Config) -> None:
    if not config.getoption("attnkit_backend", default=None):
        return  # a run that names no backend imports nothing of attnkit here
    import warnings

    from attnkit.testing.selection import selected_backends

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        named = selected_backends(config)  # an unknown name is a usage error before collection
    for warning in caught:  # a broken plugin's warning, in the run's warnings summary
        config.issue_config_time_warning(warning.message, stacklevel=2)
    from attnkit.device import test_device
    from attnkit.registry import unavailable_reason

    device = test_device()
    for name in named:
        # Named, but every test of it would be a skip: a run that tests nothing must not pass.
        reason = unavailable_reason(name, device)
        if reason is not None:
            raise pytest.UsageError(
                f"--attnkit-backend {name}: unavailable on {device}: {reason} (each of its tests would "
                "be skipped; run where it is available, or choose the device with ATTNKIT_TEST_DEVICE)"
            )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "attnkit_backend" not in metafunc.fixturenames:
        return
    from attnkit.device import test_device
    from attnkit.registry import unavailable_reason
    from attnkit.testing.selection import selected_backends

    device = test_device()
    params = []
    for name in selected_backends(metafunc.config):
        reason = unavailable_reason(name, device)
        marks = [pytest.mark.skip(reason=f"{name} unavailable on {device}: {reason}")] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    metafunc.parametrize("attnkit_backend", params)


@pytest.fixture(scope="session")
def attnkit_device():
    from attnkit.device import test_device

    return test_device()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if "attnkit.testing.selection" not in sys.modules:
        return  # nothing of the suite ran: nothing was declined
    from attnkit.testing.selection import DECLINED

    declined = config.stash.get(DECLINED, [])
    if not declined:
        return
    terminalreporter.section("attnkit: declined problems")
    for line in summarize_declines(declined):
        terminalreporter.write_line(line)


def summarize_declines(declined) -> list[str]:
    """One line per backend and reason, with how many problems it declined for that reason: the
    problem's description left out, and reasons that differ only in their numbers (a kernel's
    message naming the sizes it was given) counted as one, shown by the first of them."""
    groups: dict[tuple[str, str], list[str]] = {}
    for _test, backend, message in declined:
        reason = _PROBLEM.sub("<problem>", message)
        groups.setdefault((backend, _NUMBER.sub("#", reason)), []).append(reason)
    lines = []
    for (backend, _), reasons in sorted(groups.items()):
        varied = " (the numbers vary; the first shown)" if len(set(reasons)) > 1 else ""
        lines.append(f"{backend}: {len(reasons)} problem(s) declined: {reasons[0]}{varied}")
    return lines
