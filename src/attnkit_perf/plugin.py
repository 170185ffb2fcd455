"""pytest plugin of the perf gate: options and hooks only (the logic is in
:mod:`attnkit_perf.run.session`). Loaded with ``-p attnkit_perf.plugin``, by this repository's
tests/conftest.py, and by attnkit's plugin (``attnkit_pytest``) for ``pytest --pyargs attnkit_perf.suite``.

    pytest tests/perf --attnkit-base=origin/main            # paired: base vs this checkout, same GPU
    pytest tests/perf --attnkit-base=origin/main --attnkit-select=all   # ... every row, not the diff's
    pytest tests/correctness --attnkit-changes-since=origin/main        # the tests the diff can affect
    pytest tests/correctness --attnkit-selection=selection.json         # ... as decided once, in a file
    pytest --pyargs attnkit_perf.suite --attnkit-backend NAME --attnkit-base=origin/main  # in any repo
    pytest tests/perf --attnkit-base=origin/main -n 2       # ... sharded over 2 GPUs
    pytest tests/perf --benchmark-compare                   # stored: against baselines/<gpu_key>/
    pytest tests/perf --attnkit-record                      # record this GPU model's baseline

Every threshold is an option and an ini key (``--attnkit-slower=0.02`` / ``attnkit_slower``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from attnkit_perf.decide import gate
from attnkit_perf.formats.verdict import OUT_OF_TIME, BenchmarkVerdict
from attnkit_perf.measure.checkout import BaseError
from attnkit_perf.measure.processes import ANSWER_TIMEOUT_S
from attnkit_perf.measure.repo import RepositoryError, find_repository
from attnkit_perf.report.terminal import format_table, summary_line
from attnkit_perf.run import sides
from attnkit_perf.run.session import ERROR_PROPERTY, VERDICT_PROPERTY, PerfSession
from attnkit_perf.run.shards import ShardError, parse_shard

SESSION = pytest.StashKey[PerfSession]()
#: What selection kept and skipped (:func:`attnkit_perf.select.collection.deselect`), when it ran.
SELECTION = pytest.StashKey[dict]()
#: The run's selection decision (an :class:`attnkit_perf.select.rules.Affected`, or why there is
#: none), made once per run: read from ``--attnkit-selection``, computed, or handed to a worker.
DECISION = pytest.StashKey[object]()
#: The key of a worker's input that carries the controller's decision (as data).
_DECISION_INPUT = "attnkit_selection_decision"
#: Marks a benchmark skipped because this checkout cannot run its backend (tests/perf sets it).
DECLINED_MARK = "attnkit_declined"

#: (name, type, default, help) of the options that are also ini keys.
_TUNABLE = (
    (
        "slower",
        float,
        None,
        f"practical slowdown threshold (default {gate.Thresholds.slower} paired, "
        f"{gate.Thresholds.STORED_SLOWER} stored)",
    ),
    ("run_alpha", float, gate.Thresholds.run_alpha, "false-alarm probability allowed per run"),
    ("memory_rel", float, gate.Thresholds.memory_rel, "fail when peak memory grows by > this fraction"),
    ("memory_abs_mib", float, gate.Thresholds.memory_abs_bytes / gate.MIB, "...and by > this many MiB"),
    (
        "host_slower",
        float,
        gate.Thresholds.host_slower,
        "paired: practical threshold of the host time per call (A/A noise may raise it)",
    ),
    (
        "host_count_slower",
        float,
        gate.Thresholds.host_count_slower,
        "growth of the host work count (instructions, C calls per call) past which wall time decides",
    ),
    (
        "kept_abs_kib",
        float,
        gate.Thresholds.kept_abs_bytes / 1024,
        "fail when the memory a call keeps grows by > this many KiB (and memory_rel)",
    ),
    (
        "noise_k",
        float,
        None,
        "A/A standard deviations a benchmark's threshold clears (default: from its alpha, see gate.noise_z)",
    ),
    ("budget_s", float, None, "measuring time per benchmark (paired: per side pair of blocks, seconds)"),
    (
        "worker_timeout_s",
        float,
        ANSWER_TIMEOUT_S,
        "paired: seconds a worker may take to answer before it is killed",
    ),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnkit", "attnkit perf gate")
    group.addoption(
        "--attnkit-base", default=None, metavar="REF", help="paired mode: git ref or checkout to compare with"
    )
    group.addoption(
        "--attnkit-record", action="store_true", help="store this run as the GPU model's baseline"
    )
    group.addoption("--attnkit-verdict-json", default=None, metavar="PATH", help="write the verdict here")
    group.addoption("--attnkit-baseline-dir", default=None, help="baseline root (default: baselines)")
    parser.addini("attnkit_baseline_dir", "baseline root, relative to rootdir", default="baselines")
    group.addoption("--attnkit-noise", default=None, metavar="PATH", help="A/A noise file, or 'none'")
    group.addoption("--attnkit-fail-on-inconclusive", action="store_true", help="inconclusive fails the run")
    group.addoption("--attnkit-allow-other-gpu", action="store_true", help="compare with another GPU model")
    group.addoption(
        "--attnkit-allow-cpu", action="store_true", help="compare or record on the CPU (gate tests)"
    )
    group.addoption(
        "--attnkit-allow-dropped",
        action="store_true",
        help="accept benchmarks the base ran and this checkout no longer runs (otherwise they fail)",
    )
    group.addoption(
        "--attnkit-shard",
        default=None,
        metavar="I/N",
        help="measure shard I of the grid split over N runners (then: python -m attnkit_perf.report merge)",
    )
    group.addoption(
        "--attnkit-no-confirm",
        action="store_true",
        help=(
            "do not re-measure suspects (stored mode: at the end of the run, then in paired mode against "
            "the baseline's commit; paired mode: on fresh worker processes)"
        ),
    )
    group.addoption(
        "--attnkit-time-all",
        action="store_true",
        help=(
            "paired mode: time every row's GPU work and host metric, also where the two sides' "
            "fingerprints or host work counts are the same (A/A noise runs, which need a ratio of every row)"
        ),
    )
    group.addoption(
        "--attnkit-time-budget",
        default=None,
        metavar="SECONDS",
        help="paired mode: wall seconds for the whole run (from the pytest process's start). The rows "
        "the diff reaches most directly run first; a row is started, or measured on fresh processes "
        "again, only while the time left covers its estimated cost; the rest are named as not "
        "decided in the budget. 'none' (the default): no budget",
    )
    parser.addini("attnkit_time_budget", "paired mode: wall seconds for the whole run, or none", default=None)
    group.addoption(
        "--attnkit-out-of-time",
        choices=("pass", "fail"),
        default=None,
        help="paired mode with --attnkit-time-budget: whether rows not decided in the budget "
        "(each one named) pass the run (default: pass) or fail it",
    )
    parser.addini("attnkit_out_of_time", "pass or fail: rows not decided in the time budget", default=None)
    group.addoption(
        "--attnkit-select",
        choices=("affected", "all"),
        default=None,
        help="affected: run only the rows (and tests) the diff can affect (attnkit_perf.select); "
        "all: every one. Default: affected in paired mode, all otherwise",
    )
    group.addoption(
        "--attnkit-changes-since",
        default=None,
        metavar="REF",
        help="select the rows and tests the diff between REF and this checkout can affect (paired "
        "mode: --attnkit-base); computed once, in the controller when run under xdist",
    )
    group.addoption(
        "--attnkit-selection",
        default=None,
        metavar="FILE",
        help="select with the decision in FILE (written once per gate run by python -m "
        "attnkit_perf.select --base REF --json-out FILE) instead of computing it",
    )
    for name, kind, default, help_text in _TUNABLE:
        group.addoption("--attnkit-" + name.replace("_", "-"), type=kind, default=None, help=help_text)
        parser.addini(f"attnkit_{name}", help_text, default=None if default is None else str(default))


def _options(config: pytest.Config) -> dict:
    get = config.getoption
    options = {
        "base": get("attnkit_base"),
        "record": get("attnkit_record"),
        "baseline_dir": get("attnkit_baseline_dir") or config.getini("attnkit_baseline_dir"),
        "noise": get("attnkit_noise"),
        "fail_on_inconclusive": get("attnkit_fail_on_inconclusive"),
        "allow_other_gpu": get("attnkit_allow_other_gpu"),
        "allow_cpu": get("attnkit_allow_cpu"),
        "no_confirm": get("attnkit_no_confirm"),
        "time_all": get("attnkit_time_all"),
        "allow_dropped": get("attnkit_allow_dropped"),
        "time_budget": get("attnkit_time_budget"),
        "time_budget_ini": config.getini("attnkit_time_budget"),
        "out_of_time": get("attnkit_out_of_time") or config.getini("attnkit_out_of_time"),
    }
    try:
        options["split"] = None if get("attnkit_shard") is None else parse_shard(get("attnkit_shard"))
    except ShardError as err:
        raise pytest.UsageError(f"attnkit perf gate: {err}") from err
    for name, kind, _, _ in _TUNABLE:
        value = get("attnkit_" + name)
        if value is None and config.getini(f"attnkit_{name}") not in (None, ""):
            value = kind(config.getini(f"attnkit_{name}"))
        options[name] = value
    try:
        options["repository"] = repository = find_repository(
            Path(config.rootpath), Path(config.invocation_params.dir)
        )
    except RepositoryError as err:
        raise pytest.UsageError(f"attnkit perf gate: {err}") from err
    worker_input = getattr(config, "workerinput", None)
    options["shard"] = None
    if worker_input is not None and "attnkit_base_src" in worker_input:
        options["base_src"] = worker_input["attnkit_base_src"]
        options["base_commit"] = worker_input["attnkit_base_commit"]
        options["shard"] = int(str(worker_input["workerid"]).removeprefix("gw"))
    elif options["base"]:
        scratch = Path(tempfile.mkdtemp(prefix="attnkit-base-"))
        # After the run: xdist workers import the base from here until then.
        config.add_cleanup(lambda: shutil.rmtree(scratch, ignore_errors=True))
        try:
            roots, commit = sides.materialise(options["base"], repository, Path(config.rootpath), scratch)
        except BaseError as err:
            raise pytest.UsageError(f"attnkit perf gate: {err}") from err
        options["base_src"], options["base_commit"] = [str(r) for r in roots], commit
    return options


def _is_xdist_worker(config: pytest.Config) -> bool:
    """Whether this pytest process is an xdist worker of *this* run. Read from the config, not
    from ``PYTEST_XDIST_WORKER``: a pytest started inside a worker (the gate's own tests run the
    plugin through ``pytester``) inherits that variable but is a run of its own."""
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{DECLINED_MARK}(reason): a benchmark skipped because this checkout cannot run its backend; "
        "paired mode asks both sides instead, stored mode lists it as dropped from the baseline",
    )
    if not hasattr(config.option, "benchmark_json"):  # pytest-benchmark not installed
        return
    session = config.stash[SESSION] = PerfSession(config, _options(config))
    # pytest-benchmark's own notices that the gate's verdict says better: the gate checks a
    # baseline's machine itself (GPU, timing protocol) and refuses a foreign one, while
    # pytest-benchmark compares the whole machine_info (host name, CPU, ...), which differs between
    # any runner and the recorded baseline; a run that timed nothing is the gate's "compared
    # nothing" failure.
    config.addinivalue_line("filterwarnings", "ignore:Benchmark machine_info is different")
    config.addinivalue_line("filterwarnings", "ignore:Not saving anything, no benchmarks have been run")
    if session.mode == "stored" and (
        config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None)
    ):
        raise pytest.UsageError(
            "attnkit perf gate: stored mode (--benchmark-compare) runs in one process (pytest-benchmark "
            "is disabled under xdist); shard paired mode (--attnkit-base) instead"
        )
    reads_json = session.mode == "stored" or session.record or config.getoption("attnkit_verdict_json")
    if reads_json and session.mode != "paired" and not config.getoption("benchmark_json"):
        # The gate reads the run through pytest_benchmark_update_json, which fires only when
        # pytest-benchmark writes JSON; give it a scratch file when the user named none. Paired
        # mode times in its workers and reads none (pytest-benchmark would warn that nothing ran).
        scratch = Path(tempfile.mkdtemp(prefix="attnkit-perf-"))
        config.add_cleanup(lambda: shutil.rmtree(scratch, ignore_errors=True))
        config.option.benchmark_json = _ScratchJson(scratch / "run.json")
    workers = config.getoption("numprocesses", None) if config.pluginmanager.hasplugin("xdist") else None
    if session.mode == "paired" and not _is_xdist_worker(config) and isinstance(workers, int) and workers > 0:
        problem = session.shard_problem(workers)
        if problem:
            raise pytest.UsageError(f"attnkit perf gate: {problem}")
    if session.mode == "paired":
        # Paired mode times in worker processes; pytest-benchmark's fixture is requested but idle.
        config.addinivalue_line("filterwarnings", "ignore:Benchmark fixture was not used at all")
    if session.mode == "paired" and not _is_xdist_worker(config):
        config.pluginmanager.register(_PairedController(session), "attnkit-paired-controller")


class _ScratchJson(os.PathLike):
    """The scratch ``--benchmark-json`` target. pytest-benchmark has parsed that option to an
    open binary file (``with json as fh``) or to a path (``open(json)``) depending on its
    release; this serves both, opening the file only when it is written."""

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


class _PairedController:
    """Paired mode's collector of verdict rows: on the controller under xdist (rows arrive with
    each test's report), or in the single process otherwise."""

    def __init__(self, session: PerfSession) -> None:
        self.session = session

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput["attnkit_base_src"] = self.session.opt["base_src"]
        node.workerinput["attnkit_base_commit"] = self.session.opt["base_commit"]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            # A verdict row rides on every phase's report (once per test); an error row only on
            # the report of the phase that raised.
            if (key == VERDICT_PROPERTY and report.when == "call") or key == ERROR_PROPERTY:
                self.session.rows.append(BenchmarkVerdict(**value))
                path = self.session.config.getoption("attnkit_verdict_json")
                if path:  # a run stopped early (a job's time limit) still leaves what it decided
                    self.session.write_progress(path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A benchmark whose test raised (in the measurement, or in a fixture) gets a failing "error"
    row: a run must not read as passed, nor as "nothing failed", because a benchmark broke."""
    outcome = yield
    report = outcome.get_result()
    perf = item.config.stash.get(SESSION, None)
    if perf is None or perf.mode is None or not report.failed or call.excinfo is None:
        return
    if "attnkit_perf" not in getattr(item, "fixturenames", ()):
        return
    if any(key == VERDICT_PROPERTY for key, _ in item.user_properties):
        return  # the gate's own failing verdict (slower, dropped, ...), not an error
    row = perf.record_error(item.nodeid, _benchmark_name(item), call.excinfo)
    if perf.mode == "paired":
        report.user_properties.append((ERROR_PROPERTY, dataclasses.asdict(row)))


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: count only what will run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items) -> None:
    perf = config.stash.get(SESSION, None)
    if perf is None:
        _select(config, items, None)
        return
    for item in items:
        declined = item.get_closest_marker(DECLINED_MARK)
        if declined is None:
            continue
        if perf.mode == "paired":
            # Whether a side runs the backend is that side's to say: the base may still run a
            # case this checkout dropped (the workers report it; attnkit_perf.decide.paired_rule).
            item.own_markers = [m for m in item.own_markers if m.name != "skip"]
        else:
            perf.record_declined(item.nodeid, declined.args[0])
    _select(config, items, perf)
    # The run's false-alarm budget is split over its benchmarks (attnkit_perf.decide.policy): over
    # the whole grid when it is split over runners, whose verdicts are merged into one run.
    benchmarks = [
        item
        for item in items
        if "attnkit_perf" in getattr(item, "fixturenames", ()) and item.get_closest_marker("skip") is None
    ]
    perf.collected([_benchmark_name(item) for item in benchmarks])
    if perf.mode == "paired":
        timed = set(benchmarks)
        perf.order_rows(items, lambda item: _benchmark_name(item) if item in timed else None)
    if perf.opt.get("split"):
        rest = [item for item in items if item not in set(benchmarks)]
        others = perf.take_shard({item: _benchmark_name(item) for item in benchmarks}, rest)
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = [item for item in items if item not in set(others)]


def _selection_base(config: pytest.Config, perf) -> str | None:
    """The ref a computed selection compares with: ``--attnkit-changes-since``, else paired
    mode's base; None: neither."""
    paired = perf.base_ref if perf is not None and perf.mode == "paired" else None
    return config.getoption("attnkit_changes_since") or paired


def _selects(config: pytest.Config, perf, note: bool = False) -> bool:
    """Whether the run deselects what the diff cannot affect: with ``--attnkit-selection``, in
    paired mode unless ``--attnkit-select=all``, elsewhere only when ``--attnkit-changes-since``
    asks; never against a base that is a checkout, not a commit (``note``: say so in the
    verdict)."""
    base = _selection_base(config, perf)
    selection_file = config.getoption("attnkit_selection")
    choice = config.getoption("attnkit_select") or ("affected" if base or selection_file else "all")
    if choice == "all":
        return False
    if selection_file:
        return True
    if base is None:
        raise pytest.UsageError(
            "attnkit select: --attnkit-select=affected needs --attnkit-base, --attnkit-changes-since "
            "or --attnkit-selection"
        )
    if Path(base).is_dir():
        if note and perf is not None:
            perf.notes.append(f"selection: the base {base} is a checkout, not a commit: every row runs")
        return False
    return True


def _decision(config: pytest.Config, perf):
    """The run's decision (:data:`DECISION`), made once: read from ``--attnkit-selection``; on an
    xdist worker, the controller's (:func:`pytest_configure_node`); else computed here."""
    from attnkit_perf.formats.schema import FormatError
    from attnkit_perf.select import collection
    from attnkit_perf.select.rules import Affected

    if DECISION in config.stash:
        return config.stash[DECISION]
    gpu = None if perf is None else perf.gpu_key
    selection_file = config.getoption("attnkit_selection")
    handed = getattr(config, "workerinput", {}).get(_DECISION_INPUT)
    if selection_file:
        try:
            decision = collection.read_selection(selection_file, gpu)
        except FormatError as err:
            raise pytest.UsageError(f"attnkit select: {err}") from err
        paired = perf.base_ref if perf is not None and perf.mode == "paired" else None
        if paired and decision.base != paired:
            raise pytest.UsageError(
                f"attnkit select: {selection_file} holds the changes since {decision.base}, but paired "
                f"mode compares with {paired}: write the selection against the same base"
            )
    elif handed is not None:
        decision = handed if isinstance(handed, str) else Affected.from_dict(handed, gpu)
    else:
        decision = collection.decide(Path(config.rootpath), _selection_base(config, perf), gpu)
    config.stash[DECISION] = decision
    return decision


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist's controller: hand each worker the run's decision, made once here, so that no
    worker computes it again."""
    config = node.config
    perf = config.stash.get(SESSION, None)
    if config.getoption("attnkit_selection") or not _selects(config, perf):
        return  # each worker reads the file, or nothing is selected
    decision = _decision(config, perf)
    node.workerinput[_DECISION_INPUT] = decision if isinstance(decision, str) else decision.to_dict()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's load distribution with the longest recorded test first
    (:mod:`attnkit_perf.run.longest_first`), for a run that times no benchmark, when this GPU
    model's test durations are recorded; otherwise xdist's own (paired mode orders its rows
    itself: the rows the diff reaches most directly first)."""
    perf = config.stash.get(SESSION, None)
    if perf is None or perf.mode is not None or config.getoption("dist") != "load":
        return None
    cost = perf.test_cost()
    if cost is None:
        return None
    from attnkit_perf.run.longest_first import LongestFirstScheduling

    return LongestFirstScheduling(config, log, cost)


def _select(config: pytest.Config, items, perf) -> None:
    """Deselect what the diff cannot affect (:mod:`attnkit_perf.select`) when the run selects
    (:func:`_selects`)."""
    if not _selects(config, perf, note=True):
        return
    from attnkit_perf.select import collection

    rows = {} if perf is None else {c.name: c for c in perf.grid(gpu=True) + perf.grid(gpu=False)}
    decision = _decision(config, perf)
    if isinstance(decision, str):
        if perf is not None:
            perf.notes.append(f"selection: {decision}")
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"attnkit select: {decision}")
        return
    _selected(config, perf, collection.deselect(config, items, decision, rows), decision.base)
    if perf is not None:
        perf.affected = decision  # what the diff reaches most directly runs first
    if hasattr(config, "workeroutput"):  # the controller writes the verdict: it needs the record
        config.workeroutput["attnkit_selection"] = config.stash[SELECTION]


