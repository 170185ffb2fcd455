"""An external kernel, installed as its own distribution with an ``attnkit.backends`` entry
point and touching nothing in attnkit, is tested by the installed suite from outside the
repository: with a planted top-left causal bug it fails with attnkit's message, fixed it passes.

The kernel is the example plugin's (examples/toy-backend), installed into a temporary folder as
pip would (a ``*.dist-info`` with ``entry_points.txt``) and run in a fresh pytest process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import attnkit

# The installed suite's mechanism (entry point, plugin, failure message): the CPU CI's run decides it.
pytestmark = pytest.mark.device_independent

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "toy-backend" / "src" / "attnkit_toy"
#: The line of the example kernel that aligns causal masking bottom-right, and the bug.
BOTTOM_RIGHT = "diagonal = rows + (m - n)"
TOP_LEFT = "diagonal = rows"


def _install(site: Path, kernel_source: str) -> None:
    package = site / "attnkit_toy"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text((EXAMPLE / "__init__.py").read_text())
    (package / "kernel.py").write_text(kernel_source)
    info = site / "attnkit_toy-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: attnkit-toy\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[attnkit.backends]\ntoy = attnkit_toy:backend\n")


def _run_suite(tmp_path: Path, kernel_source: str) -> subprocess.CompletedProcess:
    site, workdir = tmp_path / "site", tmp_path / "elsewhere"
    _install(site, kernel_source)
    workdir.mkdir()
    attnkit_root = str(Path(attnkit.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), attnkit_root]),
        "HYPOTHESIS_PROFILE": "ci",
        "ATTNKIT_TEST_DEVICE": "cpu",
    }
    # The oracle tests alone keep this under a minute on a CPU; -p loads attnkit's plugin where
    # attnkit runs from a checkout rather than an install (an installed one loads it already).
    command = [sys.executable, "-m", "pytest", "--pyargs", "attnkit.suite.test_oracle",
               "--attnkit-backend", "toy", "-p", "attnkit_pytest", "-p", "no:cacheprovider",
               "-q", "-x"]  # fmt: skip
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)


def test_a_planted_top_left_causal_bug_fails_and_the_fix_passes(tmp_path):
    fixed = (EXAMPLE / "kernel.py").read_text()
    assert fixed.count(BOTTOM_RIGHT) == 1, f"the example kernel no longer has {BOTTOM_RIGHT!r}"
    buggy = _run_suite(tmp_path / "buggy", fixed.replace(BOTTOM_RIGHT, TOP_LEFT))
    report = buggy.stdout + buggy.stderr
    assert buggy.returncode == 1, (
        f"the top-left causal kernel was not failed (exit {buggy.returncode}):\n{report}"
    )
    for part in ("backend 'toy' on", "outside the tolerance rule", "error/naive"):
        assert part in report, f"{part!r} missing from the suite's failure:\n{report[-4000:]}"
    good = _run_suite(tmp_path / "fixed", fixed)
    report = good.stdout + good.stderr
    assert good.returncode == 0 and " passed" in report, (
        f"the fixed kernel failed the suite:\n{report[-4000:]}"
    )
