"""Stored mode across machines: latency-bound benchmarks are not divided by the GPU drift, a
baseline pooled from several recordings carries the spread between them (noise-stored.json),
which sets each benchmark's threshold; on synthetic data and through the plugin (CPU only)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from perf_synthetic import FAST_PROBES, H100_KEY, SHAPE, SYNTHETIC_SUITE, bench_entry, noisy_samples, run_json
from scipy import stats

from attnkit_perf.commands import pool
from attnkit_perf.decide import gate, pooled
from attnkit_perf.decide.drift import LATENCY_MULTIPLE, drift_kind, latency_bound
from attnkit_perf.decide.noise import SD_CONFIDENCE
from attnkit_perf.decide.policy import RunPolicy
from attnkit_perf.decide.stored import StoredRule
from attnkit_perf.formats import spread as spread_file
from attnkit_perf.formats.schema import FormatError, validate
from attnkit_perf.measure.machine import gpu_key

US = 1e-6
STORED = gate.Thresholds(slower=gate.Thresholds.STORED_SLOWER)
RULE = StoredRule(STORED, 1e-4, lambda name: STORED.slower)
#: Calibrations of the baseline's machine and of a fresh one whose matmul and copy ran 13% faster
#: (the kind of drift that turned an unchanged graph replay into x1.15 "slower" on the H200).
BASE_CAL = {"matmul_ms": 0.176, "copy_ms": 0.126, "host_ms": 2.3, "launch_ms": 0.003}
FRESH_CAL = {"matmul_ms": 0.176 * 0.87, "copy_ms": 0.126 * 0.87, "host_ms": 2.3, "launch_ms": 0.003}


# --- latency-bound: a stated rule on the data, not a name list --------------------------------


@pytest.mark.parametrize(
    ("median_us", "probe_us", "bound"),
    [
        (8.8, 3.0, True),  # a graph replay: ~3 probes
        (LATENCY_MULTIPLE * 3.0, 3.0, True),  # at the multiple
        (LATENCY_MULTIPLE * 3.0 + 0.1, 3.0, False),
        (86.7, 3.0, False),  # a decode step: throughput sets it
        (8.8, None, False),  # no probe anywhere: the GPU drift, as before the probe existed
        (None, 3.0, False),  # no baseline evidence
    ],
)
def test_latency_bound_is_the_median_against_the_launch_probe(median_us, probe_us, bound):
    median_s = None if median_us is None else median_us * US
    probe_ms = None if probe_us is None else probe_us * 1e-3
    assert latency_bound(median_s, probe_ms) is bound, f"{median_us} us against a {probe_us} us probe"


def test_the_drift_kind_reads_the_baselines_median_and_prefers_host_bound():
    assert drift_kind(True, 8.8 * US, BASE_CAL) == "host", "host-bound this run: the host's drift"
    assert drift_kind(False, 8.8 * US, BASE_CAL) == "latency"
    assert drift_kind(False, 200 * US, BASE_CAL) == "gpu"
    old = {k: v for k, v in BASE_CAL.items() if k != "launch_ms"}  # recorded before the probe
    assert drift_kind(False, 8.8 * US, old, FRESH_CAL) == "latency", "this run's probe, same GPU model"
    assert drift_kind(False, 8.8 * US, old, old) == "gpu"
    base, head, info = _graph_entry(3, 1.0)
    d = RULE.decide(base, head, info, old, FRESH_CAL)
    assert d.outcome == "same" and "launch probe not in the baseline" in d.reason, d.reason


def _graph_entry(seed: int, head_scale: float, median_s: float = 8.8 * US):
    rng = np.random.default_rng(seed)
    base = bench_entry("sdpa", noisy_samples(rng, median_s, cv=0.01, outlier_rate=0.0))
    head = noisy_samples(rng, median_s, cv=0.01, outlier_rate=0.0, scale=head_scale)
    return base, head, {"peak_bytes": None, "host_bound": False}


def test_an_unchanged_graph_replay_on_a_faster_machine_is_same_not_slower():
    """The false alarm: divided by the GPU drift x0.87, an unchanged 8.8 us replay reads x1.15."""
    base, head, info = _graph_entry(0, 1.0)
    d = RULE.decide(base, head, info, BASE_CAL, FRESH_CAL)
    assert d.outcome == "same" and abs(d.ratio - 1.0) < 0.02, d.reason
    assert d.extra["drift_kind"] == "latency" and d.extra["drift"] == 1.0, d.extra
    assert "latency-bound: GPU drift x0.8700 not divided out, launch probe x1.0000" in d.reason, d.reason
    no_probe = [{k: v for k, v in cal.items() if k != "launch_ms"} for cal in (BASE_CAL, FRESH_CAL)]
    divided = RULE.decide(base, head, info, *no_probe)
    assert divided.outcome == "slower" and divided.ratio == pytest.approx(1 / 0.87, rel=0.02), divided.reason


def test_a_real_slowdown_of_a_graph_replay_still_fails():
    base, head, info = _graph_entry(1, 1.3)
    d = RULE.decide(base, head, info, BASE_CAL, FRESH_CAL)
    assert d.outcome == "slower" and d.ratio == pytest.approx(1.3, rel=0.03), d.reason


def test_a_gpu_bound_benchmark_is_still_divided_by_the_gpu_drift():
    base, head, info = _graph_entry(2, 0.87, median_s=200 * US)  # the fresh machine runs it 13% faster
    d = RULE.decide(base, head, info, BASE_CAL, FRESH_CAL)
    assert d.extra["drift_kind"] == "gpu" and d.outcome == "same", d.reason
    assert d.ratio == pytest.approx(1.0, abs=0.02), d.reason


# --- pooling recordings ------------------------------------------------------------------------


def _recording(seed: int, offsets: dict[str, float], calibration: dict | None = None, **provenance) -> dict:
    """One machine's run: each benchmark's median 1 ms times its offset on this machine."""
    rng = np.random.default_rng(seed)
    cal = calibration or {"matmul_ms": 1.0, "copy_ms": 1.0, "host_ms": 1.0}
    entries = []
    for name, offset in offsets.items():
        samples = noisy_samples(rng, 1e-3, rounds=30, cv=0.005, outlier_rate=0.0, scale=offset)
        entries.append(bench_entry(name, samples, calibration=cal))
    run = run_json(entries)
    run["machine_info"]["attnkit"].update({"source": "s1", "commit": "c1", **provenance})
    return run


def test_pooling_divides_each_recordings_drift_and_measures_the_spread():
    # Machine b runs every kernel 10% slower (its calibration says so); flash_a differs beyond that.
    a = _recording(0, {"flash_a": 1.00, "cudnn_b": 1.00})
    slow = {"matmul_ms": 1.1, "copy_ms": 1.1, "host_ms": 1.0}
    b = _recording(1, {"flash_a": 1.1 * 1.06, "cudnn_b": 1.10}, calibration=slow)
    baseline, spread = pooled.merge([a, b], ["a.json", "b.json"])
    validate("baseline", baseline, "pooled")
    validate("noise-stored", spread, "spread")
    by_name = {e["extra_info"]["backend"]: e for e in baseline["benchmarks"]}
    assert len(by_name["flash_a"]["stats"]["data"]) == 60, "every recording's samples"
    # The pooled calibration sits between the two; each recording is brought to it.
    drift = math.sqrt(1.1)
    medians = spread["benchmarks"][by_name["cudnn_b"]["extra_info"]["name"]]["medians_ms"]
    assert medians == pytest.approx([drift, 1.1 / drift], rel=0.01), medians
    entry = spread["benchmarks"][by_name["flash_a"]["extra_info"]["name"]]
    assert entry["log_sd"] == pytest.approx(math.log(1.06) / math.sqrt(2), rel=0.1), entry
    quiet = spread["benchmarks"][by_name["cudnn_b"]["extra_info"]["name"]]["log_sd"]
    assert quiet < 0.005, f"drift divided out, nothing left but jitter: {quiet}"
    info = baseline["machine_info"]["attnkit"]
    assert info["pooled"] == {"id": spread["pool"], "recordings": 2}, info
    assert [r["label"] for r in spread["recordings"]] == ["a.json", "b.json"], spread["recordings"]
    assert spread["timing"] == info["timing"] and spread["provenance"]["gpu_key"] == H100_KEY, spread


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpu_key": "nvidia-h200"}, "differ in GPU model"),
        ({"timing": "flush-by-zeroing"}, "differ in timing protocol"),
        ({"source": "s2"}, "differ in source digest"),
        ({"torch": "2.12.0"}, "differ in torch"),
        ({"pooled": {"id": "x", "recordings": 2}}, "already a pooled baseline"),
    ],
)
def test_pooling_refuses_recordings_of_different_setups(change, message):
    a, b = _recording(0, {"flash_a": 1.0}), _recording(1, {"flash_a": 1.0}, **change)
    with pytest.raises(FormatError, match=message):
        pooled.merge([a, b], ["a.json", "b.json"])
    with pytest.raises(FormatError, match="needs >= 2 recordings"):
        pooled.merge([a], ["a.json"])


def test_the_command_writes_both_files_and_the_gate_reads_the_bound(tmp_path, capsys):
    paths = []
    for i, offset in enumerate((1.0, 1.04, 0.98)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(_recording(i, {"flash_a": offset, "cudnn_b": 1.0})))
    out = tmp_path / "baselines" / H100_KEY / "baseline.json"
    assert pool.main([*map(str, paths), "--out", str(out)]) == 0, capsys.readouterr().err
    spread_path = out.parent / spread_file.SPREAD_FILE
    assert out.is_file() and spread_path.is_file(), capsys.readouterr().out
    baseline = json.loads(out.read_text())
    document = spread_file.read_spread(spread_path, H100_KEY, baseline["machine_info"]["attnkit"]["timing"])
    sigmas, notes = pooled.spread_bounds(document, spread_path, baseline)
    name = next(
        b["extra_info"]["name"] for b in baseline["benchmarks"] if b["extra_info"]["backend"] == "flash_a"
    )
    # Three recordings of two GPU-bound benchmarks: their spreads pooled, 4 degrees of freedom.
    pool_sd, dof, count = pooled.kind_pools(json.loads(spread_path.read_text())["benchmarks"])["gpu"]
    assert (dof, count) == (4, 2), (dof, count)
    assert sigmas[name] == pytest.approx(pooled.sigma_bound(pool_sd, 3, dof=4)), sigmas
    assert "3 recordings pooled" in notes[0], notes
    # The threshold stored mode holds flash_a to: k sigma, above the practical 10%.
    policy = RunPolicy(STORED, confirmed=False, noise=sigmas, benchmark_count=2)
    assert policy.threshold_for(name) == pytest.approx(math.expm1(policy.noise_k * sigmas[name])), policy
    assert policy.threshold_for(name) > STORED.slower, policy.threshold_for(name)
    assert pool.main([str(paths[0]), "--out", str(out)]) == 2, "one recording is no pool"
    assert "needs >= 2 recordings" in capsys.readouterr().err


def test_a_spread_of_another_pool_gpu_or_protocol(tmp_path):
    a, b = _recording(0, {"flash_a": 1.0}), _recording(1, {"flash_a": 1.02})
    baseline, spread = pooled.merge([a, b], ["a", "b"])
    path = tmp_path / "noise-stored.json"
    path.write_text(json.dumps(spread))
    single = copy.deepcopy(a)
    sigmas, notes = pooled.spread_bounds(spread_file.read_spread(path, H100_KEY, None), path, single)
    assert sigmas == {} and notes[0].startswith("WARNING: stored spread") and "a single recording" in notes[0]
    sigmas, notes = pooled.spread_bounds(spread_file.read_spread(path, H100_KEY, None), path, baseline)
    assert set(sigmas) == set(spread["benchmarks"]) and "2 recordings pooled" in notes[0], (sigmas, notes)
    with pytest.raises(FormatError, match="is for 'nvidia-h100-80gb-hbm3'; this run is 'nvidia-h200'"):
        spread_file.read_spread(path, "nvidia-h200", None)
    with pytest.raises(FormatError, match="timing protocol, this run times with 'other'"):
        spread_file.read_spread(path, H100_KEY, "other")
    spread["benchmarks"][next(iter(spread["benchmarks"]))]["log_offsets"] = [0.1]
    path.write_text(json.dumps(spread))
    with pytest.raises(FormatError, match=r"is not a valid noise-stored file: at benchmarks/.*/log_offsets"):
        spread_file.read_spread(path, H100_KEY, None)


@pytest.mark.parametrize("recordings", [2, 4, 6])
def test_the_allowed_sigma_covers_a_new_machines_offset_at_its_confidence(recordings):
    """By simulation: from ``recordings`` machines' offsets (sigma 1%), the bound lies above the
    true sd of a new machine against their mean, sigma sqrt(1 + 1/n), in SD_CONFIDENCE of draws."""
    sigma = 0.01
    rng = np.random.default_rng(recordings)
    sds = rng.normal(0.0, sigma, (4000, recordings)).std(axis=1, ddof=1)
    truth = sigma * math.sqrt(1 + 1 / recordings)
    covered = np.mean([pooled.sigma_bound(s, recordings) >= truth for s in sds])
    assert abs(covered - SD_CONFIDENCE) < 0.02, f"{recordings} recordings: covers {covered:.1%}"
    factor = math.sqrt((recordings - 1) / stats.chi2.ppf(1 - SD_CONFIDENCE, recordings - 1))
    assert pooled.sigma_bound(sigma, recordings) == pytest.approx(
        sigma * factor * math.sqrt(1 + 1 / recordings)
    )


# --- through the plugin ------------------------------------------------------------------------

CPU_KEY = gpu_key("cpu")
NAMES = ("flash_a", "cudnn_b")


@pytest.fixture
def synthetic(pytester, monkeypatch):
    """``synthetic(*args, scale=..., seed=...)`` runs the synthetic suite in-process."""
    pytester.makepyfile(test_synthetic=SYNTHETIC_SUITE)
    pytester.makeconftest(FAST_PROBES)
    monkeypatch.setenv("ATTNKIT_TEST_DEVICE", "cpu")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    root = pytester.path / "baselines"

    def run(*args, scale=None, seed=0):
        spec = {"names": list(NAMES), "scale": scale or {}, "peak": {}, "seed": seed, "jitter": 0.03}
        monkeypatch.setenv("ATTNKIT_SYNTH_SPEC", json.dumps({**spec, "interrupt": [], "shape": SHAPE}))
        return pytester.runpytest_inprocess(
            "-p", "attnkit_perf.plugin", f"--attnkit-baseline-dir={root}", "-p", "no:cacheprovider", *args
        )

    run.baseline = root / CPU_KEY / "baseline.json"
    return run


def _verdict(synthetic, pytester, *args, **spec) -> tuple:
    path = pytester.path / "verdict.json"
    result = synthetic(
        "--benchmark-compare", "--attnkit-allow-cpu", f"--attnkit-verdict-json={path}", *args, **spec
    )
    text = result.stdout.str()
    assert path.is_file(), text[-3000:]
    data = json.loads(path.read_text())
    validate("verdict", data, str(path))
    return result, data, {r["backend"]: r for r in data["benchmarks"]}


def test_a_baseline_without_a_spread_is_compared_as_before_with_a_loud_note(synthetic, pytester):
    assert synthetic("--attnkit-record", "--attnkit-allow-cpu").ret == 0
    result, verdict, rows = _verdict(synthetic, pytester, seed=1)
    assert result.ret == 0 and {r["outcome"] for r in rows.values()} == {"same"}, verdict["counts"]
    note = next((n for n in verdict["notes"] if "no spread between recordings" in n), None)
    assert note and note.startswith("WARNING") and "python -m attnkit_perf.commands.pool" in note, verdict[
        "notes"
    ]
    assert {r["threshold"] for r in rows.values()} == {STORED.slower}, "the practical threshold"
    result.stdout.fnmatch_lines(["*WARNING: no spread between recordings*"])


def test_a_pooled_baseline_holds_a_benchmark_to_the_spread_between_its_recordings(synthetic, pytester):
    """Two machines differed by 12% on flash_a: a third that reads 20% above the first is within
    what machines do, not a change; against the first machine's recording alone it fails."""
    recordings = []
    for i, offset in enumerate((1.0, 1.12)):
        recordings.append(pytester.path / f"recording-{i}.json")
        args = ("--attnkit-record", "--attnkit-allow-cpu", f"--benchmark-json={recordings[-1]}")
        assert synthetic(*args, seed=10 + i, scale={"flash_a": offset}).ret == 0
    first = json.loads(recordings[0].read_text())
    synthetic.baseline.write_text(json.dumps(first))
    result, _, rows = _verdict(synthetic, pytester, seed=3, scale={"flash_a": 1.2})
    assert rows["flash_a"]["outcome"] == "slower" and result.ret == 1, rows["flash_a"]["reason"]
    assert pool.main([*map(str, recordings), "--out", str(synthetic.baseline)]) == 0
    result, verdict, rows = _verdict(synthetic, pytester, seed=3, scale={"flash_a": 1.2})
    assert rows["flash_a"]["outcome"] != "slower" and result.ret == 0, rows["flash_a"]["reason"]
    assert rows["flash_a"]["threshold"] > 0.2, (
        f"the spread raised its threshold: {rows['flash_a']['threshold']}"
    )
    # Two recordings each: both held by their kind's pooled spread, not by their own.
    assert rows["cudnn_b"]["outcome"] == "same", rows["cudnn_b"]["reason"]
    assert rows["cudnn_b"]["threshold"] == pytest.approx(rows["flash_a"]["threshold"]), rows
    assert any("stored spread from" in n and "2 recordings pooled" in n for n in verdict["notes"]), verdict[
        "notes"
    ]
    assert verdict["base"]["provenance"]["pooled"]["recordings"] == 2, verdict["base"]


