"""The defaults tests/conftest.py sets, so that a plain ``pytest`` runs the suite as CI does."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import attnkit


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
