"""The perf report (attnkit_perf.report) from a verdict built with the model and written by it,
and from a run alone; its command's errors name the file and exit 2 (CPU only, no timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from perf_synthetic import H100_KEY, bench_entry, noisy_samples, paired_blocks, run_json

import attnkit_perf.report
from attnkit_perf.decide import gate
from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument
from attnkit_perf.history import history_link
from attnkit_perf.measure.cases import BenchCase
from attnkit_perf.report import data, markdown, plots
from attnkit_perf.report.terminal import summary_line
from attnkit_perf.run.session import describe

SRC = Path(__file__).resolve().parents[2] / "src"
T = gate.Thresholds()
ALPHA = 1e-4
BACKENDS = ("triton", "sdpa-flash", "naive")
SEQ_LENS = (128, 256, 512)
SLOWER = BenchCase("triton", "fwd", 1, 2, 2, 256, 32, True, "fp32")
GREEDIER = BenchCase("sdpa-flash", "fwd", 1, 2, 2, 512, 32, True, "fp32")
UNCLEAR = BenchCase("naive", "fwd", 1, 2, 2, 128, 32, True, "fp32")
FASTER = BenchCase("naive", "fwd", 1, 2, 2, 512, 32, True, "fp32")
NEW = BenchCase("triton", "bwd", 1, 2, 2, 512, 32, True, "fp32")
MISSING = BenchCase("tiled", "fwd", 1, 2, 2, 128, 32, True, "fp32")
MIB = gate.MIB


def _ms(case: BenchCase) -> float:
    """A plausible time: quadratic in N, naive 5x slower, Triton a little faster than SDPA."""
    return 0.05 * {"naive": 5.0, "triton": 0.8}.get(case.backend, 1.0) * (case.seq_len / 128) ** 2


def _peak(case: BenchCase) -> int:
    return case.batch * case.q_heads * case.seq_len**2 * 4 if case.backend == "naive" else 2 * case.min_bytes


def _row(
    case: BenchCase, ratio: float = 1.0, block_sd: float = 0.0075, head_peak: int | None = None
) -> BenchmarkVerdict:
    base, head = paired_blocks(
        np.random.default_rng(case.seq_len), 16, ratio, block_sd, median_s=_ms(case) / 1e3
    )
    base_peak = _peak(case)
    head_peak = base_peak if head_peak is None else head_peak
    decision = gate.decide_paired(base, head, T, ALPHA, T.slower, base_peak, head_peak)
    head_ms = float(np.median(head)) * 1e3
    return BenchmarkVerdict.from_decision(
        describe(case),
        decision,
        base_median_ms=float(np.median(base)) * 1e3,
        head_median_ms=head_ms,
        base_peak_bytes=base_peak,
        head_peak_bytes=head_peak,
        tflops=case.flops / head_ms / 1e9,
        host_bound=case.backend == "naive",
    )


def _provenance(commit: str, torch: str = "2.11.0") -> dict:
    return {
        "gpu_key": H100_KEY,
        "device_name": "NVIDIA H100 80GB HBM3",
        "capability": "9.0",
        "sm_count": 132,
        "driver": "580.159.04",
        "cuda": "13.0",
        "torch": torch,
        "triton": "3.6.0",
        "commit": commit,
    }


def verdict_document(regress: bool = True, head_torch: str = "2.11.0") -> VerdictDocument:
    """Paired: one slower, one more-memory, one inconclusive, one faster, one new, one missing
    (or, with ``regress=False``, all same); the rest same."""
    special = {
        SLOWER: {"ratio": 1.10},
        GREEDIER: {"head_peak": _peak(GREEDIER) + 64 * MIB},
        UNCLEAR: {"ratio": 1.02, "block_sd": 0.03},
        FASTER: {"ratio": 1 / 1.2},
    }
    rows = []
    for backend in BACKENDS:
        for n in SEQ_LENS:
            case = BenchCase(backend, "fwd", 1, 2, 2, n, 32, True, "fp32")
            rows.append(_row(case, **(special.get(case, {}) if regress else {})))
    if regress:
        rows.append(
            BenchmarkVerdict.from_decision(
                describe(NEW),
                gate.Decision("new", reason="the base cannot run it: no bwd"),
                head_median_ms=_ms(NEW),
                tflops=1.0,
            )
        )
        rows.append(
            BenchmarkVerdict.from_decision(
                describe(MISSING),
                gate.Decision("missing", reason="in the baseline, not run"),
                base_median_ms=1.0,
            )
        )
    differences = {} if head_torch == "2.11.0" else {"torch": ["2.11.0", head_torch]}
    return VerdictDocument(
        mode="paired",
        base={"label": "base main (aaaaaaa)", "provenance": _provenance("a" * 40)},
        head={"label": "this checkout", "provenance": _provenance("b" * 40, head_torch)},
        thresholds={
            "slower": 0.02,
            "run_alpha": 0.01,
            "per_benchmark_alpha": ALPHA,
            "memory_rel": 0.01,
            "memory_abs_bytes": MIB,
            "noise_k": 4.0,
            "fail_on_inconclusive": False,
        },
        benchmarks=rows,
        version_differences=differences,
        notes=["no A/A noise file: every benchmark held to the practical threshold"],
    )


def _write(tmp_path: Path, doc: VerdictDocument | None = None) -> Path:
    return (doc or verdict_document()).write(tmp_path / "verdict.json")


def _report(tmp_path: Path, doc: VerdictDocument | None = None) -> str:
    written = markdown.write_report(str(_write(tmp_path, doc)), None, tmp_path / "out")
    assert written[0].name == "report.md", f"write_report returned {written}"
    return written[0].read_text()


def _table_row(text: str, name: str) -> str:
    rows = [line for line in text.splitlines() if line.startswith(f"| `{name}`")]
    assert rows, f"no table row for {name} in the report:\n{text}"
    return rows[0]


def test_the_verdict_as_written_has_the_intended_outcomes():
    outcomes = {r.name: r.outcome for r in verdict_document().benchmarks}
    expected = {
        SLOWER.name: "slower",
        GREEDIER.name: "more-memory",
        UNCLEAR.name: "inconclusive",
        FASTER.name: "faster",
        NEW.name: "new",
        MISSING.name: "missing",
    }
    assert {n: outcomes[n] for n in expected} == expected, outcomes
    assert list(outcomes.values()).count("same") == 5, outcomes


def test_markdown_names_each_regression_with_its_numbers(tmp_path):
    doc = verdict_document()
    text = _report(tmp_path, doc)
    assert "**Verdict: ❌ FAIL** — 11 benchmarks:" in text, text[:2000]
    tally = "1 🔴 slower · 1 🟠 more memory · 1 🟡 inconclusive · 1 🟢 faster · 1 🆕 new · 1 ⚪ missing"
    assert f"{tally} · 5 same." in text, f"tally differs:\n{text[:1500]}"
    slower = next(r for r in doc.benchmarks if r.name == SLOWER.name)
    row = _table_row(text.split("### Needs attention")[1], SLOWER.name)
    assert "🔴 slower" in row and f"{slower.ratio:.3f}×" in row, row
    assert f"x{slower.ratio:.4f}" in row and "16 pairs" in row, f"the evidence must carry the numbers: {row}"
    greedier = _table_row(text.split("### Needs attention")[1], GREEDIER.name)
    growth = 64 * MIB / _peak(GREEDIER)
    assert "🟠 more memory" in greedier and f"(+{growth:.1%})" in greedier, greedier
    for case, reason in ((NEW, "the base cannot run it"), (MISSING, "in the baseline, not run")):
        row = _table_row(text, case.name)
        assert reason in row, f"{case.name}: the reason {reason!r} is missing from {row}"
    assert "(host-bound)" in _table_row(text, UNCLEAR.name), "host-bound benchmarks are marked"
    attention = text.split("### Needs attention")[1].split("###")[0]
    assert "| `fwd[sdpa-flash-fp32-B1-H2-N128-D32-causal]`" not in attention, "same is not listed there"


def test_inconclusive_is_explained(tmp_path):
    text = _report(tmp_path)
    assert "Inconclusive: measured to the budget and still unclear" in text, text
    assert "--attnkit-budget-s" in text, "the report must say how to measure more"
    row = _table_row(text, UNCLEAR.name)
    assert "🟡 inconclusive" in row, f"the inconclusive row is not labelled: {row}"


def test_provenance_table_and_thresholds(tmp_path):
    text = _report(tmp_path)
    for line in (
        "|  | base | head |",
        "| GPU | NVIDIA H100 80GB HBM3 | NVIDIA H100 80GB HBM3 |",
        "| compute capability | 9.0 | 9.0 |",
        "| torch | 2.11.0 | 2.11.0 |",
        "| commit | aaaaaaaaaa | bbbbbbbbbb |",
        "Mode: **paired** — base main (aaaaaaa) against this checkout.",
        "Slower means at least 2.0% slower",
        "- no A/A noise file: every benchmark held to the practical threshold",
    ):
        assert line in text, f"missing {line!r} in:\n{text[:3000]}"
    assert "with a different" not in text, "no version difference, no warning"


def test_a_changed_stack_is_flagged_and_an_unchanged_run_passes(tmp_path):
    text = _report(tmp_path, verdict_document(regress=False, head_torch="2.12.0"))
    assert "**Verdict: ✅ PASS** — 9 benchmarks: 9 same." in text, text[:2000]
    assert "| torch | 2.11.0 | 2.12.0 |" in text and "with a different torch" in text, text[:3000]
    assert "### Needs attention" not in text and "🔴" not in text, f"nothing needs attention:\n{text[:2000]}"


def test_an_incomplete_verdict_is_never_a_pass_and_says_so(tmp_path):
    doc = verdict_document(regress=False)
    doc.complete = False
    assert not doc.passed, "a run that did not finish has not passed, even if all it decided is same"
    path = doc.write(tmp_path / "verdict.json")
    data = json.loads(path.read_text())
    assert data["complete"] is False and data["passed"] is False, data
    again = VerdictDocument.read(path)
    assert again.complete is False and not again.passed
    assert summary_line(again).startswith("attnkit perf gate (paired): INCOMPLETE, the run did not finish")
    text = _report(tmp_path, again)
    assert "**Verdict: ⚠️ INCOMPLETE (the run stopped before its end; not a pass)** — 9 benchmarks" in text, (
        text[:500]
    )


def test_a_verdict_without_the_complete_field_reads_as_complete(tmp_path):
    data = verdict_document(regress=False).to_dict()
    del data["complete"]
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(data))
    assert VerdictDocument.read(path).complete is True


def test_one_table_per_group(tmp_path):
    text = _report(tmp_path)
    header = "| benchmark | base | head | ratio | outcome | TFLOP/s | peak memory |"
    groups = {BenchCase("naive", "fwd", 1, 2, 2, n, 32, True, "fp32").group for n in SEQ_LENS}
    groups |= {NEW.group}
    for group in groups:
        assert f"#### {group}" in text, f"no section for group {group}"
    assert text.count(header) == len(groups), f"{text.count(header)} tables for {len(groups)} groups"


def test_plots_are_written_and_linked(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    written = markdown.write_report(str(_write(tmp_path)), None, out)
    names = {p.name for p in written}
    assert names == {"report.md", "summary.md", "tflops.png", "memory.png", "speedup.png"}, names
    text = (out / "report.md").read_text()
    for name in ("tflops.png", "memory.png", "speedup.png"):
        png = (out / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5_000, f"{name}: {len(png)} bytes"
        assert f"]({name})" in text, f"report.md does not link {name}"
    assert ".png)" not in (out / "summary.md").read_text(), "the job summary cannot show artifact images"


def test_windowed_benchmarks_are_reported_and_plotted(tmp_path):
    """A window is a (left, right) pair that comes back from JSON as a list: the report keys rows
    and plot slices by shape, so it must read it back as a hashable tuple (an H100 gate run with
    windowed benchmarks ended in a TypeError here)."""
    pytest.importorskip("matplotlib")
    doc = verdict_document(regress=False)
    windowed = [BenchCase("triton", "fwd", 1, 2, 2, n, 32, True, "fp32", window=(64, 0)) for n in SEQ_LENS]
    doc.benchmarks.extend(_row(case) for case in windowed)
    out = tmp_path / "out"
    written = markdown.write_report(str(_write(tmp_path, doc)), None, out)
    assert {p.name for p in written} >= {"report.md", "tflops.png"}, written
    text = (out / "report.md").read_text()
    for case in windowed:
        assert "same" in _table_row(text, case.name), _table_row(text, case.name)
    measured = data.measurements_from_verdict(VerdictDocument.read(tmp_path / "verdict.json"))
    windows = {m.shape["window"] for m in measured if m.shape.get("window")}
    assert windows == {(64, 0)}, windows
    assert plots.slice_label(plots.slice_of(next(m for m in measured if m.shape.get("window")))).endswith(
        "window (64, 0)"
    )


def test_without_matplotlib_the_plots_are_said_to_be_skipped(tmp_path, monkeypatch):
    # None in sys.modules makes `import matplotlib` fail; the plots module must be imported anew.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "attnkit_perf.report.plots", raising=False)
    monkeypatch.delattr(attnkit_perf.report, "plots", raising=False)
    out = tmp_path / "out"
    written = markdown.write_report(str(_write(tmp_path)), None, out)
    text = (out / "report.md").read_text()
    assert "_Plots skipped: matplotlib is not installed (matplotlib)" in text, text[:3000]
    assert not list(out.glob("*.png")) and all(p.suffix == ".md" for p in written), written
    assert "🔴 slower" in _table_row(text, SLOWER.name), "the verdict is reported without plots"


def _run_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    entries = [bench_entry(b, noisy_samples(rng, 1e-3, rounds=20)) for b in ("sdpa", "tiled", "naive")]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_json(entries)))
    return path


def test_a_run_alone_is_reported_without_a_verdict(tmp_path, capsys):
    out = tmp_path / "out"
    code = markdown.main(["--benchmarks", str(_run_file(tmp_path)), "--out-dir", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, f"exit {code}: {printed}"
    assert f"wrote {out / 'report.md'}" in printed and f"wrote {out / 'summary.md'}" in printed, printed
    text = (out / "report.md").read_text()
    assert "## attnkit perf run on NVIDIA H100 80GB HBM3" in text and "Verdict" not in text, text[:1500]
    for line in ("_No verdict: this run was not compared.", "| benchmark | median | TFLOP/s | peak memory |"):
        assert line in text, f"missing {line!r} in:\n{text[:2000]}"
    assert "| `fwd[tiled-fp32-B1-H2-N128-D32-causal]` |" in text, text


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    (tmp_path / "broken.json").write_text("{ not json")
    (tmp_path / "foo.json").write_text(json.dumps({"foo": 1}))
    absent, broken, foo = (str(tmp_path / n) for n in ("absent.json", "broken.json", "foo.json"))
    return {
        "missing verdict": (["--verdict", absent], f"verdict file {absent} does not exist"),
        "missing benchmarks": (["--benchmarks", absent], f"benchmark JSON file {absent} does not exist"),
        "invalid JSON": (["--verdict", broken], f"verdict file {broken} is not readable JSON"),
        "foo as verdict": (["--verdict", foo], f"verdict {foo} is not a valid verdict file: at (top level)"),
        "foo as benchmarks": (["--benchmarks", foo], f"benchmark JSON {foo} is not a valid baseline file"),
        "no inputs": ([], "nothing to report: give --verdict, --benchmarks or both"),
    }


@pytest.mark.parametrize(
    "kind",
    [
        "missing verdict",
        "missing benchmarks",
        "invalid JSON",
        "foo as verdict",
        "foo as benchmarks",
        "no inputs",
    ],
)
def test_bad_input_exits_2_naming_the_file(kind, tmp_path, capsys):
    args, message = _bad_inputs(tmp_path)[kind]
    out = tmp_path / "out"
    assert markdown.main([*args, "--out-dir", str(out)]) == 2, kind
    err = capsys.readouterr().err
    assert f"error: {message}" in err, f"{kind}: stderr was {err!r}"
    assert not (out / "report.md").exists(), f"{kind}: no report for a bad input"


def test_a_benchmark_without_samples_is_not_a_traceback(tmp_path, capsys):
    run = json.loads(_run_file(tmp_path).read_text())
    run["benchmarks"][0]["stats"]["data"] = []
    path = tmp_path / "empty.json"
    path.write_text(json.dumps(run))
    out = tmp_path / "out"
    code = markdown.main(["--benchmarks", str(path), "--out-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and str(path) in err, f"exit {code}, stderr {err!r}"


def test_the_module_command(tmp_path):
    """``python -m attnkit_perf.report`` itself: exit 2 naming the file; on success, where it wrote."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    foo = tmp_path / "foo.json"
    foo.write_text(json.dumps({"foo": 1}))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnkit_perf.report", "--verdict", str(foo), "--out-dir", str(out)]
    bad = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert bad.returncode == 2 and f"verdict {foo} is not a valid verdict file" in bad.stderr, bad.stderr
    command[4] = str(_write(tmp_path))
    good = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert good.returncode == 0, good.stderr
    for name in ("report.md", "summary.md"):
        assert f"wrote {out / name}" in good.stdout, f"stdout does not say it wrote {name}: {good.stdout!r}"


