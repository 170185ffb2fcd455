"""The verdicts of a grid split over N runners (``--attnkit-shard=I/N``, :mod:`attnkit_perf.run.shards`)
merged into one verdict, which passes only when the parts add up to one run that passed.

The merged verdict holds every part's rows and notes. It is **incomplete** (so it fails, as an
unfinished run does), with a note naming the cause, when:

* a shard of ``1..N`` is missing, or a shard index comes twice;
* the parts disagree on the split (``N``, or the digest of the rows split: another grid);
* a part was measured on another GPU model, or compared another base or head (commit and code
  digest of each side), or in another mode;
* a row is in two parts (the first one's is kept; "missing", a stored baseline's row a part did
  not select, covers nothing: the row is listed missing once if no part measured it);
* a part is itself incomplete (a runner stopped early), or is no shard at all.

A part that failed (a slower row, an error, ...) fails the merged verdict through its rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnkit_perf.formats.verdict import VerdictDocument

#: What every part must share: (side, provenance key).
SAME_RUN = (
    ("head", "gpu_key"),
    ("base", "gpu_key"),
    ("head", "commit"),
    ("head", "source"),
    ("base", "commit"),
    ("base", "source"),
)


def _provenance(doc: VerdictDocument, side: str, key: str):
    return ((getattr(doc, side) or {}).get("provenance") or {}).get(key)


def merge_verdicts(parts: Sequence[tuple[str, VerdictDocument]]) -> VerdictDocument:
    """One verdict of ``parts`` (``(where it came from, document)``), see the module's docstring."""
    if not parts:
        raise ValueError("merge_verdicts: no verdicts given")
    problems: list[str] = []
    where0, first = parts[0]
    shards = {}
    for where, doc in parts:
        if not doc.shard or "index" not in doc.shard:
            why = "no shard index: run with --attnkit-shard=I/N"
            problems.append(f"{where} is not a shard's verdict ({why})")
            continue
        index = doc.shard["index"]
        if index in shards:
            problems.append(f"shard {index} given twice: {shards[index]} and {where}")
        shards.setdefault(index, where)
        if not doc.complete:
            problems.append(f"shard {index} ({where}) is incomplete: its run did not finish")
    counts = {doc.shard.get("count") for _, doc in parts if doc.shard}
    grids = {doc.shard.get("grid") for _, doc in parts if doc.shard}
    if len(counts) > 1:
        problems.append(f"the parts split the grid into different numbers of shards: {sorted(counts)}")
    if len(grids) > 1:
        problems.append(f"the parts split different grids (row digests {sorted(grids)})")
    count = max(counts) if counts else 0
    missing = sorted(set(range(1, count + 1)) - set(shards))
    if missing:
        named = ", ".join(map(str, missing))
        problems.append(f"shard(s) {named} of {count} missing: their rows have no verdict")
    for where, doc in parts[1:]:
        if doc.mode != first.mode:
            problems.append(f"{where} ran in {doc.mode} mode, {where0} in {first.mode}")
        for side, key in SAME_RUN:
            ours, theirs = _provenance(first, side, key), _provenance(doc, side, key)
            if ours != theirs:
                problems.append(f"{where} has {side} {key} {theirs!r}, {where0} {ours!r}: not one run")
    rows, seen, notes = [], {}, []
    for where, doc in parts:
        label = f"shard {doc.shard['index']}" if doc.shard and "index" in doc.shard else where
        notes += [f"{label}: {note}" for note in doc.notes]
        for row in doc.benchmarks:
            if row.outcome == "missing":
                continue  # a baseline row this part did not select: another part's, or none's
            if row.name in seen:
                problems.append(f"row {row.name} is in {seen[row.name]} and {where}: covered twice")
                continue
            seen[row.name] = where
            rows.append(row)
    for _, doc in parts:  # a baseline row no part measured is missing once
        for row in doc.benchmarks:
            if row.outcome == "missing" and row.name not in seen:
                seen[row.name] = "missing"
                rows.append(row)
    # Each part had the budget of its own runner: the merged run spent the longest part's time.
    budgets = [doc.time_budget for _, doc in parts if doc.time_budget]
    time_budget = None
    if budgets:
        time_budget = {key: max(b[key] for b in budgets) for key in ("seconds", "spent_s")}
    return VerdictDocument(
        mode=first.mode,
        base=first.base,
        head=first.head,
        thresholds=first.thresholds,
        benchmarks=rows,
        version_differences=first.version_differences,
        notes=[f"MERGE FAILED: {p}" for p in problems] + notes,
        complete=not problems,
        shard={"count": count, "grid": next(iter(grids), ""), "merged": sorted(shards)},
        time_budget=time_budget,
    )
