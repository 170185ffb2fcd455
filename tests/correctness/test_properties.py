"""Properties every backend must have, checked without the oracle.

Allowed slack: the rule's floor (one rounding of the output plus accumulation reordering),
doubled because both sides of a comparison carry it, plus one ulp of max|v| because fused
kernels round the weights P to the input dtype before P @ V.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import INTERPRETED, backend_params
from hypothesis import given, reject
from hypothesis import strategies as st
from strategies import fit_to_interpreter, problems, windowed_problems

import attnkit
from attnkit import UnsupportedProblemError, attention
from attnkit.inputs import check_inputs
from attnkit.reference import visibility
from attnkit.testing import error_floor, term_magnitudes


def _slack(q, k, v, problem) -> float:
    """Allowed |difference| between two outputs that are mathematically equal."""
    attn_problem = check_inputs(q, k, v, problem.causal, problem.scale, problem.window)
    terms, _ = term_magnitudes(q, k, v, None, attn_problem)["out"]
    floor = error_floor(v, terms, v.dtype, max(problem.kv_len, problem.value_dim))
    return 2 * floor + torch.finfo(v.dtype).eps * v.abs().max().item()


def _run(backend, problem, device, **overrides):
    if backend in INTERPRETED:
        problem = fit_to_interpreter(problem)
    q, k, v, _ = problem.tensors(device)
    kwargs = {"causal": problem.causal, "scale": problem.scale, "window": problem.window, "backend": backend}
    kwargs.update(overrides)
    try:
        return problem, (q, k, v), attention(q, k, v, **kwargs)
    except UnsupportedProblemError:
        reject()  # this backend declines these inputs; draw another problem


def _visible(problem, device):
    """(N, M) mask of keys each query sees: the oracle's one definition."""
    q = torch.empty(1, problem.q_heads, problem.q_len, problem.head_dim, device="meta")
    k = torch.empty(1, problem.kv_heads, problem.kv_len, problem.head_dim, device="meta")
    return visibility(check_inputs(q, k, k, problem.causal, None, problem.window), device)


def _per_head_kv(x, problem):
    # (B, Hkv, M, X) -> (B, Hq, M, X): query head h reads kv head h // G.
    return x.repeat_interleave(problem.group_size, dim=1).double()


@pytest.mark.parametrize("backend", backend_params())
@given(problem=problems(max_len=96))
def test_each_row_is_a_convex_combination_of_visible_values(backend, problem, device):
    _assert_convex_combination_of_visible_values(backend, problem, device)


def _assert_convex_combination_of_visible_values(backend, problem, device):
    problem, (q, k, v), out = _run(backend, problem, device)
    visible = _visible(problem, device)  # (N, M)
    vv = _per_head_kv(v, problem)[:, :, None]  # (B, Hq, 1, M, Dv)
    hidden = ~visible[None, None, :, :, None]
    lo = vv.masked_fill(hidden, float("inf")).amin(dim=3)
    hi = vv.masked_fill(hidden, float("-inf")).amax(dim=3)
    sees_any = visible.any(dim=1)[None, None, :, None]
    lo, hi = torch.where(sees_any, lo, 0.0), torch.where(sees_any, hi, 0.0)
    slack = _slack(q, k, v, problem)
    below = (lo - out.double()).max().item()
    above = (out.double() - hi).max().item()
    assert below <= slack and above <= slack, (
        f"{backend}: output leaves the [min, max] of visible v rows by {max(below, above):.3e} "
        f"(slack {slack:.3e}) on {problem}"
    )


@pytest.mark.parametrize("backend", backend_params())
@given(problem=problems(max_len=96))
def test_scale_zero_gives_mean_of_visible_values(backend, problem, device):
    problem = dataclasses.replace(problem, scale=0.0)
    problem, (q, k, v), out = _run(backend, problem, device)
    visible = _visible(problem, device).double()
    counts = visible.sum(dim=1, keepdim=True).clamp_min(1)
    expected = (visible / counts) @ _per_head_kv(v, problem)
    error = (out.double() - expected).abs().max().item()
    assert error <= _slack(q, k, v, problem), f"{backend}: scale=0 is not the visible mean: error {error:.3e}"


@pytest.mark.parametrize("backend", backend_params())
@given(problem=problems(max_len=96), data=st.data())
def test_permuting_keys_with_values_changes_nothing_when_not_causal(backend, problem, device, data):
    problem = dataclasses.replace(problem, causal=False)
    problem, (q, k, v), out = _run(backend, problem, device)
    perm = torch.tensor(data.draw(st.permutations(range(problem.kv_len))), device=device)
    permuted = attention(q, k[:, :, perm], v[:, :, perm], scale=problem.scale, backend=backend)
    error = (permuted.double() - out.double()).abs().max().item()
    assert error <= _slack(q, k, v, problem), f"{backend}: key permutation moved the output by {error:.3e}"


@pytest.mark.parametrize("backend", backend_params())
@given(problem=problems(max_len=96))
def test_causal_first_row_is_first_value(backend, problem, device):
    problem = dataclasses.replace(problem, causal=True, kv_len=problem.q_len)
    problem, (q, k, v), out = _run(backend, problem, device)
    first = _per_head_kv(v, problem)[:, :, 0]
    error = (out[:, :, 0].double() - first).abs().max().item()
    assert error <= _slack(q, k, v, problem), f"{backend}: causal row 0 differs from v[0] by {error:.3e}"


