"""The installed suite reaches a kernel's large-shape path: a kernel that declares nothing, exact
below N = 700 and dropping the causal diagonal from there on, is failed by the scale tier's
ladder on a CPU (the drawn problems stop at N = 160), on exactly the causal problems past the
switch; fixed, those pass.

In process, through :func:`attnkit.register_backend`, to stay short in CI. The same kernel as
an installed distribution with an entry point, run through the whole suite with its default
options in a fresh pytest process, is ``python tests/correctness/switch_kernel.py --switch-at
700`` (on a GPU: ``--switch-at 4096``)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from attnkit import register_backend, unregister_backend
from attnkit.suite.checks import check_against_oracle
from attnkit.testing.scale import CPU_LIMITS, ladder

sys.path.insert(0, str(Path(__file__).parent))

from switch_kernel import KERNEL

# The installed suite's ladder reaching a planted bug: the suite's logic, decided by the CPU CI.
pytestmark = pytest.mark.device_independent

SWITCH_AT = 700


def _kernel(dropped: bool):
    module = types.ModuleType(f"switch_kernel_{dropped}")
    exec(KERNEL.format(switch_at=SWITCH_AT, dropped=dropped), module.__dict__)
    return module.attention


@pytest.fixture
def switch_backend():
    def register(dropped: bool) -> str:
        register_backend("switch-under-test", fn=_kernel(dropped), replace=True)
        return "switch-under-test"

    yield register
    unregister_backend("switch-under-test")


def _failures(backend: str, cases) -> list:
    failed = []
    for case in cases:
        try:
            check_against_oracle(backend, case, torch.device("cpu"), shrink=False)
        except AssertionError:
            failed.append(case)
    return failed


def test_the_ladder_fails_a_bug_from_n_700_on_and_passes_the_fix(switch_backend):
    cases = ladder(CPU_LIMITS)
    failed = _failures(switch_backend(dropped=True), cases)
    past = [c for c in cases if c.problem.causal and c.problem.q_len >= SWITCH_AT]
    assert past, f"the CPU ladder has no causal problem with N >= {SWITCH_AT}"
    assert failed == past, (
        f"expected the causal problems with N >= {SWITCH_AT} to fail, failed: "
        f"{[c.problem.describe() for c in failed]}"
    )
    assert _failures(switch_backend(dropped=False), past) == [], "the fixed kernel failed the ladder"
