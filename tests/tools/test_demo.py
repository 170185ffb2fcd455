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


def test_help_is_plain_text_with_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    printed = capsys.readouterr().out
    assert "``" not in printed and "::" not in printed, printed
    for default in ("(default: 512)", "(default: bf16)", "(default: 5)"):
        assert default in printed, f"{default} missing from:\n{printed}"


def test_on_the_cpu_it_says_why_peak_memory_is_blank_and_warns_of_interpreted_paths(capsys, monkeypatch):
    import attnkit.registry

    monkeypatch.setattr(
        attnkit.registry, "auto_skip_reason", lambda name, device: "interpreted" if name == "tiled" else None
    )
    status = main(
        ["--seq-len", "16", "--head-dim", "8", "--heads", "1", "--dtype", "fp32", "--device", "cpu",
         "--backends", "naive", "tiled", "--reps", "1", "--no-check"]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "warning: tiled runs through Triton's interpreter" in printed, printed
    assert "warning: naive" not in printed, printed
    assert "peak MiB: '-' on cpu: extra memory is read from CUDA's allocator statistics only" in printed, (
        printed
    )
