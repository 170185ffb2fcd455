"""One perf-suite session: it reads the options, then sequences measure -> decide -> report.
Every rule that turns measurements into an outcome lives in :mod:`attnkit_perf.decide`.

Modes (docs/PERF_GATE.md):

* **paired** (``--attnkit-base=REF``): each benchmark is measured on the base and on this
  checkout in worker processes on the same GPU (:mod:`attnkit_perf.measure.paired_session`) and decided
  as it is measured (:class:`attnkit_perf.decide.paired_rule.PairedRule`); the test fails when the
  outcome fails. Works under pytest-xdist (one GPU per worker).
* **stored** (``--benchmark-compare``): pytest-benchmark times each case in this process; at the
  end every benchmark is compared with this GPU model's baseline JSON
  (:class:`attnkit_perf.decide.stored.StoredRule`), after re-measuring suspects; a "slower" is
  then adjudicated by paired mode against the baseline's commit (:mod:`attnkit_perf.run.stored_recheck`).
* **record** (``--attnkit-record``): the run becomes this GPU model's baseline.

Every way a comparison could silently not happen is a :class:`pytest.UsageError` here, or a
failing row of the verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from attnkit.device import gpu_key, named_test_device, test_device
from attnkit.errors import UnsupportedProblemError
from attnkit_perf.decide.out_of_time import after_looks, not_reached
from attnkit_perf.decide.paired_rule import PairedRule
from attnkit_perf.decide.policy import RunPolicy
from attnkit_perf.decide.sequential import LookBudget, SequentialPlan
from attnkit_perf.decide.stored import StoredRule
from attnkit_perf.decide.verdict_assembly import (
    error_row,
    paired_base,
    paired_row,
    stored_base,
    stored_rows,
    verdict_document,
)
from attnkit_perf.formats.baseline import baseline_path, save_baseline
from attnkit_perf.formats.durations import cost_by_node, durations_path, read_durations
from attnkit_perf.formats.schema import FormatError
from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument, failing_outcomes
from attnkit_perf.measure.cases import BenchCase
from attnkit_perf.measure.machine import provenance, version_differences
from attnkit_perf.measure.measurer import CaseMeasurer, MeasureSettings
from attnkit_perf.measure.paired_session import PairedSession, PairedSettings
from attnkit_perf.measure.processes import ANSWER_TIMEOUT_S, shard_problem, visible_gpus
from attnkit_perf.measure.timing import TIMING_PROTOCOL
from attnkit_perf.run import options as options_
from attnkit_perf.run import shards, sides
from attnkit_perf.run.backend_choice import grid_backends, grid_cases
from attnkit_perf.run.paired_benchmark import measure_paired
from attnkit_perf.run.stored_recheck import Adjudicator, adjudicate_rows
from attnkit_perf.run.time_budget import TimeBudget, process_start, row_kind, run_order
from attnkit_perf.select.priority import TIERS, row_priority
from attnkit_perf.select.rules import Affected

#: ``user_properties`` keys of a benchmark's verdict row and of the row of one that raised.
VERDICT_PROPERTY = "attnkit_verdict"
ERROR_PROPERTY = "attnkit_error"


def describe(case: BenchCase) -> dict:
    shape = case.as_dict()
    del shape["backend"], shape["pass_name"]
    return {
        "name": case.name,
        "group": case.group,
        "backend": case.backend,
        "pass_name": case.pass_name,
        "shape": shape,
    }


def _describe_recorded(info: dict) -> dict:
    """:func:`describe` of a benchmark as a run's ``extra_info`` records it."""
    return describe(BenchCase(**{**info["shape"], "backend": info["backend"], "pass_name": info["pass"]}))


