"""Shipped test utilities: input generation and the one tolerance rule every test uses.

:func:`compare_to_reference` runs a kernel and the oracle and returns one :class:`QuantityCheck`
per quantity; :func:`assert_close_to_reference` fails with every quantity outside the rule.
Beside this module: :mod:`attnkit.testing.strategies` (hypothesis strategies of attention
calls), :mod:`attnkit.testing.decode_strategies` (decode shapes and KV caches),
:mod:`attnkit.testing.edge_cases` (pinned cases), :mod:`attnkit.testing.profiles` (hypothesis
profiles) and :mod:`attnkit_pytest` (``--attnkit-backend``); the suite built on
them is :mod:`attnkit.suite`.

The tolerance rule (FlashAttention's): a path's error against the float64 oracle may be at most
``factor`` times the error that the naive path makes in the same dtype, plus a floor:

    error(path) <= factor[quantity] * error(naive in dtype) + floor

* The yardstick, the naive path in the input dtype, computes as an ideal fused kernel does and
  as FlashAttention's low-precision reference does: scores and softmax in float32, the weights
  rounded to the dtype before P @ V (:mod:`attnkit.reference`). A softmax in fp16/bf16 would be
  2-4x less accurate (median; up to ~95x on large logits) and the same factors would admit that
  much more error: ``python -m attnkit_tools.pages.yardstick`` measures it, docs/<gpu>/YARDSTICK.md
  has the table.
* ``factor`` is 2 for the output and 3 for gradients. Output: 2x leaves room for a different
  summation order (online softmax rescaling, blocked accumulation). Gradients pass through two
  more matmuls (dS = P * (dP - delta), then dS @ K or dS^T @ Q), each rounding in a different
  place than autograd's (fused kernels round dS to the dtype, autograd rounds dP), and dK/dV
  also sum over the query-head group, so they get 3x, as FlashAttention's tests allow for some
  gradients.
* ``floor`` covers cases where the naive path happens to be (nearly) exact, e.g. N = 1, or a
  float64 run where the naive path *is* the oracle: one rounding of the result to the output
  dtype (``eps(dtype) * max|ref|``, and at least the dtype's subnormal spacing: below its
  smallest normal number, fp16's 6.1e-5, a rounding is absolute, 2**-24 whatever the value,
  which a gradient scaled by a tiny ``scale`` reaches) plus the reordering error of the
  float32 (float64 for float64 inputs) accumulation, ``eps(acc) * sqrt(n) * T``. T is the
  largest *sum of absolute terms* that feeds one element (the classic bound for a sum is eps
  times the sum of |terms|, not of |result|): a gradient that is mathematically 0, such as dq
  when each query sees one key, is still computed as a difference of O(1) terms. n is the
  number of terms; sqrt(n) is the random-walk growth of rounding errors with n. Each weight
  P_ij enters T as P_ij * (1 + |s_ij| + |m_i|) (s the scaled logit, m its row max): a rounding
  of relative size eps in s or m moves exp(s - m) by P * |s| * eps, so large logits are
  ill-conditioned for every implementation, the oracle's float64 aside.
  FlashAttention-2 backwards compute delta = rowsum(dO * O) from O *as stored*, rounded to the
  input dtype; that rounding, eps(dtype) * sum_d |dO_id O_id|, enters dS = P * (dP - delta)
  where dP and delta nearly cancel, and reaches dq and dk. Its propagated size is added as
  ``eps(dtype) * R`` (R = 0 for out and dv). Last, the smallest normal number of the
  accumulator dtype: below it rounding is absolute (subnormals), so no relative bound applies.

Error is the maximum absolute difference, as in FlashAttention's tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: Allowed multiple of the naive same-dtype error, per quantity (see the module docstring).
ERROR_FACTORS = {"out": 2.0, "dq": 3.0, "dk": 3.0, "dv": 3.0}

#: Memory layouts the suite draws from; each yields (B, H, S, X)-shaped tensors.
LAYOUTS = ("contiguous", "bnhd", "strided", "expanded")

#: Input magnitudes: unit normal; large logits (q * 30); rare large outliers.
MAGNITUDES = ("unit", "large", "outliers")


def max_abs_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| in float64; NaN or inf anywhere in ``actual`` gives inf."""
    if not torch.isfinite(actual).all():
        return math.inf
    return (actual.double() - expected.double()).abs().max().item()


