"""pytest plugin of the perf suite: finds this GPU's baseline, measures cases, re-measures
suspects, runs the gate and prints its table. Loaded with ``-p attnkit.bench.plugin``
(pyproject's addopts does it for this repository).

Commands::

    pytest tests/perf --benchmark-compare                  # gate against baselines/<gpu_key>/
    pytest tests/perf --benchmark-compare --attnkit-verdict-json=verdict.json
    python -m attnkit.bench.baseline record                # record / refresh this GPU's baseline

Every threshold is an option and an ini key (``[tool.pytest.ini_options]``), e.g.
``--attnkit-slower=0.06`` / ``attnkit_slower = 0.06``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from attnkit.bench import gate
from attnkit.bench.baseline import (
    RECORD_COMMAND,
    BaselineError,
    baseline_path,
    load_baseline,
    missing_message,
    save_baseline,
)
from attnkit.bench.calibration import drift_factor
from attnkit.bench.machine import gpu_key, provenance, version_differences
from attnkit.bench.measure import CaseMeasurer, MeasureSettings
from attnkit.bench.verdict import build_verdict_document, format_table, summary_line, write_verdict_json
from attnkit.errors import UnsupportedProblemError

STATE = pytest.StashKey["PerfState"]()

#: (option, ini key, type, default, help). Defaults are justified in attnkit.bench.gate.
_THRESHOLD_OPTIONS = (
    ("slower", float, gate.Thresholds.slower, "fail when drift-corrected median ratio >= 1+this"),
    ("faster", float, gate.Thresholds.faster, "report faster when ratio <= 1/(1+this)"),
    ("alpha", float, gate.Thresholds.alpha, "one-sided Mann-Whitney p-value needed for slower/faster"),
    ("memory_rel", float, gate.Thresholds.memory_rel, "fail when peak memory grows by > this fraction"),
    ("memory_abs_mib", float, gate.Thresholds.memory_abs_bytes / gate.MIB, "...and by > this many MiB"),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnkit", "attnkit perf gate")
    group.addoption("--attnkit-baseline-dir", default=None, help="baseline root (default: baselines)")
    parser.addini("attnkit_baseline_dir", "baseline root, relative to rootdir", default="baselines")
    group.addoption("--attnkit-record", action="store_true", help="store this run as the GPU's baseline")
    group.addoption("--attnkit-verdict-json", default=None, metavar="PATH", help="write the gate's verdicts")
    group.addoption("--attnkit-budget-s", type=float, default=None, help="measuring time per benchmark")
    group.addoption("--attnkit-allow-other-gpu", action="store_true", help="compare with another GPU model")
    group.addoption("--attnkit-no-normalise", action="store_true", help="do not divide out calibration drift")
    group.addoption("--attnkit-no-confirm", action="store_true", help="do not re-measure suspects")
    for name, kind, default, help_text in _THRESHOLD_OPTIONS:
        flag = "--attnkit-" + name.replace("_", "-")
        group.addoption(flag, type=kind, default=None, help=f"{help_text} (default {default})")
        parser.addini(f"attnkit_{name}", help_text, default=str(default))


def perf_device() -> torch.device:
    """``ATTNKIT_TEST_DEVICE`` if set, else CUDA when present, else the CPU."""
    name = os.environ.get("ATTNKIT_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class PerfState:
    """Per-session state: device, baseline, thresholds, suspects and the gate's outcome."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.device = perf_device()
        self.gpu_key = gpu_key(self.device)
        root = config.getoption("attnkit_baseline_dir") or config.getini("attnkit_baseline_dir")
        self.baseline_root = Path(config.rootpath, root) if not Path(root).is_absolute() else Path(root)
        self.record = config.getoption("attnkit_record")
        self.verdict_path = config.getoption("attnkit_verdict_json")
        self.thresholds = self._thresholds(config)
        self.confirm = not config.getoption("attnkit_no_confirm")
        self.baseline: dict | None = None
        self.baseline_file: Path | None = None
        self.notice: str | None = None
        self.verdicts: list[gate.Verdict] | None = None
        self.drift = 1.0
        self.versions: dict = {}
        self.suspects: list = []
        self._measurer: CaseMeasurer | None = None
        self._provenance: dict | None = None
        self._resolve_baseline(config)

    @staticmethod
    def _thresholds(config: pytest.Config) -> gate.Thresholds:
        values = {}
        for name, kind, _, _ in _THRESHOLD_OPTIONS:
            value = config.getoption("attnkit_" + name)
            values[name] = kind(value if value is not None else config.getini(f"attnkit_{name}"))
        return gate.Thresholds(
            slower=values["slower"],
            faster=values["faster"],
            alpha=values["alpha"],
            memory_rel=values["memory_rel"],
            memory_abs_bytes=int(values["memory_abs_mib"] * gate.MIB),
            normalise=not config.getoption("attnkit_no_normalise"),
        )

    def _resolve_baseline(self, config: pytest.Config) -> None:
        """Point ``--benchmark-compare`` at this GPU's baseline file, so the gate and
        pytest-benchmark's own comparison (``--benchmark-compare-fail``) use the same one."""
        compare = config.getoption("benchmark_compare", default=[])
        if compare is True:
            path = baseline_path(self.baseline_root, self.gpu_key)
            if not path.exists():
                self.notice = missing_message(self.baseline_root, self.gpu_key)
                config.option.benchmark_compare = []
                return
        elif isinstance(compare, str) and Path(compare).is_file():
            path = Path(compare)
        else:
            return  # not comparing, or a run number in pytest-benchmark's own storage
        try:
            self.baseline = load_baseline(path, self.gpu_key, config.getoption("attnkit_allow_other_gpu"))
        except BaselineError as err:
            raise pytest.UsageError(f"attnkit perf gate: {err}") from err
        self.baseline_file = path
        config.option.benchmark_compare = str(path.resolve())
        recorded = self.baseline["machine_info"].get("attnkit", {})
        self.versions = version_differences(recorded, self.provenance())

    @property
    def wants_run_json(self) -> bool:
        return bool(self.baseline is not None or self.record or self.verdict_path)

    @property
    def measurer(self) -> CaseMeasurer:
        if self._measurer is None:
            settings = MeasureSettings.for_device(self.device, self.config.getoption("attnkit_budget_s"))
            self._measurer = CaseMeasurer(self.device, settings)
        return self._measurer

    def provenance(self) -> dict:
        if self._provenance is None:
            self._provenance = provenance(self.device)
        return self._provenance

    def run_case(self, benchmark, case, wrap) -> None:
        """Benchmark ``case``; skip it if the backend rejects the shape; queue it for a second
        measurement if it already looks slower than the baseline."""
        try:
            self.measurer.benchmark_case(benchmark, case, wrap)
        except UnsupportedProblemError as err:
            benchmark.skipped = True
            pytest.skip(f"{case.backend} does not support this shape: {err}")
        if self.baseline is None or not self.confirm or self.device.type != "cuda":
            return
        reference = {b["fullname"]: b for b in self.baseline["benchmarks"]}.get(benchmark.fullname)
        if reference is None:
            return
        drift = 1.0
        if self.thresholds.normalise:
            drift = drift_factor(gate.run_calibration(self.baseline), benchmark.extra_info.get("calibration"))
        # A margin below the threshold: the final drift (median over the whole run) may differ
        # a little from this benchmark's own, and a suspect is only re-measured, never failed.
        loose = gate.Thresholds(slower=self.thresholds.slower - 0.02, alpha=self.thresholds.alpha)
        if gate.is_suspect(reference, benchmark.stats.stats.data, drift, loose):
            self.suspects.append((benchmark, case, wrap))

    def confirm_suspects(self) -> None:
        for benchmark, case, wrap in self.suspects:
            info = benchmark.extra_info
            confirm = self.measurer.remeasure(
                case, info.get("rounds") or 20, info.get("reps_per_round") or 1, wrap
            )
            info["confirm"] = confirm

    def finish(self, run: dict) -> None:
        """Called with the run's JSON (per-round samples included) once pytest-benchmark has it."""
        if self.record:
            path = save_baseline(run, baseline_path(self.baseline_root, self.gpu_key))
            count = len(run["benchmarks"])
            self.notice = f"recorded perf baseline for {self.gpu_key}: {path} ({count} benchmarks)"
        if self.baseline is None:
            return
        self.verdicts, self.drift = gate.compare_runs(self.baseline, run, self.thresholds)
        if self.verdict_path:
            document = build_verdict_document(
                self.verdicts,
                self.thresholds,
                self.drift,
                self.baseline,
                str(self.baseline_file),
                run,
                self.versions,
            )
            write_verdict_json(document, self.verdict_path)

    @property
    def failed(self) -> bool:
        return bool(self.verdicts) and any(v.failed for v in self.verdicts)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config.option, "benchmark_json"):  # pytest-benchmark not installed
        return
    state = config.stash[STATE] = PerfState(config)
    if state.wants_run_json and not config.getoption("benchmark_json"):
        # The gate reads the run through pytest_benchmark_update_json, which fires only when
        # pytest-benchmark writes JSON; give it a scratch file when the user named none.
        scratch = Path(tempfile.mkdtemp(prefix="attnkit-perf-")) / "run.json"
        config.option.benchmark_json = _ScratchJson(scratch)


