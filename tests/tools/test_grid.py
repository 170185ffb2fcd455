"""attnkit_tools.grid: the performance page rendered from saved rows with no GPU, the floor
marked, and a run with no GPU refused (CPU only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnkit_tools import grid

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("saved", ["grid_h100.json", "grid_h200.json"])
def test_the_page_renders_from_saved_rows_with_its_provenance(saved, tmp_path):
    rows = json.loads((DATA / saved).read_text())
    out = tmp_path / "PERFORMANCE.md"
    assert grid.main(["--render", str(DATA / saved), "--out", str(out)]) == 0
    page = out.read_text()
    for key in ("device_name", "driver", "cuda", "torch", "triton", "commit"):
        assert f"| {key} | {rows['provenance'][key]} |" in page, f"provenance {key} missing"
    assert f"Produced by `python -m attnkit_tools.grid --out {out}`" in page
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
