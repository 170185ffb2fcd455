"""The gate end to end through pytest (CPU only).

Stored mode runs a synthetic suite whose samples the test controls (a virtual clock), in-process
through pytester: record, compare, and every usage error with its message and exit code.
Paired mode runs the real perf suite's CPU smoke cases in real worker processes against a
copy of this checkout whose naive path sleeps 3 ms per call.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from perf_synthetic import FAST_PROBES, H100_KEY, SHAPE, SYNTHETIC_SUITE, bench_entry, run_json

from attnkit_perf.decide import gate
from attnkit_perf.formats.schema import validate
from attnkit_perf.formats.verdict import OUT_OF_TIME, VerdictDocument
from attnkit_perf.measure.machine import gpu_key
from attnkit_perf.measure.paired_session import PairedSettings
from attnkit_perf.measure.timing import TIMING_PROTOCOL
from attnkit_perf.report.merge import main as merge

REPO = Path(__file__).resolve().parents[2]
USAGE = pytest.ExitCode.USAGE_ERROR
NAMES = ("flash_a", "cudnn_b", "tiled_c")
#: These tests run the gate on the CPU (ATTNKIT_TEST_DEVICE=cpu) even on a GPU runner.
CPU_KEY = gpu_key("cpu")


def _spec(
    names=NAMES, scale=None, peak=None, seed=0, jitter=0.03, interrupt=(), calibration=None, **more
) -> str:
    return json.dumps(
        {
            **{key: list(value) for key, value in more.items()},
            "names": list(names),
            "scale": scale or {},
            "peak": peak or {},
            "seed": seed,
            "jitter": jitter,
            "interrupt": list(interrupt),
            "shape": SHAPE,
            "calibration": calibration or {},
        }
    )


@pytest.fixture
def gate_run(pytester, monkeypatch):
    """``gate_run(*args, **spec)`` runs the synthetic suite in-process; returns the RunResult.
    ``gate_run.baseline`` is where this machine's baseline lives."""
    pytester.makepyfile(test_synthetic=SYNTHETIC_SUITE)
    pytester.makeconftest(FAST_PROBES)
    monkeypatch.setenv("ATTNKIT_TEST_DEVICE", "cpu")
    # The inner run is a run of its own, not a worker of the outer one (pytest -n): pytest-benchmark
    # reads this variable and would disable itself.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    root = pytester.path / "baselines"

    def run(*args, **spec):
        monkeypatch.setenv("ATTNKIT_SYNTH_SPEC", _spec(**spec))
        return pytester.runpytest_inprocess(
            "-p", "attnkit_perf.plugin", f"--attnkit-baseline-dir={root}", "-p", "no:cacheprovider", *args
        )

    run.baseline = root / CPU_KEY / "baseline.json"
    return run


def _output(result) -> str:
    return result.stdout.str() + "\n" + result.stderr.str()


def _record(gate_run, **spec) -> dict:
    result = gate_run("--attnkit-record", "--attnkit-allow-cpu", **spec)
    assert result.ret == 0, _output(result)
    assert gate_run.baseline.is_file(), f"record must write {gate_run.baseline}:\n{_output(result)}"
    return json.loads(gate_run.baseline.read_text())


def _compare(gate_run, pytester, *args, **spec):
    """A stored-mode comparison; returns (RunResult, verdict dict read from its JSON)."""
    path = pytester.path / "verdict.json"
    result = gate_run(
        "--benchmark-compare", "--attnkit-allow-cpu", f"--attnkit-verdict-json={path}", *args, **spec
    )
    assert path.is_file(), f"no verdict written to {path}:\n{_output(result)}"
    data = json.loads(path.read_text())
    validate("verdict", data, str(path))
    return result, data


def _outcomes(verdict: dict) -> dict[str, str]:
    return {row["backend"]: row["outcome"] for row in verdict["benchmarks"]}


# --- stored mode end to end -----------------------------------------------------------------


def test_record_writes_a_valid_baseline_with_samples_and_provenance(gate_run):
    data = _record(gate_run)
    validate("baseline", data, str(gate_run.baseline))
    assert {b["extra_info"]["backend"] for b in data["benchmarks"]} == set(NAMES), data["benchmarks"]
    assert all(len(b["stats"]["data"]) == 60 for b in data["benchmarks"]), "per-round samples must be stored"
    info = data["machine_info"]["attnkit"]
    assert info["gpu_key"] == CPU_KEY and info["torch"], info
    assert info["timing"] == TIMING_PROTOCOL, info


def test_unchanged_code_passes_and_leaves_no_scratch_file(gate_run, pytester, tmp_path, monkeypatch):
    _record(gate_run, seed=0)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where this run's scratch files go
    result, verdict = _compare(gate_run, pytester, seed=1)
    assert list(scratch.iterdir()) == [], f"left in the temporary folder: {list(scratch.iterdir())}"
    assert result.ret == pytest.ExitCode.OK, _output(result)
    assert verdict["passed"] is True and verdict["mode"] == "stored", verdict["counts"]
    assert _outcomes(verdict) == dict.fromkeys(NAMES, "same"), _outcomes(verdict)
    result.stdout.fnmatch_lines(["*attnkit perf gate (stored): passed (3 same)*"])