def test_a_spread_of_another_gpu_model_is_a_usage_error(synthetic, pytester):
    assert synthetic("--attnkit-record", "--attnkit-allow-cpu").ret == 0
    _, spread = pooled.merge([_recording(0, {"flash_a": 1.0}), _recording(1, {"flash_a": 1.0})], ["a", "b"])
    path = pytester.path / "h100-spread.json"
    path.write_text(json.dumps(spread))
    result = synthetic("--benchmark-compare", "--attnkit-allow-cpu", f"--attnkit-noise={path}")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text[-3000:]
    assert f"stored spread {path} is for '{H100_KEY}'; this run is '{CPU_KEY}'" in text, text[-3000:]


def test_one_unstable_benchmark_does_not_loosen_its_kinds_pool():
    """A benchmark whose two recordings disagree by 10% (a recording that caught a warm-up) is
    left out of the GPU pool: the others keep the pool of their own spread, the note names it."""
    import math

    def entry(sd):
        return {
            "kinds": ["gpu"],
            "log_offsets": [-sd / math.sqrt(2), sd / math.sqrt(2)],
            "log_sd": sd,
            "medians_ms": [1.0, 1.0],
        }

    steady = {f"fwd[b{i}]": entry(0.004 + 0.0002 * i) for i in range(12)}
    document = {"benchmarks": {**steady, "fwd[unstable]": entry(0.07)}, "calibration": {}}
    assert pooled.pool_outliers(document["benchmarks"]) == {"fwd[unstable]"}
    sd, dof, count = pooled.kind_pools(document["benchmarks"])["gpu"]
    assert count == 12 and dof == 12 and sd < 0.007, (sd, dof, count)
    sigmas = pooled.spread_sigmas(document)
    assert sigmas["fwd[unstable]"] == sigmas["fwd[b0]"] < 0.02, sigmas
    assert "fwd[unstable]" in pooled.pool_note(document)