def _selected(config: pytest.Config, perf, record: dict, base: str) -> None:
    """Keep the selection's ``record`` for the session's end and the verdict."""
    config.stash[SELECTION] = record
    if perf is not None and perf.selection is None:
        perf.selection = record
        perf.notes += [
            f"selection (changes since {base}): {skip['count']} deselected: {skip['reason']}"
            for skip in record["skipped"]
        ]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist's controller: the selection its workers made (each decides the same diff)."""
    record = getattr(node, "workeroutput", {}).get("attnkit_selection")
    if record is not None and SELECTION not in node.config.stash:
        _selected(node.config, node.config.stash.get(SESSION, None), record, record["base"])


def _benchmark_name(item: pytest.Item) -> str:
    """The benchmark an item times: the perf suite's ``case`` parameter, else the test's name."""
    return getattr(getattr(item, "callspec", None), "params", {}).get("case") or item.name


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    perf = config.stash.get(SESSION, None)
    if perf is None:
        return None
    where = {
        "paired": f"paired with base {perf.base_ref} ({perf.opt.get('base_commit')})",
        "stored": f"stored baseline {perf.baseline_file}",
    }.get(perf.mode, "not comparing")
    return [f"attnkit perf: device {perf.device}, gpu key {perf.gpu_key}, {where}"]


