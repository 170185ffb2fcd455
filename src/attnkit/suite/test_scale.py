"""The scale tier: the backend at the sizes where kernels switch code paths, judged by the same
tolerance rule (:mod:`attnkit.testing.scale` lists the problems and the limits per device; the
oracle runs in blocks, :mod:`attnkit.testing.blocked_oracle`). Also: both sides of every
dispatch boundary the backend declares, a sequence alone and inside a batch, the backward
repeated bitwise where determinism is declared, and the log-sum-exp of rows that see few or no
keys where the backend exposes it.

Each test runs a fixed list and fails once, listing every problem outside the rule with the
lines that repeat it alone."""

from __future__ import annotations

import pytest
import torch

from attnkit import UnsupportedProblemError, attention
from attnkit.flash_autograd import PATHS
from attnkit.registry import get_backend
from attnkit.suite.checks import Declines, check_against_oracle
from attnkit.testing import compare_to_reference, run_with_grads
from attnkit.testing.scale import ScaleLimits, boundary_cases, scale_limits, tier, too_large
from attnkit.testing.strategies import AttentionCase


def _limits(backend: str, device: torch.device) -> ScaleLimits:
    return scale_limits(device, interpreted=get_backend(backend).is_interpreted(device))


def _check_each(backend: str, cases: list[AttentionCase], device, declines: Declines) -> int:
    """Check every case against the oracle; fail listing each one outside the rule. Returns how
    many ran (declined ones are noted, not failed)."""
    failures, ran = [], 0
    for case in cases:
        try:
            check_against_oracle(backend, case, device, declines, shrink=False)
            ran += 1
        except UnsupportedProblemError as err:
            declines.note(err)
        except AssertionError as err:
            ran += 1
            failures.append(str(err))
    if failures:
        pytest.fail(f"{len(failures)} of {len(cases)} problems outside the rule:\n\n" + "\n\n".join(failures))
    return ran


def _skip_if_all_declined(backend: str, ran: int, declines: Declines) -> None:
    if ran == 0:
        reasons = list(dict.fromkeys(declines.reasons))[:3]
        pytest.skip(f"{backend} declined every problem of the scale tier: " + " | ".join(reasons))


def test_large_problems_match_the_oracle(attnkit_backend, attnkit_device, request):
    """Lengths spread log-uniformly up to the device's largest (16K or 32K on a GPU, 1024 on a
    CPU; 96 for a backend interpreted on the CPU), every head dim to 256, long-KV decode,
    windows, B * H past 65,535: output and gradients within the tolerance rule."""
    declines = Declines(attnkit_backend, request)
    cases = tier(_limits(attnkit_backend, attnkit_device))
    _skip_if_all_declined(
        attnkit_backend, _check_each(attnkit_backend, cases, attnkit_device, declines), declines
    )


def test_both_sides_of_each_dispatch_boundary_match_the_oracle(attnkit_backend, attnkit_device, request):
    """Just below, at and just above every size at which the backend declares it switches code
    paths (:class:`attnkit.DispatchBoundary`)."""
    boundaries = get_backend(attnkit_backend).dispatch_boundaries
    limits = _limits(attnkit_backend, attnkit_device)
    if not boundaries:
        pytest.skip(
            f"{attnkit_backend} declares no dispatch boundaries; test_large_problems_match_the_oracle "
            f"covers sizes spread log-uniformly up to N = M = {limits.max_len}"
        )
    declines = Declines(attnkit_backend, request)
    cases, left_out = [], {}
    for boundary in boundaries:
        for case in boundary_cases(boundary):
            reason = too_large(case, limits)
            if reason is None:
                cases.append(case)
            else:  # one line per boundary: its sides differ by a size or two
                left_out.setdefault(boundary.name, reason)
    ran = _check_each(attnkit_backend, cases, attnkit_device, declines)
    _skip_if_all_declined(attnkit_backend, ran, declines)
    if left_out:
        pytest.skip(
            f"{ran} boundary problems within the rule; {len(left_out)} boundaries left out beyond the "
            f"tier's limits on {limits.label}: "
            + "; ".join(f"{name} ({why})" for name, why in left_out.items())
        )