def test_twenty_percent_slower_fails_naming_only_that_benchmark(gate_run, pytester):
    _record(gate_run)
    result, verdict = _compare(gate_run, pytester, seed=1, scale={"cudnn_b": 1.2})
    assert result.ret == pytest.ExitCode.TESTS_FAILED, _output(result)
    outcomes = _outcomes(verdict)
    assert outcomes == {"flash_a": "same", "cudnn_b": "slower", "tiled_c": "same"}, outcomes
    row = next(r for r in verdict["benchmarks"] if r["backend"] == "cudnn_b")
    assert 1.15 < row["ratio"] < 1.25 and row["ci"][0] > 1.0, f"ratio {row['ratio']}, interval {row['ci']}"
    text = result.stdout.str()
    failed = text.split("FAILED (error, dropped, slower or more memory):")[1].split(
        "attnkit perf gate (stored)"
    )[0]
    assert "fwd[cudnn_b-" in failed and "flash_a" not in failed and "tiled_c" not in failed, failed
    result.stdout.fnmatch_lines(["*attnkit perf gate (stored): FAILED (1 slower, 2 same)*"])


@pytest.mark.parametrize(("head_scale", "outcome"), [(1.0, "same"), (1.3, "slower")])
def test_a_baseline_marked_host_bound_is_compared_under_this_runs_gpu_drift(
    gate_run, pytester, head_scale, outcome
):
    """The baseline's cudnn_b was host-bound and this run's is not: its time is the GPU's, so the
    GPU drift (1.0) applies and the host calibration's (x0.77, as read on the H200 between two
    runs minutes apart) must not turn an unchanged benchmark into a slowdown; a real one still
    fails (a host-set baseline time is at least its GPU time)."""
    calibration = {"matmul_ms": 1.0, "copy_ms": 1.0, "host_ms": 1.0}
    data = _record(gate_run, calibration=calibration)
    entry = next(b for b in data["benchmarks"] if b["extra_info"]["backend"] == "cudnn_b")
    entry["extra_info"]["host_bound"] = True
    _write_baseline(gate_run, data)
    result, verdict = _compare(
        gate_run,
        pytester,
        seed=1,
        scale={"cudnn_b": head_scale},
        calibration={**calibration, "host_ms": 0.77},
    )
    assert _outcomes(verdict) == {"flash_a": "same", "cudnn_b": outcome, "tiled_c": "same"}, verdict
    assert result.ret == (pytest.ExitCode.OK if outcome == "same" else pytest.ExitCode.TESTS_FAILED), _output(
        result
    )


def test_more_memory_fails_and_names_it(gate_run, pytester):
    _record(gate_run)
    result, verdict = _compare(gate_run, pytester, seed=1, peak={"tiled_c": 12 * 2**20})
    assert result.ret == pytest.ExitCode.TESTS_FAILED, _output(result)
    assert _outcomes(verdict) == {"flash_a": "same", "cudnn_b": "same", "tiled_c": "more-memory"}, verdict
    row = next(r for r in verdict["benchmarks"] if r["backend"] == "tiled_c")
    assert row["evidence"]["memory_growth_bytes"] == 4 * 2**20, row["evidence"]


def test_a_grid_split_over_two_runners_merges_into_the_whole_run(gate_run, pytester):
    """--attnkit-shard=I/2 on each "runner": disjoint parts that cover the grid, each splitting
    the false-alarm budget over the whole grid; their verdicts merge into one passing run."""
    _record(gate_run)
    parts, measured = [], []
    for index in (1, 2):
        result, verdict = _compare(gate_run, pytester, f"--attnkit-shard={index}/2")
        assert result.ret == 0, _output(result)
        assert verdict["shard"]["index"] == index and verdict["shard"]["count"] == 2, verdict["shard"]
        assert verdict["thresholds"]["per_benchmark_alpha"] == pytest.approx(0.01 / len(NAMES))
        measured.append({r["backend"] for r in verdict["benchmarks"] if r["outcome"] != "missing"})
        path = pytester.path / f"part{index}.json"
        path.write_text(json.dumps(verdict))
        parts.append(str(path))
    assert not measured[0] & measured[1] and measured[0] | measured[1] == set(NAMES), measured
    assert merge([*parts, "--out", str(pytester.path / "merged.json")]) == 0
    merged = VerdictDocument.read(pytester.path / "merged.json")
    assert merged.passed and {r.backend for r in merged.benchmarks} == set(NAMES), merged.notes
    assert merge([parts[0], "--out", str(pytester.path / "half.json")]) == 1, "a missing shard fails"


def test_new_and_missing_are_listed_not_failed(gate_run, pytester):
    _record(gate_run, names=("flash_a", "cudnn_b"))
    result, verdict = _compare(gate_run, pytester, seed=1, names=("flash_a", "tiled_c"))
    assert result.ret == pytest.ExitCode.OK, _output(result)
    assert _outcomes(verdict) == {"flash_a": "same", "tiled_c": "new", "cudnn_b": "missing"}, verdict
    result.stdout.fnmatch_lines(["*new (not in the base):", "*fwd?tiled_c-*new*not in the baseline*"])
    result.stdout.fnmatch_lines(
        ["*missing (in the baseline, not selected in this run):", "*fwd?cudnn_b-*missing*"]
    )


def test_a_benchmark_that_raises_is_an_error_and_fails(gate_run, pytester):
    _record(gate_run)
    result, verdict = _compare(gate_run, pytester, seed=1, **{"raise": ("cudnn_b",)})
    assert result.ret == pytest.ExitCode.TESTS_FAILED, _output(result)
    assert _outcomes(verdict) == {"flash_a": "same", "tiled_c": "same", "cudnn_b": "error"}, verdict
    row = next(r for r in verdict["benchmarks"] if r["outcome"] == "error")
    assert "RuntimeError: cudnn_b broke" in row["reason"] and row["name"].startswith("fwd[cudnn_b-"), row
    assert verdict["passed"] is False, "an error is a failure of the run"


