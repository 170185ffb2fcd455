"""Properties every backend must have, checked without the oracle: convex combinations of the
visible values, the mean at scale 0, key-permutation invariance, bottom-right causal rows,
windows, and zeros with zero gradient for rows that see no key. Allowed slack:
:func:`attnkit.suite.checks.slack`."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnkit import attention
from attnkit.reference import visibility
from attnkit.registry import get_backend
from attnkit.suite.checks import Declines, per_head_kv, sized_for, slack
from attnkit.testing.strategies import attention_problem, problems, windowed_problems


def _run(declines: Declines, case, device, **overrides):
    """(case as run, (q, k, v), output) of the test's backend; a decline draws another problem."""
    case = sized_for(declines.backend, case, device)
    q, k, v, _ = case.tensors(device)
    kwargs = {**case.kwargs, "backend": declines.backend, **overrides}
    return case, (q, k, v), declines.run(lambda: attention(q, k, v, **kwargs))


def _visible(case, device) -> torch.Tensor:
    """(N, M) mask of keys each query sees: the oracle's one definition."""
    return visibility(case.problem, device)


def _assert_convex_combination_of_visible_values(declines, case, device):
    case, (q, k, v), out = _run(declines, case, device)
    visible = _visible(case, device)  # (N, M)
    vv = per_head_kv(v, case)[:, :, None]  # (B, Hq, 1, M, Dv)
    hidden = ~visible[None, None, :, :, None]
    lo = vv.masked_fill(hidden, float("inf")).amin(dim=3)
    hi = vv.masked_fill(hidden, float("-inf")).amax(dim=3)
    sees_any = visible.any(dim=1)[None, None, :, None]
    lo, hi = torch.where(sees_any, lo, 0.0), torch.where(sees_any, hi, 0.0)
    allowed = slack(q, k, v, case)
    below = (lo - out.double()).max().item()
    above = (out.double() - hi).max().item()
    assert below <= allowed and above <= allowed, (
        f"{declines.backend}: output leaves the [min, max] of visible v rows by {max(below, above):.3e} "
        f"(slack {allowed:.3e}) on {case}"
    )


def test_each_row_is_a_convex_combination_of_visible_values(attnkit_backend, attnkit_device, request):
    declines = Declines(attnkit_backend, request)

    @given(case=problems(max_len=96))
    def check(case):
        _assert_convex_combination_of_visible_values(declines, case, attnkit_device)

    declines.drive(check)


def test_scale_zero_gives_mean_of_visible_values(attnkit_backend, attnkit_device, request):
    declines = Declines(attnkit_backend, request)

    @given(case=problems(max_len=96))
    def check(case):
        case, (q, k, v), out = _run(declines, case.replace(scale=0.0), attnkit_device)
        visible = _visible(case, attnkit_device).double()
        counts = visible.sum(dim=1, keepdim=True).clamp_min(1)
        expected = (visible / counts) @ per_head_kv(v, case)
        error = (out.double() - expected).abs().max().item()
        assert error <= slack(q, k, v, case), (
            f"{attnkit_backend}: scale=0 is not the visible mean: error {error:.3e}"
        )

    declines.drive(check)


def test_permuting_keys_with_values_changes_nothing_when_not_causal(attnkit_backend, attnkit_device, request):
    declines = Declines(attnkit_backend, request)

    @given(case=problems(max_len=96), data=st.data())
    def check(case, data):
        case, (q, k, v), out = _run(declines, case.replace(causal=False), attnkit_device)
        perm = torch.tensor(data.draw(st.permutations(range(case.problem.kv_len))), device=attnkit_device)
        permuted = attention(q, k[:, :, perm], v[:, :, perm], scale=case.scale, backend=attnkit_backend)
        error = (permuted.double() - out.double()).abs().max().item()
        assert error <= slack(q, k, v, case), (
            f"{attnkit_backend}: key permutation moved the output by {error:.3e}"
        )

    declines.drive(check)


def test_causal_first_row_is_first_value(attnkit_backend, attnkit_device, request):
    """Causal with N = M: query 0 sees key 0 alone (bottom-right and top-left agree here)."""
    declines = Declines(attnkit_backend, request)

    @given(case=problems(max_len=96))
    def check(case):
        case = case.replace(causal=True, kv_len=case.problem.q_len)
        case, (q, k, v), out = _run(declines, case, attnkit_device)
        first = per_head_kv(v, case)[:, :, 0]
        error = (out[:, :, 0].double() - first).abs().max().item()
        assert error <= slack(q, k, v, case), (
            f"{attnkit_backend}: causal row 0 differs from v[0] by {error:.3e}"
        )

    declines.drive(check)


