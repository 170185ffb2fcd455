"""attnkit_tools.gate.ab_dobench's command line (CPU only: no side is started)."""

from __future__ import annotations

import pytest

from attnkit_perf import bench
from attnkit_tools.gate import ab_dobench


def test_match_words_no_case_contains_are_an_error_before_any_side_runs(capsys, monkeypatch, tmp_path):
    """Words that together name no case of the grid (every word must be in the name) stop the
    tool with an error naming them, instead of starting each side with nothing to time."""

    def no_side(*args, **kwargs):
        raise AssertionError("a side was started")

    monkeypatch.setattr(ab_dobench, "_run_side", no_side)
    argv = ["--base", str(tmp_path), "--head", str(tmp_path), "--match", "M32768", "M131072"]
    with pytest.raises(SystemExit) as stop:
        ab_dobench.main(argv)
    assert stop.value.code == 2, f"exit status {stop.value.code}, expected argparse's 2"
    err = capsys.readouterr().err
    assert "no case of the perf grid contains every --match word" in err and "M131072" in err, err


def test_a_loop_case_reads_its_steady_cost_after_a_slow_start(monkeypatch):
    """A call that costs 400 us for its first 0.2 s (cold clocks, first-touch) and 50 us after:
    the warm-up is measured in seconds, not calls, so the loops see the steady 50 us. The clock
    is simulated (each call advances it by its cost): a busy-wait on the wall clock reads the
    machine's other work too, up to twice the cost on a loaded two-core runner."""
    import time

    clock = [0.0]

    def call():
        clock[0] += 400e-6 if clock[0] < 0.2 else 50e-6

    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    ms = ab_dobench._loop_ms(call, sync=lambda: None, warmup_s=0.3, loop_s=0.01, loops=9)
    assert ms == pytest.approx(0.050), f"{ms * 1e3:.1f} us a call, expected 50"


def test_a_run_stopped_in_its_second_round_keeps_the_first(monkeypatch, tmp_path):
    """The acceptance stops a step at its time limit with SIGINT: the rounds finished by then are
    in ``--out``, read back as true effects."""
    sides = iter([{"fwd[a-loop]": 0.010}, {"fwd[a-loop]": 0.013}])

    def side(src, names):
        try:
            return next(sides)
        except StopIteration:
            raise KeyboardInterrupt from None

    monkeypatch.setattr(ab_dobench, "_run_side", side)
    monkeypatch.setattr(bench, "gpu_suite_cases", lambda: [type("Case", (), {"name": "fwd[a-loop]"})])
    monkeypatch.setattr(bench, "provenance", lambda: {"gpu": "test"})
    out = tmp_path / "ab.json"
    argv = ["--base", str(tmp_path), "--head", str(tmp_path), "--rounds", "3", "--out", str(out)]
    with pytest.raises(KeyboardInterrupt):
        ab_dobench.main(argv)
    assert ab_dobench.read_effects(out) == pytest.approx({"fwd[a-loop]": 1.3})
