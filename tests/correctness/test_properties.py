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
from strategies import fit_to_interpreter, problems

from attnkit import UnsupportedProblemError, attention
from attnkit.inputs import check_inputs
from attnkit.reference import causal_visibility
from attnkit.testing import error_floor, term_magnitudes


def _slack(q, k, v, problem) -> float:
    """Allowed |difference| between two outputs that are mathematically equal."""
    attn_problem = check_inputs(q, k, v, problem.causal, problem.scale)
    terms, _ = term_magnitudes(q, k, v, None, attn_problem)["out"]
    floor = error_floor(v, terms, v.dtype, max(problem.kv_len, problem.value_dim))
    return 2 * floor + torch.finfo(v.dtype).eps * v.abs().max().item()


def _run(backend, problem, device, **overrides):
    if backend in INTERPRETED:
        problem = fit_to_interpreter(problem)
    q, k, v, _ = problem.tensors(device)
    kwargs = {"causal": problem.causal, "scale": problem.scale, "backend": backend, **overrides}
    try:
        return problem, (q, k, v), attention(q, k, v, **kwargs)
    except UnsupportedProblemError:
        reject()  # this backend declines these inputs; draw another problem


def _visible(problem, device):
    """(N, M) mask of keys each query sees."""
    if problem.causal:
        return causal_visibility(problem.q_len, problem.kv_len, device)
    return torch.ones(problem.q_len, problem.kv_len, dtype=torch.bool, device=device)


def _per_head_kv(x, problem):
    # (B, Hkv, M, X) -> (B, Hq, M, X): query head h reads kv head h // G.
    return x.repeat_interleave(problem.group_size, dim=1).double()


@pytest.mark.parametrize("backend", backend_params())
@given(problem=problems(max_len=96))
def test_each_row_is_a_convex_combination_of_visible_values(backend, problem, device):
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
