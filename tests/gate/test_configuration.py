"""The defaults tests/conftest.py sets, so that a plain ``pytest`` runs the suite as CI does."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnkit

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU the Triton kernels are compiled, not interpreted"
)
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_runs_through_the_interpreter_on_a_cpu():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip(f"TRITON_INTERPRET={os.environ['TRITON_INTERPRET']!r} was set by hand")
    assert attnkit.unavailable_reason("triton", "cpu") is None, (
        f"triton should run interpreted under the test configuration, but: "
        f"{attnkit.unavailable_reason('triton', 'cpu')}"
    )


#: A test that compiles with Inductor on the CPU (C++ code generation, a precompiled header).
_INDUCTOR_TEST = "tests/correctness/test_compile.py::test_inductor_compiles_the_op_on_cpu"


@pytest.mark.parametrize("cache", ["cache", "no-cache"])
def test_a_run_keeps_inductors_cache_in_pytests_cache_or_nowhere(tmp_path, cache):
    """A test run leaves no compile cache in the system's temporary folder: Inductor's goes to
    pytest's cache folder (kept for the next run), or under ``-p no:cacheprovider`` to a
    temporary folder removed when the run ends."""
    scratch, pytest_cache = tmp_path / "tmp", tmp_path / "pytest-cache"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "ATTNKIT_TEST_DEVICE": "cpu"}
    for name in (
        "TORCHINDUCTOR_CACHE_DIR",
        "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS",
        "PYTEST_XDIST_WORKER",
    ):
        env.pop(name, None)  # as a fresh shell has them: this run's own values are inherited
    caching = ["-o", f"cache_dir={pytest_cache}"] if cache == "cache" else ["-p", "no:cacheprovider"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", _INDUCTOR_TEST, "-q", *caching],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "1 passed" in output, output[-3000:]
    # pytest's own temporary folders (tmp_path's pytest-of-<user>) are pytest's to keep.
    left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith("pytest-of-"))
    assert left == [], f"left in the temporary folder: {left}"
    if cache == "cache":
        compiled = pytest_cache / "d" / "attnkit-torchinductor"
        assert compiled.is_dir() and any(compiled.iterdir()), f"Inductor's cache is not in {compiled}"
