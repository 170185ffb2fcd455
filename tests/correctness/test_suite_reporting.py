"""A failing check of the installed suite is reported as one block: its message (the problem, each
quantity's error against its bound, the reproducer), not the suite's own traceback
(attnkit.suite.reporting); an explicit --tb style keeps pytest's report."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import registry

#: How a failure is reported does not depend on the device the suite runs on.
pytestmark = pytest.mark.device_independent


@pytest.fixture
def shifted(monkeypatch):
    """The backend "shifted" registered for one test, the registry restored after it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    attnkit.register_backend("shifted", _shifted)
    yield
    attnkit.api._forget_plans()  # the test's backend must not serve a later test's calls


def _shifted(q, k, v, *, causal, scale, window):
    """Attention with the causal diagonal one key short: a mask off by one."""
    n, m = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1).float() for t in (k, v))
    scores = (q.float() @ k.transpose(-1, -2)) * scale
    rows = torch.arange(n, device=q.device)[:, None] + (m - n)
    keys = torch.arange(m, device=q.device)[None, :]
    scores = scores.masked_fill(keys >= rows, float("-inf")) if causal else scores
    return torch.nan_to_num(scores.softmax(-1) @ v).to(q.dtype)


def _run(pytester, *extra):
    return pytester.runpytest_inprocess(
        "-p", "attnkit_pytest", "--pyargs", "attnkit.suite.test_oracle", "--attnkit-backend", "shifted",
        "-k", "single-token or rows-see-no-key", *extra,
    )  # fmt: skip


def test_a_failing_check_is_its_message_and_reproducer_without_the_suites_traceback(pytester, shifted):
    result = _run(pytester)
    result.assert_outcomes(failed=2)
    output = result.stdout.str()
    assert "outside the tolerance rule" in output and "Repeat this one call alone" in output
    assert "--tb=long shows the traceback" in output
    # the suite's own source, which every failure would repeat, is not shown
    assert "def check_against_oracle(" not in output and "skip_if_declined(" not in output


def test_an_explicit_traceback_style_keeps_pytests_report(pytester, shifted):
    result = _run(pytester, "--tb=long")
    result.assert_outcomes(failed=2)
    assert "def check_against_oracle(" in result.stdout.str()