class PerfSession:
    """Per-process state of the perf suite (the controller's and each xdist worker's)."""

    def __init__(self, config: pytest.Config, options: dict) -> None:
        self.config = config
        self.opt = options
        self.device = test_device()
        self.gpu_key = gpu_key(self.device)
        root = Path(options["baseline_dir"])
        self.baseline_root = root if root.is_absolute() else Path(config.rootpath, root)
        self.record = options["record"]
        self.base_ref = options["base"]
        #: The git repository gated (None outside one: attnkit's own source is compared).
        self.repository = options.get("repository")
        #: The backends the grid times (None: the standard grid), :mod:`attnkit_perf.run.backend_choice`.
        self.backends = grid_backends(config, self.repository)
        self.mode = options_.mode(config, options)
        self.thresholds = options_.thresholds(options, self.mode)
        self.policy = RunPolicy(
            self.thresholds, confirmed=self.mode == "paired" and not options["no_confirm"]
        )
        self.baseline: dict | None = None
        self.baseline_file: Path | None = None
        self.rows: list[BenchmarkVerdict] = []
        self.notes: list[str] = []
        #: Why the session ended before running every benchmark (pytest's interrupt, ``-x``), or
        #: None: the verdict is then incomplete, whatever the rows it holds say.
        self.stopped_early: str | None = None
        self.suspects: list = []
        #: Paired mode's looks over fresh processes, lent from the rows that settled early.
        self.look_budget = LookBudget(SequentialPlan())
        #: Paired mode's wall time (``--attnkit-time-budget``), counted from the process's start,
        #: and what each kind of row costs (:mod:`attnkit_perf.run.time_budget`).
        self.time_budget = TimeBudget(
            options_.time_budget(options.get("time_budget"), self.mode, options.get("time_budget_ini")),
            started=process_start(),
        )
        #: The diff's decision (:mod:`attnkit_perf.select`) when the run selected from one: the
        #: order of the rows (:meth:`order_rows`). Benchmark name -> its tier once ordered.
        self.affected: Affected | None = None
        self.priority: dict[str, int] = {}
        #: This runner's part of a split grid (``--attnkit-shard``), the verdict's ``shard``.
        self.shard: dict | None = None
        self._elsewhere: set[str] = set()
        #: Benchmarks (by test node id) this checkout skipped (-> why) and those that raised.
        self.declined: dict[str, str] = {}
        self.errored: dict[str, BenchmarkVerdict] = {}
        self.run_json: dict | None = None
        #: Why ``--attnkit-record`` wrote nothing (the run is not a valid baseline: a figure
        #: breaks the schema's rules), or None; the session then fails.
        self.record_refused: str | None = None
        #: What selection ran and skipped (:mod:`attnkit_perf.select.collection`), or None: all ran.
        self.selection: dict | None = None
        self.document: VerdictDocument | None = None
        self._measurer: CaseMeasurer | None = None
        self._paired: PairedSession | None = None
        self._provenance: dict | None = None
        self._noise_source: tuple | None = None
        options_.check_usage(self.mode, self.device, options)
        if self.mode == "stored":
            self.baseline, self.baseline_file = options_.stored_baseline(
                config, self.baseline_root, self.gpu_key, options
            )
        if self.mode:
            noise = options_.noise(options, self.baseline_root, self.gpu_key, self.mode, self.baseline)
            self.policy.noise, notes, self._noise_source = noise
            self.notes += notes

    def provenance(self) -> dict:
        """:func:`attnkit_perf.measure.machine.provenance` and the timing protocol of this run; in another
        repository its ``source`` is the digest of that repository's code (what is compared)."""
        if self._provenance is None:
            self._provenance = {**provenance(self.device), "timing": TIMING_PROTOCOL}
            if self.external:
                self._provenance["source"] = sides.code_digest(self.repository.paths(), self.repository)
        return self._provenance

    def collected(self, names: list[str]) -> None:
        """The benchmarks this run will measure (after deselection): they share the run's
        false-alarm budget, and the A/A noise file must describe them."""
        self.policy.benchmark_count = len(names)
        if self._noise_source is not None:
            gpu_grid, cpu_grid = self.grid(gpu=True), self.grid(gpu=False)
            self.notes += options_.noise_coverage(
                self._noise_source, self.policy.noise, gpu_grid, cpu_grid, names, self.mode, self.device
            )

    def take_shard(self, rows: dict, rest: list) -> list:
        """Keep this runner's shard of ``rows`` (pytest item -> benchmark name) and of the other
        tests ``rest`` (the correctness tests of the same runner, split by recorded cost), as
        ``--attnkit-shard=I/N`` asks (:mod:`attnkit_perf.run.shards`); returns the items of the other
        shards."""
        index, count = self.opt["split"]
        names = set(rows.values())
        place = shards.assign(names, count)
        by_id = shards.balance([item.nodeid for item in rest], count, self.test_cost() or cost_by_node({}))
        mine = [item for item, name in rows.items() if place[name] == index]
        self._elsewhere = {name for name in names if place[name] != index}
        if names:
            grid = shards.grid_digest(names)
            self.shard = {"index": index, "count": count, "grid": grid, "rows": len(mine)}
            self.notes.append(f"shard {index} of {count}: {len(mine)} of {len(names)} benchmarks")
        return [item for item in rows if place[rows[item]] != index] + [
            item for item in rest if by_id[item.nodeid] != index
        ]

    def test_cost(self) -> Callable[[str], float] | None:
        """A correctness test's expected seconds on this GPU model (for the split over runners, and
        the order over workers), from ``<baseline root>/<gpu_key>/test-durations.json``; None
        when that file does not exist."""
        path = durations_path(self.baseline_root, self.gpu_key)
        return cost_by_node(read_durations(path, self.gpu_key)) if path.is_file() else None

    def order_rows(self, items: list, name_of) -> None:
        """Paired mode: the benchmarks among ``items`` (``name_of(item)``: its benchmark's name)
        reordered in place, the rows the diff reaches most directly first
        (:func:`attnkit_perf.select.priority.row_priority`), within a tier the cheapest first
        (:class:`attnkit_perf.run.time_budget.RowCosts`); every other item keeps its place."""
        cases = {c.name: c for c in self.grid(gpu=True) + self.grid(gpu=False)}
        slots = [i for i, item in enumerate(items) if name_of(item) in cases]
        timed = [items[i] for i in slots]
        self.priority = {name_of(item): row_priority(self.affected, cases[name_of(item)]) for item in timed}
        order = run_order(
            [cases[name_of(item)] for item in timed], lambda c: self.priority[c.name], self.time_budget.costs
        )
        by_name = {name_of(item): item for item in timed}
        if len(by_name) == len(timed):  # one item per benchmark, as the perf suite collects them
            for slot, case in zip(slots, order, strict=True):
                items[slot] = by_name[case.name]
        tiers = [sum(t == tier for t in self.priority.values()) for tier in range(len(TIERS))]
        if self.time_budget.seconds is not None and slots:
            listed = "; ".join(f"{n} {why}" for n, why in zip(tiers, TIERS, strict=True) if n)
            self.notes.append(
                f"time budget {self.time_budget.seconds:g} s; rows in this order, the cheapest first "
                f"within each: {listed}"
            )

    def grid(self, gpu: bool) -> list[BenchCase]:
        """The cases this run's backends have on the GPU grid (``gpu``) or the CPU smoke grid."""
        return grid_cases(self.backends, gpu)

    @property
    def external(self) -> bool:
        """Whether the code compared is a repository other than attnkit's (its backends)."""
        return sides.is_external(self.repository)

    def code_digest(self, side: str) -> str:
        """The digest of the code a side runs: attnkit's, or the repository's import roots."""
        if side == "base":
            return sides.code_digest([Path(p) for p in self.opt["base_src"]], self.repository)
        return self.provenance()["source"]

    @property
    def alpha(self) -> float:
        return self.policy.alpha

    def threshold_for(self, name: str) -> float:
        return self.policy.threshold_for(name)

    # --- paired mode ------------------------------------------------------------------------

    def paired_session(self) -> PairedSession:
        if self._paired is None:
            self._paired = sides.open_paired(
                [Path(p) for p in self.opt["base_src"]],
                sides.working_tree_roots(self.repository),
                {"base": self.opt["base_commit"]},
                self.repository,
                self.backends,
                shard=self.opt.get("shard"),
                answer_timeout_s=self.opt.get("worker_timeout_s") or ANSWER_TIMEOUT_S,
            )
        return self._paired

    def shard_problem(self, workers: int) -> str | None:
        """Why paired mode cannot shard over ``workers`` xdist workers here, or None (on the
        CPU, where the gate's own tests run it, and with an explicit ATTNKIT_TEST_DEVICE the
        shards are not placed)."""
        if self.device.type != "cuda" or named_test_device():
            return None
        return shard_problem(workers, visible_gpus())

    def host_timed(self, case: BenchCase) -> bool:
        """Whether ``case`` gets the host metric here: the ``loop`` cases on a GPU, every case on
        the CPU (where all time is host time)."""
        return case.host_timed or self.device.type != "cuda"

    def paired_settings(self) -> PairedSettings:
        """Paired mode's effort per benchmark, within ``--attnkit-budget-s`` when given."""
        settings = {"time_all": bool(self.opt.get("time_all"))}
        if self.opt["budget_s"]:
            settings["budget_s"] = self.opt["budget_s"]
        return PairedSettings(**settings)

    def run_paired(self, node, case: BenchCase) -> None:
        """Measure ``case`` on both sides until :class:`PairedRule` settles it (and its host
        metric, where timed), confirm a slowdown on fresh processes, and attach the verdict row
        to the test."""
        kind = row_kind(case)
        priority = self.priority.get(case.name)
        clock = self.time_budget.start(kind)
        if isinstance(clock, str):  # the budget is spent: named, not silently dropped
            decision = not_reached(clock)
            if priority is not None:
                decision.extra["priority"] = TIERS[priority]
            self._attach(node, BenchmarkVerdict.from_decision(describe(case), decision))
            return
        settings = self.paired_settings()
        rule = PairedRule(
            self.thresholds,
            self.alpha,
            self.threshold_for(case.name),
            host_threshold=self.policy.host_threshold_for(case.name),
            confirmed=self.policy.confirmed,
            host_looks=settings.host_looks,
        )
        decision, measurements, seconds = measure_paired(
            self.paired_session(),
            rule,
            case.as_dict(),
            settings,
            host=self.host_timed(case),
            confirm=not self.opt["no_confirm"],
            budget=self.look_budget,
            clock=clock,
        )
        if decision is None:
            pytest.skip(f"neither side runs this case: {measurements[0]['head'].unsupported}")
        decision = after_looks(decision, clock.cut, measurements[0]["head"].looks, rule.plan.looks)
        decision.extra["seconds"] = {step: round(s, 3) for step, s in seconds.items()}
        if priority is not None:
            decision.extra["priority"] = TIERS[priority]
        self._attach(node, paired_row(describe(case), decision, measurements, case.flops))

    def _attach(self, node, row: BenchmarkVerdict) -> None:
        node.user_properties.append((VERDICT_PROPERTY, dataclasses.asdict(row)))
        if row.outcome in self._failing_outcomes():
            pytest.fail(f"{row.name}: {row.outcome}: {row.reason}", pytrace=False)

    def _failing_outcomes(self) -> tuple[str, ...]:
        t = self.thresholds
        return failing_outcomes(t.fail_on_inconclusive, t.allow_dropped, t.fail_out_of_time)

    def record_error(self, nodeid: str, name: str, excinfo) -> BenchmarkVerdict:
        """The "error" row of a benchmark whose test raised ``excinfo`` (failing)."""
        row = error_row(name, excinfo.typename, str(excinfo.value))
        self.errored[nodeid] = row
        return row

    def record_declined(self, nodeid: str, reason: str) -> None:
        """This checkout skipped the benchmark of test ``nodeid`` (unsupported shape, unavailable
        backend): a baseline benchmark it declines is dropped, not missing."""
        self.declined[nodeid] = reason

    def close(self) -> None:
        if self._paired is not None:
            self._paired.close()

    # --- stored mode and record -------------------------------------------------------------

    @property
    def measurer(self) -> CaseMeasurer:
        if self._measurer is None:
            settings = MeasureSettings.for_device(self.device, self.opt["budget_s"])
            self._measurer = CaseMeasurer(self.device, settings)
        return self._measurer

    @property
    def stored_rule(self) -> StoredRule:
        return StoredRule(self.thresholds, self.alpha, self.threshold_for)

    def run_stored(self, benchmark, case: BenchCase, wrap) -> None:
        """Benchmark ``case`` with pytest-benchmark; queue it for a second measurement if it
        already looks slower than the baseline (decided once the whole run is in)."""
        declined = None
        try:
            self.measurer.benchmark_case(benchmark, case, wrap)
        except UnsupportedProblemError as err:
            declined = str(err)
        # Skipped outside the except block: raised inside it, the skip would keep ``err`` and
        # with it the frames of the measurement (and the case's inputs) alive in a reference
        # cycle until the collector runs, possibly in the middle of the next case's readings.
        if declined is not None:
            benchmark.skipped = True
            self.record_declined(benchmark.fullname, declined)
            pytest.skip(f"{case.backend} does not support this shape: {declined}")
        if self.baseline is None or self.opt["no_confirm"]:
            return
        reference = self._baseline_entries().get(benchmark.fullname)
        if reference is not None and self.stored_rule.suspect(
            reference, benchmark.stats.stats.data, benchmark.extra_info
        ):
            self.suspects.append((benchmark, case, wrap, reference))

    def confirm_suspects(self) -> None:
        """Re-measure each suspect until :meth:`StoredRule.wants_remeasure` is satisfied."""
        rule = self.stored_rule
        for benchmark, case, wrap, reference in self.suspects:
            info = benchmark.extra_info
            info["confirm"] = []
            while rule.wants_remeasure(reference, benchmark.stats.stats.data, info):
                rounds, reps = info.get("rounds") or 20, info.get("reps_per_round") or 1
                info["confirm"].append(self.measurer.remeasure(case, rounds, reps, wrap))

    def _baseline_entries(self) -> dict:
        return {b["fullname"]: b for b in self.baseline["benchmarks"]}

    def finish_stored(self, run: dict) -> None:
        """Called with the run's JSON (per-round samples included) once pytest-benchmark has it."""
        self.run_json = run
        if self.record and run.get("benchmarks"):
            try:
                path = save_baseline(run, baseline_path(self.baseline_root, self.gpu_key))
            except FormatError as err:
                self.record_refused = str(err)
                self.notes.append(f"NOT recorded: {err}")
            else:
                self.notes.append(
                    f"recorded perf baseline for {self.gpu_key}: {path} ({len(run['benchmarks'])} benchmarks)"
                )
        if self.baseline is None:
            return
        compared = self.stored_rule.compare(self.baseline, run, self.declined, errored=self.errored)
        if not self.opt["no_confirm"]:
            compared = adjudicate_rows(compared, self.adjudicator())
        # Another shard's rows (--attnkit-shard) are not rows this run lost.
        compared = [
            (info, decision, measured)
            for info, decision, measured in compared
            if not (decision.outcome == "missing" and info.get("name") in self._elsewhere)
        ]
        recorded = {nodeid: entry["extra_info"] for nodeid, entry in self._baseline_entries().items()}
        self.rows += stored_rows(compared, self.errored, recorded, _describe_recorded)

    def adjudicator(self) -> Adjudicator:
        """Paired mode against the baseline's commit, from the git repository at the rootdir."""
        recorded = self.baseline["machine_info"].get("attnkit") or {}
        timeout = self.opt.get("worker_timeout_s") or ANSWER_TIMEOUT_S
        return Adjudicator(
            Path(self.config.rootpath),
            self.repository,
            self.backends,
            recorded,
            self.thresholds,
            timeout,
            self.paired_settings(),
        )

    # --- the verdict ------------------------------------------------------------------------

    def write_progress(self, path: str) -> None:
        """Paired mode: the verdict so far, marked incomplete (the session's end overwrites it)."""
        document = self._document(complete=False)
        if document is not None:
            document.write(path)

    def build_document(self) -> VerdictDocument | None:
        self.document = self._document(complete=True)
        return self.document

    def _document(self, complete: bool) -> VerdictDocument | None:
        if self.mode is None:
            return None
        if self.mode == "stored" and self.run_json is None:
            # pytest-benchmark writes no JSON when no benchmark ran: then nothing was compared,
            # which the verdict must say (every baseline benchmark is missing, dropped or broke).
            self.finish_stored({"benchmarks": []})
        if self.mode == "paired":
            # The same machine and software; the base's own commit and code.
            base = paired_base(
                str(self.base_ref), self.opt["base_commit"], self.provenance(), self.code_digest("base")
            )
            versions = {}
        else:
            base = stored_base(self.baseline_file, self.baseline)
            versions = {
                k: list(v) for k, v in version_differences(base["provenance"], self.provenance()).items()
            }
        return verdict_document(
            self.mode,
            base,
            self.provenance(),
            self.policy,
            self.rows,
            versions=versions,
            notes=self.notes,
            stopped_early=self.stopped_early,
            complete=complete,
            selection=self.selection,
            shard=self.shard,
            time_budget=self.time_budget.summary() if self.mode == "paired" else None,
        )
