"""One perf-suite session: which mode, what to compare with, and the verdict it reaches.

Modes (docs/PERF_GATE.md):

* **paired** (``--attnkit-base=REF``): each benchmark is measured on the base and on this
  checkout in worker processes on the same GPU (:mod:`attnkit_perf.measure.paired`), decided as
  soon as it is measured (:func:`attnkit_perf.decide.gate.decide_paired`), and the test fails
  when it is slower or uses more memory. Works under pytest-xdist (one GPU per worker).
* **stored** (``--benchmark-compare``): pytest-benchmark times each case in this process; at the
  end every benchmark is compared with this GPU model's baseline JSON
  (:func:`attnkit_perf.decide.gate.decide_stored`), after re-measuring suspects.
* **record** (``--attnkit-record``): the run becomes this GPU model's baseline.

Every way a comparison could silently not happen is a :class:`pytest.UsageError` here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from pathlib import Path

import pytest
import torch

from attnkit.device import gpu_key
from attnkit.errors import UnsupportedProblemError
from attnkit_perf.decide import gate
from attnkit_perf.decide.baseline import (
    RECORD_COMMAND,
    baseline_path,
    load_baseline,
    missing_message,
    save_baseline,
)
from attnkit_perf.decide.formats import FormatError
from attnkit_perf.decide.noise import load_noise, noise_file
from attnkit_perf.decide.verdict import BenchmarkVerdict, VerdictDocument
from attnkit_perf.machine import provenance, source_digest, version_differences
from attnkit_perf.measure.calibration import GPU_KEYS, HOST_KEYS, drift_factor
from attnkit_perf.measure.cases import BenchCase
from attnkit_perf.measure.measurer import CaseMeasurer, MeasureSettings
from attnkit_perf.measure.paired import (
    ANSWER_TIMEOUT_S,
    PairedSession,
    PairedSettings,
    SideResult,
    shard_problem,
    visible_gpus,
)
from attnkit_perf.measure.timing import HOST_BOUND_SHARE, TIMING_PROTOCOL

VERDICT_PROPERTY = "attnkit_verdict"


def perf_device() -> torch.device:
    """``ATTNKIT_TEST_DEVICE`` if set, else CUDA when present, else the CPU."""
    name = os.environ.get("ATTNKIT_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _median_ms(samples) -> float | None:
    """Median of ``samples`` (seconds) in ms, or None when they are no evidence (empty, NaN):
    the row's outcome says why, and the verdict stays valid JSON."""
    values = [float(s) for s in samples or ()]
    median = statistics.median(values) * 1e3 if values else math.nan
    return median if math.isfinite(median) else None


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


