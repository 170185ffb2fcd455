"""The gate's file formats (attnkit_perf/formats/schemas/*.json): valid documents pass, corrupt
ones raise FormatError naming the field, and the verdict's writer and reader agree."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from perf_synthetic import H100_KEY, bench_entry, case_for, noisy_samples, paired_blocks, run_json

from attnkit_perf.decide import gate
from attnkit_perf.decide.noise import noise_sigmas
from attnkit_perf.formats.baseline import UNNAMED_TIMING_PROTOCOL, load_baseline, save_baseline
from attnkit_perf.formats.noise import FORMAT as NOISE_FORMAT
from attnkit_perf.formats.noise import read_noise
from attnkit_perf.formats.schema import FormatError, validate
from attnkit_perf.formats.verdict import FORMAT as VERDICT_FORMAT
from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument
from attnkit_perf.measure.timing import TIMING_PROTOCOL
from attnkit_perf.report.terminal import summary_line
from attnkit_perf.run.session import describe

T = gate.Thresholds()
REPO = Path(__file__).resolve().parents[2]


def _baseline() -> dict:
    rng = np.random.default_rng(0)
    return run_json([bench_entry(b, noisy_samples(rng, 1e-3, rounds=20)) for b in ("sdpa", "tiled")])


def _row(backend: str, ratio: float, **measured) -> BenchmarkVerdict:
    base, head = paired_blocks(np.random.default_rng(1), 16, ratio)
    decision = gate.decide_paired(base, head, T, 1e-4, T.slower, 8 * gate.MIB, 8 * gate.MIB)
    return BenchmarkVerdict.from_decision(
        describe(case_for(backend)),
        decision,
        base_median_ms=float(np.median(base)) * 1e3,
        head_median_ms=float(np.median(head)) * 1e3,
        base_peak_bytes=8 * gate.MIB,
        head_peak_bytes=8 * gate.MIB,
        tflops=0.5,
        host_bound=False,
        **measured,
    )


def verdict_document(rows=None, mode: str = "paired") -> VerdictDocument:
    side = {"label": "base", "provenance": {"gpu_key": H100_KEY, "torch": "2.11.0", "commit": "a" * 40}}
    return VerdictDocument(
        mode=mode,
        base=side,
        head={"label": "this checkout", "provenance": {**side["provenance"], "commit": "b" * 40}},
        thresholds={"slower": 0.02, "run_alpha": 0.01, "memory_rel": 0.01, "memory_abs_bytes": gate.MIB},
        benchmarks=rows if rows is not None else [_row("sdpa", 1.0), _row("tiled", 1.1)],
        notes=["a note"],
    )


def _noise() -> dict:
    return {
        "format": NOISE_FORMAT,
        "gpu_key": H100_KEY,
        "mode": "paired",
        "runs": 3,
        "provenance": {"gpu_key": H100_KEY},
        "benchmarks": {case_for("sdpa").name: {"log_ratio_sd": 0.004, "ratios": [1.0, 1.004, 0.995]}},
    }


def _set(doc: dict, path: tuple, value) -> dict:
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


# --- valid documents ------------------------------------------------------------------------


def test_valid_documents_pass():
    validate("baseline", _baseline(), "baseline")
    validate("verdict", verdict_document().to_dict(), "verdict")
    validate("noise", _noise(), "noise")


# --- corrupt documents name the field -------------------------------------------------------

CORRUPT_BASELINES = {
    "stats null": (("benchmarks", 0, "stats"), None, "at benchmarks/0/stats:"),
    "machine_info.attnkit null": (("machine_info", "attnkit"), None, "at machine_info/attnkit:"),
    "stats.data null": (("benchmarks", 0, "stats", "data"), None, "at benchmarks/0/stats/data:"),
    "stats.data strings": (
        ("benchmarks", 1, "stats", "data"),
        ["1e-3", "2e-3"],
        "at benchmarks/1/stats/data/",
    ),
    "no gpu key": (("machine_info", "attnkit", "gpu_key"), "", "at machine_info/attnkit/gpu_key:"),
    "extra_info null": (("benchmarks", 0, "extra_info"), None, "at benchmarks/0/extra_info:"),
    "benchmarks not a list": (("benchmarks",), {"a": 1}, "at benchmarks:"),
    "unknown mode": (
        ("benchmarks", 0, "extra_info", "shape", "mode"),
        "jit",
        "at benchmarks/0/extra_info/shape/mode:",
    ),
}


@pytest.mark.parametrize("kind", CORRUPT_BASELINES)
def test_corrupt_baseline_names_the_field(kind, tmp_path):
    path, value, field = CORRUPT_BASELINES[kind]
    file = tmp_path / "baseline.json"
    file.write_text(json.dumps(_set(_baseline(), path, value)))
    with pytest.raises(FormatError) as err:
        load_baseline(file, H100_KEY)
    assert field in str(err.value), f"{kind}: the message must name {field}: {err.value}"
    assert str(file) in str(err.value), f"{kind}: the message must name the file: {err.value}"


@pytest.mark.parametrize("kind", ["baseline", "verdict", "noise"])
def test_a_foreign_document_is_rejected(kind):
    with pytest.raises(FormatError, match=r"not a valid .* file: at \(top level\): '\w+' is a required"):
        validate(kind, {"foo": 1}, f"{kind} file")


def test_unreadable_files_say_why(tmp_path):
    with pytest.raises(FormatError, match="does not exist"):
        load_baseline(tmp_path / "absent.json", H100_KEY)
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json")
    with pytest.raises(FormatError, match=r"broken\.json is not readable JSON"):
        load_baseline(broken, H100_KEY)


def test_another_gpus_baseline_is_refused_unless_allowed(tmp_path):
    file = save_baseline(_baseline(), tmp_path / "b.json")
    with pytest.raises(FormatError, match=f"recorded on '{H100_KEY}', this run is on 'nvidia-h200'"):
        load_baseline(file, "nvidia-h200")
    assert load_baseline(file, "nvidia-h200", allow_other_gpu=True)["benchmarks"], "allowed: loaded"


def test_a_baseline_timed_with_another_protocol_is_refused(tmp_path):
    file = save_baseline(_baseline(), tmp_path / "b.json")
    assert load_baseline(file, H100_KEY, timing_protocol=TIMING_PROTOCOL)["benchmarks"], "same protocol"
    with pytest.raises(
        FormatError, match=f"timed with the '{TIMING_PROTOCOL}' protocol, this run times with 'x'"
    ):
        load_baseline(file, H100_KEY, timing_protocol="x")
    # Recorded before protocols were named: timed with the zeroing flush, not this one.
    unnamed = _baseline()
    del unnamed["machine_info"]["attnkit"]["timing"]
    file = save_baseline(unnamed, tmp_path / "old.json")
    with pytest.raises(FormatError, match=f"timed with the '{UNNAMED_TIMING_PROTOCOL}' protocol"):
        load_baseline(file, H100_KEY, timing_protocol=TIMING_PROTOCOL)


def test_save_baseline_refuses_an_invalid_run(tmp_path):
    with pytest.raises(FormatError, match=r"the run being recorded .*machine_info"):
        save_baseline({"benchmarks": []}, tmp_path / "b.json")
    assert not (tmp_path / "b.json").exists(), "nothing is written for an invalid run"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("format",), "attnkit-perf-verdict/1", "format"),
        (("benchmarks", 0, "outcome"), "regressed", "benchmarks/0/outcome"),
        (("mode",), "both", "mode"),
        (("benchmarks", 0, "ci"), [1.0], "benchmarks/0/ci"),
        (("benchmarks", 1, "surprise"), 1, "benchmarks/1"),
        (("thresholds", "run_alpha"), 1.5, "thresholds/run_alpha"),
        (("passed",), None, "passed"),
    ],
)
def test_corrupt_verdict_names_the_field(path, value, field, tmp_path):
    file = tmp_path / "verdict.json"
    file.write_text(json.dumps(_set(verdict_document().to_dict(), path, value)))
    with pytest.raises(FormatError) as err:
        VerdictDocument.read(file)
    assert f"at {field}:" in str(err.value), f"the message must name {field}: {err.value}"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("format",), "attnkit-perf-noise/0", "format"),
        (("runs",), 1, "runs"),
        (("mode",), "record", "mode"),
        (("benchmarks", case_for("sdpa").name, "log_ratio_sd"), -0.1, "benchmarks/" + case_for("sdpa").name),
        (("benchmarks", case_for("sdpa").name, "ratios"), [1.0, 0.0], "benchmarks/" + case_for("sdpa").name),
    ],
)
def test_corrupt_noise_names_the_field(path, value, field, tmp_path):
    file = tmp_path / "noise.json"
    file.write_text(json.dumps(_set(_noise(), path, value)))
    with pytest.raises(FormatError) as err:
        read_noise(file, H100_KEY, "paired")
    assert f"at {field}" in str(err.value), f"the message must name {field}: {err.value}"


# --- impossible figures: bytes >= 0, times > 0, counts >= 0 ---------------------------------

#: The words jsonschema uses for the two rules: bytes and counts >= 0, times > 0.
AT_LEAST_0 = "less than the minimum of 0"
ABOVE_0 = "less than or equal to the minimum of 0"
_COUNT = {"instructions": 0, "c_calls": 0, "repeatable": True, "environment": {}}
_KEPT = {"base_bytes": 0, "head_bytes": 0, "limit_bytes": 65536}
_RESAMPLED = [{"samples_s": [1e-6]}]
_SDPA = case_for("sdpa").name

#: figure -> (kind, field path, an impossible value, the rule, the boundary value the rule
#: allows). The baseline's and the verdict's paths lie in benchmark 1 (``tiled``).
IMPOSSIBLE = {
    "kept bytes": ("baseline", "benchmarks/1/extra_info/kept_bytes", -100663296, AT_LEAST_0, 0),
    "peak bytes": ("baseline", "benchmarks/1/extra_info/peak_bytes", -1, AT_LEAST_0, 0),
    "min bytes": ("baseline", "benchmarks/1/extra_info/min_bytes", -4, AT_LEAST_0, 0),
    "a round's time": ("baseline", "benchmarks/1/stats/data/3", 0.0, ABOVE_0, 1e-9),
    "a negative time": ("baseline", "benchmarks/1/stats/data/0", -1e-3, ABOVE_0, 1e-9),
    "the median": ("baseline", "benchmarks/1/stats/median", 0.0, ABOVE_0, 1e-9),
    "host time per call": (
        "baseline", "benchmarks/1/extra_info/host", {"per_call_s": 0.0}, ABOVE_0, {"per_call_s": 1e-9}
    ),
    "a calibration probe": (
        "baseline", "benchmarks/1/extra_info/calibration", {"matmul_ms": -0.2}, ABOVE_0, {"matmul_ms": 1e-6}
    ),
    "a re-measurement": (
        "baseline", "benchmarks/1/extra_info/confirm", [{"samples_s": [0.0]}], ABOVE_0, _RESAMPLED
    ),
    "host instructions": (
        "baseline", "benchmarks/1/extra_info/host_count", {**_COUNT, "instructions": -1}, AT_LEAST_0, _COUNT
    ),
    "verdict kept bytes": ("verdict", "benchmarks/1/kept", {**_KEPT, "base_bytes": -1}, AT_LEAST_0, _KEPT),
    "verdict median": ("verdict", "benchmarks/1/head_median_ms", 0.0, ABOVE_0, 1e-6),
    "verdict ratio": ("verdict", "benchmarks/1/ratio", -1.0, ABOVE_0, 1e-6),
    "verdict peak": ("verdict", "benchmarks/1/base_peak_bytes", -1, AT_LEAST_0, 0),
    "noise ratio": ("noise", f"benchmarks/{_SDPA}/ratios", [1.0, 0.0], ABOVE_0, [1.0, 1e-9]),
}  # fmt: skip


def _path(field: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in field.split("/"))


def _document(kind: str) -> dict:
    return {"baseline": _baseline, "verdict": lambda: verdict_document().to_dict(), "noise": _noise}[kind]()


@pytest.mark.parametrize("figure", IMPOSSIBLE)
def test_the_schema_refuses_an_impossible_figure_and_names_benchmark_field_value_and_rule(figure):
    kind, field, value, rule, boundary = IMPOSSIBLE[figure]
    validate(kind, _set(_document(kind), _path(field), boundary), kind)  # the boundary is possible
    with pytest.raises(FormatError) as err:
        validate(kind, _set(_document(kind), _path(field), value), f"the {kind} being written")
    message = str(err.value)
    name = case_for("tiled").name if kind != "noise" else _SDPA
    assert f"at {field}" in message and rule in message, f"{figure}: {message}"
    assert f"benchmark {name}" in message, f"{figure}: the message must name the benchmark: {message}"
    shown = value if not isinstance(value, (dict, list)) else None
    assert shown is None or str(shown) in message, f"{figure}: the message must show {shown}: {message}"


def test_a_baseline_holding_a_negative_kept_memory_is_refused_when_recorded_and_when_loaded(tmp_path):
    bad = _set(_baseline(), ("benchmarks", 1, "extra_info", "kept_bytes"), -100663296)
    expected = (
        "at benchmarks/1/extra_info/kept_bytes: -100663296 is less than the minimum of 0 "
        f"(benchmark {case_for('tiled').name})"
    )
    with pytest.raises(
        FormatError, match=re.escape(f"the run being recorded is not a valid baseline file: {expected}")
    ):
        save_baseline(bad, tmp_path / "recorded.json")
    assert not (tmp_path / "recorded.json").exists(), "nothing is written for a refused run"
    file = tmp_path / "committed.json"
    file.write_text(json.dumps(bad))
    with pytest.raises(
        FormatError, match=re.escape(f"baseline {file} is not a valid baseline file: {expected}")
    ):
        load_baseline(file, H100_KEY)


def test_pooling_refuses_a_recording_with_an_impossible_figure_and_keeps_the_largest_kept_memory():
    from attnkit_perf.decide import pooled

    runs = []
    for kept in (0, 4096):
        run = _baseline()
        run["machine_info"]["attnkit"]["source"] = "s1"
        for bench in run["benchmarks"]:
            bench["extra_info"]["kept_bytes"] = kept
        runs.append(run)
    baseline, _ = pooled.merge(runs, ["a.json", "b.json"])
    kept = {b["extra_info"]["name"]: b["extra_info"]["kept_bytes"] for b in baseline["benchmarks"]}
    assert set(kept.values()) == {4096}, f"a reading one recording reached is the code's own: {kept}"
    runs[1]["benchmarks"][1]["extra_info"]["kept_bytes"] = -100663296
    refused = (
        "recording b.json is not a valid baseline file: at benchmarks/1/extra_info/kept_bytes: -100663296"
    )
    with pytest.raises(FormatError, match=re.escape(refused)):
        pooled.merge(runs, ["a.json", "b.json"])


def test_a_verdict_with_an_impossible_figure_is_not_written(tmp_path):
    doc = verdict_document()
    doc.benchmarks[0].kept = {"base_bytes": -100663296, "head_bytes": 0, "limit_bytes": 65536}
    path = tmp_path / "verdict.json"
    with pytest.raises(FormatError, match=r"the verdict being written .*kept/base_bytes: -100663296"):
        doc.write(path)
    assert not path.exists(), "a refused verdict must leave no file behind"


COMMITTED = sorted((REPO / "baselines").glob("*/baseline.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=[path.parent.name for path in COMMITTED])
def test_the_committed_baselines_load_through_the_gates_reader(path):
    key = path.parent.name
    baseline = load_baseline(path, key, timing_protocol=TIMING_PROTOCOL)
    assert baseline["benchmarks"], f"{path} holds no benchmark"
    paired = path.parent / "noise-paired.json"
    if paired.is_file():
        assert noise_sigmas(read_noise(paired, key, "paired")), f"{paired} holds no benchmark"


# --- the verdict's writer and reader together -----------------------------------------------


def test_verdict_round_trip(tmp_path):
    doc = verdict_document([_row("sdpa", 1.0), _row("tiled", 1.1), _row("naive", 1 / 1.1)])
    doc.benchmarks.append(
        BenchmarkVerdict.from_decision(
            describe(case_for("triton")),
            gate.Decision("new", reason="the base cannot run it"),
            head_median_ms=0.1,
        )
    )
    path = doc.write(tmp_path / "sub" / "verdict.json")
    data = json.loads(path.read_text())
    assert data["format"] == VERDICT_FORMAT and data["passed"] is False, data["format"]
    assert data["counts"] == {"slower": 1, "faster": 1, "new": 1, "same": 1}, data["counts"]
    back = VerdictDocument.read(path)
    assert back == doc, "read(write(doc)) differs from doc"
    outcomes = [r.outcome for r in back.benchmarks]
    assert outcomes == ["same", "slower", "faster", "new"], f"outcomes read back: {outcomes}"
    assert back.failing == [doc.benchmarks[1]] and not back.passed, f"failing: {back.failing}"


def test_fail_on_inconclusive_is_part_of_the_document():
    row = BenchmarkVerdict.from_decision(
        describe(case_for("sdpa")), gate.Decision("inconclusive", reason="wide")
    )
    doc = verdict_document([row])
    assert doc.passed, "inconclusive is listed, not failing, by default"
    doc.thresholds["fail_on_inconclusive"] = True
    assert not doc.passed and doc.failing == [row], "told to, the run fails on inconclusive"


def _bare(backend: str, outcome: str) -> BenchmarkVerdict:
    return BenchmarkVerdict.from_decision(describe(case_for(backend)), gate.Decision(outcome, reason=outcome))


@pytest.mark.parametrize(
    "outcomes",
    [(), ("error",), ("new",), ("new", "missing"), ("dropped",)],
    ids=lambda o: "+".join(o) or "empty",
)
def test_a_run_that_compared_nothing_has_not_passed(outcomes):
    """A gate that measured no benchmark on both sides guarded nothing: it fails, and says so
    (a paired run whose only benchmark raised once printed "passed (nothing compared)")."""
    doc = verdict_document([_bare(b, o) for b, o in zip(("sdpa", "tiled"), outcomes, strict=False)])
    doc.thresholds["allow_dropped"] = True
    assert doc.compared == 0 and not doc.passed, f"{outcomes}: passed={doc.passed}"
    line = summary_line(doc)
    assert "FAILED, nothing compared" in line, line
    doc.benchmarks.append(_bare("naive", "same"))
    assert doc.compared == 1, doc.counts()


@pytest.mark.parametrize(("outcome", "fails"), [("error", True), ("dropped", True), ("missing", False)])
def test_a_benchmark_that_was_not_compared_fails_unless_it_was_not_selected(outcome, fails):
    doc = verdict_document([_row("sdpa", 1.0), _bare("tiled", outcome)])
    assert doc.passed is not fails and bool(doc.failing) is fails, f"{outcome}: failing {doc.failing}"
    if outcome == "dropped":
        doc.thresholds["allow_dropped"] = True
        assert doc.passed, "--attnkit-allow-dropped accepts a dropped benchmark knowingly"


@pytest.mark.parametrize("field", ["ratio", "head_median_ms", "p"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_number_is_refused_on_write(field, value, tmp_path):
    doc = verdict_document()
    setattr(doc.benchmarks[0], field, value)
    path = tmp_path / "verdict.json"
    with pytest.raises(ValueError, match="not JSON compliant"):
        doc.write(path)
    assert not path.exists(), "a refused verdict must leave no file behind"


def test_the_source_digest_names_the_code_not_the_commit(tmp_path):
    """Two trees with the same attnkit files share a digest; one changed byte changes it."""
    from attnkit_perf.measure.machine import source_digest

    trees = []
    for name in ("a", "b", "c"):
        package = tmp_path / name / "attnkit"
        package.mkdir(parents=True)
        (package / "api.py").write_text("x = 1\n")
        (package / "configs.json").write_text("{}")
        trees.append(package)
    (trees[2] / "api.py").write_text("x = 2\n")
    digests = [source_digest(t) for t in trees]
    assert digests[0] == digests[1] != digests[2], digests