@pytest.mark.parametrize("backend", backend_params())
@given(problem=problems(max_len=96))
def test_rows_that_see_no_key_are_zero_with_zero_gradient(backend, problem, device):
    if backend in INTERPRETED:
        problem = fit_to_interpreter(problem)
    # At least one row sees no key: N > M, bottom-right aligned.
    problem = dataclasses.replace(problem, causal=True, q_len=max(problem.q_len, problem.kv_len + 3))
    q, k, v, grad_out = problem.tensors(device)
    hidden_rows = problem.q_len - problem.kv_len
    q = q.detach().requires_grad_()
    try:
        out = attention(q, k, v, causal=True, scale=problem.scale, backend=backend)
    except UnsupportedProblemError:
        reject()  # this backend declines these inputs; draw another problem
    (dq,) = torch.autograd.grad(out, (q,), grad_out)
    assert torch.isfinite(out).all() and torch.isfinite(dq).all(), f"{backend}: NaN/inf with hidden rows"
    for name, x in (("output", out), ("dq", dq)):
        largest = x[:, :, :hidden_rows].abs().max().item()
        assert largest == 0, (
            f"{backend}: the {hidden_rows} rows that see no key have {name} up to {largest:.3e}, not 0"
        )


# --- Sliding windows -------------------------------------------------------------------------


def _skip_unless_windows(backend, device):
    """Skip a backend that declines every window (sdpa-flash: no attn_mask), so a property test
    does not reject all its draws."""
    meta = torch.empty(1, 1, 4, 16, device="meta", dtype=torch.float16)
    problem = dataclasses.replace(check_inputs(meta, meta, meta, False, None, (1, 1)), device=device)
    reason = attnkit.registry.get_backend(backend).problem_support(problem)
    if reason is not None:
        pytest.skip(f"{backend} declines windows: {reason}")


@pytest.mark.parametrize("backend", backend_params())
@given(problem=windowed_problems(max_len=96))
def test_windowed_row_is_a_convex_combination_of_its_window(backend, problem, device):
    _skip_unless_windows(backend, device)
    _assert_convex_combination_of_visible_values(backend, problem, device)


@pytest.mark.parametrize("backend", backend_params())
@given(problem=problems(max_len=96), data=st.data())
def test_window_covering_every_key_is_no_window(backend, problem, device, data):
    """left >= M - 1 and right >= N - 1 (bottom-right offsets included) hide nothing: the same
    function, bitwise (it is normalised to the same problem, so the same kernels run)."""
    extra_left, extra_right = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))
    problem, (q, k, v), plain = _run(backend, problem, device)
    window = (problem.kv_len - 1 + extra_left, problem.q_len - 1 + extra_right)
    windowed = attention(q, k, v, causal=problem.causal, scale=problem.scale, window=window, backend=backend)
    assert torch.equal(windowed, plain), (
        f"{backend}: window {window} covering every key changed the output by "
        f"{(windowed.double() - plain.double()).abs().max().item():.3e} on {problem}"
    )


@pytest.mark.parametrize("backend", backend_params())
@given(problem=problems(max_len=96))
def test_window_zero_returns_the_aligned_value(backend, problem, device):
    """window (0, 0): row i sees key i + M - N alone (softmax of one score is 1), so it returns
    that value row, or zeros where i + M - N is not a key."""
    _skip_unless_windows(backend, device)
    problem = dataclasses.replace(problem, window=(0, 0))
    problem, (q, k, v), out = _run(backend, problem, device)
    offset = problem.kv_len - problem.q_len
    expected = torch.zeros(out.shape, dtype=torch.float64, device=device)
    rows = torch.arange(problem.q_len, device=device)
    keys = rows + offset
    inside = (keys >= 0) & (keys < problem.kv_len)
    expected[:, :, inside] = _per_head_kv(v, problem)[:, :, keys[inside]]
    error = (out.double() - expected).abs().max().item()
    slack = _slack(q, k, v, problem)
    assert error <= slack, f"{backend}: window (0, 0) differs from v[i + M - N] by {error:.3e}"


@pytest.mark.parametrize("backend", backend_params())
@given(problem=problems(max_len=96), data=st.data())
def test_windowed_rows_that_see_no_key_are_zero_with_zero_gradient(backend, problem, device, data):
    """With N > M and a right edge, the first rows' bands end before key 0: zeros and zero dq,
    every gradient finite."""
    _skip_unless_windows(backend, device)
    if backend in INTERPRETED:
        problem = fit_to_interpreter(problem)
    right = data.draw(st.integers(0, 2))
    q_len = max(problem.q_len, problem.kv_len + right + 2)
    window = (data.draw(st.integers(0, problem.kv_len + 2)), right)
    problem = dataclasses.replace(problem, q_len=q_len, window=window)
    hidden_rows = q_len - problem.kv_len - right
    q, k, v, grad_out = problem.tensors(device)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    try:
        out = attention(q, k, v, causal=problem.causal, scale=problem.scale, window=window, backend=backend)
    except UnsupportedProblemError:
        reject()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_out)
    assert all(torch.isfinite(x).all() for x in (out, dq, dk, dv)), f"{backend}: NaN/inf with hidden rows"
    for name, x in (("output", out), ("dq", dq)):
        largest = x[:, :, :hidden_rows].abs().max().item()
        assert largest == 0, (
            f"{backend}: the {hidden_rows} rows that see no key under window {window} have {name} up to "
            f"{largest:.3e}, not 0 ({problem})"
        )