class PerfSession:
    """Per-process state of the perf suite (the controller's and each xdist worker's)."""

    def __init__(self, config: pytest.Config, options: dict) -> None:
        self.config = config
        self.opt = options
        self.device = perf_device()
        self.gpu_key = gpu_key(self.device)
        root = Path(options["baseline_dir"])
        self.baseline_root = root if root.is_absolute() else Path(config.rootpath, root)
        self.record = options["record"]
        self.base_ref = options["base"]
        self.mode = "paired" if self.base_ref else ("stored" if self._compare_requested() else None)
        self.thresholds = self._thresholds()
        self.noise: dict[str, float] = {}
        self.baseline: dict | None = None
        self.baseline_file: Path | None = None
        self.rows: list[BenchmarkVerdict] = []
        self.notes: list[str] = []
        #: Why the session ended before running every benchmark (pytest's interrupt, ``-x``), or
        #: None: the verdict is then incomplete, whatever the rows it holds say.
        self.stopped_early: str | None = None
        self.suspects: list = []
        self.run_json: dict | None = None
        self.document: VerdictDocument | None = None
        self.benchmark_count = 0
        self._measurer: CaseMeasurer | None = None
        self._paired: PairedSession | None = None
        self._provenance: dict | None = None
        self._check_usage()

    # --- configuration --------------------------------------------------------------------

    def _compare_requested(self) -> bool:
        compare = self.config.getoption("benchmark_compare", default=None)
        return compare not in (None, [], False)

    def _thresholds(self) -> gate.Thresholds:
        o = self.opt
        default_slower = gate.Thresholds.slower if self.mode == "paired" else gate.Thresholds.STORED_SLOWER
        return gate.Thresholds(
            slower=o["slower"] if o["slower"] is not None else default_slower,
            run_alpha=o["run_alpha"],
            memory_rel=o["memory_rel"],
            memory_abs_bytes=int(o["memory_abs_mib"] * gate.MIB),
            noise_k=o["noise_k"],
            fail_on_inconclusive=o["fail_on_inconclusive"],
        )

    def _check_usage(self) -> None:
        gpu = self.device.type == "cuda"
        if self.mode and not gpu and not self.opt["allow_cpu"]:
            raise pytest.UsageError(
                f"attnkit perf gate: {self.mode} mode compares GPU timings, and there is no CUDA device "
                f"here ({self.device}). Without --benchmark-compare / --attnkit-base, tests/perf runs "
                "the CPU smoke benchmarks without comparing."
            )
        if self.record and not gpu and not self.opt["allow_cpu"]:
            raise pytest.UsageError(
                "attnkit perf gate: refusing to record a baseline on the CPU: host timings of the smoke "
                "grid are not a gate; record on the GPU model the gate runs on"
            )
        if self.record and self.base_ref:
            raise pytest.UsageError(
                "attnkit perf gate: --attnkit-record and --attnkit-base exclude each other"
            )
        if self.mode == "stored":
            self._load_stored_baseline()
        if self.mode:
            self._load_noise()

    def _load_stored_baseline(self) -> None:
        compare = self.config.getoption("benchmark_compare")
        if compare is True:
            path = baseline_path(self.baseline_root, self.gpu_key)
            if not path.exists():
                raise pytest.UsageError(
                    f"attnkit perf gate: {missing_message(self.baseline_root, self.gpu_key)}"
                )
        else:
            path = Path(str(compare))
            if not path.is_file():
                default = baseline_path(self.baseline_root, self.gpu_key)
                raise pytest.UsageError(
                    f"attnkit perf gate: --benchmark-compare={compare}: no such baseline file (give the "
                    f"path of a baseline JSON, or no value for {default})"
                )
        try:
            self.baseline = load_baseline(
                path, self.gpu_key, self.opt["allow_other_gpu"], timing_protocol=TIMING_PROTOCOL
            )
        except FormatError as err:
            raise pytest.UsageError(f"attnkit perf gate: {err}; re-record it with: {RECORD_COMMAND}") from err
        self.baseline_file = path
        # pytest-benchmark's own --benchmark-compare-fail then reads the same file.
        self.config.option.benchmark_compare = str(path.resolve())

    def _load_noise(self) -> None:
        path = self.opt["noise"] or noise_file(self.baseline_root, self.gpu_key, self.mode)
        if str(path) == "none" or (not self.opt["noise"] and not Path(path).is_file()):
            self.notes.append(f"no A/A noise file ({path}): every benchmark held to the practical threshold")
            return
        try:
            self.noise = load_noise(path, self.gpu_key, self.mode)
        except FormatError as err:
            raise pytest.UsageError(f"attnkit perf gate: {err}") from err
        self.notes.append(f"A/A noise from {path}: {len(self.noise)} benchmarks")

    def provenance(self) -> dict:
        """:func:`attnkit_perf.machine.provenance` and the timing protocol of this run."""
        if self._provenance is None:
            self._provenance = {**provenance(self.device), "timing": TIMING_PROTOCOL}
        return self._provenance

    @property
    def alpha(self) -> float:
        return gate.per_benchmark_alpha(self.thresholds, self.benchmark_count)

    @property
    def confirmed(self) -> bool:
        """Whether a slowdown must show twice on independent measurements to fail: paired mode
        re-measures every suspect on fresh processes of both sides; stored mode re-measures
        only the head against the same recorded baseline, whose own deviation both share."""
        return self.mode == "paired" and not self.opt["no_confirm"]

    @property
    def noise_k(self) -> float:
        """A/A standard deviations a benchmark's threshold clears (:func:`gate.noise_z`)."""
        if self.thresholds.noise_k is not None:
            return self.thresholds.noise_k
        return gate.noise_z(self.alpha, self.confirmed)

    def threshold_for(self, name: str) -> float:
        return gate.benchmark_threshold(self.thresholds, self.noise.get(name), self.alpha, self.confirmed)

    def _noise_notes(self) -> list[str]:
        noisy = sorted(n for n in self.noise if self.threshold_for(n) > 2 * self.thresholds.slower)
        if not noisy:
            return []
        return [
            f"too noisy to guard at {self.thresholds.slower:.1%} (their threshold, {self.noise_k:.2f} A/A "
            f"standard deviations, is over twice it): " + ", ".join(noisy)
        ]

    # --- paired mode ------------------------------------------------------------------------

    def paired_session(self) -> PairedSession:
        if self._paired is None:
            import attnkit
            import attnkit_perf

            base_src, base_commit = self.opt["base_src"], self.opt["base_commit"]
            head_src = Path(attnkit.__file__).resolve().parent.parent
            self._paired = PairedSession(
                Path(base_src),
                head_src,
                Path(attnkit_perf.__file__).parent,
                {"base": base_commit},
                shard=self.opt.get("shard"),
                answer_timeout_s=self.opt.get("worker_timeout_s") or ANSWER_TIMEOUT_S,
            )
        return self._paired

    def shard_problem(self, workers: int) -> str | None:
        """Why paired mode cannot shard over ``workers`` xdist workers here, or None (on the
        CPU, where the gate's own tests run it, and with an explicit ATTNKIT_TEST_DEVICE the
        shards are not placed)."""
        if self.device.type != "cuda" or os.environ.get("ATTNKIT_TEST_DEVICE"):
            return None
        return shard_problem(workers, visible_gpus())

    def run_paired(self, node, case: BenchCase) -> None:
        name = case.name
        threshold, alpha = self.threshold_for(name), self.alpha
        budget = self.opt["budget_s"]
        settings = PairedSettings(budget_s=budget) if budget else PairedSettings()

        def decide(results: dict[str, SideResult], *earlier: dict[str, SideResult]) -> gate.Decision:
            b, h = results["base"], results["head"]
            limit = threshold
            # Host-bound benchmarks keep their floor with an A/A noise file too: a few A/A runs
            # cannot bound the tails of what moved by tens of percent between worker processes.
            if _host_bound_throughout(results, *earlier):
                limit = max(threshold, self.thresholds.host_bound_slower)
            return gate.decide_paired(
                b.blocks, h.blocks, self.thresholds, alpha, limit, b.peak_bytes, h.peak_bytes
            )

        paired = self.paired_session()
        start = time.perf_counter()
        results = paired.measure(case.as_dict(), settings, lambda r: decide(r).settled)
        # Where the gate's own time goes, per benchmark: "measure" is the first measurement, its
        # "prepare" included; a suspect adds "restart" (fresh workers) and "confirm".
        seconds = {"prepare": paired.last_prepare_s, "measure": time.perf_counter() - start}
        base, head = results["base"], results["head"]
        host_bound = _host_bound_throughout(results)
        if head.unsupported:
            pytest.skip(f"{case.backend} does not support this shape: {head.unsupported}")
        if base.unsupported:
            decision = gate.Decision("new", reason=f"the base cannot run it: {base.unsupported}")
        else:
            decision = decide(results)
            if decision.outcome == "slower" and not self.opt["no_confirm"]:
                # Every pair so far ran on the same processes, whose offsets the interval cannot
                # see: a slowdown must show again on fresh ones (both sides restarted).
                start = time.perf_counter()
                paired.restart()
                seconds["restart"] = time.perf_counter() - start
                # Judged by the first measurement's classification too: a slowdown seen under
                # the GPU rule must not pass because the fresh processes read host-bound.
                again = paired.measure(case.as_dict(), settings, lambda r: decide(r, results).settled)
                seconds["confirm"] = time.perf_counter() - start - seconds["restart"]
                decision = gate.confirm_slowdown(decision, decide(again, results))
                host_bound = _host_bound_throughout(again, results)
                base, head = again["base"], again["head"]
        decision.extra["seconds"] = {step: round(s, 3) for step, s in seconds.items()}
        decision.extra["host_share"] = {
            side: None if r.host_share is None else round(r.host_share, 3)
            for side, r in (("base", base), ("head", head))
        }
        row = BenchmarkVerdict.from_decision(
            describe(case),
            decision,
            base_median_ms=None if base.median_s is None else base.median_s * 1e3,
            # A benchmark new to this change was not timed (nothing to pair it with).
            head_median_ms=None if head.median_s is None else head.median_s * 1e3,
            base_peak_bytes=base.peak_bytes,
            head_peak_bytes=head.peak_bytes,
            tflops=None if head.median_s is None else case.flops / head.median_s / 1e12,
            host_bound=None if _share(base, head) is None else host_bound,
        )
        node.user_properties.append((VERDICT_PROPERTY, dataclasses.asdict(row)))
        failing = gate.FAILING + (("inconclusive",) if self.thresholds.fail_on_inconclusive else ())
        if row.outcome in failing:
            pytest.fail(f"{name}: {row.outcome}: {row.reason}", pytrace=False)

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

    def run_stored(self, benchmark, case: BenchCase, wrap) -> None:
        """Benchmark ``case`` with pytest-benchmark; queue it for a second measurement if it
        already looks slower than the baseline (decided once the whole run is in)."""
        try:
            self.measurer.benchmark_case(benchmark, case, wrap)
        except UnsupportedProblemError as err:
            benchmark.skipped = True
            pytest.skip(f"{case.backend} does not support this shape: {err}")
        if self.baseline is None or self.opt["no_confirm"]:
            return
        reference = self._baseline_entries().get(benchmark.fullname)
        if reference is None:
            return
        decision = self._decide_stored(
            reference, benchmark.stats.stats.data, benchmark.extra_info, local=True
        )
        if decision.outcome in ("slower", "inconclusive"):
            self.suspects.append((benchmark, case, wrap))

    def confirm_suspects(self) -> None:
        for benchmark, case, wrap in self.suspects:
            info = benchmark.extra_info
            info["confirm"] = self.measurer.remeasure(
                case, info.get("rounds") or 20, info.get("reps_per_round") or 1, wrap
            )

    def _baseline_entries(self) -> dict:
        return {b["fullname"]: b for b in self.baseline["benchmarks"]}

    def _drift(self, base_info: dict, head_calibration: dict | None, host_bound: bool) -> float:
        keys = HOST_KEYS if host_bound else GPU_KEYS
        return drift_factor(base_info, head_calibration, keys)

    def _decide_stored(
        self, base_entry: dict, head_samples, head_info: dict, local: bool = False
    ) -> gate.Decision:
        base_info = base_entry.get("extra_info") or {}
        # This run's host-boundness alone picks the drift. A time this run's GPU set is compared
        # under the GPU's drift whatever the baseline's was: a baseline time its host set is at
        # least its GPU time, so a slowdown against it is a slowdown of the GPU work. On the
        # H200 (2026-11-24) the host calibration read x0.77 between two runs minutes apart while
        # the benchmarks did not move; divided out of two GPU-bound benchmarks that the baseline
        # had marked host-bound, it turned ratios of 0.98 into "slower" at x1.27.
        host_bound = bool(head_info.get("host_bound"))
        if local:  # while measuring: this benchmark's own calibration against the baseline's
            drift = self._drift(base_info.get("calibration"), head_info.get("calibration"), host_bound)
        else:
            drift = self._drift(
                self._run_calibration(self.baseline), self._run_calibration(self.run_json), host_bound
            )
        name = base_info.get("name") or base_entry["fullname"]
        return gate.decide_stored(
            base_entry["stats"]["data"],
            head_samples,
            drift,
            self.thresholds,
            self.alpha,
            self.threshold_for(name),
            base_info.get("peak_bytes"),
            head_info.get("peak_bytes"),
        )

    @staticmethod
    def _run_calibration(run: dict) -> dict:
        """A run's calibration: per kernel, the median over its benchmarks' local calibrations."""
        per_key: dict[str, list[float]] = {}
        for bench in run.get("benchmarks", []):
            for key, value in ((bench.get("extra_info") or {}).get("calibration") or {}).items():
                per_key.setdefault(key, []).append(value)
        return {key: statistics.median(values) for key, values in per_key.items()}

    def finish_stored(self, run: dict) -> None:
        """Called with the run's JSON (per-round samples included) once pytest-benchmark has it."""
        self.run_json = run
        if self.record:
            try:
                path = save_baseline(run, baseline_path(self.baseline_root, self.gpu_key))
            except FormatError as err:
                self.notes.append(f"NOT recorded: {err}")
            else:
                self.notes.append(
                    f"recorded perf baseline for {self.gpu_key}: {path} ({len(run['benchmarks'])} benchmarks)"
                )
        if self.baseline is None:
            return
        baseline = self._baseline_entries()
        now = {b["fullname"]: b for b in run.get("benchmarks", [])}
        for fullname, bench in now.items():
            info = bench.get("extra_info") or {}
            case = BenchCase(**{**info["shape"], "backend": info["backend"], "pass_name": info["pass"]})
            measured = {
                "head_median_ms": _median_ms(bench["stats"]["data"]),
                "head_peak_bytes": info.get("peak_bytes"),
                "tflops": info.get("tflops"),
                "host_bound": info.get("host_bound"),
            }
            reference = baseline.get(fullname)
            if reference is None:
                decision = gate.Decision("new", reason="not in the baseline")
            else:
                decision = self._decide_stored(reference, bench["stats"]["data"], info)
                confirm = info.get("confirm")
                if confirm and decision.outcome in ("slower", "inconclusive"):
                    second = self._decide_stored(reference, confirm["samples_s"], info)
                    decision = (
                        gate.confirm_slowdown(decision, second) if decision.outcome == "slower" else second
                    )
                if info.get("host_bound") and decision.outcome == "slower":
                    # The Python layer and launches set this time, and hosts differ far more than
                    # GPUs (x1.2-1.9 between two H100 machines); paired mode guards it.
                    decision.outcome = "inconclusive"
                    decision.reason = f"host-bound, not comparable across machines: {decision.reason}"
                measured["base_median_ms"] = _median_ms(reference["stats"]["data"])
                measured["base_peak_bytes"] = (reference.get("extra_info") or {}).get("peak_bytes")
            self.rows.append(BenchmarkVerdict.from_decision(describe(case), decision, **measured))
        for fullname, reference in baseline.items():
            if fullname not in now:
                info = reference["extra_info"]
                case = BenchCase(**{**info["shape"], "backend": info["backend"], "pass_name": info["pass"]})
                self.rows.append(
                    BenchmarkVerdict.from_decision(
                        describe(case),
                        gate.Decision("missing", reason="in the baseline, not run"),
                        base_median_ms=_median_ms(reference["stats"]["data"]),
                        base_peak_bytes=info.get("peak_bytes"),
                    )
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
        if self.mode is None or (self.mode == "stored" and self.run_json is None):
            return None
        if self.mode == "paired":
            # The same machine and software; the base's own commit and code.
            base_code = source_digest(Path(self.opt["base_src"]) / "attnkit")
            base = {
                "label": f"base {self.base_ref} ({self.opt['base_commit']})",
                "provenance": {**self.provenance(), "commit": self.opt["base_commit"], "source": base_code},
            }
            versions = {}
        else:
            recorded = self.baseline["machine_info"].get("attnkit") or {}
            base = {
                "label": f"baseline {self.baseline_file}",
                "provenance": recorded,
                "datetime": self.baseline.get("datetime"),
            }
            versions = {k: list(v) for k, v in version_differences(recorded, self.provenance()).items()}
        stopped = []
        if self.stopped_early:
            stopped.append(
                f"the run stopped early ({self.stopped_early}): "
                "the benchmarks after the last row have no verdict"
            )
        thresholds = {
            "slower": self.thresholds.slower,
            "run_alpha": self.thresholds.run_alpha,
            "per_benchmark_alpha": self.alpha,
            "memory_rel": self.thresholds.memory_rel,
            "memory_abs_bytes": self.thresholds.memory_abs_bytes,
            "noise_k": self.noise_k,
            "fail_on_inconclusive": self.thresholds.fail_on_inconclusive,
        }
        return VerdictDocument(
            mode=self.mode,
            base=base,
            head={"label": "this checkout", "provenance": self.provenance()},
            thresholds=thresholds,
            benchmarks=list(self.rows),
            version_differences=versions,
            notes=self.notes + self._noise_notes() + stopped,
            complete=complete and self.stopped_early is None,
        )


def _share(base: SideResult, head: SideResult) -> float | None:
    """The host share that classifies a paired benchmark: the smaller of the two sides' (the
    other side's where one has none, as for a benchmark new to the head). Host-bound means the
    host set the time of *both* codes. A slowdown of the GPU's work lowers the head's share; a
    host-only slowdown of a GPU-bound benchmark raises it but not the base's, so it is judged
    by the GPU rule, which is right: the benchmark got slower. (The classification once read
    the host's issue time over the measured time instead, which the flush's head start made
    meaningless: GPU-bound benchmarks read 0.5-1.4 and passed real slowdowns of x1.10 and x1.24
    under the host-bound threshold, sessions 9-11 and 14 of docs/evidence.)"""
    shares = [f for f in (base.host_share, head.host_share) if f is not None]
    return min(shares) if shares else None


def _host_bound(base: SideResult, head: SideResult) -> bool:
    return (_share(base, head) or 0.0) >= HOST_BOUND_SHARE


def _host_bound_throughout(*measurements: dict[str, SideResult]) -> bool:
    """Host-bound by every measurement of the benchmark (each a {"base", "head"} result): a
    suspect's confirmation on fresh processes is judged by the strictest classification seen,
    so a slowdown seen under the GPU rule cannot pass because fresh processes read otherwise."""
    return all(_host_bound(m["base"], m["head"]) for m in measurements)
