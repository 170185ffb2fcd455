"""attnkit_tools.pages.grid: the performance page rendered from saved rows with no GPU, the floor
marked, and a run with no GPU refused (CPU only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnkit_tools.pages import grid

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("saved", ["grid_h100.json", "grid_h200.json"])
def test_the_page_renders_from_saved_rows_with_its_provenance(saved, tmp_path):
    rows = json.loads((DATA / saved).read_text())
    out = tmp_path / "PERFORMANCE.md"
    assert grid.main(["--render", str(DATA / saved), "--out", str(out)]) == 0
    page = out.read_text()
    for key in ("device_name", "driver", "cuda", "torch", "triton", "commit"):
        assert f"| {key} | {rows['provenance'][key]} |" in page, f"provenance {key} missing"
    # The page names no scratch path: the report's own file name, outside the working directory.
    assert "Produced by `python -m attnkit_tools.pages.grid --out PERFORMANCE.md`" in page
    first = rows["rows"][0]  # D=64 fwd full N=1024: triton TFLOP/s and both ratios
    cell = f"{first['triton']:.0f} ({first['triton'] / first['sdpa-flash']:.2f}x, "
    assert f"| 64 | fwd | no | {cell}" in page, f"{cell!r} not in the D=64 forward row"
    assert "issue" not in page.lower()


def test_a_cell_below_the_floor_is_marked_and_counted():
    rows = [
        {"D": 64, "pass": "fwd", "causal": False, "N": 2048, "triton": 110.0, "sdpa-flash": 100.0,
         "sdpa-cudnn": 120.0},
        {"D": 64, "pass": "bwd", "causal": False, "N": 2048, "triton": 100.0, "sdpa-flash": 100.0,
         "sdpa-cudnn": 120.0},
        {"D": 64, "pass": "fwd", "causal": True, "N": 1024, "triton": 50.0, "sdpa-flash": 100.0,
         "sdpa-cudnn": 120.0},
    ]  # fmt: skip
    page = grid.report(rows, {"commit": "abc1234"}, None)
    assert "| 64 | fwd | no | n/a | 110 (1.10x, 0.92x) **(below floor)** |" in page  # 1.10 < 1.2
    assert "| 64 | bwd | no | n/a | 100 (1.00x, 0.83x) |" in page  # 1.00 meets 1.0
    assert "Cells below the floor: 1 of 2." in page  # N=1024 is below FLOOR_FROM: not judged


def test_a_file_that_is_not_a_saved_grid_is_refused(tmp_path, capsys):
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit) as stop:
        grid.main(["--render", str(bad), "--out", str(tmp_path / "P.md")])
    assert stop.value.code == 2
    assert "is not a saved grid (--json): it has no ['provenance']" in capsys.readouterr().err
    assert not (tmp_path / "P.md").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine with no GPU")
def test_measuring_on_a_machine_with_no_gpu_is_refused_with_the_reason(tmp_path):
    with pytest.raises(SystemExit, match="none is visible here"):
        grid.main(["--out", str(tmp_path / "P.md")])


def test_the_parts_of_one_grid_render_as_one_page_in_grid_order(tmp_path):
    """The grid measured by head dim on two GPUs renders as the page of one run."""
    saved = json.loads((DATA / "grid_h100.json").read_text())
    parts = []
    for d in (128, 64):  # the parts in either order
        part = tmp_path / f"d{d}.json"
        part.write_text(
            json.dumps({"provenance": saved["provenance"], "rows": [r for r in saved["rows"] if r["D"] == d]})
        )
        parts.append(str(part))
    whole, merged = tmp_path / "whole.md", tmp_path / "merged.md"
    assert grid.main(["--render", str(DATA / "grid_h100.json"), "--out", str(whole)]) == 0
    assert grid.main(["--render", *parts, "--out", str(merged)]) == 0
    assert merged.read_text().replace("merged.md", "whole.md") == whole.read_text()


def test_parts_of_two_runs_are_refused(tmp_path):
    saved = json.loads((DATA / "grid_h100.json").read_text())
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**saved, "provenance": {**saved["provenance"], "commit": "0000000"}}))
    with pytest.raises(SystemExit):
        grid.main(["--render", str(DATA / "grid_h100.json"), str(other), "--out", str(tmp_path / "x.md")])
