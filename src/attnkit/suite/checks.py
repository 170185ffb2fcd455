"""What the suite's tests share: running a case on a backend, turning a decline into a skip
with the backend's own reason, and the slack of the oracle-free properties."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
from hypothesis import reject, settings
from hypothesis.errors import Unsatisfiable

from attnkit import UnsupportedProblemError, attention
from attnkit.inputs import check_inputs
from attnkit.registry import get_backend
from attnkit.testing import assert_close_to_reference, compare_to_reference, error_floor, term_magnitudes
from attnkit.testing.selection import DECLINED
from attnkit.testing.strategies import AttentionCase


def sized_for(backend: str, case: AttentionCase, device: torch.device) -> AttentionCase:
    """``case``, shrunk where ``backend`` runs interpreted (:meth:`Backend.is_interpreted
    <attnkit.registry.Backend.is_interpreted>`: e.g. Triton's interpreter on the CPU, ~1000x
    slower than on a GPU; :meth:`AttentionCase.fit_to_interpreter`)."""
    return case.fit_to_interpreter() if get_backend(backend).is_interpreted(device) else case


class Declines:
    """The problems one test's backend declined. In a hypothesis test a decline draws another
    problem; when every draw was declined the test is skipped with the backend's reasons, and
    the run ends with a summary of all declines (:mod:`attnkit_pytest`)."""

    def __init__(self, backend: str, request: pytest.FixtureRequest):
        self.backend, self.test = backend, request.node.nodeid
        self.device = request.getfixturevalue("attnkit_device")
        self.ran, self.reasons = 0, []
        self.declined = request.config.stash.setdefault(DECLINED, [])

    def note(self, err: UnsupportedProblemError) -> None:
        message = str(err)
        assert self.backend in message, f"a decline of {self.backend!r} does not name it: {message}"
        self.reasons.append(message)
        self.declined.append((self.test, self.backend, message))

    def run(self, step: Callable[[], object]):
        """``step()``; a decline is noted and the hypothesis example rejected."""
        try:
            result = step()
        except UnsupportedProblemError as err:
            self.note(err)
            reject()
        self.ran += 1
        return result

    def drive(self, given_test: Callable[[], None]) -> None:
        """Run a ``@given`` test, then skip with the reasons if the backend declined every draw.
        A backend that compiles each problem class on this device draws fewer examples
        (:func:`examples_for_compiled`)."""
        if get_backend(self.backend).is_compiled_per_class(self.device):
            given_test = settings(max_examples=examples_for_compiled(settings().max_examples))(given_test)
        with contextlib.suppress(Unsatisfiable):  # every example was rejected: reported below
            given_test()
        if self.ran == 0:
            distinct = list(dict.fromkeys(self.reasons))
            pytest.skip(f"{self.backend} declined every drawn problem: " + " | ".join(distinct[:3]))


def examples_for_compiled(max_examples: int) -> int:
    """The hypothesis examples a test draws for a backend compiled per problem class
    (:attr:`Backend.compiled_per_class <attnkit.registry.Backend.compiled_per_class>`): each drawn
    problem is a new class and pays a compilation (10-80 s for FlexAttention on an H200), so a
    quarter of the profile's, at least 2; the pinned edge cases still run in full."""
    return max(2, max_examples // 4)


def check_against_oracle(
    backend: str,
    case: AttentionCase,
    device: torch.device,
    declines: Declines | None = None,
    shrink: bool = True,
) -> None:
    """Output and dq, dk, dv of ``backend`` on ``case`` within the tolerance rule of the
    float64 oracle (:func:`attnkit.testing.compare_to_reference`). A backend that declines the
    call with gradients (a forward-only kernel) has its forward checked alone, the gradients'
    decline noted in ``declines``; one that declines the forward too raises
    UnsupportedProblemError. ``shrink``: fit the case to an interpreted backend
    (:func:`sized_for`); the scale tier sizes its problems itself (False)."""
    if shrink:
        case = sized_for(backend, case, device)
    q, k, v, grad_out = case.tensors(device)

    def compare(with_grad: bool):
        return compare_to_reference(
            lambda a, b, c: attention(a, b, c, **case.kwargs, backend=backend),
            q,
            k,
            v,
            grad_out=grad_out if with_grad else None,
            **case.kwargs,
        )

    try:
        checks = compare(with_grad=True)
    except UnsupportedProblemError as err:
        checks = compare(with_grad=False)
        if declines is not None:
            declines.note(err)
    try:
        assert_close_to_reference(f"backend {backend!r} on {case}", checks)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{reproducer(backend, case, device)}") from None


def reproducer(backend: str, case: AttentionCase, device: torch.device) -> str:
    """The lines that repeat :func:`check_against_oracle` on this one case, outside the suite and
    without hypothesis: a kernel's author pastes them into a test of their own (the case is
    already sized for ``device``, so the tensors are the failing ones)."""
    code = (
        "import torch\n"
        "from attnkit.suite.checks import check_against_oracle\n"
        "from attnkit.testing.strategies import AttentionCase\n"
        f"check_against_oracle({backend!r}, {case.as_code()}, torch.device({str(device)!r}), shrink=False)"
    )
    indented = code.replace("\n", "\n    ")
    return f"Repeat this one call alone (the same tensors, no hypothesis):\n    {indented}"


def skip_if_declined(backend: str, step: Callable[[], object]):
    """``step()``, or a skip with the backend's reason if it declines the problem."""
    try:
        return step()
    except UnsupportedProblemError as err:
        pytest.skip(f"{backend} declines this problem: {err}")


def slack(q, k, v, case: AttentionCase) -> float:
    """Allowed |difference| between two outputs that are mathematically equal: the rule's floor
    (one rounding of the output plus accumulation reordering), doubled because both sides carry
    it, plus one ulp of max|v| because fused kernels round the weights P to the input dtype
    before P @ V."""
    problem = check_inputs(q, k, v, case.problem.causal, case.scale, case.window)
    terms, _ = term_magnitudes(q, k, v, None, problem)["out"]
    floor = error_floor(v, terms, v.dtype, max(problem.kv_len, problem.value_dim))
    return 2 * floor + torch.finfo(v.dtype).eps * v.abs().max().item()


def per_head_kv(x: torch.Tensor, case: AttentionCase) -> torch.Tensor:
    """(B, Hkv, M, X) -> (B, Hq, M, X) in float64: query head h reads kv head h // G."""
    return x.repeat_interleave(case.problem.group_size, dim=1).double()
