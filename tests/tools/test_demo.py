"""``attnkit-demo`` prints the problem it ran and throughput in a unit that fits it."""

from __future__ import annotations

import re

import pytest

from attnkit_tools.demo import format_rate, main


@pytest.mark.parametrize(
    ("flop_per_s", "expected"),
    [(4.16e9, "4.16 GFLOP/s"), (889e6, "889 MFLOP/s"), (1.234e12, "1.23 TFLOP/s"), (0.5, "0.5 FLOP/s")],
)
def test_throughput_is_printed_in_a_unit_that_keeps_three_digits(flop_per_s, expected):
    assert format_rate(flop_per_s) == expected, (
        f"{flop_per_s:g} FLOP/s printed as {format_rate(flop_per_s)!r}"
    )


def test_the_demo_prints_its_problem_and_each_paths_result(capsys):
    status = main(
        ["--seq-len", "32", "--head-dim", "16", "--heads", "2", "--dtype", "fp32", "--device", "cpu",
         "--backends", "naive", "tiled", "--reps", "1"]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "problem: B=1 Hq=2 Hkv=2 N=M=32 D=Dv=16 fp32 no mask, forward+backward" in printed, printed
    for name in ("naive", "tiled"):
        row = next((line for line in printed.splitlines() if line.startswith(name)), None)
        assert row is not None, f"no row for {name} in:\n{printed}"
        assert re.search(r"\d[\d.]* [kMGTP]?FLOP/s", row), f"{name}: no throughput with a unit in {row!r}"
        assert "ok (worst" in row, f"{name}: not within the tolerance rule: {row!r}"
    assert "0.0 TFLOP/s" not in printed, printed