class _ScratchJson(os.PathLike):
    """The scratch ``--benchmark-json`` target. pytest-benchmark has parsed that option to an
    open binary file (``with json as fh``, argparse.FileType) or to a path (``open(json)``)
    depending on its release; this serves both, opening the file only when it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __enter__(self):
        self._file = open(self.path, "wb")
        return self._file

    def __exit__(self, *exc_info) -> None:
        self._file.close()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = config.stash.get(STATE, None)
    if state is None:
        return None
    where = f"baseline {state.baseline_file}" if state.baseline_file else "no baseline compared"
    return [f"attnkit perf: device {state.device}, gpu key {state.gpu_key}, {where}"]


@pytest.fixture(scope="session")
def attnkit_perf(request: pytest.FixtureRequest) -> PerfState:
    """The session's perf state; ``attnkit_perf.run_case(benchmark, case, wrap)`` times a case."""
    return request.config.stash[STATE]


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        machine_info["attnkit"] = state.provenance()


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config: pytest.Config, benchmarks, output_json: dict) -> None:
    state = config.stash.get(STATE, None)
    if state is not None and state.verdicts is None:
        state.finish(output_json)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus):
    state = session.config.stash.get(STATE, None)
    if state is not None:
        # Before pytest-benchmark serialises the run: suspects get their second measurement,
        # minutes after the first, so one disturbed stretch of time cannot fail the gate.
        state.confirm_suspects()
    yield
    if state is not None and state.failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    write = terminalreporter.write_line
    if state.notice or state.verdicts is not None:
        terminalreporter.section("attnkit perf gate")
    if state.notice:
        write(state.notice)
    if state.verdicts is None:
        if state.baseline is not None:
            write("no benchmark ran, nothing compared")
        return
    for key, (then, now) in state.versions.items():
        write(f"WARNING: baseline recorded under {key} {then}, this run has {now}; refresh: {RECORD_COMMAND}")
    write(f"baseline {state.baseline_file}; calibration drift x{state.drift:.3f} divided out")
    for title, kinds in (
        ("FAILED (slower or more memory)", gate.FAILING),
        ("faster (refresh the baseline to lock in)", ("faster",)),
        ("new (not in the baseline)", ("new",)),
        ("missing (in the baseline, not run)", ("missing",)),
    ):
        lines = format_table(state.verdicts, kinds)
        if lines:
            write(title + ":", bold=True, red="slower" in kinds)
            for line in lines:
                write("  " + line)
    write(summary_line(state.verdicts), bold=True, red=state.failed, green=not state.failed)