def test_a_cpu_run_names_the_device_it_ran_on_not_the_cuda_torch_was_built_with():
    """A CPU verdict once showed "CUDA 13.0" and "cuDNN 92400": the versions of a CUDA build of
    torch, not of the device that ran the benchmarks."""
    from attnkit_perf.measure.machine import provenance

    info = provenance("cpu")
    assert (info["cuda"], info["cudnn"], info["device_name"], info["driver"]) == (None, None, None, None), (
        info
    )
    rows = markdown.provenance(data.RunInfo({"attnkit": info}, {}, None))
    assert rows["CUDA"] == rows["cuDNN"] == "—", rows
    assert rows["GPU"] == info["gpu_key"] and info["gpu_key"].startswith("cpu"), rows


def test_the_report_links_the_bases_point_in_the_performance_history(tmp_path):
    doc = verdict_document()
    link = history_link(doc, "https://example.org/perf")
    assert link and link.startswith("https://example.org/perf/"), link
    written = markdown.write_report(
        str(_write(tmp_path, doc)), None, tmp_path / "out", "https://example.org/perf"
    )
    for path in written[:2]:  # report.md and the job summary
        assert f"The base in the performance history: {link}" in path.read_text(), path
    assert "performance history" not in _report(tmp_path / "plain"), "no site given, no link"