def test_a_run_whose_only_benchmark_raised_compared_nothing_and_fails(gate_run, pytester):
    _record(gate_run, names=("flash_a",))
    result, verdict = _compare(gate_run, pytester, names=("flash_a",), **{"raise": ("flash_a",)})
    assert result.ret == pytest.ExitCode.TESTS_FAILED and verdict["passed"] is False, _output(result)
    result.stdout.fnmatch_lines(["*attnkit perf gate (stored): FAILED, nothing compared*1 error*"])


def test_a_baseline_benchmark_this_checkout_declines_is_dropped_and_fails(gate_run, pytester):
    """A backend this checkout makes unavailable must not leave a silent hole: "dropped" fails,
    unless --attnkit-allow-dropped accepts it knowingly."""
    _record(gate_run)
    result, verdict = _compare(gate_run, pytester, seed=1, declined=("tiled_c",))
    assert result.ret == pytest.ExitCode.TESTS_FAILED, _output(result)
    assert _outcomes(verdict) == {"flash_a": "same", "cudnn_b": "same", "tiled_c": "dropped"}, verdict
    row = next(r for r in verdict["benchmarks"] if r["outcome"] == "dropped")
    assert "backend 'tiled_c' is unavailable here" in row["reason"], row["reason"]
    result, verdict = _compare(gate_run, pytester, "--attnkit-allow-dropped", seed=1, declined=("tiled_c",))
    assert result.ret == pytest.ExitCode.OK and verdict["passed"] is True, _output(result)
    result.stdout.fnmatch_lines(["*dropped, accepted (--attnkit-allow-dropped):", "*fwd?tiled_c-*dropped*"])


def test_an_interrupted_run_is_incomplete_never_passed(gate_run, pytester):
    """A job's time limit (SIGINT) that stops the suite part-way leaves a verdict over some of
    the benchmarks: it must say so and not pass (on the H100 one was written as complete)."""
    _record(gate_run)
    path = pytester.path / "verdict.json"
    result = gate_run(
        "--benchmark-compare", "--attnkit-allow-cpu", f"--attnkit-verdict-json={path}", interrupt=["cudnn_b"]
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED, _output(result)
    # What was decided before the interrupt is written, marked incomplete, never as a pass.
    assert path.is_file(), f"no verdict written to {path}:\n{_output(result)}"
    data = json.loads(path.read_text())
    validate("verdict", data, str(path))
    assert data["complete"] is False and data["passed"] is False, data
    assert any("stopped early (interrupted)" in n for n in data["notes"]), data["notes"]
    result.stdout.fnmatch_lines(["*attnkit perf gate (stored): INCOMPLETE*"])
    assert "attnkit perf gate (stored): passed" not in _output(result), _output(result)


@pytest.mark.parametrize(
    ("status", "shouldstop", "shouldfail", "expected"),
    [
        (pytest.ExitCode.OK, False, False, None),
        (pytest.ExitCode.TESTS_FAILED, False, False, None),
        (pytest.ExitCode.INTERRUPTED, False, False, "interrupted"),
        (pytest.ExitCode.TESTS_FAILED, False, "stopping after 1 failures", "stopping after 1 failures"),
        (pytest.ExitCode.TESTS_FAILED, True, False, "stopped"),
    ],
)
def test_a_session_stopped_before_its_end_is_recognised(status, shouldstop, shouldfail, expected):
    from types import SimpleNamespace

    from attnkit_perf.plugin import _stopped_early

    session = SimpleNamespace(shouldstop=shouldstop, shouldfail=shouldfail)
    assert _stopped_early(session, status) == expected


def test_the_verdict_file_reads_back_into_the_model(gate_run, pytester):
    _record(gate_run)
    _, verdict = _compare(gate_run, pytester, seed=1, scale={"flash_a": 1.3})
    doc = VerdictDocument.read(pytester.path / "verdict.json")
    assert not doc.passed and [r.backend for r in doc.failing] == ["flash_a"], doc.failing
    assert doc.base["provenance"]["gpu_key"] == CPU_KEY and doc.head["provenance"]["torch"], doc.base
    assert (
        doc.thresholds["slower"] == gate.Thresholds.STORED_SLOWER
        and doc.thresholds["per_benchmark_alpha"] > 0
    ), doc.thresholds
    assert verdict["counts"] == {"slower": 1, "same": 2}, verdict["counts"]


@pytest.mark.parametrize(
    ("selection", "benchmarks"),
    [
        pytest.param((), 3, id="all"),
        pytest.param(("-k", "flash_a or cudnn_b"), 2, id="-k"),
    ],
)
def test_the_false_alarm_budget_is_split_over_the_benchmarks_that_run(
    gate_run, pytester, selection, benchmarks
):
    _record(gate_run)
    _, verdict = _compare(gate_run, pytester, *selection, seed=1)
    run = [r["backend"] for r in verdict["benchmarks"] if r["outcome"] != "missing"]
    assert len(run) == benchmarks, f"benchmarks run: {run}, want {benchmarks}"
    thresholds = verdict["thresholds"]
    expected = thresholds["run_alpha"] / benchmarks
    assert thresholds["per_benchmark_alpha"] == pytest.approx(expected), f"{thresholds}, {benchmarks} run"
    assert {r["alpha"] for r in verdict["benchmarks"] if r["alpha"] is not None} == {
        thresholds["per_benchmark_alpha"]
    }, "every row is decided at the run's per-benchmark alpha"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        pytest.param([1e-3] * 60, "identical", id="constant"),
        pytest.param([1e-3, 1.1e-3, 0.9e-3], "3 samples", id="too few"),
        pytest.param([], "no samples", id="empty"),
        pytest.param([float("nan")] * 60, "NaN", id="NaN"),
    ],
)
def test_a_baseline_entry_without_evidence_is_inconclusive(gate_run, pytester, data, why):
    """A baseline entry that is no evidence gives one of two outcomes: the row is inconclusive,
    or the baseline is a usage error naming its file. Never "same", never a crash."""
    base = _record(gate_run)
    base["benchmarks"][1]["stats"]["data"] = data
    gate_run.baseline.write_text(json.dumps(base))
    path = pytester.path / "verdict.json"
    result = gate_run("--benchmark-compare", "--attnkit-allow-cpu", f"--attnkit-verdict-json={path}", seed=1)
    if result.ret == USAGE:
        _usage_error(result, f"baseline {gate_run.baseline}")
        return
    assert result.ret == pytest.ExitCode.OK, f"exit {result.ret}:\n{_output(result)[-3000:]}"
    verdict = json.loads(path.read_text())
    name = base["benchmarks"][1]["extra_info"]["backend"]
    row = next(r for r in verdict["benchmarks"] if r["backend"] == name)
    assert row["outcome"] == "inconclusive" and why in row["reason"], row
    result.stdout.fnmatch_lines(["*inconclusive (measured to the budget and still unclear*"])


