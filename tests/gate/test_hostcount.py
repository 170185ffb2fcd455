"""The host work count (measure/host.py) and its decision (decide/host.py): the same
count on every call, in every fresh process; a planted change adding Python per call makes it
grow; paired and stored mode decide host rows on it, and hand the rows it cannot speak for to
wall time."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit_perf.decide import gate
from attnkit_perf.decide.gate import Decision
from attnkit_perf.decide.host import compare_counts, count_decision, side_count, with_stored_count
from attnkit_perf.decide.paired_rule import PairedRule
from attnkit_perf.formats.schema import validate
from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument
from attnkit_perf.measure.cases import BenchCase, build_runner
from attnkit_perf.measure.host import count_call, count_environment, host_count
from attnkit_perf.measure.paired_session import SideResult

ROOT = Path(__file__).resolve().parents[2]
HOST_3US = ROOT / "tests" / "perf" / "gate_changes" / "host-3us.patch"
#: CPU cases free of the Triton interpreter: the pure-PyTorch paths and SDPA, forward and training.
CASES = [
    BenchCase(backend, pass_name, 1, 2, 2, 128, 32, True, "fp32", mode="loop")
    for backend in ("tiled", "naive", "sdpa")
    for pass_name in ("fwd", "fwd+bwd")
]
ENV = count_environment()


def _warm(case: BenchCase):
    runner = build_runner(case, torch.device("cpu"))
    for _ in range(3):
        runner()
    return runner


# --- the count --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_call_after_warm_up_counts_the_same(case):
    counted = host_count(_warm(case), repeats=3)
    assert counted["repeatable"], f"{case.name}: counts moved between calls: {counted['counts']}"
    assert counted["instructions"] > 50 and counted["c_calls"] > 0, counted
    # The call enters the compiled fast path only where it is loaded (CI builds it), and the
    # count then names that build.
    fast = sys.modules.get("attnkit.fastpath")
    loaded = getattr(getattr(fast, "memo", None), "__name__", None)
    assert counted["fastpath"] in {None, loaded}, counted
    assert counted["environment"] == ENV, counted


def _loop(n: int):
    def call():
        total = 0
        for i in range(n):
            total += i
        return total

    return call


def test_the_count_is_exact_one_loop_iteration_at_a_time():
    """Each iteration adds the same instructions and no C call: the count is linear in the work."""
    counts = [count_call(_loop(n)) for n in (10, 20, 30)]
    steps = [b["instructions"] - a["instructions"] for a, b in itertools.pairwise(counts)]
    assert steps[0] == steps[1] > 0, counts
    assert len({c["c_calls"] for c in counts}) == 1, counts


def test_a_c_call_counts_one_however_long_it_waits():
    import time

    short = count_call(lambda: time.sleep(0))
    long = count_call(lambda: time.sleep(0.02))
    assert short == long and short["c_calls"] >= 1, (short, long)


def test_a_call_into_the_compiled_fast_path_is_named(monkeypatch):
    """The fast path's C++ is invisible to the count, so the count says when the call entered it
    (here a stand-in: any extension module as ``attnkit.fastpath.memo``)."""
    import math
    import types

    monkeypatch.setitem(sys.modules, "attnkit.fastpath", types.SimpleNamespace(memo=math))
    assert count_call(lambda: math.sqrt(2.0))["fastpath"] == "math"
    assert count_call(lambda: abs(-2.0))["fastpath"] is None


def test_a_call_whose_work_changes_between_calls_is_unrepeatable():
    """A cache filled lazily on a later call, or a polling loop: the count says it cannot be used."""
    calls = []

    def drifting():
        calls.append(1)
        for _ in range(len(calls)):
            pass

    counted = host_count(drifting, repeats=2)
    assert not counted["repeatable"] and counted["counts"][0] != counted["counts"][1], counted


def test_the_garbage_collector_does_not_move_the_count():
    """A call that leaves reference cycles behind would start collections (and their callbacks)
    at allocation thresholds: collection is off while a call is counted, on again after."""
    import gc

    enabled = []

    def cycles():
        enabled.append(gc.isenabled())
        for _ in range(2000):
            a = []
            a.append(a)

    counted = host_count(cycles, repeats=3)
    assert counted["repeatable"] and enabled == [False] * 3, (counted["counts"], enabled)
    assert gc.isenabled(), "collection is switched back on after counting"


_PROBE = """
import json, torch
from attnkit_perf.measure.cases import BenchCase, build_runner
from attnkit_perf.measure.host import host_count
out = {}
for backend in ("naive", "sdpa", "tiled"):
    case = BenchCase(backend, "fwd", 1, 2, 2, 128, 32, True, "fp32", mode="loop")
    runner = build_runner(case, torch.device("cpu"))
    for _ in range(3):
        runner()
    counted = host_count(runner)
    out[backend] = [counted["instructions"], counted["c_calls"], counted["repeatable"]]
