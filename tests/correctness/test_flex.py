"""The ``flex`` backend's checks before any kernel runs: what it declines, and why, on each device
(its numerics are the installed suite's: ``pytest --pyargs attnkit.suite --attnkit-backend flex``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnkit.flex import CPU_OPT_IN, flex_device_support, flex_problem_support
from attnkit.inputs import check_inputs

# flex's support checks run before any kernel: the CPU CI's run decides them.
pytestmark = pytest.mark.device_independent


def problem(q_heads=4, kv_heads=4, n=256, d=64, dtype=torch.bfloat16, device="cuda"):
    q = torch.empty(1, q_heads, n, d, dtype=dtype, device="meta")
    k = torch.empty(1, kv_heads, n, d, dtype=dtype, device="meta")
    return dataclasses.replace(check_inputs(q, k, k, True, None, None), device=torch.device(device))


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"dtype": torch.float64}, "not float64"),
        ({"d": 8}, "head dims >= 16"),
        ({"kv_heads": 1, "n": 33}, "decoding kernel"),
        ({"kv_heads": 2, "n": 127}, "decoding kernel"),
    ],
)
def test_flex_declines_with_its_reason(kwargs, reason):
    got = flex_problem_support(problem(**kwargs))
    assert got is not None and reason in got, f"{kwargs}: declined with {got!r}, expected {reason!r}"


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"kv_heads": 1, "n": 128}, {"kv_heads": 1, "n": 33, "device": "cpu"}, {"d": 8, "device": "cpu"}],
)
def test_flex_takes_what_its_kernels_run(kwargs):
    assert flex_problem_support(problem(**kwargs)) is None, kwargs


def test_on_the_cpu_flex_runs_only_when_asked(monkeypatch):
    monkeypatch.delenv(CPU_OPT_IN, raising=False)
    reason = flex_device_support(torch.device("cpu"))
    assert reason is not None and CPU_OPT_IN in reason, reason
    monkeypatch.setenv(CPU_OPT_IN, "1")
    assert flex_device_support(torch.device("cpu")) is None


def test_on_the_cpu_flex_is_forward_only_and_takes_inputs_that_require_grad_under_no_grad(monkeypatch):
    """A call that records a backward is refused before anything compiles, by attention and
    chosen_backend alike; under torch.no_grad the same inputs run (FlexAttention's CPU path
    itself refuses inputs that require grad even then)."""
    import attnkit
    from attnkit.testing import assert_close_to_reference, compare_to_reference

    monkeypatch.setenv(CPU_OPT_IN, "1")
    monkeypatch.setattr(attnkit.api, "_PLANNED", {})
    monkeypatch.setattr(attnkit.api, "_compiled_memo", None)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 16, generator=gen, requires_grad=True) for _ in range(3))
    for call in (attnkit.attention, attnkit.chosen_backend):
        with pytest.raises(attnkit.UnsupportedProblemError, match="'flex' is forward-only on the cpu"):
            call(q, k, v, causal=True, backend="flex")
    with torch.no_grad():
        assert attnkit.chosen_backend(q, k, v, causal=True, backend="flex") == "flex"
        attnkit.attention(q, k, v, causal=True, backend="flex")  # q, k and v as given

    def flex(a, b, c):
        return attnkit.attention(a, b, c, causal=True, backend="flex")

    checks = compare_to_reference(flex, q, k, v, causal=True, scale=None)  # the forward only
    assert_close_to_reference("flex on the cpu", checks)
