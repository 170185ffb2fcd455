"""Every backend computes the same function as the float64 oracle: output and dq, dk, dv.

The tolerance rule lives in :mod:`attnkit.testing` and is used unchanged for every backend,
dtype and quantity.
"""

from __future__ import annotations

import pytest
import torch
from conftest import INTERPRETED, backend_params
from hypothesis import given
from strategies import CUDNN_MASKED_FLOAT16, Problem, fit_to_interpreter, problems, windowed_problems

from attnkit import UnsupportedProblemError, attention
from attnkit.testing import assert_close_to_reference, compare_to_reference


def _edge(**overrides) -> Problem:
    base = dict(
        batch=1, q_heads=2, kv_heads=2, q_len=16, kv_len=16, head_dim=32, value_dim=32, causal=True,
        dtype=torch.float32, scale=None, q_layout="contiguous", kv_layout="contiguous",
        magnitude="unit", seed=0,
    )  # fmt: skip
    return Problem(**{**base, **overrides})


#: Cases that broke, or would break, real attention kernels; every backend runs each one.
EDGE_CASES = {
    "single-token": _edge(q_len=1, kv_len=1, head_dim=16, value_dim=16),
    "decode-gqa": _edge(q_len=1, kv_len=37, q_heads=4, kv_heads=1, head_dim=40, value_dim=40),
    "rows-see-no-key": _edge(q_len=37, kv_len=13, head_dim=24, value_dim=40, dtype=torch.bfloat16),
    "block-edge-fp16": _edge(q_len=64, kv_len=64, head_dim=64, value_dim=64, dtype=torch.float16),
    "just-past-blocks": _edge(
        q_len=65, kv_len=129, causal=False, head_dim=80, value_dim=80, dtype=torch.bfloat16
    ),
    "scale-zero": _edge(q_len=7, kv_len=19, scale=0.0),
    "negative-scale": _edge(q_len=9, kv_len=9, scale=-0.3, dtype=torch.float16),
    "mqa": _edge(q_heads=4, kv_heads=1, q_len=33, kv_len=33, dtype=torch.bfloat16),
    "large-logits": _edge(q_len=48, kv_len=48, magnitude="large", dtype=torch.bfloat16),
    "outliers": _edge(
        q_len=31, kv_len=47, head_dim=96, value_dim=96, magnitude="outliers", dtype=torch.float16
    ),
    "head-dim-256": _edge(q_len=17, kv_len=17, head_dim=256, value_dim=256),
    "strided-layouts": _edge(q_len=29, kv_len=41, q_layout="bnhd", kv_layout="strided", causal=False),
    "expanded-kv": _edge(batch=2, q_len=23, kv_len=23, kv_layout="expanded", dtype=torch.bfloat16),
    "float64": _edge(q_len=50, kv_len=70, q_heads=3, kv_heads=1, dtype=torch.float64),
    # Drawn by the dev profile: float64 scores at this scale are normal numbers, so dq and dk
    # are ~1e-205, not 0 (the SDPA path once zeroed q below float32's smallest normal).
    "tiny-scale-float64": _edge(q_len=9, kv_len=12, dtype=torch.float64, scale=7.8e-207),
    # Drawn by the thorough profile on the CPU: a float32-subnormal scale with large operands
    # gives dk ~3e-37, a normal number (the SDPA path once zeroed q below float32's smallest
    # normal and returned dk = 0).
    "subnormal-scale-bf16": _edge(
        q_len=2,
        kv_len=2,
        head_dim=3,
        value_dim=3,
        causal=False,
        dtype=torch.bfloat16,
        scale=6.786719798781322e-39,
        magnitude="large",
    ),
    # Found on the H100 by the ci profile (as a windowed problem): cuDNN's backward (torch 2.11)
    # returned inf gradients at a float32-subnormal scale.
    "subnormal-scale-bf16-d32": _edge(
        batch=5,
        q_len=62,
        kv_len=25,
        head_dim=32,
        value_dim=16,
        causal=False,
        dtype=torch.bfloat16,
        scale=2.4784527358487718e-42,
        magnitude="outliers",
    ),
    # Found on the H100 by the ci profile: Triton's compiled forward read out of bounds (wrong
    # rows, or an illegal memory access) with a value tile narrower than the key tile; CUDA
    # now declines it (triton_problem_support), every other path must still be right.
    "narrow-value-tile-fp16": _edge(
        batch=4,
        q_heads=2,
        kv_heads=1,
        q_len=1,
        kv_len=46,
        head_dim=40,
        value_dim=24,
        causal=False,
        dtype=torch.float16,
        scale=-0.18456691482860818,
        q_layout="expanded",
        kv_layout="strided",
        magnitude="large",
    ),
    # Found on the H100 by the thorough profile: cuDNN (torch 2.11) crashed the process with a
    # segmentation fault on operands expanded along the batch (stride 0).
    "expanded-batch-dv24": _edge(
        batch=3,
        q_len=3,
        kv_len=3,
        head_dim=96,
        value_dim=24,
        causal=False,
        dtype=torch.float16,
        q_layout="expanded",
        kv_layout="expanded",
    ),
    # Found on the H100 by the thorough profile: the memory-efficient backward (torch 2.11) had
    # "no kernel found to launch" for a single-row key whose size-1 dimensions keep odd strides.
    "single-row-odd-strides": _edge(
        q_len=1,
        kv_len=1,
        q_heads=1,
        kv_heads=1,
        head_dim=16,
        value_dim=16,
        causal=False,
        dtype=torch.float16,
        scale=-0.25,
        kv_layout="strided",
    ),
    # Found on the H100 by the thorough profile: a scale this small puts fp16 gradients below
    # fp16's smallest normal number, where roundings are absolute (the rule's floor).
    "subnormal-fp16-gradients": _edge(
        q_len=7,
        kv_len=7,
        q_heads=1,
        kv_heads=1,
        head_dim=16,
        value_dim=16,
        causal=False,
        dtype=torch.float16,
        scale=2.6442243881016228e-06,
    ),
    "expanded-batch-gqa": _edge(
        batch=2,
        q_heads=3,
        kv_heads=3,
        q_len=3,
        kv_len=37,
        head_dim=16,
        value_dim=96,
        causal=False,
        dtype=torch.float16,
        q_layout="expanded",
        kv_layout="expanded",
    ),
    # Head dims that are not multiples of 8: rows of 118/222/34 bytes in fp16/bf16.
    "head-dim-59": _edge(q_len=45, kv_len=67, head_dim=59, value_dim=59, dtype=torch.float16),
    "head-dim-111-dv-17": _edge(
        q_len=33, kv_len=40, head_dim=111, value_dim=17, dtype=torch.bfloat16, kv_layout="bnhd"
    ),
    "head-dim-3": _edge(q_len=20, kv_len=20, head_dim=3, value_dim=3, dtype=torch.float16, causal=False),
    # Found on the H100: 76-byte rows of a Dv=16 V made triton 3.6's causal forward fault.
    "unaligned-rows-dv16": _edge(
        batch=3,
        kv_heads=1,
        q_len=128,
        kv_len=128,
        head_dim=96,
        value_dim=16,
        dtype=torch.float16,
        kv_layout="strided",
        magnitude="outliers",
        seed=9191,
    ),
    # Found on the H100 by the thorough profile: cuDNN's masked float16 backward gave NaN dq.
    "window-one-key-fp16-large-logits": CUDNN_MASKED_FLOAT16,
    # Sliding windows: each edge of the band inside a block, N != M offsets, rows that see no key.
    "window-causal-left": _edge(q_len=45, kv_len=45, window=(6, -1), dtype=torch.bfloat16),
    "window-zero-n-gt-m": _edge(q_len=40, kv_len=23, causal=False, window=(0, 0)),
    "window-right-only-n-lt-m": _edge(q_len=19, kv_len=44, causal=False, window=(-1, 3), dtype=torch.float16),
    "window-asymmetric-gqa": _edge(
        q_heads=4, kv_heads=2, q_len=37, kv_len=41, causal=False, window=(9, 2), head_dim=40, value_dim=24
    ),
}


