"""How a run's decisions become its verdict (:mod:`attnkit_perf.formats.verdict`): the row of a
benchmark decided in paired mode, of one that raised, the rows of stored mode, and the document
with both sides, the thresholds and the notes. The session hands in plain values: descriptions
of the benchmarks, decisions, and what paired mode measured (read by field name, so that this
package stays free of the measuring code)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from attnkit_perf.decide.gate import Decision
from attnkit_perf.decide.host import host_bound_throughout, paired_share
from attnkit_perf.decide.policy import RunPolicy
from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def paired_row(
    described: dict, decision: Decision, measurements: list[dict], flops: float
) -> BenchmarkVerdict:
    """The row of a benchmark paired mode decided. ``described``: its name, group, backend, pass
    and shape; ``measurements``: ``{"base": side, "head": side}`` each, the first the one the
    row reports (a confirmation where there was one), each side with ``median_s``,
    ``peak_bytes`` and ``host_share`` (:class:`attnkit_perf.measure.paired_session.SideResult`);
    ``flops``: the work of one call. Each side's host share is kept in the evidence."""
    base, head = measurements[0]["base"], measurements[0]["head"]
    decision.extra["host_share"] = {
        side: None if r.host_share is None else round(r.host_share, 3)
        for side, r in (("base", base), ("head", head))
    }
    share = paired_share(base.host_share, head.host_share)
    return BenchmarkVerdict.from_decision(
        described,
        decision,
        base_median_ms=_ms(base.median_s),
        head_median_ms=_ms(head.median_s),
        base_peak_bytes=base.peak_bytes,
        head_peak_bytes=head.peak_bytes,
        tflops=None if head.median_s is None else flops / head.median_s / 1e12,
        host_bound=None if share is None else host_bound_throughout(*measurements),
    )


def error_row(name: str, typename: str, message: str) -> BenchmarkVerdict:
    """The "error" row (failing) of benchmark ``name``, whose test raised ``typename`` with
    ``message``; named as the run knows it (a stored run names it again from its baseline)."""
    last = (message.strip().splitlines() or [""])[-1]
    reason = f"the benchmark raised {typename}: {last}"
    return BenchmarkVerdict(
        name=name, group="", backend="", pass_name="", shape={}, outcome="error", reason=reason
    )


def stored_rows(
    compared: list[tuple],
    errored: Mapping[str, BenchmarkVerdict],
    recorded: Mapping[str, dict],
    describe: Callable[[dict], dict],
) -> list[BenchmarkVerdict]:
    """The rows of stored mode: one per compared benchmark (``(extra_info, decision, measured)``,
    :meth:`attnkit_perf.decide.stored.StoredRule.compare`), then one per benchmark whose test
    raised (``errored``: test id -> :func:`error_row`), described as the baseline recorded it
    where ``recorded`` (test id -> the baseline's ``extra_info``) holds it. ``describe`` turns
    an ``extra_info`` into a row's name, group, backend, pass and shape."""
    rows = [
        BenchmarkVerdict.from_decision(describe(info), decision, **measured)
        for info, decision, measured in compared
    ]
    for nodeid, row in errored.items():
        if nodeid in recorded:  # name the broken benchmark as the baseline knows it
            row = BenchmarkVerdict.from_decision(
                describe(recorded[nodeid]), Decision("error", reason=row.reason)
            )
        rows.append(row)
    return rows


def paired_base(ref: str, commit, provenance: dict, source: str) -> dict:
    """The base side of a paired verdict: this machine and software, the base's commit and code
    (``source``: the digest of its code)."""
    # A ref that is (a prefix of) the commit, or a checkout, whose label holds its absolute path,
    # is not named twice; a substring match would drop a short tag found in a hash.
    named = str(commit).startswith(ref) or str(commit).startswith("checkout ")
    return {
        "label": f"base {commit}" if named else f"base {ref} ({commit})",
        "provenance": {**provenance, "commit": commit, "source": source},
    }


def stored_base(baseline_file, baseline: dict) -> dict:
    """The base side of a stored verdict: the baseline file and the provenance it recorded."""
    return {
        "label": f"baseline {baseline_file}",
        "provenance": baseline["machine_info"].get("attnkit") or {},
        "datetime": baseline.get("datetime"),
    }


def verdict_document(
    mode: str,
    base: dict,
    head_provenance: dict,
    policy: RunPolicy,
    rows: list[BenchmarkVerdict],
    *,
    versions: dict,
    notes: list[str],
    stopped_early: str | None,
    complete: bool,
    selection: dict | None = None,
    shard: dict | None = None,
    time_budget: dict | None = None,
) -> VerdictDocument:
    """The verdict of a run: ``rows`` so far, the policy's thresholds and notes, and whether it is
    ``complete`` (never when the run ``stopped_early``, the reason why), and what the diff's
    ``selection`` kept and skipped, when rows were selected; ``shard``: which part of a grid
    split over runners this run measured (:mod:`attnkit_perf.run.shards`); ``time_budget``: the
    paired run's budget, what it spent and its cost estimates, when it had one."""
    stopped = []
    if stopped_early:
        stopped.append(
            f"the run stopped early ({stopped_early}): the benchmarks after the last row have no verdict"
        )
    return VerdictDocument(
        mode=mode,
        base=base,
        head={"label": "this checkout", "provenance": head_provenance},
        thresholds=policy.as_dict(),
        benchmarks=list(rows),
        version_differences=versions,
        notes=notes + policy.noise_notes() + policy.budget_notes(rows) + stopped,
        complete=complete and stopped_early is None,
        selection=selection,
        shard=shard,
        time_budget=time_budget,
    )
