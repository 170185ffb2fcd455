"""The backend computes the same function as the float64 oracle: output and dq, dk, dv, under
the one tolerance rule (:mod:`attnkit.testing`), over drawn problems, windows and the pinned
edge cases."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from attnkit import UnsupportedProblemError
from attnkit.suite.checks import Declines, check_against_oracle, skip_if_declined
from attnkit.testing.edge_cases import EDGE_CASES, edge
from attnkit.testing.strategies import problems, windowed_problems


def test_backend_matches_reference(attnkit_backend, attnkit_device, request):
    """MHA/GQA/MQA, M != N, causal or not, odd lengths and head dims, any scale, strided,
    transposed and broadcast layouts, large and outlying values, every dtype."""
    declines = Declines(attnkit_backend, request)

    @given(case=problems())
    def check(case):
        declines.run(lambda: check_against_oracle(attnkit_backend, case, attnkit_device, declines))

    declines.drive(check)


def test_windowed_backend_matches_reference(attnkit_backend, attnkit_device, request):
    """Sliding windows, with and without causal, N != M, GQA, against the oracle's visibility."""
    declines = Declines(attnkit_backend, request)

    @given(case=windowed_problems(max_len=96))
    def check(case):
        declines.run(lambda: check_against_oracle(attnkit_backend, case, attnkit_device, declines))

    declines.drive(check)


@pytest.mark.parametrize("edge_case", list(EDGE_CASES))
def test_edge_case_matches_reference(attnkit_backend, edge_case, attnkit_device):
    """The pinned edge cases (:data:`attnkit.testing.edge_cases.EDGE_CASES`), one test item
    each: pytest-xdist then spreads them over its workers (on a GPU each compiles its own
    kernels, and one hypothesis test runs its examples one after another)."""
    case = EDGE_CASES[edge_case]
    skip_if_declined(attnkit_backend, lambda: check_against_oracle(attnkit_backend, case, attnkit_device))


def test_the_everyday_problem_runs_and_matches_the_oracle(attnkit_backend, attnkit_device):
    """A backend must accept the everyday case (D=64, N=M=40, causal) in some 16-bit dtype, so
    that declines in the tests above cannot hide a backend that runs nothing."""
    reasons = []
    for dtype in (torch.float16, torch.bfloat16):
        try:
            check_against_oracle(
                attnkit_backend,
                edge(q_len=40, kv_len=40, head_dim=64, value_dim=64, dtype=dtype),
                attnkit_device,
            )
            return
        except UnsupportedProblemError as err:
            reasons.append(str(err))
    pytest.fail(f"{attnkit_backend} declined the everyday problem (D=64, N=M=40) in fp16 and bf16: {reasons}")