def check_backend(backend: str, problem: Problem, device: torch.device) -> bool:
    """Check ``backend`` on ``problem`` against the oracle; False if the backend declined it."""
    if backend in INTERPRETED:
        problem = fit_to_interpreter(problem)
    q, k, v, grad_out = problem.tensors(device)

    def run(a, b, c):
        return attention(
            a, b, c, causal=problem.causal, scale=problem.scale, window=problem.window, backend=backend
        )

    try:
        checks = compare_to_reference(
            run, q, k, v, causal=problem.causal, scale=problem.scale, grad_out=grad_out, window=problem.window
        )
    except UnsupportedProblemError as err:
        # A path may decline inputs it cannot take (e.g. SDPA-flash and float32 on CUDA), but
        # only with an error that names itself; test_supported_set checks it declines little.
        assert backend in str(err), f"rejection of {backend} does not name it: {err}"
        return False
    assert_close_to_reference(f"backend {backend!r} on {problem}", checks)
    return True


@pytest.mark.parametrize("backend", backend_params())
@given(problem=problems())
def test_backend_matches_reference(backend, problem, device):
    check_backend(backend, problem, device)


@pytest.mark.parametrize("backend", backend_params())
@given(problem=windowed_problems(max_len=96))
def test_windowed_backend_matches_reference(backend, problem, device):
    """Sliding windows, with and without causal, N != M, GQA, against the oracle's visibility."""
    check_backend(backend, problem, device)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("edge", list(EDGE_CASES))
def test_edge_case_matches_reference(backend, edge, device):
    """The pinned edge cases, one test item each rather than ``@example``s of the test above:
    pytest-xdist then spreads them over its workers (on a GPU each compiles its own Triton
    kernels, and one hypothesis test runs its examples one after another)."""
    check_backend(backend, EDGE_CASES[edge], device)


@pytest.mark.parametrize("backend", backend_params())
def test_supported_set_is_not_empty(backend, device):
    """A backend must accept the everyday case in some 16-bit dtype, so that rejections in
    test_backend_matches_reference cannot hide a backend that runs nothing."""
    problems_16bit = [
        _edge(q_len=40, kv_len=40, head_dim=64, value_dim=64, dtype=dtype)
        for dtype in (torch.float16, torch.bfloat16)
    ]
    accepted = [p.dtype for p in problems_16bit if check_backend(backend, p, device)]
    assert accepted, f"{backend} declined the everyday problem (D=64, N=M=40) in both fp16 and bf16"