print(json.dumps(out))
"""


def _probe(src: Path, hash_seed: str) -> dict:
    env = {"PYTHONPATH": f"{src}{':' + str(ROOT / 'src') if src != ROOT / 'src' else ''}"}
    env.update(PYTHONHASHSEED=hash_seed, OMP_NUM_THREADS="1", ATTNKIT_TEST_DEVICE="cpu")
    import os

    result = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("patch") is None, reason="the planted change is applied with patch(1)")
def test_fresh_processes_count_the_same_and_a_few_us_of_python_grow_the_count(tmp_path):
    """Three fresh processes, each with another hash seed, read the same counts; the planted
    change adding a few microseconds of Python per call (host-3us.patch) grows every one."""
    runs = [_probe(ROOT / "src", seed) for seed in ("0", "1", "random")]
    assert runs[0] == runs[1] == runs[2], runs
    assert all(repeatable for *_, repeatable in runs[0].values()), runs[0]
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    with HOST_3US.open() as diff:
        applied = subprocess.run(
            ["patch", "-s", "-p1"], stdin=diff, cwd=tmp_path, capture_output=True, text=True
        )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    changed = _probe(tmp_path / "src", "0")
    for backend, (instructions, c_calls, _) in runs[0].items():
        grown = changed[backend]
        assert grown[0] > instructions and grown[1] >= c_calls, (backend, runs[0][backend], grown)
        comparison = compare_counts([_answer(instructions, c_calls)], [_answer(*grown[:2])], 0.01)
        assert comparison.outcome == "grew", (backend, comparison.reason)


# --- the decision -----------------------------------------------------------------------------


def _answer(instructions: int, c_calls: int, fastpath: str | None = None, **changes) -> dict:
    answer = {
        "instructions": instructions,
        "c_calls": c_calls,
        "fastpath": fastpath,
        "repeatable": True,
        "counts": [[instructions, c_calls]] * 2,
        "environment": ENV,
    }
    return {**answer, **changes}


def _side(*answers) -> list[dict]:
    return list(answers) * 4  # every worker process of a side counts the same


@pytest.mark.parametrize(
    ("base", "head", "outcome"),
    [
        ((400, 30), (400, 30), "same"),
        ((400, 30), (403, 30), "same"),  # +0.75%: within 1%
        ((400, 30), (443, 33), "grew"),  # host-3us on the naive forward
        ((1796, 106), (1796, 107), "same"),  # one C call more in 106: within 1%
        ((400, 30), (400, 31), "grew"),  # one C call more in 30
        ((400, 30), (300, 30), "faster"),
        ((400, 30), (300, 31), "grew"),  # less Python but a C call more: wall time decides
    ],
)
def test_counts_compare_by_their_growth_past_the_threshold(base, head, outcome):
    comparison = compare_counts(_side(_answer(*base)), _side(_answer(*head)), 0.01)
    assert comparison.outcome == outcome, comparison.reason
    assert comparison.decides is (outcome in ("same", "faster"))


def test_a_count_that_cannot_speak_for_the_row_leaves_it_to_wall_time():
    base = _answer(400, 30)
    drifting = _answer(400, 30, repeatable=False, counts=[[400, 30], [420, 31]])
    assert compare_counts([base], [drifting], 0.01).outcome == "unrepeatable"
    # processes of one side that disagree (a count that depends on the hash seed, say)
    assert side_count([base, _answer(401, 30)])[0] is None
    assert compare_counts([base, _answer(401, 30)], [base, base], 0.01).outcome == "unrepeatable"
    other = _answer(400, 30, environment={**ENV, "torch": "0.0"})
    incomparable = compare_counts([base], [other], 0.01)
    assert incomparable.outcome == "incomparable" and "torch" in incomparable.reason, incomparable.reason
    # the compiled fast path: its C++ is not counted, so two builds of it leave it to wall time
    fast = compare_counts(
        [_answer(12, 2, "attnkit_fast_calls_a")], [_answer(12, 2, "attnkit_fast_calls_b")], 0.01
    )
    assert fast.outcome == "unseen" and not fast.decides, fast.reason
    one_build = compare_counts(
        [_answer(12, 2, "attnkit_fast_calls_a")], [_answer(12, 2, "attnkit_fast_calls_a")], 0.01
    )
    assert one_build.outcome == "same" and "compiled fast path" in one_build.reason, one_build.reason


def _rule(**thresholds) -> PairedRule:
    return PairedRule(gate.Thresholds(**thresholds), alpha=0.01 / 100, threshold=0.02, host_threshold=0.05)


def _results(base: list[dict], head: list[dict], base_us=None, head_us=None) -> dict:
    def side(counts, us):
        return SideResult(
            blocks=[1e-3] * 8,
            workers=[i % 4 for i in range(8)],
            host_counts=counts,
            host_per_call=[u * 1e-6 for u in us or []],
            host_cpu_per_call=[u * 1e-6 for u in us or []],
        )

    return {"base": side(base, base_us), "head": side(head, head_us)}


def test_paired_equal_counts_decide_same_without_wall_time():
    rule = _rule()
    results = _results(_side(_answer(400, 30)), _side(_answer(400, 30)))
    assert not rule.host_needs_wall(results)
    host = rule.decide_host(results)
    assert host.outcome == "same" and host.extra["count"]["base"] == {"instructions": 400, "c_calls": 30}
    assert host.ratio is None, "the host metric's ratio is wall time's (its A/A noise is built from it)"
    row = rule.join(Decision("same", ratio=1.0, reason="GPU same"), host, results)
    assert row.outcome == "same" and row.extra["host"]["count"]["outcome"] == "same", row
    assert row.extra["host"]["processes"] is None and row.extra["host"]["cpu_us"] is None


def test_paired_count_growth_hands_the_host_metric_to_wall_time_which_fails_a_slowdown():
    rule = _rule()
    counts = _side(_answer(400, 30)), _side(_answer(443, 33))
    assert rule.host_needs_wall(_results(*counts))
    slower = rule.decide_host(_results(*counts, [10.0, 10.1, 9.9, 10.0], [15.0, 15.2, 14.9, 15.1]))
    assert slower.outcome == "slower" and slower.extra["count"]["outcome"] == "grew", slower.reason
    assert slower.reason.startswith("host work per call grew"), slower.reason
    costless = rule.decide_host(_results(*counts, [10.0, 10.1, 9.9, 10.0], [10.0, 10.05, 9.95, 10.0]))
    assert costless.outcome == "same", costless.reason


def test_the_count_threshold_is_an_option():
    counts = _side(_answer(400, 30)), _side(_answer(410, 30))  # +2.5%
    assert _rule().host_needs_wall(_results(*counts))
    assert not _rule(host_count_slower=0.05).host_needs_wall(_results(*counts))


def test_the_verdict_and_report_carry_the_count(tmp_path):
    from attnkit_perf.report.host import host_lines

    rule = _rule()
    results = _results(_side(_answer(400, 30)), _side(_answer(443, 33)), [10.0] * 4, [15.0, 15.1, 14.9, 15.2])
    row_decision = rule.join(
        Decision("same", ratio=1.0, reason="GPU same"), rule.decide_host(results), results
    )
    row = BenchmarkVerdict.from_decision(
        {"name": "fwd[x-loop]", "group": "g", "backend": "x", "pass_name": "fwd", "shape": {}}, row_decision
    )
    thresholds = {"slower": 0.02, "run_alpha": 0.01, "memory_rel": 0.01, "memory_abs_bytes": 1}
    doc = VerdictDocument("paired", {"label": "b"}, {"label": "h"}, thresholds, benchmarks=[row])
    data = json.loads(doc.write(tmp_path / "v.json").read_text())
    validate("verdict", data, "verdict")
    assert data["benchmarks"][0]["host"]["count"]["head"] == {"instructions": 443, "c_calls": 33}
    text = "\n".join(host_lines(doc))
    assert "400 / 30 → 443 / 33" in text and "grew" in text, text


# --- stored mode ------------------------------------------------------------------------------


def _exempt() -> Decision:
    d = Decision("inconclusive", reason="host-bound here and in the baseline: time not compared")
    d.extra["time_compared"] = False
    return d


def test_stored_equal_counts_make_a_host_bound_row_same():
    base = {"host_count": _answer(400, 30), "host": {"per_call_s": 9e-6}}
    head = {"host_count": _answer(400, 30), "host": {"per_call_s": 12e-6}}
    row = with_stored_count(_exempt(), base, head, 0.01)
    assert row.outcome == "same" and row.extra["host"]["outcome"] == "same", row.reason
    assert row.extra["host"]["base_us"] == 9.0 and row.extra["host"]["head_us"] == 12.0


def test_stored_count_growth_is_inconclusive_and_names_paired_mode():
    base, head = {"host_count": _answer(400, 30)}, {"host_count": _answer(443, 33)}
    row = with_stored_count(Decision("same", reason="GPU same"), base, head, 0.01)
    assert row.outcome == "inconclusive" and "--attnkit-base" in row.reason, row.reason
    assert with_stored_count(_exempt(), base, head, 0.01).outcome == "inconclusive"


def test_stored_counts_of_other_environments_or_old_baselines_are_refused_and_said_so():
    head = {"host_count": _answer(400, 30)}
    other = {"host_count": _answer(400, 30, environment={**ENV, "python": "3.10.0"})}
    refused = with_stored_count(_exempt(), other, head, 0.01)
    assert refused.outcome == "inconclusive" and "python 3.10.0 vs" in refused.reason, refused.reason
    old = with_stored_count(Decision("same", reason="GPU same"), {}, head, 0.01)
    assert old.outcome == "same" and "no host work count" in old.reason, old.reason
    assert with_stored_count(Decision("same", reason="r"), {}, {}, 0.01).extra == {}
    assert count_decision(compare_counts([_answer(1, 1)], [_answer(1, 1)], 0.01)).outcome == "same"