# --- usage errors: one clear message, exit code 4 -------------------------------------------


def _usage_error(result, *messages: str) -> None:
    text = _output(result)
    assert result.ret == USAGE, f"exit {result.ret}, want {USAGE}:\n{text[-3000:]}"
    for message in messages:
        assert message in text, f"missing {message!r} in:\n{text[-3000:]}"
    assert "Traceback" not in text and "INTERNALERROR" not in text, text[-3000:]


def _write_baseline(gate_run, data: dict, path: Path | None = None) -> Path:
    path = path or gate_run.baseline
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _valid_baseline(key: str | None = None) -> dict:
    entries = [bench_entry(name, [1e-3 * (1 + 0.01 * i) for i in range(20)]) for name in NAMES]
    return run_json(entries, gpu_key=key or CPU_KEY)


def test_compare_with_a_path_that_does_not_exist(gate_run):
    result = gate_run("--benchmark-compare=baselines/nope.json", "--attnkit-allow-cpu")
    _usage_error(result, "--benchmark-compare=baselines/nope.json: no such baseline file")


CORRUPT = {
    "stats null": ((0, "stats"), None, "at benchmarks/0/stats:"),
    "shape without its dimensions": (
        (1, "extra_info", "shape"),
        {"seq_len": 128},
        "at benchmarks/1/extra_info",
    ),
    "machine_info.attnkit null": (None, None, "at machine_info/attnkit:"),
    "stats.data null": ((0, "stats", "data"), None, "at benchmarks/0/stats/data:"),
    "stats.data strings": ((1, "stats", "data"), ["0.001"] * 20, "at benchmarks/1/stats/data/"),
}


@pytest.mark.parametrize("kind", list(CORRUPT))
def test_a_corrupt_baseline(gate_run, kind):
    path, value, field = CORRUPT[kind]
    data = _valid_baseline()
    if path is None:
        data["machine_info"]["attnkit"] = None
    else:
        target = data["benchmarks"][path[0]]
        for key in path[1:-1]:
            target = target[key]
        target[path[-1]] = value
    _write_baseline(gate_run, data)
    result = gate_run("--benchmark-compare", "--attnkit-allow-cpu")
    _usage_error(
        result, f"baseline {gate_run.baseline} is not a valid baseline file", field, "re-record it with"
    )


def test_a_baseline_holding_an_impossible_figure_fails_the_gate_with_its_benchmark_named(gate_run):
    """A kept memory of -96 MiB (what a recording once stored) is refused when the gate reads
    the baseline: a usage error naming the file, the benchmark, the field, the value and the
    rule, never a comparison against it and never a crash."""
    data = _valid_baseline()
    data["benchmarks"][1]["extra_info"]["kept_bytes"] = -100663296
    _write_baseline(gate_run, data)
    result = gate_run("--benchmark-compare", "--attnkit-allow-cpu")
    name = data["benchmarks"][1]["extra_info"]["name"]
    _usage_error(
        result,
        f"baseline {gate_run.baseline} is not a valid baseline file",
        "at benchmarks/1/extra_info/kept_bytes: -100663296 is less than the minimum of 0",
        f"(benchmark {name})",
        "re-record it with",
    )


def test_a_recording_with_an_impossible_figure_is_not_written_and_fails_the_run(gate_run):
    result = gate_run("--attnkit-record", "--attnkit-allow-cpu", peak={"cudnn_b": -1})
    text = _output(result)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, f"exit {result.ret}:\n{text[-3000:]}"
    assert not gate_run.baseline.exists(), "a refused recording writes no baseline"
    assert "NOT recorded: the run being recorded is not a valid baseline file" in text, text[-3000:]
    assert "peak_bytes: -1 is less than the minimum of 0 (benchmark fwd[cudnn_b-" in text, text[-3000:]
    assert "Traceback" not in text and "INTERNALERROR" not in text, text[-3000:]


def test_a_baseline_that_is_not_json(gate_run):
    gate_run.baseline.parent.mkdir(parents=True)
    gate_run.baseline.write_text("{ not json")
    _usage_error(
        gate_run("--benchmark-compare", "--attnkit-allow-cpu"), "is not readable JSON", "re-record it with"
    )


