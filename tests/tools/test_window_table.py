"""attnkit_tools.pages.window_table: the checks computed from timed cells, the page with its
provenance, and the command line (CPU only: nothing is timed)."""

from __future__ import annotations

import pytest
import torch

from attnkit_tools.pages import window_table

SIZES = [4096, 8192]


def _cells(window_fwd, window_bwd, causal_fwd, sdpa_fwd):
    """(label, pass, N) -> cell; ms per N as given (lists over SIZES), sdpa-efficient skipped."""
    cells = {}
    for i, n in enumerate(SIZES):
        cells["triton window", "fwd", n] = {"ms": window_fwd[i], "tflops": 100.0}
        cells["triton window", "bwd", n] = {"ms": window_bwd[i], "tflops": 90.0}
        cells["triton causal", "fwd", n] = {"ms": causal_fwd[i], "tflops": 300.0}
        cells["sdpa window", "fwd", n] = {"ms": sdpa_fwd[i], "tflops": 50.0}
        cells["sdpa-efficient window", "fwd", n] = {"skipped": "mask needs ~13.0 GiB"}
    return cells


def test_linear_growth_and_both_speedups_are_read_from_the_cells():
    found = window_table.checks(_cells([1.0, 2.2], [3.0, 6.0], [4.0, 12.0], [2.0, 4.4]), SIZES)
    assert found["time_per_n_vs_smallest"]["fwd"] == {4096: 1.0, 8192: pytest.approx(1.1)}
    assert found["time_per_n_vs_smallest"]["bwd"][8192] == pytest.approx(1.0)
    assert found["fwd_speedup_vs_full_causal"] == pytest.approx(12.0 / 2.2)  # >= 5: passes
    assert found["fwd_speedup_vs_fastest_sdpa_mask"] == pytest.approx(2.0)  # only sdpa was timed
    assert found["pass_vs_full_causal"] and found["pass_vs_sdpa"]


def test_a_missing_cell_leaves_its_check_unmeasured_not_passed():
    cells = _cells([1.0, 2.0], [3.0, 6.0], [4.0, 8.0], [2.0, 2.5])
    del cells["triton causal", "fwd", 8192]
    found = window_table.checks(cells, SIZES)
    assert found["fwd_speedup_vs_full_causal"] is None and found["pass_vs_full_causal"] is False
    assert found["fwd_speedup_vs_fastest_sdpa_mask"] == pytest.approx(1.25)
    assert found["pass_vs_sdpa"] is False  # 1.25 < 1.5


def test_the_page_carries_the_command_provenance_and_skipped_cells():
    cells = _cells([1.0, 2.2], [3.0, 6.0], [4.0, 12.0], [2.0, 4.4])
    listed = [{"label": lab, "pass": p, "N": n, **cell} for (lab, p, n), cell in cells.items()]
    prov = {"device_name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda": "13.0",
            "torch": "2.11.0", "triton": "3.6.0", "commit": "abc1234"}  # fmt: skip
    report = {"command": "python -m attnkit_tools.pages.window_table --out w", "provenance": prov,
              "shape": {"heads": 16, "head_dim": 128, "dtype": "bf16", "window": [1024, 0]},
              "sizes": SIZES, "cells": listed, "checks": window_table.checks(cells, SIZES)}  # fmt: skip
    page = window_table.markdown(report)
    assert "Produced by `python -m attnkit_tools.pages.window_table --out w`" in page
    for key, value in prov.items():
        assert f"| {key} | {value} |" in page, f"provenance {key} missing"
    assert "| 8192 | 2.200 (100) | 12.000 (300) | skipped | 4.400 (50) |" in page
    assert "5.45x (target >= 5.0x: PASS)" in page
    assert "- sdpa-efficient window fwd N=4096: mask needs ~13.0 GiB" in page


def test_sizes_that_are_not_integers_are_an_error(capsys):
    with pytest.raises(SystemExit) as stop:
        window_table.parse_args(["--out", "w", "--smoke", "--sizes", "4k"])
    assert stop.value.code == 2
    assert "--sizes takes comma-separated integers, not '4k'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine with no GPU")
def test_timing_on_a_machine_with_no_gpu_is_refused_and_smoke_named(capsys):
    with pytest.raises(SystemExit) as stop:
        window_table.parse_args(["--out", "w"])
    assert stop.value.code == 2
    assert "none is visible here; --smoke runs the pipeline" in capsys.readouterr().err
