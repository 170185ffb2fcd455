"""A/A noise (attnkit_perf.decide.noise): built from several verdicts of unchanged code, written
by its command, read back by the gate for the same GPU model and mode only."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from perf_synthetic import H100_KEY, case_for

from attnkit_perf.commands.noise import main
from attnkit_perf.decide import gate
from attnkit_perf.decide.noise import noise_sigmas
from attnkit_perf.formats.noise import build, noise_file, read_noise
from attnkit_perf.formats.schema import FormatError, validate
from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument
from attnkit_perf.run.session import describe

#: Per benchmark, the ratio each of three A/A runs measured (None: the run has no ratio for it).
RATIOS = {
    "sdpa": (1.004, 0.998, 1.001),
    "tiled": (1.05, 0.96, 1.02),
    "naive": (1.01, None, None),  # one usable ratio: not enough for a standard deviation
}


def _doc(run: int, mode: str = "paired", key: str = H100_KEY) -> VerdictDocument:
    rows = []
    for backend, ratios in RATIOS.items():
        ratio = ratios[run]
        outcome = "same" if ratio is not None else "inconclusive"
        rows.append(
            BenchmarkVerdict.from_decision(
                describe(case_for(backend)), gate.Decision(outcome, ratio=ratio, reason="A/A")
            )
        )
    side = {"label": "A", "provenance": {"gpu_key": key, "torch": "2.11.0"}}
    return VerdictDocument(
        mode=mode,
        base=side,
        head=side,
        thresholds={"slower": 0.02, "run_alpha": 0.01, "memory_rel": 0.01, "memory_abs_bytes": gate.MIB},
        benchmarks=rows,
    )


def test_sd_of_the_log_ratios():
    noise = build([_doc(i) for i in range(3)])
    validate("noise", noise, "built noise")
    assert noise["gpu_key"] == H100_KEY and noise["mode"] == "paired" and noise["runs"] == 3, noise
    for backend in ("sdpa", "tiled"):
        entry = noise["benchmarks"][case_for(backend).name]
        expected = statistics.stdev(math.log(r) for r in RATIOS[backend])
        assert entry["log_ratio_sd"] == pytest.approx(expected, rel=1e-12), f"{backend}: {entry}"
        assert entry["ratios"] == list(RATIOS[backend]), f"{backend}: ratios {entry['ratios']}"
    assert case_for("naive").name not in noise["benchmarks"], "one ratio gives no standard deviation"


@pytest.mark.parametrize(
    "docs",
    [
        pytest.param([_doc(0)], id="one verdict"),
        pytest.param([], id="no verdict"),
        pytest.param([_doc(0), _doc(1, mode="stored")], id="mixed modes"),
        pytest.param([_doc(0), _doc(1, key="nvidia-h200")], id="mixed GPU keys"),
    ],
)
def test_build_refuses_what_is_not_one_aa_series(docs):
    with pytest.raises(FormatError, match=">= 2 verdicts of one mode and one GPU model"):
        build(docs)


def test_the_command_writes_a_valid_file_the_gate_reads(tmp_path, capsys):
    paths = [_doc(i).write(tmp_path / f"aa{i}.json") for i in range(3)]
    out = noise_file(tmp_path / "baselines", H100_KEY, "paired")
    assert main([*map(str, paths), "--out", str(out)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert f"wrote {out}: 2 benchmarks from 3 runs" in printed, printed
    validate("noise", json.loads(out.read_text()), str(out))
    sds = noise_sigmas(read_noise(out, H100_KEY, "paired"))
    assert set(sds) == {case_for("sdpa").name, case_for("tiled").name}, sds
    assert sds[case_for("tiled").name] > sds[case_for("sdpa").name], f"tiled is the noisier: {sds}"


def test_the_command_rejects_mixed_inputs_with_exit_2(tmp_path, capsys):
    paths = [_doc(0).write(tmp_path / "a.json"), _doc(1, key="nvidia-h200").write(tmp_path / "b.json")]
    out = tmp_path / "noise.json"
    code = main([*map(str, paths), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "error: A/A noise needs >= 2 verdicts" in err, f"exit {code}, stderr {err!r}"
    assert not out.exists(), "nothing is written for rejected inputs"


@pytest.mark.parametrize(("key", "mode"), [("nvidia-h200", "paired"), (H100_KEY, "stored")])
def test_reading_noise_rejects_another_gpu_or_mode(key, mode, tmp_path):
    path = tmp_path / "noise.json"
    path.write_text(json.dumps(build([_doc(0), _doc(1)])))
    with pytest.raises(
        FormatError, match=f"is for '{H100_KEY}' in paired mode; this run is '{key}' in {mode}"
    ):
        read_noise(path, key, mode)


def test_a_verdict_of_changed_code_is_refused_as_noise():
    """A change's verdict taken for A/A noise would raise every threshold by the change's own
    effect: the sides' source digests must agree when both are recorded."""
    changed = _doc(1)
    changed.base = {"label": "A", "provenance": {"gpu_key": H100_KEY, "source": "aaaa"}}
    changed.head = {"label": "B", "provenance": {"gpu_key": H100_KEY, "source": "bbbb"}}
    with pytest.raises(FormatError, match=r"verdict 2 of 3 compares different code \(base source aaaa, head"):
        build([_doc(0), changed, _doc(2)])
    same = _doc(1)
    same.base = same.head = {"label": "A", "provenance": {"gpu_key": H100_KEY, "source": "aaaa"}}
    assert build([_doc(0), same, _doc(2)])["runs"] == 3