def error_floor(
    reference: torch.Tensor,
    term_magnitude: float,
    dtype: torch.dtype,
    n_terms: int,
    stored_o_magnitude: float = 0.0,
) -> float:
    """The absolute floor of the tolerance rule (see the module docstring)."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    info = torch.finfo(dtype)
    rounding = (
        info.eps * (reference.abs().max().item() + stored_o_magnitude) + info.tiny * info.eps
    )  # the subnormal spacing
    reordering = torch.finfo(acc).eps * math.sqrt(max(n_terms, 1)) * term_magnitude
    return rounding + reordering + torch.finfo(acc).tiny


def term_magnitudes(q, k, v, grad_out, problem) -> dict[str, tuple[float, float]]:
    """For each quantity: (T, R) of the floor (see the module docstring), in float64, computed
    in blocks of query rows (:mod:`attnkit.testing.blocked_oracle`).

    With P the weights, dP = dO V^T, delta = rowsum(P * dP) and dS = P * (dP - delta):
    out = P V, dv = P^T dO, dq = scale * dS K, dk = scale * dS^T Q.
    """
    from attnkit.testing.blocked_oracle import rule_inputs

    return rule_inputs(q, k, v, grad_out, problem).magnitudes


@dataclass(frozen=True)
class QuantityCheck:
    """One compared quantity (output or a gradient) of one path."""

    quantity: str
    error: float
    baseline_error: float
    bound: float

    @property
    def ok(self) -> bool:
        return self.error <= self.bound

    def describe(self) -> str:
        if self.baseline_error > 0:
            versus = f"error/naive = {self.error / self.baseline_error:.2f}x"
        else:  # no ratio to give: say what happened instead
            versus = f"error {self.error:.1e} where the naive path in the same dtype is exact"
        return (
            f"{self.quantity}: error {self.error:.3e} vs bound {self.bound:.3e} "
            f"(= {ERROR_FACTORS[self.quantity]:g} x naive same-dtype error {self.baseline_error:.3e} "
            f"+ floor); {versus}"
        )


def check_quantity(
    quantity: str,
    actual: torch.Tensor,
    baseline: torch.Tensor,
    reference: torch.Tensor,
    magnitudes: tuple[float, float],
    dtype: torch.dtype,
    n_terms: int,
) -> QuantityCheck:
    """Apply the tolerance rule to one quantity; ``magnitudes`` is (T, R) of the floor."""
    baseline_error = max_abs_error(baseline, reference)
    floor = error_floor(reference, magnitudes[0], dtype, n_terms, magnitudes[1])
    bound = ERROR_FACTORS[quantity] * baseline_error + floor
    return QuantityCheck(quantity, max_abs_error(actual, reference), baseline_error, bound)


AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def run_with_grads(
    fn: AttentionFn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """Call ``fn(q, k, v)`` on fresh leaves; return out (and dq, dk, dv if grad_out is given)."""
    leaves = [x.detach().requires_grad_(grad_out is not None) for x in (q, k, v)]
    out = fn(*leaves)
    result = {"out": out.detach()}
    if grad_out is not None:
        grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype))
        result.update(dq=grads[0], dk=grads[1], dv=grads[2])
    return result


def compare_to_reference(
    fn: AttentionFn,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    grad_out: torch.Tensor | None = None,
    window: tuple[int, int] | None = None,
) -> list[QuantityCheck]:
    """Run ``fn`` and the naive path in q's dtype, both against the float64 oracle (the oracle
    and the naive path computed in blocks of query rows, :mod:`attnkit.testing.blocked_oracle`,
    so any size the kernel runs can be judged)."""
    from attnkit.inputs import check_inputs
    from attnkit.testing.blocked_oracle import rule_inputs

    problem = check_inputs(q, k, v, causal, scale, window)
    actual = run_with_grads(fn, q, k, v, grad_out)
    # The oracle, the yardstick and the floor's terms, in blocks of rows: bounded memory at any size.
    expected = rule_inputs(q, k, v, grad_out, problem)
    baseline, reference, magnitudes = expected.baseline, expected.reference, expected.magnitudes
    key_sum = max(problem.kv_len, problem.head_dim, problem.value_dim)
    query_sum = max(problem.q_len * problem.group_size, problem.head_dim, problem.value_dim)
    lengths = {"out": key_sum, "dq": key_sum, "dk": query_sum, "dv": query_sum}
    return [
        check_quantity(
            name, actual[name], baseline[name], reference[name], magnitudes[name], q.dtype, lengths[name]
        )
        for name in actual
    ]


def assert_close_to_reference(label: str, checks: list[QuantityCheck]) -> None:
    """Fail with every quantity that broke the rule, named, with its numbers."""
    failed = [c for c in checks if not c.ok]
    if failed:
        lines = "\n  ".join(c.describe() for c in failed)
        raise AssertionError(f"{label}: {len(failed)} quantity(ies) outside the tolerance rule\n  {lines}")


def make_tensor(
    shape: tuple[int, int, int, int],
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    generator: torch.Generator,
    layout: str = "contiguous",
    magnitude: str = "unit",
) -> torch.Tensor:
    """A random (B, H, S, X) tensor with the requested memory layout and magnitude.

    Layouts: ``contiguous``; ``bnhd`` (stored as (B, S, H, X), then transposed); ``strided``
    (every other row of a wider buffer: no dimension is contiguous but the last); ``expanded``
    (one batch entry broadcast over the batch with stride 0).
    """
    b, h, s, x = shape
    if layout == "contiguous":
        base = torch.randn(shape, generator=generator, dtype=torch.float32)
    elif layout == "bnhd":
        base = torch.randn(b, s, h, x, generator=generator, dtype=torch.float32).transpose(1, 2)
    elif layout == "strided":
        base = torch.randn(b, h, 2 * s, x + 3, generator=generator, dtype=torch.float32)[:, :, ::2, :x]
    elif layout == "expanded":
        base = torch.randn(1, h, s, x, generator=generator, dtype=torch.float32).expand(b, h, s, x)
    else:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    if magnitude == "large":
        base = base * 30.0
    elif magnitude == "outliers":
        spikes = torch.randn(base.shape, generator=generator) * 10.0
        keep = torch.rand(base.shape, generator=generator) < 0.01
        base = base + spikes * keep
    elif magnitude != "unit":
        raise ValueError(f"magnitude: expected one of {MAGNITUDES}, got {magnitude!r}")
    # Cast on the host, then move: the stride pattern survives .to() for non-expanded layouts.
    converted = base.to(dtype)
    if layout == "expanded":
        converted = converted[:1].to(device).expand(b, h, s, x)
    elif layout in ("bnhd", "strided"):
        converted = _move_keeping_strides(base, dtype, device, layout)
    else:
        converted = converted.to(device)
    return converted


def _move_keeping_strides(base, dtype, device, layout):
    b, h, s, x = base.shape
    if layout == "bnhd":
        return base.transpose(1, 2).contiguous().to(dtype=dtype, device=device).transpose(1, 2)
    wide = torch.zeros(b, h, 2 * s, x + 3, dtype=dtype, device=device)
    wide[:, :, ::2, :x] = base.to(dtype=dtype, device=device)
    return wide[:, :, ::2, :x]