def test_another_gpus_baseline(gate_run, pytester):
    other = _write_baseline(gate_run, _valid_baseline("nvidia-h200"), pytester.path / "h200.json")
    result = gate_run(f"--benchmark-compare={other}", "--attnkit-allow-cpu")
    _usage_error(result, f"was recorded on 'nvidia-h200', this run is on '{CPU_KEY}'", "not comparable")
    # ... also when it sits where this GPU's baseline belongs
    _write_baseline(gate_run, _valid_baseline("nvidia-h200"))
    _usage_error(gate_run("--benchmark-compare", "--attnkit-allow-cpu"), "was recorded on 'nvidia-h200'")


def test_a_baseline_timed_with_another_protocol(gate_run):
    old = _valid_baseline()
    del old["machine_info"]["attnkit"]["timing"]  # recorded before protocols were named
    _write_baseline(gate_run, old)
    _usage_error(
        gate_run("--benchmark-compare", "--attnkit-allow-cpu"),
        f"timed with the 'flush-by-zeroing' protocol, this run times with '{TIMING_PROTOCOL}'",
        "re-record it with",
    )


def test_compare_without_a_baseline_for_this_gpu(gate_run):
    result = gate_run("--benchmark-compare", "--attnkit-allow-cpu")
    _usage_error(
        result,
        f"no perf baseline for GPU '{CPU_KEY}'",
        "pytest tests/perf --attnkit-record",
        "--attnkit-base=REF",
    )


def test_compare_on_the_cpu_needs_allow_cpu(gate_run):
    _write_baseline(gate_run, _valid_baseline())
    _usage_error(
        gate_run("--benchmark-compare"), "stored mode compares GPU timings, and there is no CUDA device"
    )


def test_record_on_the_cpu_needs_allow_cpu(gate_run):
    _usage_error(gate_run("--attnkit-record"), "refusing to record a baseline on the CPU")
    assert not gate_run.baseline.exists(), "nothing may be recorded"


def _bare_checkout(root: Path) -> Path:
    (root / "src" / "attnkit").mkdir(parents=True)
    (root / "src" / "attnkit" / "__init__.py").write_text("")
    return root


def test_paired_on_the_cpu_needs_allow_cpu(gate_run, pytester):
    base = _bare_checkout(pytester.path / "base")
    _usage_error(gate_run(f"--attnkit-base={base}"), "paired mode compares GPU timings")


def test_record_and_base_exclude_each_other(gate_run, pytester):
    base = _bare_checkout(pytester.path / "base")
    result = gate_run("--attnkit-record", f"--attnkit-base={base}", "--attnkit-allow-cpu")
    _usage_error(result, "--attnkit-record and --attnkit-base exclude each other")


def test_a_base_that_is_neither_a_folder_nor_a_commit(gate_run):
    result = gate_run("--attnkit-base=no-such-ref", "--attnkit-allow-cpu")
    _usage_error(result, "--attnkit-base=no-such-ref: neither a folder nor a commit of")


def test_a_base_folder_without_attnkit(gate_run, pytester):
    empty = pytester.mkdir("empty")
    _usage_error(
        gate_run(f"--attnkit-base={empty}", "--attnkit-allow-cpu"), "the folder has no src/attnkit package"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "--attnkit-time-budget: expected a number of seconds > 0 or 'none', got 'soon'"),
        ("-5", "--attnkit-time-budget: expected a number of seconds > 0 or 'none', got '-5'"),
    ],
)
def test_a_time_budget_that_is_no_number_of_seconds(gate_run, pytester, value, message):
    base = _bare_checkout(pytester.path / "base")
    _usage_error(
        gate_run(f"--attnkit-base={base}", "--attnkit-allow-cpu", f"--attnkit-time-budget={value}"), message
    )


def test_a_time_budget_outside_paired_mode(gate_run):
    _write_baseline(gate_run, _valid_baseline())
    result = gate_run("--benchmark-compare", "--attnkit-allow-cpu", "--attnkit-time-budget=60")
    _usage_error(result, "--attnkit-time-budget plans paired mode's rows", "this run is in stored mode")


def test_stored_mode_under_xdist(gate_run):
    _write_baseline(gate_run, _valid_baseline())
    result = gate_run("--benchmark-compare", "--attnkit-allow-cpu", "-n", "2")
    _usage_error(result, "stored mode (--benchmark-compare) runs in one process", "shard paired mode")


def test_a_noise_file_of_another_gpu(gate_run, pytester):
    _write_baseline(gate_run, _valid_baseline())
    noise = pytester.path / "noise.json"
    noise.write_text(
        json.dumps(
            {
                "format": "attnkit-perf-noise/1",
                "gpu_key": H100_KEY,
                "mode": "stored",
                "runs": 2,
                "provenance": {},
                "benchmarks": {},
            }
        )
    )
    result = gate_run("--benchmark-compare", "--attnkit-allow-cpu", f"--attnkit-noise={noise}")
    _usage_error(result, f"A/A noise {noise} is for '{H100_KEY}' in stored mode; this run is '{CPU_KEY}'")


def test_a_noise_file_that_does_not_exist(gate_run, pytester):
    _write_baseline(gate_run, _valid_baseline())
    result = gate_run(
        "--benchmark-compare", "--attnkit-allow-cpu", f"--attnkit-noise={pytester.path / 'nope.json'}"
    )
    _usage_error(result, "does not exist")


# --- paired mode end to end: real worker processes on the CPU -------------------------------

#: The perf suite's CPU smoke case that paired mode measures here: the naive forward, not causal.
PAIRED_CASE = "fwd[naive-fp32-B1-H2-N128-D32]"


