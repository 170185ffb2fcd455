"""Inputs a new user tries: NumPy scalars, huge scales, zero-size dimensions, NaN, a wrong
embedding size, TRITON_INTERPRET set late. Each gets the documented behaviour (README, "Input
rules"): the right answer, or a clear error before any compute."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import INTERPRETED, RecordOps

import attnkit
from attnkit import MultiHeadAttention, UnsupportedProblemError, attention
from attnkit.registry import Backend
from attnkit.testing import assert_close_to_reference, compare_to_reference, make_tensor


def _qkv(shape_q=(1, 2, 6, 8), shape_kv=(1, 2, 7, 8), dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = make_tensor(shape_q, dtype=dtype, device=device, generator=gen)
    k = make_tensor(shape_kv, dtype=dtype, device=device, generator=gen)
    v = make_tensor(shape_kv, dtype=dtype, device=device, generator=gen)
    return q, k, v


def _run_or_skip(backend, *args, **kwargs):
    try:
        return attention(*args, backend=backend, **kwargs)
    except UnsupportedProblemError as err:
        pytest.skip(f"{backend} declines these inputs: {err}")


@pytest.mark.device_independent
def test_numpy_scalars_are_accepted_as_flags_and_scales():
    q, k, v = _qkv()
    expected = attention(q, k, v, causal=True, scale=0.25, backend="naive")
    for causal, scale in [(np.bool_(True), np.float32(0.25)), (True, np.float64(0.25)), (True, 0.25)]:
        out = attention(q, k, v, causal=causal, scale=scale, backend="naive")
        assert torch.equal(out, expected), f"causal={causal!r}, scale={scale!r} gave another result"
    integer = attention(q, k, v, scale=np.int64(1), backend="naive")
    assert torch.equal(integer, attention(q, k, v, scale=1.0, backend="naive")), "numpy int scale differs"


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"causal": np.int64(1)}, TypeError, r"causal: expected a bool \(Python or NumPy\), got int64"),
        ({"causal": "yes"}, TypeError, r"causal: expected a bool \(Python or NumPy\), got str"),
        ({"scale": np.bool_(True)}, TypeError, r"scale: expected a real number or None, got bool"),
        ({"scale": torch.tensor(0.5)}, TypeError, r"scale: expected a real number or None, got Tensor"),
        ({"scale": 1e39}, ValueError, r"scale: .* \|scale\| <= 8.51e\+37; got 1e\+39"),
        ({"scale": 1e300}, ValueError, r"scale: .* \|scale\| <= 8.51e\+37; got 1e\+300"),
    ],
    ids=["causal-int64", "causal-str", "scale-numpy-bool", "scale-tensor", "scale-1e39", "scale-1e300"],
)
def test_odd_flag_and_scale_types_raise_before_compute(kwargs, error, message):
    q, k, v = _qkv()
    recorder = RecordOps()
    with recorder, pytest.raises(error, match=message):
        attention(q, k, v, **kwargs)
    assert recorder.ops == [], f"ops ran before the error: {recorder.ops}"


@pytest.mark.device_independent
def test_scale_that_overflows_these_scores_is_rejected_after_one_reduction():
    """Above 1, the scale is checked against the inputs: |scale| * max|q| * max|k| * D must fit
    the score dtype. Only the reductions that measure q and k run before the error."""
    q, k, v = _qkv(dtype=torch.float64)
    q = q * 1e156
    recorder = RecordOps()
    with recorder, pytest.raises(ValueError, match=r"scale: .* for these q and k; got 1e\+156"):
        attention(q, k, v, scale=1e156)
    measuring = {"aten.abs.default", "aten.amax.default", "aten._local_scalar_dense.default"}
    assert set(recorder.ops) <= measuring, f"ops beyond measuring q and k ran: {recorder.ops}"


@pytest.mark.parametrize(("dtype", "scale"), [(torch.float16, 7e4), (torch.float64, 1e300)], ids=str)
def test_large_representable_scale_matches_the_oracle(backend, dtype, scale, device):
    """Scales the rule accepts give the oracle's answer (fp16 scores are computed in float32,
    so 7e4 * q.k does not overflow to inf and NaN)."""
    q, k, v = _qkv(dtype=dtype, device=device)
    if backend in INTERPRETED:
        pytest.skip("interpreted: covered by the native paths' run of the same code")
    try:
        checks = compare_to_reference(
            lambda a, b, c: attention(a, b, c, scale=scale, backend=backend),
            q,
            k,
            v,
            causal=False,
            scale=scale,
        )
    except UnsupportedProblemError as err:
        pytest.skip(f"{backend} declines these inputs: {err}")
    assert_close_to_reference(f"{backend} at scale {scale:g} in {dtype}", checks)


#: (dimension name, shapes of q, k, v) with that dimension 0.
_ZERO_DIMS = {
    "B": ((0, 2, 5, 8), (0, 1, 7, 8), (0, 1, 7, 6)),
    "Hq": ((1, 0, 5, 8), (1, 1, 7, 8), (1, 1, 7, 6)),
    "N": ((1, 2, 0, 8), (1, 1, 7, 8), (1, 1, 7, 6)),
    "M": ((1, 2, 5, 8), (1, 1, 0, 8), (1, 1, 0, 6)),
    "D": ((1, 2, 5, 0), (1, 1, 7, 0), (1, 1, 7, 6)),
    "Dv": ((1, 2, 5, 8), (1, 1, 7, 8), (1, 1, 7, 0)),
}


@pytest.mark.parametrize("dim", list(_ZERO_DIMS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_zero_size_dimension_gives_the_defined_result_on_every_path(backend, dim, causal, device):
    _check_zero_size_dimension(backend, dim, causal, device)


@pytest.mark.parametrize("dim", list(_ZERO_DIMS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_zero_size_dimension_gives_the_defined_result_through_auto(dim, causal, device):
    _check_zero_size_dimension("auto", dim, causal, device)


def _check_zero_size_dimension(backend: str, dim: str, causal: bool, device) -> None:
    """One rule: a zero-size dimension returns the (B, Hq, N, Dv) result without a kernel.
    M = 0: every row sees no key, so zeros with zero gradients. D = 0: every score is 0, so
    each row is the mean of the values it sees. Otherwise the result is empty."""
    gen = torch.Generator().manual_seed(0)
    dtype = torch.float64 if backend in ("naive", "tiled", "sdpa-math", "auto") else torch.float16
    q, k, v = (torch.randn(s, generator=gen).to(device=device, dtype=dtype) for s in _ZERO_DIMS[dim])
    leaves = [x.requires_grad_() for x in (q, k, v)]
    out = _run_or_skip(backend, *leaves, causal=causal)
    b, hq, n, _ = q.shape
    assert out.shape == (b, hq, n, v.shape[-1]) and out.dtype == dtype, f"{dim}=0: got {out.shape}"
    grads = torch.autograd.grad(out, leaves, torch.ones_like(out), allow_unused=False)
    for name, x, g in zip("qkv", leaves, grads, strict=True):
        assert g.shape == x.shape, f"{dim}=0: d{name} has shape {tuple(g.shape)}, expected {tuple(x.shape)}"
    if dim == "D":
        checks = compare_to_reference(
            lambda a, c, d: attention(a, c, d, causal=causal, backend=backend),
            q,
            k,
            v,
            causal=causal,
            scale=None,
        )
        assert_close_to_reference(f"{backend} with D=0", checks)
    else:
        largest = max(
            [out.abs().max().item() if out.numel() else 0.0]
            + [g.abs().max().item() for g in grads if g.numel()]
        )
        assert largest == 0, f"{dim}=0: output or gradient is {largest:.3e}, not 0"


@pytest.mark.device_independent
@pytest.mark.parametrize("backend", ["sdpa", "sdpa-flash"])
def test_the_cpu_flash_kernel_zeroes_a_nan_query_row_as_documented(backend, device):
    """A NaN in q row 2 makes output row 2 NaN on every path (the installed suite's
    ``test_contract``), but PyTorch's CPU flash kernel, called without a mask, returns zeros for
    that row instead: the documented exception (README, "Input rules"), pinned here so that a
    PyTorch change is noticed. On the CPU ``sdpa`` picks that kernel for the square causal
    problem."""
    if device.type != "cpu":
        pytest.skip("the exception is PyTorch's CPU flash kernel's")
    q, k, v = _qkv(shape_q=(1, 2, 6, 16), shape_kv=(1, 2, 6, 16), device=device)
    q[0, 1, 2, 5] = float("nan")
    out = _run_or_skip(backend, q, k, v, causal=True)
    others = torch.cat([out[0, 1, :2], out[0, 1, 3:], out[0, 0]])
    assert torch.isfinite(others).all(), f"{backend}: a NaN in one query row reached other rows"
    row = out[0, 1, 2]
    assert (row == 0).all(), f"{backend} on the CPU: the documented zero row is now {row.tolist()}"


@pytest.mark.device_independent
def test_module_with_wrong_embedding_size_names_the_argument():
    layer, x = MultiHeadAttention(64, 4), torch.randn(2, 5, 48)
    recorder = RecordOps()
    with recorder, pytest.raises(ValueError, match=r"x: expected last dimension embed_dim=64, got 48"):
        layer(x)
    assert recorder.ops == [], f"ops ran before the error: {recorder.ops}"


@pytest.mark.device_independent
def test_auto_never_picks_interpreted_triton(monkeypatch):
    """On the CPU Triton runs interpreted (~1000x slower; it declares ``interpreted_on=("cpu",)``):
    ``auto`` passes it over even when it is available; asking for it by name still runs it."""
    calls = []
    fake = Backend(
        "triton",
        run=lambda q, k, v, p: calls.append(p) or q.new_zeros(0),
        description="records calls",
        interpreted_on=("cpu",),
    )
    monkeypatch.setitem(attnkit.registry._REGISTRY, "triton", fake)
    q, k, v = _qkv()
    attention(q, k, v)
    assert calls == [], "auto ran interpreted triton on the CPU"
    attention(q, k, v, backend="triton")
    assert len(calls) == 1, "triton requested by name did not run"


@pytest.mark.device_independent
def test_triton_interpret_set_after_import_is_reported_not_crashed():
    """Triton decides at import whether its kernels are interpreted; setting TRITON_INTERPRET=1
    later must not list triton as available and then crash with "0 active drivers"."""
    script = textwrap.dedent(
        """
        import os, torch, attnkit
        os.environ["TRITON_INTERPRET"] = "1"
        q = torch.randn(1, 1, 4, 8)
        assert "triton" not in attnkit.available_backends("cpu"), attnkit.available_backends("cpu")
        try:
            attnkit.attention(q, q, q, backend="triton")
        except attnkit.BackendUnavailableError as err:
            assert "before importing attnkit" in str(err), err
        else:
            raise AssertionError("triton ran although its kernels were not interpreted")
        attnkit.attention(q, q, q)
        """
    )
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    if "triton" not in attnkit.backend_names() or torch.cuda.is_available():
        pytest.skip(
            "needs triton installed and no GPU (with a GPU the kernels are compiled, not interpreted)"
        )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"TRITON_INTERPRET set after import:\n{done.stderr[-2000:]}"


def test_a_device_not_on_this_machine_lists_no_backend_and_says_why():
    """``available_backends("cuda")`` on a machine without CUDA (a CPU-only torch build included)
    listed every path that declines nothing of CUDA: naive, tiled, sdpa, ..."""
    absent = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    assert attnkit.available_backends(absent) == [], attnkit.available_backends(absent)
    reason = attnkit.unavailable_reason("naive", absent)
    assert reason is not None and reason.startswith(f"{absent}: "), reason
    with pytest.raises(ValueError, match="got 'no-such-backend'"):
        attnkit.unavailable_reason("no-such-backend", absent)
    with pytest.raises(ValueError, match="'auto' is attention's choice among the backends, not one of"):
        attnkit.unavailable_reason("auto", "cpu")
    with pytest.raises(ValueError, match=r"device: expected a torch\.device or a device string.*got 'gpu'"):
        attnkit.available_backends("gpu")
