"""Paired mode against the baseline's commit, for stored mode's "slower" rows before they fail
(the rule: :mod:`attnkit_perf.decide.adjudication`).

The baseline's provenance names the commit it was recorded at; its code is extracted from the
git repository at the run's rootdir as ``--attnkit-base`` extracts it (:mod:`attnkit_perf.run.sides`:
attnkit's ``src``, or another repository's import roots) and checked against the recorded
``source`` digest. Each suspect is
then measured as paired mode measures a benchmark (worker processes of both sides on this GPU,
in looks over fresh sets of processes until settled: :func:`paired_decision`, which bisect uses too).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from attnkit_perf.decide.adjudication import adjudicated, kept, source_problem
from attnkit_perf.decide.gate import Decision, Thresholds
from attnkit_perf.decide.paired_rule import PairedRule
from attnkit_perf.measure.cases import BenchCase
from attnkit_perf.measure.checkout import BaseError
from attnkit_perf.measure.paired_session import PairedSession, PairedSettings
from attnkit_perf.measure.processes import ANSWER_TIMEOUT_S, WorkerError
from attnkit_perf.measure.repo import Repository
from attnkit_perf.run import sides
from attnkit_perf.run.paired_benchmark import measure_looks


def paired_decision(
    session: PairedSession, case: BenchCase, rule: PairedRule, settings: PairedSettings
) -> tuple[Decision | None, str | None]:
    """``(decision, None)`` of ``case`` measured on both sides of ``session`` in looks over fresh
    sets of processes until settled (:func:`attnkit_perf.run.paired_benchmark.measure_looks`: a slowdown
    shows on two sets); ``(None, why)`` when a side cannot run it."""
    results, _ = measure_looks(session, rule, case.as_dict(), settings, host=False)
    unsupported = results["base"].unsupported or results["head"].unsupported
    if unsupported:
        return None, unsupported
    return rule.decide(results), None


class Adjudicator:
    """Paired comparisons of this checkout with the baseline's commit; the base is extracted and
    the workers started at the first suspect, once."""

    def __init__(
        self,
        rootpath: Path,
        repository: Repository | None,
        backends: list[str] | None,
        recorded: Mapping,
        thresholds: Thresholds,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
        settings: PairedSettings | None = None,
    ) -> None:
        self.rootpath = Path(rootpath)
        self.repository = repository
        self.backends = backends
        self.recorded = recorded
        self.thresholds = thresholds
        self.answer_timeout_s = answer_timeout_s
        self.settings = settings or PairedSettings()
        self._scratch: Path | None = None
        self._source: tuple[Path | None, str | None, str | None] | None = None
        self._session: PairedSession | None = None

    def source(self) -> tuple[list[Path] | None, str | None, str | None]:
        """``(import roots, commit, None)`` of the baseline's code, or ``(None, None, why not)``."""
        if self._source is None:
            self._source = self._materialise()
        return self._source

    def _materialise(self) -> tuple[list[Path] | None, str | None, str | None]:
        problem = source_problem(self.recorded)
        if problem:
            return None, None, problem
        label = str(self.recorded["commit"])
        self._scratch = Path(tempfile.mkdtemp(prefix="attnkit-adjudicate-"))
        where = self.repository.top if self.repository is not None else self.rootpath
        try:
            roots, commit = sides.materialise(label, self.repository, self.rootpath, self._scratch)
        except BaseError as err:
            return None, None, f"the baseline's commit {label} is not available in {where}: {err}"
        recorded, found = self.recorded.get("source"), sides.code_digest(roots, self.repository)
        if recorded and recorded != found:
            return (
                None,
                None,
                (
                    f"commit {label}'s code (source {found}) is not the code the baseline recorded "
                    f"(source {recorded})"
                ),
            )
        return roots, commit, None

    def _paired(self, roots: list[Path], commit: str) -> PairedSession:
        if self._session is None:
            self._session = sides.open_paired(
                roots,
                sides.working_tree_roots(self.repository),
                {"base": commit},
                self.repository,
                self.backends,
                answer_timeout_s=self.answer_timeout_s,
            )
        return self._session

    def adjudicate(self, case: BenchCase, stored: Decision) -> Decision:
        """The row of ``case``, whose stored decision ``stored`` is slower."""
        roots, commit, problem = self.source()
        if problem:
            return kept(stored, problem)
        rule = PairedRule(self.thresholds, stored.alpha, stored.threshold)
        try:
            decision, unsupported = paired_decision(self._paired(roots, commit), case, rule, self.settings)
        except WorkerError as err:
            return kept(stored, f"the paired measurement failed: {str(err).strip().splitlines()[-1]}")
        if decision is None:
            return kept(stored, f"a side cannot run it in paired mode: {unsupported}")
        return adjudicated(stored, decision, commit)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)


def adjudicate_rows(compared: list[tuple], adjudicator: Adjudicator) -> list[tuple]:
    """``(extra_info, decision, measured)`` rows of stored mode, each "slower" adjudicated."""
    rows = []
    try:
        for info, decision, measured in compared:
            if decision.outcome == "slower":
                shape = {**info["shape"], "backend": info["backend"], "pass_name": info["pass"]}
                decision = adjudicator.adjudicate(BenchCase(**shape), decision)
            rows.append((info, decision, measured))
    finally:
        adjudicator.close()
    return rows
