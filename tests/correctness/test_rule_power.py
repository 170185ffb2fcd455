"""The tolerance rule is not vacuous: it rejects realistic kernel bugs.

Each mutant is a small, plausible mistake; the rule must flag it on a problem where the bug
matters, in each 16-bit dtype and in float32.
"""

from __future__ import annotations

import pytest
import torch

from attnkit import UnsupportedProblemError, attention
from attnkit.testing import assert_close_to_reference, compare_to_reference, error_floor, make_tensor


def _mask_off_by_one(q, k, v, causal, scale):
    # Top-left instead of bottom-right alignment when N != M: the classic mask offset bug.
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)


def _last_key_block_dropped(q, k, v, causal, scale):
    # A loop bound that forgets the partial last block (M % block != 0).
    return attention(q, k[:, :, :-3], v[:, :, :-3], causal=causal, scale=scale, backend="tiled")


def _scale_slightly_wrong(q, k, v, causal, scale):
    # sqrt(D) vs sqrt(D + something): a 3% error in the softmax temperature.
    return attention(q, k, v, causal=causal, scale=scale * 1.03, backend="tiled")


class _ZeroLastRowGrad(torch.autograd.Function):
    """Identity forward; backward drops the last query row's gradient, as a dQ pass that skips
    the partial last block would."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        grad[:, :, -1] = 0
        return grad


def _dq_tail_dropped(q, k, v, causal, scale):
    return attention(_ZeroLastRowGrad.apply(q), k, v, causal=causal, scale=scale, backend="tiled")


MUTANTS = {
    "mask-top-left": _mask_off_by_one,
    "last-key-block-dropped": _last_key_block_dropped,
    "scale-3pct": _scale_slightly_wrong,
    "dq-last-row-dropped": _dq_tail_dropped,
}


def _problem(dtype, device):
    """GQA, N != M (so a top-left mask differs), M = 67 (a partial last key block)."""
    gen = torch.Generator().manual_seed(1)
    shape_q, shape_kv = (2, 4, 45, 40), (2, 2, 67, 40)
    q = make_tensor(shape_q, dtype=dtype, device=device, generator=gen)
    k = make_tensor(shape_kv, dtype=dtype, device=device, generator=gen)
    v = make_tensor(shape_kv, dtype=dtype, device=device, generator=gen)
    return q, k, v, torch.randn(shape_q, generator=gen).to(device=device, dtype=dtype)


@pytest.mark.device_independent
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_rule_rejects_mutant(mutant, dtype):
    q, k, v, grad_out = _problem(dtype, "cpu")
    fn = MUTANTS[mutant]
    checks = compare_to_reference(
        lambda a, b, c: fn(a, b, c, True, 40**-0.5), q, k, v, causal=True, scale=None, grad_out=grad_out
    )
    caught = [c.quantity for c in checks if not c.ok]
    assert caught, f"the rule let mutant {mutant!r} pass in {dtype}: " + "; ".join(
        c.describe() for c in checks
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_rule_accepts_every_correct_path(backend, dtype, device):
    """Control for the mutants above: every path passes the same problem, in the same dtypes."""
    q, k, v, grad_out = _problem(dtype, device)
    try:
        checks = compare_to_reference(
            lambda a, b, c: attention(a, b, c, causal=True, backend=backend),
            q, k, v, causal=True, scale=None, grad_out=grad_out,
        )  # fmt: skip
    except UnsupportedProblemError as err:
        pytest.skip(f"{backend} declines {dtype}: {err}")
    assert_close_to_reference(f"unmutated {backend} in {dtype}", checks)


@pytest.mark.device_independent
def test_floor_holds_one_subnormal_rounding_of_fp16():
    # A gradient scaled by a tiny scale (the H100's thorough run drew 2.6e-6) lands below fp16's
    # smallest normal number, where one rounding is 2**-24 whatever the value: the rule's
    # "one rounding of the result" must allow that much, and no more than a few of them.
    tiny_result = torch.full((4,), 1e-6, dtype=torch.float64)
    floor = error_floor(tiny_result, term_magnitude=0.0, dtype=torch.float16, n_terms=1)
    assert 2.0**-24 <= floor < 2 * 2.0**-24, f"fp16 floor {floor:.3e} for a 1e-6 result"
    for dtype in (torch.bfloat16, torch.float32):
        floor = error_floor(tiny_result, term_magnitude=0.0, dtype=dtype, n_terms=1)
        relative = torch.finfo(dtype).eps * 1e-6
        assert floor < 1.01 * relative, f"{dtype}: floor {floor:.3e} beyond one relative rounding"


@pytest.mark.device_independent
def test_a_failure_where_the_naive_path_is_exact_says_so_instead_of_an_infinite_ratio():
    from attnkit.testing import QuantityCheck

    exact = QuantityCheck("out", error=3e-3, baseline_error=0.0, bound=1e-6).describe()
    assert "error 3.0e-03 where the naive path in the same dtype is exact" in exact, exact
    assert "inf" not in exact, exact
    ratio = QuantityCheck("out", error=3e-3, baseline_error=1e-3, bound=2e-3).describe()
    assert "error/naive = 3.00x" in ratio, ratio


@pytest.mark.device_independent
def test_a_drawn_case_prints_as_the_call_that_makes_it_not_on_the_meta_device():
    from attnkit.testing.strategies import AttentionCase

    case = AttentionCase.make(q_len=5, kv_len=7, causal=True, seed=3)
    assert "meta" not in repr(case) and repr(case).startswith("AttentionCase.make("), repr(case)
    assert eval(repr(case), {"AttentionCase": AttentionCase, "torch": torch}) == case
