"""attnkit_tools.gate.ab_dobench's command line (CPU only: no side is started)."""

from __future__ import annotations

import pytest

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
