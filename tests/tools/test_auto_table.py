"""The auto-table tool's pure parts: the table it writes is the one attnkit.auto reads, its
renderings say what auto picks and where it strays from the fastest path, and it refuses to
run without a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.auto import AutoTable
from attnkit.inputs import check_inputs
from attnkit_tools.tune import auto_table

INFO = {"gpu_key": "test-gpu", "device_name": "Test GPU", "driver": "1", "commit": "abc1234"}
MEASURED = [
    ((64, True, 1024, "fwd"), {"triton": 1.0, "sdpa-cudnn": 0.9, "sdpa-efficient": None}),
    ((64, True, 1024, "fwd+bwd"), {"triton": 2.0, "sdpa-cudnn": 2.5, "sdpa-efficient": None}),
]


def test_the_written_table_is_read_back_by_auto_with_each_cells_fastest_first():
    data = auto_table.build_table(MEASURED, ["triton", "sdpa-cudnn", "sdpa-efficient"], [1024], INFO)
    assert [c["fastest"] for c in data["cells"]] == ["sdpa-cudnn", "triton"], data["cells"]
    assert data["provenance"] == INFO and data["gpu_key"] == "test-gpu"
    table = AutoTable(data, "written")
    x = torch.empty(4, 32, 1024, 64, dtype=torch.bfloat16, device="meta")
    problem = check_inputs(x, x, x, True, None, None)
    assert table.order(problem, training=False) == ("sdpa-cudnn", "triton")
    assert table.order(problem, training=True) == ("triton", "sdpa-cudnn")


def test_the_table_markdown_names_the_pick_and_every_paths_ratio_to_it():
    data = auto_table.build_table(MEASURED, ["triton", "sdpa-cudnn", "sdpa-efficient"], [1024], INFO)
    text = auto_table.table_markdown(data)
    assert "| D=64 fwd causal N=1024 | sdpa-cudnn | 1.11 | 1.00 | n/a |" in text, text
    assert "commit abc1234" in text and "Test GPU" in text, "provenance must be in the rendering"


def test_verify_reports_the_picks_time_and_autos_over_the_fastest_and_counts_cells_beyond_tolerance():
    measured = [
        ((64, False, 2048, "fwd"), {"triton": 1.0, "sdpa-cudnn": 1.2, "auto": 1.01}),
        ((64, True, 2048, "fwd"), {"triton": 1.0, "sdpa-cudnn": 0.9, "auto": 1.0}),
    ]
    rows = auto_table.verify_rows(measured, ["triton", "sdpa-cudnn"], ["triton", "triton"])
    assert [r["fastest"] for r in rows] == ["triton", "sdpa-cudnn"]
    assert rows[0]["pick_ratio"] == pytest.approx(1.0) and rows[1]["pick_ratio"] == pytest.approx(1.0 / 0.9)
    assert rows[0]["auto_ratio"] == pytest.approx(1.01)
    text = auto_table.verify_markdown(rows, INFO)
    assert "beyond x1.03: 1" in text, text
    assert "| D=64 fwd causal N=2048 | triton | sdpa-cudnn | 1.111 | 1.111 |" in text, text


def test_render_rewrites_the_markdown_from_the_json_without_a_gpu(tmp_path):
    data = auto_table.build_table(MEASURED, ["triton", "sdpa-cudnn"], [1024], INFO)
    (tmp_path / "t.json").write_text(json.dumps(data))
    assert auto_table.main(["--render", str(tmp_path / "t.json"), "--md", str(tmp_path / "t.md")]) == 0
    assert (tmp_path / "t.md").read_text() == auto_table.table_markdown(data)


def test_the_pick_of_a_cell_comes_from_the_installed_table(monkeypatch, tmp_path):
    data = auto_table.build_table(MEASURED, ["triton", "sdpa-cudnn"], [1024], INFO)
    (tmp_path / "t.json").write_text(json.dumps(data))
    monkeypatch.setenv("ATTNKIT_AUTO_TABLE", str(tmp_path / "t.json"))
    assert auto_table.table_pick((64, True, 1024, "fwd")) == "sdpa-cudnn"
    assert auto_table.table_pick((64, True, 1024, "fwd+bwd")) == "triton"


def test_cells_cover_both_passes_masks_head_dims_and_lengths():
    grid = auto_table.cells((64, 128), (1024, 2048))
    assert len(grid) == 2 * 2 * 2 * 2 and len(set(grid)) == len(grid)
    assert {c[3] for c in grid} == {"fwd", "fwd+bwd"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_refuses_with_a_reason(tmp_path):
    with pytest.raises(SystemExit, match="none is visible here"):
        auto_table.main(["--out", str(tmp_path / "t.json")])
    assert not (tmp_path / "t.json").exists()