@pytest.fixture(scope="session")
def attnkit_perf(request: pytest.FixtureRequest):
    """``attnkit_perf(benchmark, case, wrap)`` times a case the way the session's mode asks."""
    perf: PerfSession = request.config.stash[SESSION]

    def run_case(benchmark, case, wrap, node=None):
        if perf.mode == "paired":
            perf.run_paired(node, case)
        else:
            perf.run_stored(benchmark, case, wrap)

    return run_case


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    perf = config.stash.get(SESSION, None)
    if perf is not None:
        machine_info["attnkit"] = perf.provenance()


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config: pytest.Config, benchmarks, output_json: dict) -> None:
    perf = config.stash.get(SESSION, None)
    if perf is not None and perf.run_json is None and perf.mode != "paired":
        perf.finish_stored(output_json)


def _stopped_early(session: pytest.Session, exitstatus) -> str | None:
    """Why the session did not run every collected test (Ctrl-C or a job's SIGINT, ``-x`` /
    ``--maxfail``), or None. A verdict over part of the suite must not read as a pass."""
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        return "interrupted"
    for reason in (session.shouldstop, session.shouldfail):
        if reason:
            return reason if isinstance(reason, str) else "stopped"
    return None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus):
    perf = session.config.stash.get(SESSION, None)
    if perf is not None:
        perf.stopped_early = _stopped_early(session, exitstatus)
        perf.close()
        # Before pytest-benchmark serialises the run: suspects get their second measurement,
        # minutes after the first, so one disturbed stretch of time cannot fail the gate.
        perf.confirm_suspects()
    yield
    selection = session.config.stash.get(SELECTION, None)
    if (
        selection
        and selection["selected"] == 0
        and not selection["everything"]
        and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED
    ):
        # Every item deselected because the diff reaches none of their code: that run passed,
        # for that reason alone (the selection lines and the verdict say so).
        session.exitstatus = pytest.ExitCode.OK
    if perf is None or _is_xdist_worker(session.config):
        return
    if perf.record_refused and session.exitstatus == pytest.ExitCode.OK:
        # A recording asked for and refused (an impossible figure) must not read as done.
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    document = perf.document or perf.build_document()
    if document is None:
        return
    path = session.config.getoption("attnkit_verdict_json")
    if path:
        document.write(path)
    if not document.passed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    perf = config.stash.get(SESSION, None)
    if perf is None or _is_xdist_worker(config):
        return
    if perf.document is None:
        perf.build_document()  # the stored run's JSON and the paired rows are all in by now
    if perf.document is None and not perf.notes:
        return
    write = terminalreporter.write_line
    terminalreporter.section("attnkit perf gate")
    for note in perf.notes:
        write(note)
    doc = perf.document
    if doc is None:
        return
    for key, (then, now) in doc.version_differences.items():
        write(f"WARNING: baseline recorded under {key} {then}, this run has {now}")
    write(f"{doc.base['label']} against {doc.head['label']}")
    failing = tuple(k for k in doc.failing_outcomes if k not in ("inconclusive", *OUT_OF_TIME))
    accepted = ("dropped",) if "dropped" not in failing else ()
    out_of_time = OUT_OF_TIME
    out_of_time_fails = set(out_of_time) <= set(doc.failing_outcomes)
    budget_rule = "failing: --attnkit-out-of-time=fail"
    if not out_of_time_fails:
        budget_rule = "not failing; they run where there is no budget"
    for title, kinds in (
        ("FAILED (error, dropped, slower or more memory):", failing),
        (
            "inconclusive (measured to the budget and still unclear; not failing by default):",
            ("inconclusive",),
        ),
        (f"NOT DECIDED IN THE TIME BUDGET ({budget_rule}):", out_of_time),
        ("faster:", ("faster",)),
        ("new (not in the base):", ("new",)),
        ("missing (in the baseline, not selected in this run):", ("missing",)),
        ("dropped, accepted (--attnkit-allow-dropped):", accepted),
    ):
        rows = [r for r in doc.benchmarks if r.outcome in kinds]
        if rows:
            red = kinds == failing or (kinds == out_of_time and out_of_time_fails)
            yellow = kinds == ("inconclusive",) or (kinds == out_of_time and not red)
            write(title, bold=True, red=red, yellow=yellow)
            for line in format_table(rows):
                write("  " + line)
    write(summary_line(doc), bold=True, red=not doc.passed, green=doc.passed)
