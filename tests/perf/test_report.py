"""The perf report, from a small synthetic verdict and benchmark run (CPU only, no timing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import attnkit.bench
from attnkit.bench import report
from attnkit.bench.cases import BenchCase

BACKENDS = ("triton", "sdpa-flash", "sdpa-cudnn", "naive")
SEQ_LENS = (1024, 2048, 4096)
SLOWER = BenchCase("triton", "fwd", 4, 16, 16, 2048, 128, True)
GREEDIER = BenchCase("sdpa-flash", "bwd", 4, 16, 16, 4096, 128, True)
NEW = BenchCase("triton", "bwd", 4, 16, 16, 8192, 128, True)
MISSING = BenchCase("tiled", "fwd", 4, 16, 16, 1024, 128, True)

#: machine_info as the perf suite stores it: pytest-benchmark's fields plus an "attnkit" block.
H100 = {
    "node": "gpu-runner-1",
    "cpu": {"arch": "X86_64", "count": 16},
    "attnkit": {
        "gpu_key": "NVIDIA_H100_80GB_HBM3",
        "device_name": "NVIDIA H100 80GB HBM3",
        "capability": "9.0",
        "sm_count": 132,
        "driver": "580.159.04",
        "cuda": "13.0",
        "cudnn": 91002,
        "torch": "2.11.0+cu130",
        "triton": "3.6.0",
    },
}


def _shape(case: BenchCase) -> dict:
    return {k: v for k, v in case.as_dict().items() if k not in ("backend", "pass_name")}


def _median_ms(case: BenchCase) -> float:
    """A plausible time: quadratic in N, naive 5x slower, Triton a little faster than SDPA."""
    speed = {"naive": 5.0, "triton": 0.8}.get(case.backend, 1.0)
    return 0.05 * speed * (case.seq_len / 1024) ** 2 * (2.5 if case.pass_name == "bwd" else 1.0)


def _peak_bytes(case: BenchCase) -> int:
    # naive materialises the N x N score matrix; the fused paths need little beyond their outputs
    if case.backend == "naive":
        return case.batch * case.q_heads * case.seq_len**2 * 4
    return int(case.min_bytes * 1.05)


def _cases(include_new: bool) -> list[BenchCase]:
    cases = [
        BenchCase(backend, pass_name, 4, 16, 16, n, 128, True)
        for backend in BACKENDS
        for pass_name in ("fwd", "bwd")
        for n in SEQ_LENS
    ]
    return [*cases, NEW] if include_new else [*cases, MISSING]


def _benchmark_entry(case: BenchCase, slowdown: float = 1.0, extra_bytes: int = 0) -> dict:
    median_s = _median_ms(case) * slowdown / 1e3
    return {
        "group": case.group,
        "name": f"test_attention[{case.name}]",
        "fullname": f"tests/perf/test_attention_perf.py::test_attention[{case.name}]",
        "stats": {"median": median_s, "min": median_s * 0.98, "max": median_s * 1.05, "rounds": 20},
        "extra_info": {
            "name": case.name,
            "backend": case.backend,
            "pass": case.pass_name,
            "shape": _shape(case),
            "tflops": case.flops / (median_s * 1e12),
            "peak_bytes": _peak_bytes(case) + extra_bytes,
            "min_bytes": case.min_bytes,
        },
    }


def _now_entry(case: BenchCase) -> dict:
    slowdown = 1.2 if case == SLOWER else 1.0
    return _benchmark_entry(case, slowdown, 64 * 2**20 if case == GREEDIER else 0)


def _run(entries: list[dict], commit: str, machine_info: dict) -> dict:
    return {
        "machine_info": machine_info,
        "commit_info": {"id": commit, "branch": "main", "dirty": False},
        "datetime": "2026-11-20T10:00:00",
        "benchmarks": entries,
    }


def _verdict_row(case: BenchCase, before: dict | None, after: dict | None) -> dict:
    """A row as the gate writes it (attnkit.bench.verdict, format attnkit-perf-verdict/1)."""
    base_ms = before and before["stats"]["median"] * 1e3
    now_ms = after and after["stats"]["median"] * 1e3
    base_peak = before and before["extra_info"]["peak_bytes"]
    now_peak = after and after["extra_info"]["peak_bytes"]
    evidence = {}
    if before is None:
        verdict = "new"
    elif after is None:
        verdict = "missing"
    else:
        ratio = now_ms / base_ms
        evidence = {
            "drift": 1.0,
            "p_slower": 0.5,
            "p_faster": 0.5,
            "ratio_ci99": [ratio - 0.02, ratio + 0.02],
        }
        evidence["confirm"] = None
        verdict = "same"
        if ratio > 1.1:
            verdict = "slower"
            evidence.update(p_slower=1e-6, confirm={"ratio": ratio, "p_slower": 2e-6}, also_more_memory=False)
        elif now_peak > base_peak:
            verdict = "more-memory"
            evidence["memory_growth_bytes"] = now_peak - base_peak
    return {
        "name": case.name,
        "fullname": f"tests/perf/test_attention_perf.py::test_attention[{case.name}]",
        "group": case.group,
        "backend": case.backend,
        "pass": case.pass_name,
        "shape": _shape(case),
        "baseline_median_ms": base_ms,
        "now_median_ms": now_ms,
        "ratio": now_ms / base_ms if before and after else None,
        "verdict": verdict,
        "evidence": evidence,
        "baseline_peak_bytes": base_peak,
        "now_peak_bytes": now_peak,
        "tflops": after and after["extra_info"]["tflops"],
    }


def write_fixture(folder: Path, regress: bool = True, now_torch: str = "2.11.0+cu130") -> tuple[Path, Path]:
    """A baseline-vs-now comparison: one slower, one more-memory, one new, one missing (or, with
    ``regress=False``, an unchanged run); returns (verdict path, benchmark JSON path)."""
    baseline = {c: _benchmark_entry(c) for c in _cases(include_new=False)}
    now = {c: (_now_entry(c) if regress else _benchmark_entry(c)) for c in _cases(include_new=True)}
    now_info = {**H100, "attnkit": {**H100["attnkit"], "torch": now_torch}}
    rows = [_verdict_row(c, baseline.get(c), now.get(c)) for c in {**baseline, **now}]
    verdict = {
        "format": "attnkit-perf-verdict/1",
        "passed": not any(row["verdict"] in ("slower", "more-memory") for row in rows),
        "drift": 1.004,
        "version_differences": {}
        if now_torch == H100["attnkit"]["torch"]
        else {"torch": ["2.11.0", now_torch]},
        "baseline": {"path": "baselines/NVIDIA_H100_80GB_HBM3/baseline.json", **_run([], "a" * 40, H100)},
        "now": _run([], "b" * 40, now_info),
        "benchmarks": rows,
    }
    verdict_path, benchmarks_path = folder / "verdict.json", folder / "benchmarks.json"
    verdict_path.write_text(json.dumps(verdict))
    benchmarks_path.write_text(json.dumps(_run(list(now.values()), "b" * 40, now_info)))
    return verdict_path, benchmarks_path


def _table_row(markdown: str, name: str) -> str:
    rows = [line for line in markdown.splitlines() if line.startswith(f"| `{name}`")]
    assert rows, f"no table row for {name} in the report:\n{markdown}"
    return rows[0]


def test_markdown_names_each_regression_with_its_numbers(tmp_path):
    verdict, benchmarks = write_fixture(tmp_path)
    markdown = report.write_report(verdict, benchmarks, tmp_path / "out").read_text()

    assert "**Verdict: ❌ FAIL**" in markdown
    assert "1 🔴 slower · 1 🟠 more memory" in markdown
    slower = _table_row(markdown, SLOWER.name)
    assert "1.200×" in slower and "🔴 slower" in slower
    assert "Mann-Whitney p=1.0e-06" in slower and "re-measured 1.200×" in slower
    greedier = _table_row(markdown, GREEDIER.name)
    assert "🟠 more memory" in greedier and "peak +64.0 MiB" in greedier and "floor" in greedier
    assert "not in the baseline" in _table_row(markdown, NEW.name)
    assert "not run now" in _table_row(markdown, MISSING.name)
    assert "Baseline: `baselines/NVIDIA_H100_80GB_HBM3/baseline.json`" in markdown
    assert "drift 1.004×" in markdown


def test_markdown_has_provenance_and_one_table_per_group(tmp_path):
    verdict, benchmarks = write_fixture(tmp_path)
    markdown = report.write_report(verdict, benchmarks, tmp_path / "out").read_text()

    assert "| GPU | NVIDIA H100 80GB HBM3 | NVIDIA H100 80GB HBM3 |" in markdown
    assert "| triton | 3.6.0 | 3.6.0 |" in markdown
    assert "| commit | aaaaaaaaaa (main) | bbbbbbbbbb (main) |" in markdown
    for pass_name in ("fwd", "bwd"):
        for n in SEQ_LENS:
            assert f"#### {BenchCase('naive', pass_name, 4, 16, 16, n, 128, True).group}" in markdown
    header = "| benchmark | baseline | now | ratio | verdict | TFLOP/s | peak memory |"
    # MISSING shares its group with the other forwards at N=1024; NEW opens one of its own
    assert markdown.count(header) == 2 * len(SEQ_LENS) + 1


def test_unchanged_run_passes_and_a_changed_stack_is_flagged(tmp_path):
    verdict, benchmarks = write_fixture(tmp_path, regress=False, now_torch="2.12.0+cu130")
    markdown = report.write_report(verdict, benchmarks, tmp_path / "out").read_text()

    assert "**Verdict: ✅ PASS**" in markdown
    assert "with a different torch" in markdown
    assert "🔴" not in markdown


def test_plots_are_written_and_linked(tmp_path):
    pytest.importorskip("matplotlib")
    verdict, benchmarks = write_fixture(tmp_path)
    out = tmp_path / "out"
    markdown = report.write_report(verdict, benchmarks, out).read_text()

    for name in ("tflops.png", "memory.png", "speedup.png"):
        png = (out / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000, f"{name}: {len(png)} bytes"
        assert f"]({name})" in markdown
    # the job summary cannot show the artifact's images, so it links none
    assert ".png)" not in (out / "summary.md").read_text()


def test_markdown_without_matplotlib_says_plots_were_skipped(tmp_path, monkeypatch):
    # None in sys.modules makes `import matplotlib` fail; report_plots must then be imported anew
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "attnkit.bench.report_plots", raising=False)
    monkeypatch.delattr(attnkit.bench, "report_plots", raising=False)
    verdict, benchmarks = write_fixture(tmp_path)
    out = tmp_path / "out"
    markdown = report.write_report(verdict, benchmarks, out).read_text()

    assert "_Plots skipped: matplotlib is not installed" in markdown
    assert not list(out.glob("*.png"))
    assert "🔴 slower" in _table_row(markdown, SLOWER.name)


def test_a_run_alone_is_reported_without_a_verdict(tmp_path):
    _, benchmarks = write_fixture(tmp_path)
    out = tmp_path / "out"
    assert report.main(["--benchmarks", str(benchmarks), "--out-dir", str(out)]) == 0
    markdown = (out / "report.md").read_text()

    assert "## attnkit perf run on NVIDIA H100 80GB HBM3" in markdown and "Verdict" not in markdown
    assert "_No verdict: this run was not compared with a baseline." in markdown
    assert "| benchmark | median | TFLOP/s | peak memory |" in markdown
    assert f"#### {SLOWER.group}" in markdown


def test_missing_or_corrupt_input_names_the_file(tmp_path):
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    with pytest.raises(SystemExit, match="no such file"):
        report.main(["--benchmarks", str(tmp_path / "absent.json"), "--out-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"corrupt\.json: not valid JSON"):
        report.main(["--benchmarks", str(corrupt), "--out-dir", str(tmp_path)])


@pytest.mark.parametrize(
    ("n_bytes", "text"),
    [(512, "512 B"), (3 * 2**20, "3.0 MiB"), (int(2.5 * 2**30), "2.5 GiB"), (None, "—")],
)
def test_bytes_read_in_binary_units(n_bytes, text):
    assert report.format_bytes(n_bytes) == text


@pytest.mark.parametrize(("ms", "text"), [(0.0852, "85.2 µs"), (1.23456, "1.235 ms"), (42.0, "42.0 ms")])
def test_times_read_in_a_fitting_unit(ms, text):
    assert report.format_ms(ms) == text
