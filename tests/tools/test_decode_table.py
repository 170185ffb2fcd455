"""attnkit_tools.pages.decode_table: the page rendered from a saved result with its provenance, and
the command line (CPU only: nothing is timed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnkit_tools.pages import decode_table

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("saved", ["decode_h100.json", "decode_h200.json"])
def test_a_saved_result_renders_with_its_provenance_and_every_row(saved, tmp_path):
    result = json.loads((DATA / saved).read_text())
    page_path = tmp_path / "DECODE.md"
    assert decode_table.main(["--from-json", str(DATA / saved), "--md", str(page_path)]) == 0
    page = page_path.read_text()
    assert "Produced by `python -m attnkit_tools.pages.decode_table --out decode.json --md " in page
    for key in ("device_name", "driver", "cuda", "torch", "triton", "commit"):
        assert f"| {key} | {result['provenance'][key]} |" in page, f"provenance {key} missing"
    for b, n, m in decode_table.TABLE_ROWS:
        row = next(r for r in result["rows"] if (r["B"], r["N"], r["M"]) == (b, n, m))
        graph = row["times_us"]["triton graph"]
        cell = (
            f"{graph:.0f} us ({row['gbs']['triton graph']:.0f} GB/s, {row['pct_copy']['triton graph']:.0f}%)"
        )
        assert cell in page, f"B{b} N{n} M{m}: {cell!r} not on the page"
    for entry in result["tokens"]:
        assert f"| {entry['M']} | " in page, f"context {entry['M']} missing from the tokens/s table"


def test_causal_over_non_causal_and_paged_over_contiguous_are_computed_per_row():
    times = {"triton": 30.0, "triton non-causal": 25.0, "triton graph": 20.0,
             "triton contiguous cache graph": 20.0, "triton paged cache graph": 22.0}  # fmt: skip
    row = {"B": 1, "N": 1, "M": 4096, "times_us": times, "triton_max_abs_diff": 1e-3,
           "gbs": dict.fromkeys(times, 100.0), "pct_copy": dict.fromkeys(times, 5.0)}  # fmt: skip
    result = {"provenance": {"device_name": "GPU"}, "copy_gbs": 2000.0, "rows": [row],
              "tokens": [{"M": 512, "tokens_per_s": {"triton": 1234.5, "triton graph": None}}]}  # fmt: skip
    text = decode_table.markdown(result)
    assert "- B1 N1 M4096: triton 1.20; paged / contiguous 1.10; triton max |diff| 1.00e-03" in text
    assert "| 512 | 1,234 | n/a |" in text  # a path that could not be captured shows n/a


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--out is required when measuring"),
        (["--from-json", "d.json"], "--from-json renders a saved result: give --md"),
    ],
)
def test_bad_arguments_stop_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        decode_table.parse_args(argv)
    assert stop.value.code == 2, f"exit status {stop.value.code}, expected argparse's 2"
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine with no GPU")
def test_measuring_on_a_machine_with_no_gpu_is_refused_with_the_reason(tmp_path):
    with pytest.raises(SystemExit, match="none is visible here"):
        decode_table.main(["--out", str(tmp_path / "d.json")])
    assert not (tmp_path / "d.json").exists()
