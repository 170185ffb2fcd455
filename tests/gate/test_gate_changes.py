"""The planted changes that ``tests/perf/verify_gate_on_gpu.sh change:NAME`` measures the gate
with must still apply to the source: a patch that no longer applies would make that step log
"patch failed" and verify nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCHES = sorted((ROOT / "tests" / "perf" / "gate_changes").glob("*.patch"))


def test_there_are_planted_changes():
    assert len(PATCHES) >= 1, "tests/perf/gate_changes/ holds no *.patch"


@pytest.mark.skipif(
    shutil.which("patch") is None, reason="the verification script applies them with patch(1)"
)
@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_planted_change_applies_to_the_source(patch, tmp_path):
    first = patch.read_text().splitlines()[0]
    assert first.startswith("# cases: "), f"{patch.name}: first line names no cases: {first!r}"
    shutil.copytree(ROOT / "src", tmp_path / "src")
    # The same command as the script's, on a copy of src/ as the script makes.
    with patch.open() as diff:
        result = subprocess.run(
            ["patch", "-s", "-p1", "--dry-run"], stdin=diff, cwd=tmp_path, capture_output=True, text=True
        )
    assert result.returncode == 0, f"{patch.name} no longer applies to src/:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_planted_change_names_cases_of_the_grid(patch):
    """The true effect is measured on the grid's cases whose names hold every word of the first
    line (``ab_dobench --match``): a word that matches nothing would measure no case at all."""
    from attnkit_perf.bench import gpu_suite_cases

    words = patch.read_text().splitlines()[0].removeprefix("# cases: ").split()
    assert words and not any(w.startswith("-") for w in words), f"{patch.name}: {words} (read as options)"
    named = [c.name for c in gpu_suite_cases() if all(w in c.name for w in words)]
    assert named, f"{patch.name}: no case of the grid holds every one of {words}"