def _batch_case(limits: ScaleLimits) -> AttentionCase:
    n = min(limits.max_len // 4, 2048)
    return AttentionCase.make(batch=3, q_heads=4, kv_heads=2, q_len=n, kv_len=n + 3, head_dim=64, causal=True,
                              dtype=torch.bfloat16, seed=11)  # fmt: skip


def test_a_sequence_gives_the_same_result_alone_and_inside_a_batch(attnkit_backend, attnkit_device):
    """The middle sequence of a batch of three, then alone: output, dq, dk, dv bitwise equal
    where the backend declares ``batch_invariant`` for the device's type, else within the
    tolerance rule's bound."""
    backend = get_backend(attnkit_backend)
    case = _batch_case(_limits(attnkit_backend, attnkit_device))
    q, k, v, grad_out = case.tensors(attnkit_device)
    gradients = not backend.is_forward_only(attnkit_device)

    def fn(a, b, c):
        return attention(a, b, c, **case.kwargs, backend=attnkit_backend)

    def run(a, b, c, g):
        return run_with_grads(fn, a, b, c, g if gradients else None)

    try:
        batched = run(q, k, v, grad_out)
    except UnsupportedProblemError as err:
        pytest.skip(f"{attnkit_backend} declines {case}: {err}")
    one = slice(1, 2)
    alone = run(q[one], k[one], v[one], grad_out[one])
    if backend.is_batch_invariant(attnkit_device):
        differ = [name for name in alone if not torch.equal(alone[name], batched[name][one])]
        assert not differ, (
            f"{attnkit_backend} declares batch_invariant on {attnkit_device.type}, but {differ} of "
            f"sequence 1 differ alone and in a batch of 3 on {case}"
        )
        return
    checks = compare_to_reference(fn, q[one], k[one], v[one], grad_out=grad_out[one] if gradients else None,
                                  **case.kwargs)  # fmt: skip
    outside = []
    for check in checks:
        moved = (alone[check.quantity].double() - batched[check.quantity][one].double()).abs().max().item()
        if not moved <= check.bound:
            outside.append(f"{check.quantity}: {moved:.3e} > the rule's bound {check.bound:.3e}")
    assert not outside, f"{attnkit_backend}: sequence 1 alone vs in a batch of 3 on {case}: {outside}"


def _determinism_cases(limits: ScaleLimits) -> list[AttentionCase]:
    n = min(limits.max_len // 4, 4096)
    return [
        # GQA: dk and dv sum over a group of query heads, where atomics would reorder.
        AttentionCase.make(q_heads=8, kv_heads=2, q_len=n, kv_len=n, head_dim=128, causal=True,
                           dtype=torch.bfloat16, seed=21),
        AttentionCase.make(batch=2, q_heads=8, kv_heads=1, q_len=16, kv_len=limits.decode_kv_len // 4,
                           head_dim=64, dtype=torch.float16, seed=22),
    ]  # fmt: skip


def test_repeated_backward_is_bitwise_equal(attnkit_backend, attnkit_device):
    """Where the backend declares ``deterministic`` for the device's type: output, dq, dk, dv of
    the same call, repeated, bitwise equal, at scale (GQA, where dk and dv sum over query heads)."""
    backend = get_backend(attnkit_backend)
    if not backend.is_deterministic(attnkit_device):
        pytest.skip(
            f"{attnkit_backend} does not declare deterministic on {attnkit_device.type} "
            f"(Backend.deterministic: {backend.deterministic})"
        )
    limits = _limits(attnkit_backend, attnkit_device)
    forward_only = backend.is_forward_only(attnkit_device)
    ran = 0
    for case in _determinism_cases(limits):
        q, k, v, grad_out = case.tensors(attnkit_device)

        def call(a, b, c, case=case):
            return attention(a, b, c, **case.kwargs, backend=attnkit_backend)

        try:
            first = run_with_grads(call, q, k, v, None if forward_only else grad_out)
        except UnsupportedProblemError:
            continue
        ran += 1
        for repeat in range(1, limits.repeats):
            again = run_with_grads(call, q, k, v, None if forward_only else grad_out)
            differ = [name for name in first if not torch.equal(first[name], again[name])]
            assert not differ, f"{attnkit_backend}: call {repeat + 1} changed {differ} bitwise on {case}"
    if ran == 0:
        pytest.skip(f"{attnkit_backend} declined every determinism problem")


def test_log_sum_exp_of_rows_that_see_few_or_no_keys(attnkit_backend, attnkit_device):
    """Where the backend exposes its log-sum-exp (attnkit's flash paths, through
    ``attnkit::flash_forward``): +inf for a row that sees no key (so exp(s - lse) is 0 in a
    backward), the row's one score for a row that sees one key, and the float64 logsumexp of
    the visible scores for rows that see a few, within float32 rounding."""
    if attnkit_backend not in PATHS:
        pytest.skip(f"{attnkit_backend} exposes no log-sum-exp (attnkit's flash paths {sorted(PATHS)} do)")
    # Causal with N = M + 3, and a window (1, 0) below: rows 0-2 see no key, row 3 one, the rest two.
    case = AttentionCase.make(q_heads=2, q_len=67, kv_len=64, head_dim=32, causal=True, window=(1, 0),
                              dtype=torch.float16, seed=31)  # fmt: skip
    q, k, v, _ = case.tensors(attnkit_device)
    p = case.problem
    try:
        _out, lse = torch.ops.attnkit.flash_forward(q, k, v, True, p.scale, attnkit_backend, *p.window)
    except UnsupportedProblemError as err:
        pytest.skip(f"{attnkit_backend} declines {case}: {err}")
    from attnkit.reference import attention_scores

    scores = attention_scores(q.double(), k.double(), p).flatten(1, 2)  # (B, Hq, N, M), -inf where hidden
    expected = torch.logsumexp(scores, dim=-1)  # -inf where a row sees nothing
    hidden = torch.isneginf(expected)
    assert lse[hidden].isposinf().all(), (
        f"{attnkit_backend}: rows that see no key have log-sum-exp {lse[hidden].unique().tolist()}, not +inf"
    )
    seen = ~hidden
    error = (lse[seen].double() - expected[seen]).abs()
    # float32 rounding of the scores and of log(sum): a few ulps of the largest magnitude involved.
    allowed = 8 * torch.finfo(torch.float32).eps * (1 + scores.nan_to_num(neginf=0).abs().amax(-1))[seen]
    assert (error <= allowed).all(), (
        f"{attnkit_backend}: log-sum-exp of rows that see one or two keys off by up to "
        f"{error.max().item():.3e} (allowed {allowed.max().item():.3e})"
    )
