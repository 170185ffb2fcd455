"""attnkit_tools.gate.detection: a change's true effect joined with the gate's verdict on it (CPU only)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from perf_synthetic import paired_blocks

from attnkit_perf.decide import gate
from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument
from attnkit_perf.measure.cases import BenchCase
from attnkit_perf.run.session import describe
from attnkit_tools.gate import detection

T = gate.Thresholds()
#: sequence length of a synthetic benchmark -> the true effect of the change on it
EFFECTS = dict(zip((64, 128, 256, 512, 1024), (1.10, 1.04, 1.025, 1.015, 1.0), strict=True))


def _case(n: int) -> BenchCase:
    return BenchCase("triton", "fwd", 1, 2, 2, n, 32, True, "fp32")


def _verdict(tmp_path) -> tuple[str, str]:
    rows = []
    for n, ratio in EFFECTS.items():
        base, head = paired_blocks(np.random.default_rng(n), 16, ratio, block_sd=0.002)
        decision = gate.decide_paired(base, head, T, 1e-4, T.slower)
        rows.append(BenchmarkVerdict.from_decision(describe(_case(n)), decision, head_median_ms=1.0))
    thresholds = {
        "slower": T.slower,
        "run_alpha": T.run_alpha,
        "memory_rel": T.memory_rel,
        "memory_abs_bytes": T.memory_abs_bytes,
    }
    doc = VerdictDocument("paired", {"label": "base"}, {"label": "head"}, thresholds, rows)
    verdict = doc.write(tmp_path / "verdict.json")
    effects = tmp_path / "ab.json"
    effect_rows = [{"name": _case(n).name, "ratio": r, "ratios": [r, r, r]} for n, r in EFFECTS.items()]
    effects.write_text(
        json.dumps({"rows": [*effect_rows, {"name": "fwd[other]", "ratio": 1.2, "ratios": [1.2]}]})
    )
    return str(effects), str(verdict)


def test_the_table_joins_both_files_largest_effect_first(tmp_path, capsys):
    effects, verdict = _verdict(tmp_path)
    assert detection.main(["--effects", effects, "--verdict", verdict, "--out", str(tmp_path / "t.md")]) == 0
    text = (tmp_path / "t.md").read_text()
    names = [
        line.split(" | ")[0].removeprefix("| ") for line in text.splitlines() if line.startswith("| fwd[")
    ]
    assert names == [_case(n).name for n in EFFECTS], names  # fwd[other] is in one file only
    assert f"| {_case(64).name} | x1.1000 | slower |" in text, text
    assert f"wrote {tmp_path / 't.md'}" in capsys.readouterr().out


def test_bands_count_what_the_gate_failed(tmp_path):
    effects, verdict = _verdict(tmp_path)
    rows = detection.join(detection.read_effects(effects), VerdictDocument.read(verdict))
    # Quiet synthetic blocks (0.2%): the gate fails exactly what is above its 2% threshold.
    assert detection.bands(rows) == [
        ("< x1.01", 0, 1),
        ("x1.01 - x1.02", 0, 1),
        ("x1.02 - x1.03", 1, 1),
        ("x1.03 - x1.05", 1, 1),
        (">= x1.05", 1, 1),
    ]


@pytest.mark.parametrize(
    ("which", "content", "message"),
    [
        ("effects", None, "true-effect file"),
        ("effects", '{"rows": [{"name": "x", "ratio": -1, "ratios": [1]}]}', "at rows/0/ratio"),
        ("verdict", "not json", "is not readable JSON"),
    ],
)
def test_bad_inputs_exit_2_naming_the_file(tmp_path, capsys, which, content, message):
    effects, verdict = _verdict(tmp_path)
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    args = {"effects": effects, "verdict": verdict, which: str(bad)}
    assert detection.main(["--effects", args["effects"], "--verdict", args["verdict"]]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and message in err, err


def test_no_benchmark_in_common_is_an_error(tmp_path, capsys):
    _, verdict = _verdict(tmp_path)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": [{"name": "fwd[other]", "ratio": 1.2, "ratios": [1.2]}]}))
    assert detection.main(["--effects", str(other), "--verdict", verdict]) == 2
    assert "name no benchmark in common" in capsys.readouterr().err
