"""attnkit_tools.pages.yardstick: the dtype-softmax naive path, the summary table from fixed rows, the
page with its provenance, and the command line (CPU only)."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit_tools.pages import yardstick


def test_the_dtype_softmax_path_is_attention_in_float64():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 7, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    for causal in (False, True):
        got = yardstick.naive_dtype_softmax(q, k, v, causal, None)
        want = attnkit.reference_attention(q, k, v, causal=causal)
        assert torch.allclose(got, want, atol=1e-12), (
            f"causal={causal}: max diff {(got - want).abs().max():.3e}"
        )


def _row(backend, quantity, error, yardstick_error, loose_error, bound, seed=0):
    return {"dtype": "bf16", "problem": [1, 2, 2, 8, 8, 16, 16, True, "unit"], "seed": seed,
            "backend": backend, "quantity": quantity, "error": error, "yardstick_error": yardstick_error,
            "dtype_softmax_error": loose_error, "bound": bound, "ok": error <= bound}  # fmt: skip


def test_the_summary_reads_looseness_multiples_and_failures_from_the_rows():
    rows = [_row("triton", x, 2e-3, 1e-3, 4e-3, 3e-3) for x in yardstick.QUANTITIES]
    rows[0] = _row("triton", "out", 4e-3, 1e-3, 8e-3, 3e-3)  # outside its bound
    table, summary = yardstick.summarise(rows)
    assert summary["looseness"]["bf16/out"] == (8.0, 8.0, 8.0)
    assert summary["multiples"]["triton/bf16/out"] == (0.5, 4.0)  # dtype-softmax -> the rule's
    assert summary["error_over_bound"]["triton/bf16"] == pytest.approx(4 / 3)
    assert "| triton | bf16 | 0.50 -> 4.00 | 0.50 -> 2.00 | 0.50 -> 2.00 | 0.50 -> 2.00 | 1.33 | 1 |" in table


def test_the_page_carries_the_command_and_provenance():
    info = {"device_name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda": "13.0",
            "torch": "2.11.0", "triton": "3.6.0", "commit": "abc1234"}  # fmt: skip
    page = yardstick.page("TABLE", info, "python -m attnkit_tools.pages.yardstick --seeds 3", 3)
    assert page.startswith("# The tolerance rule's yardstick\n")
    assert (
        f"Produced by `python -m attnkit_tools.pages.yardstick --seeds 3`: {len(yardstick.PROBLEMS)} problems"
        in page
    )
    for key, value in info.items():
        assert f"| {key} | {value} |" in page, f"provenance {key} missing"
    assert "Usage" not in page and page.rstrip().endswith("TABLE")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--device", "cpu", "--backends", "no-such-path"],
            "--backends ['no-such-path'] not available on cpu",
        ),
        (["--device", "cpu", "--seeds", "0"], "--seeds must be at least 1, not 0"),
    ],
)
def test_bad_arguments_stop_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        yardstick.parse_args(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_a_small_run_measures_every_quantity_and_passes_the_rule(monkeypatch):
    """End to end on the CPU with one small problem and one dtype: one row per quantity, each
    error measured against the float64 oracle, and the SDPA path inside the rule."""
    monkeypatch.setattr(yardstick, "PROBLEMS", ((1, 2, 1, 9, 13, 16, 16, True, "unit"),))
    monkeypatch.setattr(yardstick, "DTYPES", {"bf16": torch.bfloat16})
    rows = yardstick.measure(torch.device("cpu"), ["sdpa"], seeds=1)
    assert sorted(r["quantity"] for r in rows) == sorted(yardstick.QUANTITIES)
    for r in rows:
        assert min(r["error"], r["yardstick_error"], r["dtype_softmax_error"]) > 0, r
        assert r["ok"], f"sdpa {r['quantity']}: error {r['error']:.3e} above its bound {r['bound']:.3e}"
