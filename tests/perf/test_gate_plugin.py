"""The gate end to end through pytest: synthetic benchmarks whose time and memory the test
controls, recorded as a baseline, then compared (pytester, in-process, CPU only)."""

from __future__ import annotations

import json

import pytest

from attnkit.bench.machine import gpu_key

SYNTHETIC_TESTS = '''
import json, os
import numpy as np
import pytest

SPEC = json.loads(os.environ["ATTNKIT_SYNTH_SPEC"])


class VirtualClock:
    """Time advances only when a synthetic kernel "runs": samples are exactly the spec's."""
    now = 0.0


def virtual_clock():
    return VirtualClock.now


@pytest.mark.parametrize("name", SPEC["names"])
@pytest.mark.benchmark(timer=virtual_clock)
def test_synthetic(benchmark, name):
    rng = np.random.default_rng([SPEC["seed"], sum(map(ord, name))])
    median = 1e-3 * SPEC["scale"].get(name, 1.0)
    jitter = SPEC["jitter"]
    durations = iter(median * (1 + rng.uniform(-jitter, jitter, 1000)))

    def kernel():
        VirtualClock.now += next(durations)

    benchmark.extra_info.update(
        name=f"fwd[{name}]", backend=name.split("_")[0], shape={"seq_len": 128},
        peak_bytes=SPEC["peak"].get(name, 8 * 2**20), tflops=1.0,
    )
    benchmark.extra_info["pass"] = "fwd"
    benchmark.pedantic(kernel, rounds=60, iterations=1)
'''


FAST_PROBES = """
def pytest_benchmark_generate_machine_info(config):
    return {"node": "synthetic"}


def pytest_benchmark_generate_commit_info(config):
    return {"id": "synthetic"}
"""


def _spec(names=("flash_a", "cudnn_b", "tiled_c"), scale=None, peak=None, seed=0, jitter=0.03):
    return json.dumps(
        {"names": list(names), "scale": scale or {}, "peak": peak or {}, "seed": seed, "jitter": jitter}
    )


@pytest.fixture
def gate_run(pytester, monkeypatch):
    """Run the synthetic suite with a spec; returns the RunResult."""
    pytester.makepyfile(test_synthetic=SYNTHETIC_TESTS)
    # pytest-benchmark's own machine and commit probes (py-cpuinfo, git) cost ~1 s per run.
    pytester.makeconftest(FAST_PROBES)
    root = pytester.path / "baselines"

    def run(*args, **spec):
        monkeypatch.setenv("ATTNKIT_SYNTH_SPEC", _spec(**spec))
        return pytester.runpytest_inprocess(
            "-p", "attnkit.bench.plugin", f"--attnkit-baseline-dir={root}", "-p", "no:cacheprovider", *args
        )

    run.baseline = root / gpu_key() / "baseline.json"
    return run


def _record(gate_run, **spec):
    result = gate_run("--attnkit-record", **spec)
    assert result.ret == 0, result.stdout.str()
    assert gate_run.baseline.is_file(), "record must write baselines/<gpu_key>/baseline.json"


def _failed_lines(result) -> str:
    text = result.stdout.str()
    return (
        text.split("FAILED (slower or more memory):")[1].split("attnkit perf gate:")[0]
        if "FAILED (" in text
        else ""
    )


def test_record_writes_a_pytest_benchmark_file_with_samples_and_provenance(gate_run):
    _record(gate_run)
    data = json.loads(gate_run.baseline.read_text())
    assert {b["name"] for b in data["benchmarks"]} >= {"test_synthetic[flash_a]"}
    assert len(data["benchmarks"][0]["stats"]["data"]) == 60, "per-round samples must be stored"
    info = data["machine_info"]["attnkit"]
    assert info["gpu_key"] == gpu_key() and info["torch"], info


