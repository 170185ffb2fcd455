"""Sharding: paired mode under pytest-xdist (each xdist worker measures on a GPU and a core of
its own), and the grid split over N runners (--attnkit-shard=I/N) whose verdicts are merged."""

from __future__ import annotations

import pytest

from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument
from attnkit_perf.measure.cases import gpu_suite_cases
from attnkit_perf.measure.processes import placement, shard_problem
from attnkit_perf.report.merge import main as merge_main
from attnkit_perf.run.shards import HOST_ROW_COST, SLACK, ShardError, assign, parse_shard, row_cost


def test_without_xdist_the_workers_keep_the_callers_gpu_on_the_last_core():
    assert placement(None, [0, 1, 2, 3], ["0", "1"]) == (3, None)


@pytest.mark.parametrize(("shard", "expected"), [(0, (7, "GPU-a")), (1, (6, "GPU-b")), (2, (5, "GPU-a"))])
def test_each_shard_takes_its_own_gpu_and_core(shard, expected):
    assert placement(shard, list(range(8)), ["GPU-a", "GPU-b"]) == expected


def test_one_core_is_left_unpinned():
    assert placement(1, [5], ["0", "1"]) == (None, "1")


def test_more_shards_than_gpus_is_refused_with_the_numbers():
    why = shard_problem(2, ["0"])
    assert why is not None
    for part in ("2 workers asked for (-n 2)", "1 GPU(s) visible (0)", "use -n 1 or fewer"):
        assert part in why, why


def test_as_many_shards_as_gpus_is_fine():
    assert shard_problem(2, ["0", "1"]) is None


# --- the grid split over N runners (--attnkit-shard=I/N) ------------------------------------


def _grid() -> list[str]:
    return [case.name for case in gpu_suite_cases()]


@pytest.mark.parametrize("count", [2, 3, 4])
def test_the_split_covers_every_row_once_and_balances_the_cost(count):
    names = _grid()
    place = assign(names, count)
    assert sorted(place) == sorted(set(names)), "every row in exactly one shard"
    assert set(place.values()) == set(range(1, count + 1)), f"shards used: {sorted(set(place.values()))}"
    loads = [sum(row_cost(n) for n in names if place[n] == s) for s in range(1, count + 1)]
    fair = sum(loads) / count
    assert max(loads) <= (1 + SLACK) * fair + HOST_ROW_COST, f"loads {loads}, fair {fair:.1f}"
    host = [sum(row_cost(n) > 1 for n in names if place[n] == s) for s in range(1, count + 1)]
    assert min(host) >= 1, f"host rows per shard {host}: all on some shards"


def test_the_split_is_deterministic_whatever_the_order_rows_come_in():
    names = _grid()
    assert assign(names, 4) == assign(list(reversed(names)), 4)


def test_adding_a_row_moves_few_others():
    names = _grid()
    before = assign(names, 4)
    after = assign([*names, "fwd[triton-bf16-B2-H8-N3072-D128-causal]"], 4)
    moved = [n for n in names if before[n] != after[n]]
    assert len(moved) <= len(names) // 10, f"{len(moved)} of {len(names)} rows moved: {moved[:5]}"


def test_host_shape_rows_cost_more():
    assert row_cost("fwd[triton-bf16-B1-H8-N128-D64-causal-loop]") == HOST_ROW_COST
    assert row_cost("fwd[triton-bf16-B4-H16-N4096-D128-causal]") == 1.0


@pytest.mark.parametrize(
    ("text", "why"), [("3", "expected I/N"), ("0/4", "between 1 and N=4"), ("5/4", "got 5")]
)
def test_a_shard_that_names_no_shard_is_refused(text, why):
    with pytest.raises(ShardError, match=why):
        parse_shard(text)


def test_parse_shard():
    assert parse_shard(" 2/4 ") == (2, 4)


# --- merging the shards' verdicts -----------------------------------------------------------


def _provenance(commit: str = "h" * 40, gpu: str = "h200") -> dict:
    return {"gpu_key": gpu, "commit": commit, "source": f"src-{commit[:4]}"}


