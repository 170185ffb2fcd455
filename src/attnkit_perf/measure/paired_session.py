"""Paired mode's measuring side: the base's and the head's code timed on one GPU in one job.

Each side runs in :data:`PROCESSES_PER_SIDE` worker processes of its own
(:mod:`attnkit_perf.measure.worker`); both sides share one Triton cache (:func:`triton_cache`),
so a kernel compiles once per run, and once per machine while the cache is kept. For one
benchmark (:meth:`PairedSession.prepare`), each side's first worker builds the case and calls
it, compiling what the cache lacks (both at once where two cores allow); they then warm up and
plan alone on the measuring core, the head's first (it plans the rounds both sides use and
measures the host share), then the base's; then the other workers build, loading the kernels
from the cache, and warm up, all at once. Then pairs of blocks are measured, pair ``i`` on
worker ``i % PROCESSES_PER_SIDE`` of each side, in the order A-B for even ``i`` and B-A for odd
(A-B-B-A...), so slow drifts cancel within the pairs and both sides are sampled in more than
one process. A
block is ``rounds`` rounds of the same flushed repetitions (the plan of the head's first
worker, used by both sides), after one untimed round that brings clocks and caches back to
where a running workload keeps them; its value is the median of its rounds. For a host-timed
case every worker then measures the host metric (:meth:`PairedSession.time_host`, timed in
the workers by :mod:`attnkit_perf.measure.host`): one value per process, the decision's unit.
Before that, every worker counts the host work of one call (:meth:`PairedSession.count_host`,
:mod:`attnkit_perf.measure.host`).

The session runs one step at a time, each on the workers of both sides and none deciding
anything: :meth:`PairedSession.prepare` (each side's first worker, its fingerprint where asked),
:meth:`~PairedSession.prepare_others`, :meth:`~PairedSession.measure_pairs`,
:meth:`~PairedSession.count_host`, :meth:`~PairedSession.time_host`,
:meth:`~PairedSession.release`, :meth:`~PairedSession.restart`. Which steps a benchmark takes,
and when it stops, is paired mode's loop (:mod:`attnkit_perf.run.paired_benchmark`). Only the
head's code is under test: a base that rejects, fails, dies or hangs (no answer within
``answer_timeout_s``) on a case leaves it new (:meth:`PairedSession.failed`); dead or hung
workers are replaced before the next benchmark.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from attnkit.cache import cache_root
from attnkit.device import named_test_device, test_device
from attnkit_perf.measure.processes import (
    ANSWER_TIMEOUT_S,
    WorkerError,
    WorkerProcess,
    placement,
    visible_gpus,
)
from attnkit_perf.measure.repo import RepositoryError, backends_absent

#: Worker processes per side. Each process carries an offset of its own (allocation addresses,
#: code placement): on the H100, backward kernels moved by a few percent between processes, and
#: 2 per side failed 3 of ~80 unchanged benchmarks at a 2% threshold in one A/A run. The median
#: over pairs spread across 4 processes halves that offset's variance (the gate's simulations
#: of its decision rule put a 1% process offset at 1% first-stage alarms with 4, 3% with 2).
PROCESSES_PER_SIDE = 4


def triton_cache() -> Path:
    """The ``TRITON_CACHE_DIR`` of both sides' workers: the caller's own where it sets one (the
    gate's steps then share their kernels), else a folder of attnkit's cache, kept between runs.

    One cache for both sides is safe: Triton files a compiled kernel under a hash of its source
    (the kernel function's and every function it calls, the constexpr globals it reads), its
    signature and constants, the compile options, the target GPU and Triton's own version. A
    kernel the two sides define alike is one entry, compiled by whichever side needs it first; a
    kernel the change touches hashes apart, so neither side ever loads the other's. Entries are
    written to a temporary file and renamed into place, so two workers compiling the same
    kernel at once each read a whole file."""
    explicit = os.environ.get("TRITON_CACHE_DIR")
    return Path(explicit) if explicit else cache_root() / "triton"


@dataclass(frozen=True)
class PairedSettings:
    """Effort per benchmark, in pairs of blocks measured before each decision.

    "Same" needs only the interval's upper end below the threshold, which one look's 8 pairs of
    a quiet benchmark settle; "slower" needs the Wilcoxon test at the per-benchmark alpha of a
    ~100-benchmark run, which 16 pairs are the fewest to reach (2^-16 < 0.01 / 100), so a
    suspect always gets a second look. Simulated A/A runs and 3% slowdowns give the same
    outcomes as 16 pairs from the start (the gate's decision tests) at half the time for the
    benchmarks that settle at once.
    """

    rounds_per_block: int = 3
    #: Seconds of measuring after which no further look starts, once two have run
    #: (:func:`attnkit_perf.run.paired_benchmark.measure_looks`).
    budget_s: float = 8.0
    #: Host metric (:mod:`attnkit_perf.measure.host`): rounds over every worker, each a
    #: measurement of ``host_batches`` batches per process, sides alternating first.
    host_rounds: int = 2
    host_batches: int = 15
    #: Most sets of :data:`PROCESSES_PER_SIDE` processes whose host metric one measurement pools
    #: (:func:`attnkit_perf.measure.host.extend_host`); the decision's ``looks``.
    host_looks: int = 3
    #: GPU time, decided sequentially (:mod:`attnkit_perf.decide.sequential`): pairs of blocks per
    #: look (a look is one set of fresh processes; 2 pairs per process pairing at 4 per side).
    pairs_per_look: int = 8
    #: Time every row: no fingerprints and no host work counts, whose equality would decide a
    #: row without timing it. A/A noise runs need this: the noise file holds each row's ratios
    #: (``.ci/aa-noise.sh``, ``--attnkit-time-all``).
    time_all: bool = False


@dataclass
class SideResult:
    """What one side measured for one benchmark: ``blocks[i]`` is pair ``i``'s block, measured by
    worker ``workers[i]`` (pair ``i`` of both sides runs on the workers of index ``i %``
    :data:`PROCESSES_PER_SIDE`: the decision's unit of replication)."""

    blocks: list[float] = field(default_factory=list)
    workers: list[int] = field(default_factory=list)
    peak_bytes: int | None = None
    host_share: float | None = None
    unsupported: str | None = None
    #: Memory the call keeps after it returns (the first worker's reading; None on the CPU).
    kept_bytes: int | None = None
    #: Host metric, one value per worker process (index = worker): median wall and thread CPU
    #: seconds per call over its batches; ``host_dropped``: preempted batches dropped, summed.
    host_per_call: list[float] = field(default_factory=list)
    host_cpu_per_call: list[float] = field(default_factory=list)
    host_dropped: int = 0
    #: Host work count, one answer per worker process (index = worker):
    #: :func:`attnkit_perf.measure.host.host_count`.
    host_counts: list[dict] = field(default_factory=list)
    #: Sets of processes whose blocks these are (:meth:`pool_look`).
    looks: int = 1
    #: The GPU work of one call on the first worker (:mod:`attnkit_perf.measure.fingerprint`);
    #: None where none was taken.
    fingerprint: dict | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.blocks) if self.blocks else None

    def pool_look(self, fresh: SideResult) -> None:
        """Pool the blocks of a further look (a fresh set of processes) into this side's; its
        workers are labelled apart from every earlier set's (the decision's units)."""
        offset = self.looks * PROCESSES_PER_SIDE
        self.blocks += fresh.blocks
        self.workers += [offset + w for w in fresh.workers]
        self.looks += 1

    def pool_host(self, fresh: SideResult) -> None:
        """Pool the host metric of ``fresh`` processes into this side's
        (:func:`attnkit_perf.measure.host.extend_host`)."""
        self.host_per_call += fresh.host_per_call
        self.host_cpu_per_call += fresh.host_cpu_per_call
        self.host_dropped += fresh.host_dropped


@dataclass
class PreparedCase:
    """One benchmark prepared on the current workers (:meth:`PairedSession.prepare`): what the
    session measured of it so far (``results``, by side) and what its next steps need."""

    case: dict
    results: dict[str, SideResult]
    #: Repetitions per round, planned by the head's first worker and used by both sides.
    reps: int | None
    #: False where a side lacks the case's backend: nothing was built, nothing to release.
    built: bool = True
    #: Whether the workers past each side's first are prepared too (:meth:`PairedSession.prepare_others`).
    everyone: bool = False


class PairedSession:
    """Worker processes of both sides, started once per pytest process and reused."""

    def __init__(
        self,
        base_src: Path | list[Path],
        head_src: Path | list[Path],
        perf_dir: Path,
        commits: dict[str, str | None],
        shard: int | None = None,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
        checked_backends: tuple[str, ...] | None = None,
        checkouts: dict[str, Path] | None = None,
    ) -> None:
        """``base_src``, ``head_src``: each side's import root(s), first on its workers' path.
        ``shard``: this pytest process's index among xdist workers (None without xdist). Shard
        ``i`` measures on the ``i``-th visible GPU, its workers pinned to the ``i``-th core from
        the end, so shards share neither.

        ``checked_backends``: None when attnkit itself is compared (each side must import attnkit
        from its first root). Otherwise both sides run the installed attnkit and these backends
        are the code compared: each side must import their modules from its own roots; a
        backend whose module the base's roots do not hold at all is one the base does not have
        (its cases are new).

        ``checkouts``: each side's checkout folder, its workers' working folder (``python -m``
        puts it first on their path, where it must hold none of the side's packages: a src
        layout's); default: the parent of its first root."""
        self.sides = {
            side: [Path(p) for p in (src if isinstance(src, (list, tuple)) else [src])]
            for side, src in (("base", base_src), ("head", head_src))
        }
        self.shard = shard
        self.answer_timeout_s = answer_timeout_s
        self.checked_backends = checked_backends
        self.checkouts = {
            side: (checkouts or {}).get(side) or roots[0].parent for side, roots in self.sides.items()
        }
        #: Per side, the checked backends it does not have (-> why): their cases are not prepared there.
        self.absent: dict[str, dict[str, str]] = {side: {} for side in self.sides}
        self._scratch = Path(tempfile.mkdtemp(prefix="attnkit-paired-"))
        # A folder holding only this attnkit_perf, first on each worker's path: both sides are
        # measured by the same protocol whatever the base's own perf code is.
        link_dir = self._scratch / "perf"
        link_dir.mkdir()
        (link_dir / "attnkit_perf").symlink_to(Path(perf_dir).resolve(), target_is_directory=True)
        self._commits = commits
        self._link_dir = link_dir
        self.workers: dict[str, list[WorkerProcess]] = {}
        #: The next set of workers, started while the current one measures (None until the
        #: first :meth:`restart`): a restart then costs no process start in the row's time.
        self._standby: dict[str, list[WorkerProcess]] | None = None
        self.identity: dict[str, dict] = {}
        #: Whether both sides' first workers may build a case at once: two cores for two compiles.
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else {0}
        self._parallel_build = len(cores) >= 2
        self._start_workers()

    def _start_workers(self) -> None:
        self.workers = self._spawn()
        self._identify()

    def _spawn(self) -> dict[str, list[WorkerProcess]]:
        """A set of worker processes for both sides, started (their imports under way), not yet
        asked anything."""
        link_dir, commits = self._link_dir, self._commits
        spawned = {}
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        # An explicit ATTNKIT_TEST_DEVICE names the GPU itself: the shards are not placed then.
        gpus = visible_gpus() if self.shard is not None and not named_test_device() else []
        core, gpu = placement(self.shard, cores, gpus)
        for side, roots in self.sides.items():
            env = dict(os.environ)
            # Then the caller's own path (site folders): a package resolves to its first folder, so
            # the side's code wins even if the caller's path (or an editable install) names another.
            inherited = [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]
            env["PYTHONPATH"] = os.pathsep.join([str(link_dir), *map(str, roots), *inherited])
            env["TRITON_CACHE_DIR"] = str(triton_cache())
            # The device is resolved here, by this checkout's rule: a side's attnkit may predate it.
            env["ATTNKIT_WORKER_DEVICE"] = str(test_device())
            if core is not None:
                env["ATTNKIT_WORKER_CPU"] = str(core)
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpu
            if commits.get(side):
                env["ATTNKIT_COMMIT"] = commits[side]
            spawned[side] = [
                WorkerProcess(side, i, env, self.checkouts[side], self.answer_timeout_s)
                for i in range(PROCESSES_PER_SIDE)
            ]
        return spawned

    def _identify(self) -> None:
        """Ask every worker of the current set who it is; check where it imported the compared
        code from."""
        request = {"op": "identify"}
        if self.checked_backends is not None:
            request["backends"] = list(self.checked_backends)
        for side, roots in self.sides.items():
            for worker in self.workers[side]:
                ident = worker.ask(request)
                if self.checked_backends is None:
                    where = Path(ident["attnkit_file"]).resolve()
                    if not where.is_relative_to(roots[0].resolve()):
                        raise WorkerError(
                            f"{worker.label} imported attnkit from {where}, not from {roots[0]}: an "
                            "installed attnkit shadows the side's source (uninstall it, or run from a "
                            "checkout)"
                        )
                else:
                    self.absent[side] = self._check_backends(side, worker, ident.get("backends") or {})
                self.identity[side] = ident["provenance"]

    def _check_backends(self, side: str, worker: WorkerProcess, found: dict) -> dict[str, str]:
        """The checked backends side ``side`` does not have (-> why), after checking that it
        imported each one it has from its own roots (a :class:`WorkerError` otherwise)."""
        try:
            return backends_absent(side, self.sides[side], found, self.checked_backends)
        except RepositoryError as err:
            raise WorkerError(f"{worker.label} {err}", side) from None

    def _stop_workers(self, kill: bool = False, workers: dict | None = None) -> None:
        """Stop every worker of the current set (or of ``workers``): told first, then waited for,
        so their exits overlap. ``kill``: a restart's, whose workers hold nothing to keep (every
        answer is in, the case released): killed at once, since an interpreter's teardown with
        torch loaded took ~1 s per worker on the CPU, most of a restart's cost after the imports."""
        every = [worker for group in (workers or self.workers).values() for worker in group]
        for worker in every:
            if kill and worker.proc.poll() is None:
                worker.proc.kill()
            worker.hang_up()
        for worker in every:
            worker.close()
        if workers is None:
            self.workers = {}

    def restart(self) -> None:
        """Replace every worker by a fresh process: a second measurement then draws new
        process offsets instead of repeating the first one's. The replacement is the standby
        set when there is one (started during the previous measurement: its imports are done);
        a new standby is started at once, to be ready for the next restart (on a GPU)."""
        self._stop_workers(kill=True)
        standby, self._standby = self._standby, None
        if standby is not None and all(w.proc.poll() is None for group in standby.values() for w in group):
            self.workers = standby
            self._identify()
        else:
            if standby is not None:
                self._stop_workers(kill=True, workers=standby)
            self._start_workers()
        # Where the workers measure on the CPU (the gate's own tests) a process start is short
        # next to nothing, and a standby set importing torch would only compete with the pairs.
        on_cpu = str(self.identity.get("head", {}).get("gpu_key", "")).startswith("cpu-")
        self._standby = None if on_cpu else self._spawn()

    def close(self) -> None:
        # Every answer is in and every case released: nothing to keep, killed at once.
        self._stop_workers(kill=True)
        if self._standby is not None:  # never asked anything: killed, not waited for past imports
            self._stop_workers(kill=True, workers=self._standby)
            self._standby = None
        shutil.rmtree(self._scratch, ignore_errors=True)

    def prepare(self, case: dict, fingerprint: bool = False) -> PreparedCase:
        """Each side's first worker built, warmed up and planned for ``case``; ``fingerprint``:
        then both first workers take the GPU work of one call (into ``results``), unless a side
        cannot run the case. The workers past the first are left unprepared
        (:meth:`prepare_others`). A side without the case's backend is unsupported and nothing
        is built (``built`` False)."""
        absent = {side: self.absent[side].get(case["backend"]) for side in self.sides}
        if any(absent.values()):  # nothing to build on a side that does not have the backend
            results = {side: SideResult(unsupported=why) for side, why in absent.items()}
            return PreparedCase(case, results, reps=None, built=False)
        results = {side: SideResult() for side in self.sides}
        firsts = [("head", 0), ("base", 0)]
        build = {"op": "prepare", "case": case}
        # Each side's first worker builds the case and compiles what the shared cache lacks: both
        # at once where two cores allow (a kernel the change touches compiles on each side in
        # parallel; one they share compiles on both at once, in the time of one), else the
        # head's then the base's, which loads what they share.
        if self._parallel_build:
            answers = self._ask_all(firsts, build)
        else:
            answers = {**self._ask_all(firsts[:1], build), **self._ask_all(firsts[1:], build)}
        # Then each plans alone on the measuring core, the head's first (it measures the host
        # share and plans the rounds both sides use), then the base's (its host share): no other
        # process competes for the core or the GPU meanwhile.
        for key in firsts:
            if answers[key]["ok"]:
                answers[key].update(self._ask_all([key], {"op": "plan"})[key])
        self._read_answers(case, answers, results)
        if fingerprint and not any(r.unsupported for r in results.values()):
            for (side, _), answer in self._ask_all(firsts, {"op": "fingerprint"}).items():
                if not answer["ok"]:
                    raise WorkerError(f"{side} could not take a fingerprint: {answer['error']}", side)
                results[side].fingerprint = answer["fingerprint"]
        return PreparedCase(case, results, answers[("head", 0)].get("reps"))

    def prepare_others(self, prepared: PreparedCase) -> None:
        """The workers past each side's first built and planned for the prepared case (their
        answers read into its ``results``); nothing where they are already, or a side cannot
        run the case."""
        results = prepared.results
        if prepared.everyone or any(r.unsupported for r in results.values()):
            return
        # They build (loading the kernels from the cache) and warm up at once: only their pairs
        # and host metric are used, and peak memory is per process either way.
        others = [(side, i) for side in ("head", "base") for i in range(1, len(self.workers[side]))]
        answers = self._ask_all(others, {"op": "prepare", "case": prepared.case})
        planned = [key for key in others if answers[key]["ok"]]
        for key, answer in self._ask_all(planned, {"op": "plan"}).items():
            answers[key].update(answer)
        self._read_answers(prepared.case, answers, results)
        prepared.everyone = True

    def _read_answers(self, case: dict, answers: dict, results: dict[str, SideResult]) -> None:
        for (side, i), answer in answers.items():
            if "unsupported" in answer:
                results[side].unsupported = answer["unsupported"]
            elif not answer["ok"] and side == "base":
                # Only the head's code is under test: a case the base cannot build (an older API,
                # a bug fixed since) is new to this change, not a failure of it.
                last = answer["error"].strip().splitlines()[-1]
                results[side].unsupported = f"it failed there ({last})"
            elif not answer["ok"]:
                label = self.workers[side][i].label
                raise WorkerError(f"{label} could not prepare {case}: {answer['error']}", side)
            elif i == 0:
                results[side].peak_bytes = answer["peak_bytes"]
                results[side].host_share = answer["host_share"]
                results[side].kept_bytes = answer.get("kept_bytes")

    def _ask_all(self, keys: list[tuple[str, int]], request: dict) -> dict[tuple[str, int], dict]:
        """``request`` sent to the workers ``keys`` (``(side, index)``) at once, each with its own
        ``seed`` (its index) when it is a prepare; their answers, each awaited in turn (a worker
        that dies or hangs is raised as :class:`WorkerError` once every request is out)."""
        for side, i in keys:
            self.workers[side][i].send({**request, "seed": i} if request["op"] == "prepare" else request)
        return {(side, i): self.workers[side][i].receive(request["op"]) for side, i in keys}

    def _host_rounds(self, results: dict[str, SideResult], settings: PairedSettings) -> None:
        """The host metric on every worker of both sides, into ``results``: worker ``i`` of each
        side back to back, the side first alternating with ``i`` and the round, so that neither
        side always follows the other; a process's value is the median over its rounds."""
        count = len(self.workers["head"])
        answers = {side: [[] for _ in range(count)] for side in self.sides}
        for rnd in range(settings.host_rounds):
            for i in range(count):
                order = ("base", "head") if (i + rnd) % 2 == 0 else ("head", "base")
                for side in order:
                    worker = self.workers[side][i]
                    answer = worker.ask({"op": "host", "batches": settings.host_batches})
                    if not answer["ok"]:
                        raise WorkerError(f"{worker.label} failed to time the host: {answer['error']}", side)
                    answers[side][i].append(answer)
        for side, per_worker in answers.items():
            result = results[side]
            result.host_per_call = [statistics.median(a["per_call_s"] for a in got) for got in per_worker]
            result.host_cpu_per_call = [
                statistics.median(a["cpu_per_call_s"] for a in got) for got in per_worker
            ]
            result.host_dropped = sum(a["dropped"] for got in per_worker for a in got)

    def _host_counts(self, results: dict[str, SideResult], firsts_only: bool = False) -> None:
        """The host work count on every worker of both sides (``firsts_only``: on each side's
        first, the only ones prepared), into ``results`` (each worker counts its call more than
        once: :data:`attnkit_perf.measure.host.REPEATS`). The workers count at once: a
        count does not depend on what else runs, only on the code."""
        every = [
            (side, worker)
            for side in self.sides
            for worker in self.workers[side][: 1 if firsts_only else None]
        ]
        for _, worker in every:
            worker.send({"op": "count"})
        for side, worker in every:
            answer = worker.receive("count")
            if not answer.pop("ok"):
                raise WorkerError(f"{worker.label} failed to count host work: {answer['error']}", side)
            results[side].host_counts.append(answer)

    def _block(self, side: str, pair: int, reps: int, rounds: int) -> float:
        worker = self.workers[side][pair % PROCESSES_PER_SIDE]
        answer = worker.ask({"op": "measure", "rounds": rounds, "reps": reps, "warm_rounds": 1})
        if not answer["ok"]:
            raise WorkerError(f"{worker.label} failed to measure: {answer['error']}", side)
        return statistics.median(answer["samples"])

    def measure_pairs(self, prepared: PreparedCase, pairs: int, rounds: int) -> None:
        """``pairs`` more pairs of blocks of ``rounds`` rounds each, into the prepared case's
        ``results`` (every worker prepared first): pair ``i`` on worker ``i %``
        :data:`PROCESSES_PER_SIDE` of each side, A-B for even ``i``, B-A for odd."""
        self.prepare_others(prepared)
        results = prepared.results
        first = len(results["head"].blocks)
        for pair in range(first, first + pairs):
            order = ("base", "head") if pair % 2 == 0 else ("head", "base")
            for side in order:
                results[side].blocks.append(self._block(side, pair, prepared.reps, rounds))
                results[side].workers.append(pair % PROCESSES_PER_SIDE)

    def count_host(self, prepared: PreparedCase) -> None:
        """The host work count on every prepared worker of both sides (each side's first alone
        where the others were not needed), into the prepared case's ``results``."""
        self._host_counts(prepared.results, firsts_only=not prepared.everyone)

    def time_host(self, prepared: PreparedCase, settings: PairedSettings) -> None:
        """The host metric's wall time on every worker of both sides (each prepared first: the
        value is per process), into the prepared case's ``results``."""
        self.prepare_others(prepared)
        self._host_rounds(prepared.results, settings)

    def release(self) -> None:
        """Every live worker drops the case and frees its memory (a dead one's error is already
        on its way)."""
        for workers in self.workers.values():
            for worker in workers:
                if worker.proc.poll() is None:
                    worker.ask({"op": "release"})

    def failed(self, err: WorkerError) -> dict[str, SideResult]:
        """What a measurement that raised ``err`` leaves: the workers replaced where one died;
        a failure of the head's raised again; a base's failure the case unsupported there (only
        the head's code is under test)."""
        if any(w.proc.poll() is not None for workers in self.workers.values() for w in workers):
            self.restart()
        if err.side != "base":
            raise err
        results = {side: SideResult() for side in self.sides}
        results["base"].unsupported = f"a base worker failed ({str(err).strip().splitlines()[-1]})"
        return results

    def measure_host(self, case: dict, settings: PairedSettings) -> dict[str, SideResult]:
        """The host metric alone on every worker (fresh ones, after :meth:`restart`): the case
        prepared on every worker, its host work counted (not with ``settings.time_all``) and its
        wall time measured, no pairs of blocks; failures as :meth:`failed` says."""
        try:
            prepared = self.prepare(case)
            if not prepared.built:
                return prepared.results
            self.prepare_others(prepared)
            try:
                if not any(r.unsupported for r in prepared.results.values()):
                    if not settings.time_all:
                        self.count_host(prepared)
                    self.time_host(prepared, settings)
                return prepared.results
            finally:
                self.release()
        except WorkerError as err:
            return self.failed(err)