def _copy_checkout(dest: Path, sleep_s: float | None, statement: str | None = None) -> Path:
    """A copy of this checkout's src/ whose ``naive_attention`` first sleeps ``sleep_s`` (if given)
    or runs ``statement``."""
    shutil.copytree(REPO / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))
    if sleep_s is not None:
        statement = f"__import__('time').sleep({sleep_s})"
    if statement is not None:
        reference = dest / "src" / "attnkit" / "reference.py"
        lines = reference.read_text().splitlines(keepends=True)
        func = next(
            node
            for node in ast.parse("".join(lines)).body
            if isinstance(node, ast.FunctionDef) and node.name == "naive_attention"
        )
        first = func.body[1] if ast.get_docstring(func) else func.body[0]
        indent = " " * first.col_offset
        lines.insert(first.lineno - 1, f"{indent}{statement}\n")
        reference.write_text("".join(lines))
    return dest


def _run_paired(
    base: Path,
    tmp_path: Path,
    select: str = "naive and fwd and not causal",
    names: tuple = (PAIRED_CASE,),
    extra: tuple = (),
    head: Path = REPO,
) -> tuple[subprocess.CompletedProcess, dict]:
    """A paired run of the perf suite's CPU smoke cases; ``head``: the checkout whose ``src`` the
    run imports (this one, or a changed copy)."""
    verdict = tmp_path / "verdict.json"
    scratch = tmp_path / "tmp"  # the run's temporary folder: it must leave nothing there
    scratch.mkdir(exist_ok=True)
    # One intra-op thread per process: on a shared 2-core runner, the OpenMP threads of four
    # workers (spinning after each block) would otherwise time each other instead of the code.
    env = {
        **os.environ,
        "PYTHONPATH": str(head / "src"),
        "ATTNKIT_TEST_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TMPDIR": str(scratch),
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests/perf/test_attention_perf.py",
        "-k",
        f"cpu_smoke and {select}",
        "-p",
        "no:cacheprovider",
        "-q",
        f"--attnkit-base={base}",
        "--attnkit-allow-cpu",
        "--attnkit-budget-s=5",
        # A shared 2-core runner moves single blocks by 10-45%: the practical threshold is set where
        # the 3 ms sleep (10x the call) is far beyond it and CPU contention is not.
        "--attnkit-slower=0.5",
        "--attnkit-host-slower=0.5",
        f"--attnkit-verdict-json={verdict}",
        *extra,
    ]
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    output = result.stdout + result.stderr
    assert verdict.is_file(), f"no verdict (exit {result.returncode}):\n{output[-4000:]}"
    data = json.loads(verdict.read_text())
    validate("verdict", data, str(verdict))
    run = [r["name"] for r in data["benchmarks"]]
    assert run == list(names), f"benchmarks run: {run}\n{output[-4000:]}"
    left = [p.name for p in scratch.iterdir() if p.name not in _TOOL_CACHES]
    assert left == [], f"the run left {left} in its temporary folder"
    return result, data


#: What other tools keep in the temporary folder by design: torch.compile's cache, reused by later
#: runs (attnkit's fast path compiles its memo with torch.compile).
_TOOL_CACHES = {f"torchinductor_{os.environ.get('USER', '')}", "torchinductor_root"}


def test_paired_mode_sees_the_head_faster_than_a_slowed_base(tmp_path):
    base = _copy_checkout(tmp_path / "base", sleep_s=0.003)
    result, verdict = _run_paired(base, tmp_path)
    output = result.stdout + result.stderr
    row = verdict["benchmarks"][0]
    assert row["outcome"] == "faster", f"{row['outcome']}: {row['reason']}\n{output[-3000:]}"
    assert row["ratio"] < 0.5 and row["base_median_ms"] > 3.0, (
        f"ratio {row['ratio']}, base {row['base_median_ms']} ms"
    )
    assert result.returncode == 0 and verdict["passed"] is True, output[-3000:]
    label = verdict["base"]["label"]
    assert verdict["mode"] == "paired" and f"checkout {base.resolve()}" in label, label
    assert row["evidence"]["pairs"] >= PairedSettings().pairs_per_look, row["evidence"]
    # The host metric: the base's sleep is more work per call (an import and the sleep, two C
    # calls), which the count sees; a count that dropped decides the host metric alone, with no
    # wall-time rounds.
    host = row["host"]
    count = host["count"]
    assert host["outcome"] == count["outcome"] == "faster", host
    assert count["base"]["c_calls"] == count["head"]["c_calls"] + 2, count
    assert host["processes"] is None and host["base_process_us"] is None, host
    sources = [verdict[side]["provenance"]["source"] for side in ("base", "head")]
    assert sources[0] != sources[1], f"the slowed base is other code: {sources}"


def _base_fails_on_naive(tmp_path: Path, statement: str, *extra: str) -> tuple[dict, str]:
    """A paired run of the naive and sdpa forwards whose base runs ``statement`` in
    ``naive_attention``: the naive case's row, after checking that sdpa was still measured and
    the run passed. Returns (row, output)."""
    base = _copy_checkout(tmp_path / "base", None, statement)
    sdpa = "fwd[sdpa-fp32-B1-H2-N128-D32]"
    result, verdict = _run_paired(
        base, tmp_path, "(naive or sdpa) and fwd and not causal", (PAIRED_CASE, sdpa), extra
    )
    output = result.stdout + result.stderr
    rows = {r["name"]: r for r in verdict["benchmarks"]}
    assert rows[sdpa]["outcome"] in ("same", "inconclusive"), f"{rows[sdpa]}\n{output[-3000:]}"
    assert result.returncode == 0 and verdict["passed"] is True, output[-3000:]
    return rows[PAIRED_CASE], output