def _part(index, count=3, outcome="same", rows=None, complete=True, base="b" * 40, gpu="h200", grid="g1"):
    names = rows if rows is not None else [f"fwd[row-{index}-{i}]" for i in range(2)]
    benchmarks = [
        BenchmarkVerdict(
            name=n, group="g", backend="triton", pass_name="fwd", shape={}, outcome=outcome, reason="planted"
        )
        for n in names
    ]
    return VerdictDocument(
        mode="paired",
        base={"label": "base", "provenance": _provenance(base, gpu)},
        head={"label": "head", "provenance": _provenance(gpu=gpu)},
        thresholds={"slower": 0.02, "run_alpha": 0.01, "memory_rel": 0.01, "memory_abs_bytes": 1},
        benchmarks=benchmarks,
        notes=[f"note of {index}"],
        complete=complete,
        shard={"index": index, "count": count, "grid": grid, "rows": len(names)},
    )


def _merge(tmp_path, parts) -> tuple[int, VerdictDocument]:
    paths = []
    for i, part in enumerate(parts):
        paths.append(str(part.write(tmp_path / f"part{i}.json")))
    out = tmp_path / "merged.json"
    code = merge_main([*paths, "--out", str(out)])
    return code, VerdictDocument.read(out)


def test_all_shards_good_merge_into_one_passing_verdict(tmp_path):
    code, merged = _merge(tmp_path, [_part(1), _part(2), _part(3)])
    assert code == 0 and merged.passed, merged.notes
    assert len(merged.benchmarks) == 6 and merged.shard["merged"] == [1, 2, 3], merged.shard
    assert "shard 2: note of 2" in merged.notes, merged.notes


@pytest.mark.parametrize(
    ("parts", "why"),
    [
        ([_part(1), _part(3)], "shard(s) 2 of 3 missing"),
        ([_part(1), _part(2), _part(3, base="c" * 40)], "base commit"),
        ([_part(1), _part(2), _part(3, gpu="h100")], "gpu_key"),
        ([_part(1), _part(2), _part(3, rows=["fwd[row-1-0]"])], "row fwd[row-1-0] is in"),
        ([_part(1), _part(2), _part(2)], "shard 2 given twice"),
        ([_part(1), _part(2), _part(3, complete=False)], "shard 3 ("),
        ([_part(1), _part(2), _part(3, grid="g2")], "different grids"),
        ([_part(1), _part(2), _part(3, count=4)], "different numbers of shards"),
    ],
    ids=[
        "missing",
        "other-base",
        "other-gpu",
        "row-twice",
        "shard-twice",
        "incomplete",
        "other-grid",
        "other-n",
    ],
)
def test_a_merge_that_is_not_one_run_fails_and_says_why(tmp_path, parts, why):
    code, merged = _merge(tmp_path, parts)
    assert code == 1 and not merged.passed, merged.notes
    problems = [n for n in merged.notes if n.startswith("MERGE FAILED")]
    assert any(why in n for n in problems), problems


def test_a_failing_shard_fails_the_merged_verdict(tmp_path):
    code, merged = _merge(tmp_path, [_part(1), _part(2, outcome="slower"), _part(3)])
    assert code == 1 and not merged.passed
    assert [r.name for r in merged.failing] == ["fwd[row-2-0]", "fwd[row-2-1]"], merged.failing
    assert not [n for n in merged.notes if n.startswith("MERGE FAILED")], "the parts are one run"


def test_an_unreadable_part_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert merge_main([str(bad), "--out", str(tmp_path / "m.json")]) == 2
    assert "not a valid verdict" in capsys.readouterr().err


def test_a_baseline_row_one_part_did_not_select_is_not_covered_twice(tmp_path):
    elsewhere = _part(1, rows=["fwd[row-1-0]", "fwd[row-2-0]", "fwd[row-none]"])
    for row in elsewhere.benchmarks[1:]:
        row.outcome = "missing"
    code, merged = _merge(tmp_path, [elsewhere, _part(2), _part(3)])
    assert code == 0, merged.notes
    outcomes = {r.name: r.outcome for r in merged.benchmarks}
    assert outcomes["fwd[row-2-0]"] == "same" and outcomes["fwd[row-none]"] == "missing", outcomes