def test_unchanged_code_passes(gate_run):
    _record(gate_run, seed=0)
    result = gate_run("--benchmark-compare", seed=1)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*attnkit perf gate: passed (3 same,*"])


def test_five_percent_jitter_passes(gate_run):
    _record(gate_run, seed=0, jitter=0.05)
    result = gate_run("--benchmark-compare", seed=2, jitter=0.05)
    assert result.ret == 0, result.stdout.str()


def test_twenty_percent_slower_fails_and_names_only_that_benchmark(gate_run):
    _record(gate_run)
    result = gate_run("--benchmark-compare", seed=1, scale={"cudnn_b": 1.2})
    assert result.ret == 1, result.stdout.str()
    failed = _failed_lines(result)
    assert "fwd[cudnn_b]" in failed and "slower" in failed, result.stdout.str()
    assert "flash_a" not in failed and "tiled_c" not in failed, failed


def test_more_memory_fails_and_names_it(gate_run):
    _record(gate_run)
    result = gate_run("--benchmark-compare", seed=1, peak={"tiled_c": 8 * 2**20 + 4 * 2**20})
    assert result.ret == 1, result.stdout.str()
    failed = _failed_lines(result)
    assert "fwd[tiled_c]" in failed and "more-memory" in failed, failed
    assert "flash_a" not in failed, failed


def test_verdict_file_has_every_field(gate_run, pytester):
    _record(gate_run)
    path = pytester.path / "verdict.json"
    gate_run("--benchmark-compare", f"--attnkit-verdict-json={path}", seed=1, scale={"flash_a": 1.3})
    doc = json.loads(path.read_text())
    assert doc["format"] == "attnkit-perf-verdict/1" and doc["passed"] is False
    assert doc["baseline"]["machine_info"]["attnkit"]["gpu_key"] == gpu_key()
    row = next(b for b in doc["benchmarks"] if b["name"] == "fwd[flash_a]")
    expected = {"name", "group", "backend", "pass", "shape", "baseline_median_ms", "now_median_ms", "ratio"}
    expected |= {"verdict", "evidence", "baseline_peak_bytes", "now_peak_bytes", "tflops"}
    assert expected <= set(row), expected - set(row)
    assert row["verdict"] == "slower" and row["backend"] == "flash" and row["pass"] == "fwd"


def test_new_and_missing_benchmarks_are_listed_not_failed(gate_run):
    _record(gate_run, names=("flash_a", "cudnn_b"))
    result = gate_run("--benchmark-compare", seed=1, names=("flash_a", "tiled_c"))
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["new (not in the baseline):", "*fwd?tiled_c?*new*"])
    result.stdout.fnmatch_lines(["missing (in the baseline, not run):", "*cudnn_b*missing*"])


def test_no_baseline_for_this_gpu_says_how_to_record_one(gate_run):
    result = gate_run("--benchmark-compare")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [f"*no perf baseline for GPU '{gpu_key()}'*python -m attnkit.bench.baseline record*"]
    )


def test_corrupt_baseline_is_a_clear_usage_error(gate_run):
    gate_run.baseline.parent.mkdir(parents=True)
    gate_run.baseline.write_text("{ not json")
    result = gate_run("--benchmark-compare")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*baseline*is not readable JSON*re-record it with*"])


def test_another_gpus_baseline_is_never_used_silently(gate_run, pytester):
    _record(gate_run)
    data = json.loads(gate_run.baseline.read_text())
    data["machine_info"]["attnkit"]["gpu_key"] = "NVIDIA_H200"
    other = pytester.path / "baselines" / "NVIDIA_H200" / "baseline.json"
    other.parent.mkdir(parents=True)
    other.write_text(json.dumps(data))
    gate_run.baseline.unlink()
    bare = gate_run("--benchmark-compare")
    bare.stdout.fnmatch_lines([f"*no perf baseline for GPU '{gpu_key()}'*"])
    explicit = gate_run(f"--benchmark-compare={other}")
    assert explicit.ret == pytest.ExitCode.USAGE_ERROR
    explicit.stderr.fnmatch_lines(["*recorded on 'NVIDIA_H200'*not comparable*"])


def test_baseline_from_other_versions_is_flagged(gate_run):
    _record(gate_run)
    data = json.loads(gate_run.baseline.read_text())
    data["machine_info"]["attnkit"]["torch"] = "1.0.0"
    gate_run.baseline.write_text(json.dumps(data))
    result = gate_run("--benchmark-compare", seed=1)
    result.stdout.fnmatch_lines(["*WARNING: baseline recorded under torch 1.0.0, this run has*"])


def test_benchmark_compare_fail_still_works(gate_run):
    _record(gate_run)
    result = gate_run(
        "--benchmark-compare", "--benchmark-compare-fail=median:10%", seed=1, scale={"flash_a": 1.3}
    )
    assert result.ret != 0
    assert "Performance has regressed" in result.stdout.str() + result.stderr.str()