def test_a_case_the_base_cannot_build_is_new_not_a_failure(tmp_path):
    """Only the head's code is under test: a base older than an argument the grid passes (or
    with a bug fixed since) makes its cases new, never an error of the change."""
    row, output = _base_fails_on_naive(tmp_path, "raise TypeError('an older attention() signature')")
    assert row["outcome"] == "new", f"{row['outcome']}: {row['reason']}\n{output[-3000:]}"
    assert "TypeError: an older attention() signature" in row["reason"], row["reason"]


def test_a_base_worker_that_dies_makes_its_case_new_and_the_run_goes_on(tmp_path):
    """A base that crashes on a case (a segfault the change fixes) must not fail the change, nor
    the benchmarks after it: its case is new, and fresh workers measure the next one."""
    crashed, output = _base_fails_on_naive(tmp_path, "__import__('os')._exit(3)")
    assert crashed["outcome"] == "new", f"{crashed['outcome']}: {crashed['reason']}\n{output[-3000:]}"
    assert "worker exited (status 3)" in crashed["reason"], crashed["reason"]


def test_a_base_worker_that_hangs_is_killed_and_its_case_is_new(tmp_path):
    """A deadlock must not hang the gate until the job's time limit: a worker that does not
    answer within --attnkit-worker-timeout-s is killed and replaced."""
    hung, output = _base_fails_on_naive(
        tmp_path, "__import__('time').sleep(3600)", "--attnkit-worker-timeout-s=20"
    )
    assert hung["outcome"] == "new", f"{hung['outcome']}: {hung['reason']}\n{output[-3000:]}"
    assert "did not answer prepare within 20 s and was killed" in hung["reason"], hung["reason"]


def test_a_case_the_base_runs_and_this_checkout_declines_is_dropped(tmp_path):
    """No silent hole: a case the head stops supporting fails, named, while the others are
    compared as usual."""
    errors = "__import__('attnkit.errors', fromlist=['errors'])"
    head = _copy_checkout(
        tmp_path / "head", None, f"raise {errors}.UnsupportedProblemError('no longer here')"
    )
    sdpa = "fwd[sdpa-fp32-B1-H2-N128-D32]"
    result, verdict = _run_paired(
        REPO, tmp_path, "(naive or sdpa) and fwd and not causal", (PAIRED_CASE, sdpa), head=head
    )
    output = result.stdout + result.stderr
    rows = {r["name"]: r for r in verdict["benchmarks"]}
    assert rows[PAIRED_CASE]["outcome"] == "dropped", f"{rows[PAIRED_CASE]}\n{output[-3000:]}"
    assert "the base runs it, this checkout does not: no longer here" in rows[PAIRED_CASE]["reason"]
    assert rows[sdpa]["outcome"] in ("same", "inconclusive"), rows[sdpa]
    assert result.returncode == 1 and verdict["passed"] is False, output[-3000:]


def test_a_paired_run_whose_only_benchmark_raised_fails_and_says_nothing_was_compared(tmp_path):
    head = _copy_checkout(tmp_path / "head", None, "raise RuntimeError('the head broke')")
    result, verdict = _run_paired(REPO, tmp_path, head=head)
    output = result.stdout + result.stderr
    row = verdict["benchmarks"][0]
    assert row["outcome"] == "error" and "RuntimeError: the head broke" in row["reason"], row
    assert result.returncode != 0 and verdict["passed"] is False, output[-3000:]
    assert "attnkit perf gate (paired): FAILED, nothing compared" in output, output[-3000:]


def test_paired_aa_run_does_not_fail(tmp_path):
    base = _copy_checkout(tmp_path / "base", sleep_s=None)
    result, verdict = _run_paired(base, tmp_path)
    output = result.stdout + result.stderr
    row = verdict["benchmarks"][0]
    assert row["outcome"] in ("same", "inconclusive"), f"{row['outcome']}: {row['reason']}\n{output[-3000:]}"
    assert result.returncode == 0 and verdict["passed"] is True, f"exit {result.returncode}\n{output[-3000:]}"
    assert verdict["thresholds"]["slower"] == 0.5, verdict["thresholds"]
    assert verdict["complete"] is True, "the session's end overwrites the progress file"
    seconds = row["evidence"]["seconds"]
    assert 0 < seconds["prepare"] < seconds["measure"], f"the gate's own time per step: {seconds}"
    host = row["host"]
    # The same code counts the same host work on every worker of both sides: "same" at once, with
    # no wall-time rounds and no fresh processes.
    count = host["count"]
    assert host["outcome"] == count["outcome"] == "same" and count["base"] == count["head"], host
    # No wall time, so no host ratio: the A/A noise of the host metric is wall time's alone.
    assert count["head"]["instructions"] > 0 and host["ratio"] is None, host
    assert host["processes"] is None and host["cpu_us"] is None, host
    assert not {"host_restart", "host_more", "restart"} & set(seconds), seconds
    sources = [verdict[side]["provenance"]["source"] for side in ("base", "head")]
    assert sources[0] == sources[1], f"a copy of the same code must carry the same digest: {sources}"


def test_paired_mode_rewrites_the_verdict_after_each_benchmark(tmp_path):
    """A run stopped before its end (a job's time limit) leaves the rows it decided, marked
    incomplete: the controller writes them as each benchmark's report arrives."""
    from types import SimpleNamespace

    from attnkit_perf.plugin import _PairedController
    from attnkit_perf.run.session import VERDICT_PROPERTY

    path = tmp_path / "verdict.json"
    written = []
    session = SimpleNamespace(
        rows=[],
        config=SimpleNamespace(getoption=lambda name: str(path) if name == "attnkit_verdict_json" else None),
        write_progress=lambda p: written.append((p, len(session.rows))),
    )
    row = {
        "name": "fwd[x]",
        "group": "g",
        "backend": "triton",
        "pass_name": "fwd",
        "shape": {},
        "outcome": "same",
    }
    controller = _PairedController(session)
    for when in ("setup", "call", "teardown"):
        controller.pytest_runtest_logreport(
            SimpleNamespace(when=when, user_properties=[(VERDICT_PROPERTY, row)])
        )
    assert [r.name for r in session.rows] == ["fwd[x]"], session.rows
    assert written == [(str(path), 1)], written


