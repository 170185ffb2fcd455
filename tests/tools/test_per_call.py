"""attnkit_tools.pages.per_call: targets decided on saved paired comparisons, the page rendered from a
saved report with its provenance, and the command line (CPU only: nothing is timed)."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit_tools.pages import per_call, per_call_report

PROVENANCE = {"device_name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda": "13.0",
              "torch": "2.11.0+cu130", "triton": "3.6.0", "commit": "abc1234"}  # fmt: skip


def _summary(median, low, high):
    return {"median": median, "low": low, "high": high}


def _pair(path, raw, extra, ratio, path_us=(20.0, 19.0, 21.0), size="B1-H8-N128-D64", pass_name="fwd"):
    return {
        "size": size, "pass": pass_name, "path": path, "raw": raw, "calls": 2000,
        "path_us": _summary(*path_us), "raw_us": _summary(30.0, 29.0, 31.0),
        "extra_us": _summary(*extra), "ratio": _summary(*ratio),
    }  # fmt: skip


PAIRED = [
    _pair("raw-sdpa", "raw-sdpa", (0.1, -0.1, 0.2), (1.0, 0.99, 1.01)),
    _pair("sdpa-flash", "raw-flash", (2.0, 1.8, 2.2), (1.04, 1.03, 1.05)),  # within +10 us
    _pair("sdpa-cudnn", "raw-cudnn", (12.0, 11.0, 13.0), (1.3, 1.2, 1.4)),  # all of it above
    _pair("sdpa-math", "raw-math", (9.0, 5.0, 14.0), (1.01, 1.0, 1.02)),  # straddles the limit
    _pair("triton", "raw-sdpa", (-10.0, -11.0, -9.0), (0.5, 0.45, 0.55), path_us=(45.0, 42.0, 48.0)),
]
ROWS = [
    {
        "size": "B1-H8-N128-D64",
        "pass": "fwd",
        "path": "triton",
        "host_us": 12.3,
        "wall_us": 20.5,
        "gpu_us": 8.25,
    },
    {"size": "B1-H8-N128-D64", "pass": "fwd", "path": "sdpa-cudnn", "error": "no kernel for this input"},
]
COMMAND = "python -m attnkit_tools.pages.per_call --out p.json"
REPORT = {"provenance": PROVENANCE, "python": "3.12.3", "direct_launches": True, "fast_calls": "on",
          "rows": ROWS, "paired": PAIRED, "command": COMMAND}  # fmt: skip


def test_each_target_is_decided_on_its_whole_interval():
    lines = per_call_report.targets(PAIRED)
    assert lines[0].startswith("A/A raw-sdpa - raw-sdpa host +0.1 us"), lines[0]
    assert lines[1].startswith("PASS sdpa-flash - raw-flash host +2.0 us"), lines[1]
    assert lines[2].startswith("FAIL sdpa-cudnn - raw-cudnn host +12.0 us"), lines[2]
    assert lines[3].startswith("UNCLEAR sdpa-math - raw-math host +9.0 us"), lines[3]
    # triton: the ratio (x0.50 <= x2) passes, the small-shape forward's 45 us (42-48) fails 40 us.
    assert lines[4].startswith("PASS triton / raw-sdpa host x0.50"), lines[4]
    assert lines[5].startswith("FAIL triton host 45.0 us (95% [42.0, 48.0]) <= 40 us"), lines[5]
    assert len(lines) == 6, lines


def test_the_absolute_triton_limit_holds_only_for_the_small_forward():
    large = _pair("triton", "raw-sdpa", (-10.0, -11.0, -9.0), (0.5, 0.45, 0.55), size="B16-H16-N1024-D128")
    backward = _pair("triton", "raw-sdpa", (-10.0, -11.0, -9.0), (0.5, 0.45, 0.55), pass_name="fwd+bwd")
    lines = per_call_report.targets([large, backward])
    assert len(lines) == 2 and all("triton / raw-sdpa" in line for line in lines), lines


def test_the_page_carries_the_command_and_the_provenance():
    page = per_call_report.markdown(REPORT, REPORT["command"])
    assert "Produced by `python -m attnkit_tools.pages.per_call --out p.json`" in page
    for key, value in PROVENANCE.items():
        assert f"| {key} | {value} |" in page, f"provenance {key} missing from the page"
    assert "| python | 3.12.3 |" in page and "| compiled_call_memo | on |" in page
    assert "| B1-H8-N128-D64 | fwd | A/A control | 20.0 | raw-sdpa | 30.0 | +0.1 [-0.1, +0.2] |" in page
    assert "| B1-H8-N128-D64 | fwd | triton | 12.3 | 20.5 | 8.2 |" in page
    assert "| B1-H8-N128-D64 | fwd | sdpa-cudnn | error: no kernel for this input |  |  |" in page
    assert "- FAIL sdpa-cudnn - raw-cudnn" in page


def test_a_saved_report_renders_without_measuring(tmp_path, monkeypatch):
    def no_measuring(*args, **kwargs):
        raise AssertionError("--from-json measured")

    monkeypatch.setattr(per_call, "run", no_measuring)
    saved, page = tmp_path / "p.json", tmp_path / "PER_CALL.md"
    saved.write_text(json.dumps(REPORT))
    assert per_call.main(["--from-json", str(saved), "--md", str(page)]) == 0
    assert page.read_text() == per_call_report.markdown(REPORT, REPORT["command"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--out is required when measuring"),
        (["--from-json", "p.json"], "--from-json renders a saved report: give --md"),
        (["--out", "p.json", "--sizes", "B1-H1-N8-D16,B2-H3"], "unknown --sizes ['B2-H3']"),
    ],
)
def test_bad_arguments_stop_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        per_call.parse_args(argv)
    assert stop.value.code == 2, f"exit status {stop.value.code}, expected argparse's 2"
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine with no GPU")
def test_measuring_on_a_machine_with_no_gpu_is_refused_with_the_reason(tmp_path):
    with pytest.raises(SystemExit, match="no CUDA GPU is visible here"):
        per_call.main(["--out", str(tmp_path / "p.json")])
    assert not (tmp_path / "p.json").exists()


def test_the_fast_path_status_says_no_triton_only_when_triton_is_missing(monkeypatch):
    if per_call.importlib.util.find_spec("triton") is not None:
        direct, memo = per_call.fast_path_status()
        assert isinstance(direct, bool) and memo, (direct, memo)
    monkeypatch.setattr(per_call.importlib.util, "find_spec", lambda name: None)
    assert per_call.fast_path_status() == (None, "no triton")
