"""The verdict: one model, written by the gate and read by the report (and by anyone's tooling).

Format ``attnkit-perf-verdict/2``, validated by ``schemas/verdict.schema.json`` on write and on
read. A document holds the mode (``paired`` or ``stored``), both sides' provenance, the
thresholds, and one row per benchmark (:class:`BenchmarkVerdict`). ``passed`` is false iff a
row fails (:data:`FAILING`: error, dropped unless allowed, slower,
more-memory, kept-memory; inconclusive too when the run was told to fail on those, and the rows
its time budget left undecided under ``--attnkit-out-of-time=fail``), no benchmark was compared
at all (a gate that guarded nothing has not passed), or the document is not ``complete``: paired
mode rewrites the verdict file after each benchmark with ``complete: false``, so a run stopped
before its end (a job's time limit) leaves the benchmarks it decided, and never a file that
reads as passed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from attnkit_perf.formats.schema import read_json, validate

FORMAT = "attnkit-perf-verdict/2"

#: Every outcome a row can have (the schema's enum), in the order reports list them; the rules
#: that give each are :mod:`attnkit_perf.decide`'s.
OUTCOMES = (
    "error",
    "dropped",
    "slower",
    "more-memory",
    "kept-memory",
    "inconclusive",
    "unfinished",
    "not-reached",
    "faster",
    "new",
    "missing",
    "same",
)
FAILING = ("error", "dropped", "slower", "more-memory", "kept-memory")
#: Rows paired mode did not decide within its time budget: cut short, or never started.
OUT_OF_TIME = ("unfinished", "not-reached")
#: Outcomes of a benchmark measured on both sides: a run with none of them compared nothing.
COMPARED = ("slower", "more-memory", "kept-memory", "inconclusive", "unfinished", "faster", "same")


def failing_outcomes(
    fail_on_inconclusive: bool = False, allow_dropped: bool = False, fail_out_of_time: bool = False
) -> tuple[str, ...]:
    """The outcomes that fail a run under these options."""
    kinds = FAILING + (("inconclusive",) if fail_on_inconclusive else ())
    kinds += OUT_OF_TIME if fail_out_of_time else ()
    return tuple(k for k in kinds if not (allow_dropped and k == "dropped"))


def undecided(rows: Iterable) -> list[str]:
    """The names of the rows (anything with ``name`` and ``outcome``) left undecided by the
    time budget (:data:`OUT_OF_TIME`), in the order the run met them."""
    return [row.name for row in rows if row.outcome in OUT_OF_TIME]


@dataclass
class BenchmarkVerdict:
    """One benchmark's outcome. Times are medians per call in ms; ``ratio`` is head/base
    (drift-corrected in stored mode); ``ci`` its interval; ``threshold`` the fraction this
    benchmark had to exceed; ``reason`` the evidence in words."""

    name: str
    group: str
    backend: str
    pass_name: str
    shape: dict
    outcome: str
    reason: str = ""
    base_median_ms: float | None = None
    head_median_ms: float | None = None
    ratio: float | None = None
    ci: list[float] | None = None
    p: float | None = None
    threshold: float | None = None
    alpha: float | None = None
    base_peak_bytes: int | None = None
    head_peak_bytes: int | None = None
    tflops: float | None = None
    host_bound: bool | None = None
    #: The host metric beside the GPU time (host time per call, per-process evidence), or None
    #: where it was not measured: :func:`attnkit_perf.decide.host.host_summary`.
    host: dict | None = None
    #: Device memory the call keeps after it returns, per side:
    #: ``{"base_bytes", "head_bytes", "limit_bytes"}`` (:func:`attnkit_perf.decide.host.with_kept`).
    kept: dict | None = None
    evidence: dict = field(default_factory=dict)

    @classmethod
    def from_decision(cls, describe: dict, decision, **measured) -> BenchmarkVerdict:
        """The row of a rule's ``decision`` (an :class:`attnkit_perf.decide.gate.Decision`, read by
        its fields: the file format does not depend on the rules) for the case ``describe``."""
        extra = dict(decision.extra)
        measured.setdefault("host", extra.pop("host", None))
        measured.setdefault("kept", extra.pop("kept", None))
        return cls(
            **describe,
            outcome=decision.outcome,
            reason=decision.reason,
            ratio=decision.ratio,
            ci=list(decision.ci) if decision.ci else None,
            p=decision.p,
            threshold=decision.threshold,
            alpha=decision.alpha,
            evidence=extra,
            **measured,
        )

    @property
    def failed(self) -> bool:
        return self.outcome in FAILING


@dataclass
class VerdictDocument:
    mode: str
    base: dict
    head: dict
    thresholds: dict
    benchmarks: list[BenchmarkVerdict]
    version_differences: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: False while the run is still deciding benchmarks (a progress file, never a pass).
    complete: bool = True
    #: What the run selected from the diff and skipped, per reason (attnkit_perf.select), or None
    #: when every benchmark of the grid was run.
    selection: dict | None = None
    #: The part of a split grid this verdict covers (``index``, ``count``, ``grid`` digest, its
    #: ``rows``: :mod:`attnkit_perf.run.shards`), or the parts a merged verdict joins (``merged``).
    shard: dict | None = None
    #: Paired mode's time budget, when it had one: ``seconds``, ``spent_s`` and the cost
    #: ``estimates`` per row kind (:mod:`attnkit_perf.run.time_budget`); written with the names
    #: of the rows it left ``undecided``.
    time_budget: dict | None = None

    @property
    def fail_on_inconclusive(self) -> bool:
        return bool(self.thresholds.get("fail_on_inconclusive"))

    @property
    def failing_outcomes(self) -> tuple[str, ...]:
        t = self.thresholds
        return failing_outcomes(
            self.fail_on_inconclusive, bool(t.get("allow_dropped")), t.get("out_of_time") == "fail"
        )

    @property
    def undecided(self) -> list[str]:
        """The rows the time budget left undecided (unfinished or not reached), by name."""
        return undecided(self.benchmarks)

    @property
    def failing(self) -> list[BenchmarkVerdict]:
        return [b for b in self.benchmarks if b.outcome in self.failing_outcomes]

    @property
    def compared(self) -> int:
        """Benchmarks measured on both sides (whatever their outcome)."""
        return sum(b.outcome in COMPARED for b in self.benchmarks)

    @property
    def nothing_affected(self) -> bool:
        """Whether the diff reached no benchmark's code, so none was selected: the one way a
        verdict with nothing compared passes."""
        s = self.selection
        return bool(s) and not s.get("everything") and s.get("selected") == 0 and not self.benchmarks

    @property
    def passed(self) -> bool:
        return self.complete and not self.failing and (self.compared > 0 or self.nothing_affected)

    def counts(self) -> dict[str, int]:
        counts = Counter(b.outcome for b in self.benchmarks)
        return {k: counts[k] for k in OUTCOMES if counts[k]}

    def to_dict(self) -> dict:
        rows = []
        for b in self.benchmarks:
            row = asdict(b)
            row["pass"] = row.pop("pass_name")
            rows.append(row)
        return {
            "format": FORMAT,
            "mode": self.mode,
            "complete": self.complete,
            "passed": self.passed,
            "counts": self.counts(),
            "thresholds": self.thresholds,
            "base": self.base,
            "head": self.head,
            "version_differences": self.version_differences,
            "notes": self.notes,
            **({"selection": self.selection} if self.selection is not None else {}),
            **({"shard": self.shard} if self.shard is not None else {}),
            **(
                {"time_budget": {**self.time_budget, "undecided": self.undecided}}
                if self.time_budget is not None
                else {}
            ),
            "benchmarks": rows,
        }

    @classmethod
    def from_dict(cls, data: dict, where: str = "verdict") -> VerdictDocument:
        validate("verdict", data, where)
        rows = []
        for row in data["benchmarks"]:
            row = dict(row)
            row["pass_name"] = row.pop("pass")
            rows.append(BenchmarkVerdict(**row))
        return cls(
            mode=data["mode"],
            base=data["base"],
            head=data["head"],
            thresholds=data["thresholds"],
            benchmarks=rows,
            version_differences=data.get("version_differences", {}),
            notes=data.get("notes", []),
            complete=data.get("complete", True),
            selection=data.get("selection"),
            shard=data.get("shard"),
            time_budget=_without(data.get("time_budget"), "undecided"),
        )

    def write(self, path: Path | str) -> Path:
        data = self.to_dict()
        validate("verdict", data, "the verdict being written")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n", encoding="utf8")
        return path

    @classmethod
    def read(cls, path: Path | str) -> VerdictDocument:
        return cls.from_dict(read_json(path, "verdict"), f"verdict {path}")


def _without(block: dict | None, key: str) -> dict | None:
    """``block`` less ``key`` (a value the document derives from its rows), or None."""
    return None if block is None else {k: v for k, v in block.items() if k != key}