@pytest.mark.parametrize(
    ("base_share", "head_share", "host_bound"),
    [
        (0.0, 0.8, False),  # a host-only slowdown of a GPU-bound benchmark: the GPU rule
        (0.8, 0.1, False),  # a GPU slowdown lowers the head's share: the GPU rule
        (0.55, 0.45, False),  # near the boundary, one side's reading is not enough
        (0.8, 0.9, True),  # the host sets both sides' time
        (None, 0.9, True),  # new to the head: its own share
        (None, None, False),
    ],
)
def test_a_paired_benchmark_is_host_bound_only_when_both_sides_are(base_share, head_share, host_bound):
    """Neither side alone may put a benchmark under the loose host-bound threshold: a change that
    adds host work would hide behind it."""
    from attnkit_perf.decide.host import host_bound_pair

    assert host_bound_pair(base_share, head_share) is host_bound, f"base {base_share}, head {head_share}"


@pytest.mark.parametrize(
    ("first", "second", "host_bound"),
    [
        ((0.4, 0.45), (0.53, 0.59), False),  # GPU-bound first: fresh processes cannot loosen it
        ((0.53, 0.59), (0.4, 0.45), False),
        ((0.9, 0.9), (0.8, 0.95), True),
    ],
)
def test_a_confirmed_benchmark_is_host_bound_only_when_every_measurement_says_so(first, second, host_bound):
    """The confirmation of a suspect is judged by the strictest classification seen: a slowdown
    measured under the GPU rule must not pass because fresh processes read host-bound."""
    from attnkit_perf.decide.host import host_bound_throughout
    from attnkit_perf.measure.paired_session import SideResult

    def measurement(shares):
        base, head = shares
        return {"base": SideResult(host_share=base), "head": SideResult(host_share=head)}

    assert host_bound_throughout(measurement(first), measurement(second)) is host_bound
    assert host_bound_throughout(measurement(second)) is (min(second) >= 0.5)


def test_a_head_doing_more_python_per_call_grows_its_count_and_fails_on_wall_time(tmp_path):
    """The host metric through the plugin: a head whose every call runs a Python loop (~0.7 ms,
    as long as the call itself) counts more host work, so wall time decides, over every process
    pair, and finds it slower, again on fresh processes."""
    head = _copy_checkout(tmp_path / "head", None, "[None for _ in range(20000)]")
    result, verdict = _run_paired(REPO, tmp_path, head=head)
    output = result.stdout + result.stderr
    row = verdict["benchmarks"][0]
    host = row["host"]
    assert row["outcome"] == "slower" and host["outcome"] == "slower", f"{row}\n{output[-3000:]}"
    count = host["count"]
    assert count["outcome"] == "grew", count
    assert count["head"]["instructions"] > count["base"]["instructions"] + 20000, count
    assert host["ratio"] > 2 and host["ci"][0] > 1.5 and host["processes"] >= 4, host
    assert "restart" in row["evidence"]["seconds"], "a slowdown is measured again on fresh processes"
    assert result.returncode == 1 and verdict["passed"] is False, output[-3000:]


@pytest.mark.parametrize(("out_of_time", "status"), [("pass", 0), ("fail", 1)])
def test_a_run_out_of_time_names_the_rows_it_did_not_decide(tmp_path, out_of_time, status):
    """A budget spent before the second row: the first row still runs (a run compares
    something), the second is not started and is named, in its row, the verdict's time budget
    and the summary line; it fails the run only under --attnkit-out-of-time=fail."""
    sdpa = "fwd[sdpa-fp32-B1-H2-N128-D32]"
    budget = ("--attnkit-time-budget=1", f"--attnkit-out-of-time={out_of_time}")
    result, verdict = _run_paired(
        REPO, tmp_path, "(naive or sdpa) and fwd and not causal", (PAIRED_CASE, sdpa), budget
    )
    output = result.stdout + result.stderr
    rows = {r["name"]: r for r in verdict["benchmarks"]}
    first, second = rows[PAIRED_CASE], rows[sdpa]
    assert first["outcome"] in ("same", "inconclusive", "unfinished"), f"{first}\n{output[-3000:]}"
    assert second["outcome"] == "not-reached", f"{second}\n{output[-3000:]}"
    assert second["reason"].startswith("not started within the time budget ("), second["reason"]
    assert "s of 1 s left, the first look of a row (eager fwd) takes" in second["reason"], second["reason"]
    undecided = [name for name, row in rows.items() if row["outcome"] in OUT_OF_TIME]
    block = verdict["time_budget"]
    assert block["undecided"] == undecided and sdpa in undecided, block
    assert block["seconds"] == 1 and block["estimates"]["eager fwd"]["first"]["looks"] == 1, block
    assert verdict["thresholds"]["out_of_time"] == out_of_time, verdict["thresholds"]
    assert "NOT DECIDED IN THE TIME BUDGET" in output, output[-3000:]
    line = next(x for x in output.splitlines() if x.startswith("attnkit perf gate (paired):"))
    assert "not decided in the time budget of 1 s: " in line and sdpa in line, line
    assert result.returncode == status and verdict["passed"] is (status == 0), f"{line}\n{output[-3000:]}"