def _assert_hidden_rows_zero(declines, case, device, hidden_rows: int):
    """Rows 0..hidden_rows-1 see no key: zeros and zero dq, and every gradient finite."""
    q, k, v, grad_out = case.tensors(device)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = declines.run(lambda: attention(q, k, v, **case.kwargs, backend=declines.backend))
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_out)
    # Booleans, not tensor expressions: a failure then prints no tensor (pytest explains the latter).
    not_finite = [name for name, x in zip(("output", "dq", "dk", "dv"), (out, dq, dk, dv), strict=True)
                  if not bool(torch.isfinite(x).all())]  # fmt: skip
    assert not not_finite, (
        f"{declines.backend}: NaN/inf in {', '.join(not_finite)} with rows that see no key ({case})"
    )
    for name, x in (("output", out), ("dq", dq)):
        largest = x[:, :, :hidden_rows].abs().max().item()
        assert largest == 0, (
            f"{declines.backend}: the {hidden_rows} rows that see no key have {name} up to {largest:.3e}, "
            f"not 0 ({case})"
        )


def test_rows_that_see_no_key_are_zero_with_zero_gradient(attnkit_backend, attnkit_device, request):
    """Causal with N > M, bottom-right aligned: the first N - M rows see no key."""
    declines = Declines(attnkit_backend, request)

    @given(case=problems(max_len=96))
    def check(case):
        case = sized_for(attnkit_backend, case, attnkit_device)
        p = case.problem
        case = case.replace(causal=True, q_len=max(p.q_len, p.kv_len + 3))
        _assert_hidden_rows_zero(declines, case, attnkit_device, case.problem.q_len - p.kv_len)

    declines.drive(check)


# --- Sliding windows -------------------------------------------------------------------------


def _skip_unless_windows(backend, device):
    """Skip a backend that declines every window (sdpa-flash: no attn_mask), so a property test
    does not reject all its draws."""
    problem = attention_problem(
        q_len=4, kv_len=4, head_dim=16, dtype=torch.float16, window=(1, 1), device=device
    )
    reason = get_backend(backend).supports(problem)
    if reason is not None:
        pytest.skip(f"{backend} declines windows: {reason}")


def test_windowed_row_is_a_convex_combination_of_its_window(attnkit_backend, attnkit_device, request):
    _skip_unless_windows(attnkit_backend, attnkit_device)
    declines = Declines(attnkit_backend, request)

    @given(case=windowed_problems(max_len=96))
    def check(case):
        _assert_convex_combination_of_visible_values(declines, case, attnkit_device)

    declines.drive(check)


def test_window_covering_every_key_is_no_window(attnkit_backend, attnkit_device, request):
    """left >= M - 1 and right >= N - 1 (bottom-right offsets included) hide nothing: the same
    function, bitwise (it is normalised to the same problem, so the same kernels run)."""
    declines = Declines(attnkit_backend, request)

    @given(case=problems(max_len=96), data=st.data())
    def check(case, data):
        extra_left, extra_right = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))
        case, (q, k, v), plain = _run(declines, case, attnkit_device)
        p = case.problem
        window = (p.kv_len - 1 + extra_left, p.q_len - 1 + extra_right)
        windowed = attention(
            q, k, v, causal=p.causal, scale=case.scale, window=window, backend=attnkit_backend
        )
        same = torch.equal(windowed, plain)
        assert same, (
            f"{attnkit_backend}: window {window} covering every key changed the output by "
            f"{(windowed.double() - plain.double()).abs().max().item():.3e} on {case}"
        )

    declines.drive(check)


def test_window_zero_returns_the_aligned_value(attnkit_backend, attnkit_device, request):
    """window (0, 0): row i sees key i + M - N alone (softmax of one score is 1), so it returns
    that value row, or zeros where i + M - N is not a key."""
    _skip_unless_windows(attnkit_backend, attnkit_device)
    declines = Declines(attnkit_backend, request)

    @given(case=problems(max_len=96))
    def check(case):
        case, (q, k, v), out = _run(declines, case.replace(window=(0, 0)), attnkit_device)
        p = case.problem
        expected = torch.zeros(out.shape, dtype=torch.float64, device=attnkit_device)
        keys = torch.arange(p.q_len, device=attnkit_device) + p.kv_len - p.q_len
        inside = (keys >= 0) & (keys < p.kv_len)
        expected[:, :, inside] = per_head_kv(v, case)[:, :, keys[inside]]
        error = (out.double() - expected).abs().max().item()
        assert error <= slack(q, k, v, case), (
            f"{attnkit_backend}: window (0, 0) differs from v[i + M - N] by {error:.3e}"
        )

    declines.drive(check)


def test_windowed_rows_that_see_no_key_are_zero_with_zero_gradient(attnkit_backend, attnkit_device, request):
    """With N > M and a right edge, the first rows' bands end before key 0: zeros and zero dq,
    every gradient finite."""
    _skip_unless_windows(attnkit_backend, attnkit_device)
    declines = Declines(attnkit_backend, request)

    @given(case=problems(max_len=96), data=st.data())
    def check(case, data):
        case = sized_for(attnkit_backend, case, attnkit_device)
        kv_len = case.problem.kv_len
        right = data.draw(st.integers(0, 2))
        q_len = max(case.problem.q_len, kv_len + right + 2)
        case = case.replace(q_len=q_len, window=(data.draw(st.integers(0, kv_len + 2)), right))
        _assert_hidden_rows_zero(declines, case, attnkit_device, q_len - kv_len - right)

    declines.drive(check)
