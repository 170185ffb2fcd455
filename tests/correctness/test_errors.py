"""Bad input raises a clear error — naming the argument, what was expected and what was given —
before any compute runs."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from conftest import RecordOps

import attnkit.api
from attnkit import BackendUnavailableError, MultiHeadAttention, attention
from attnkit.testing.edge_cases import CUDNN_MASKED_FLOAT16


def _qkv(b=2, hq=4, hkv=2, n=8, m=8, d=16, dv=16, dtype=torch.float32):
    return (
        torch.randn(b, hq, n, d, dtype=dtype),
        torch.randn(b, hkv, m, d, dtype=dtype),
        torch.randn(b, hkv, m, dv, dtype=dtype),
    )


def _bad_inputs():
    q, k, v = _qkv()
    half = q.half()
    meta_k = torch.empty(k.shape, device="meta")
    yield "rank", (q[0], k, v), {}, ValueError, r"q: expected a 4-D tensor .*got 3-D"
    yield "not-a-tensor", (q.tolist(), k, v), {}, TypeError, r"q: expected a torch.Tensor, got list"
    yield (
        "sparse",
        (q, k.to_sparse(), v),
        {},
        TypeError,
        r"k: expected a dense \(strided\) tensor, got layout torch.sparse_coo",
    )
    nested = torch.nested.nested_tensor([v[0], v[1, :, :5]], layout=torch.jagged)
    yield (
        "nested",
        (q, k, nested),
        {},
        TypeError,
        r"v: expected a dense \(B, H, N, D\) tensor, got a nested tensor",
    )
    yield "batch", (q, k[:1], v[:1]), {}, ValueError, r"batch size mismatch: q has 2, k has 1"
    yield "head-dim", (q, k[..., :8], v), {}, ValueError, r"head_dim mismatch: q has D=16, k has D=8"
    yield "kv-length", (q, k, v[:, :, :5]), {}, ValueError, r"key/value length mismatch: k has M=8, v has M=5"
    yield "kv-heads", (q, k, v[:, :1]), {}, ValueError, r"head count mismatch: k has 2 heads, v has 1"
    q3, k3, v3 = _qkv(hq=4, hkv=3)
    yield "gqa-divisible", (q3, k3, v3), {}, ValueError, r"q has 4 heads, which is not a multiple of k/v's 3"
    yield (
        "mixed-dtype",
        (half, k, v),
        {},
        TypeError,
        r"k: dtype torch.float32 differs from q's dtype torch.float16",
    )
    yield "mixed-device", (q, meta_k, v), {}, ValueError, r"k: device meta differs from q's device cpu"
    yield (
        "int-dtype",
        (q.int(), k.int(), v.int()),
        {},
        TypeError,
        r"q: expected a floating dtype .*got torch.int32",
    )
    yield "bool-dtype", (q.bool(), k, v), {}, TypeError, r"q: expected a floating dtype .*got torch.bool"
    yield (
        "complex-dtype",
        (q.cfloat(), k, v),
        {},
        TypeError,
        r"q: expected a floating dtype .*got torch.complex64",
    )
    yield "no-kv-heads", (q, k[:, :0], v[:, :0]), {}, ValueError, r"GQA needs Hkv >= 1 and Hq % Hkv == 0"
    yield (
        "scale-nan",
        (q, k, v),
        {"scale": float("nan")},
        ValueError,
        r"scale: expected a finite float, got nan",
    )
    yield (
        "scale-inf",
        (q, k, v),
        {"scale": float("inf")},
        ValueError,
        r"scale: expected a finite float, got inf",
    )
    yield (
        "scale-type",
        (q, k, v),
        {"scale": "0.5"},
        TypeError,
        r"scale: expected a real number or None, got str",
    )
    yield (
        "causal-type",
        (q, k, v),
        {"causal": 1},
        TypeError,
        r"causal: expected a bool \(Python or NumPy\), got int",
    )
    window_expected = r"window: expected None or a \(left, right\) pair of ints, each >= -1"
    yield "window-int", (q, k, v), {"window": 4}, TypeError, window_expected + r".*got int 4"
    yield "window-triple", (q, k, v), {"window": (1, 2, 3)}, TypeError, window_expected + r".*got tuple"
    yield "window-bool", (q, k, v), {"window": (True, 1)}, TypeError, window_expected + r".*left = True"
    yield "window-float", (q, k, v), {"window": (1, 2.0)}, TypeError, window_expected + r".*right = 2.0"
    yield "window-below", (q, k, v), {"window": (-2, 0)}, ValueError, window_expected + r".*left = -2"
    yield (
        "unknown-backend",
        (q, k, v),
        {"backend": "flash3"},
        ValueError,
        r"backend: expected one of .*'tiled'.*got 'flash3'",
    )


BAD = list(_bad_inputs())


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_input_raises_named_error_before_any_compute(args, kwargs, error, message):
    recorder = RecordOps()
    with recorder, pytest.raises(error, match=message):
        attention(*args, **kwargs)
    assert recorder.ops == [], f"ops ran before the error: {recorder.ops}"


def _strided_nested(v):
    with warnings.catch_warnings():  # torch: "the strided layout of nested tensors is in prototype stage"
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor([v[0], v[1, :, :5]])


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("refused", "message"),
    [
        (lambda v: v.to_sparse(), r"v: expected a dense \(strided\) tensor, got layout torch.sparse_coo"),
        (_strided_nested, r"v: expected a dense \(B, H, N, D\) tensor, got a nested tensor"),
    ],
    ids=["sparse", "strided-nested"],
)
def test_a_refused_tensor_is_refused_after_a_dense_call_of_its_shape(monkeypatch, refused, message):
    """The memos answer a call whose signature an earlier call ran: a sparse tensor with the shape,
    dtype and device of an earlier dense one must still reach the checks (the layout is part of
    the key), and a strided nested tensor, whose shape cannot be read, too."""
    monkeypatch.setattr(attnkit.api, "_PLANNED", {})
    q, k, v = _qkv(hq=2)
    attention(q, k, v, backend="naive")
    v = refused(v)
    recorder = RecordOps()
    with recorder, pytest.raises(TypeError, match=message):
        attention(q, k, v, backend="naive")
    assert recorder.ops == [], f"ops ran before the error: {recorder.ops}"


@pytest.mark.device_independent
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CUDA-only backend on a CPU-only machine")
@pytest.mark.parametrize("backend", ["sdpa-efficient", "sdpa-cudnn"])
def test_cuda_only_backend_on_cpu_says_why(backend):
    q, k, v = _qkv()
    with pytest.raises(BackendUnavailableError, match=re.escape(backend) + r".*CUDA"):
        attention(q, k, v, backend=backend)


@pytest.mark.device_independent
def test_forced_backend_that_declines_names_itself_and_the_reason():
    q, k, v = _qkv(dtype=torch.float64)
    with pytest.raises(NotImplementedError, match=r"'sdpa-flash'.*float64"):
        attention(q, k, v, backend="sdpa-flash")


@pytest.mark.device_independent
def test_forced_backend_without_masks_declines_windows_by_name():
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match=r"'sdpa-flash'.*window=\(2, -1\).*takes no attn_mask"):
        attention(q, k, v, window=(2, -1), backend="sdpa-flash")


@pytest.mark.device_independent
def test_an_error_gives_the_window_as_called_beside_the_one_it_runs():
    """attnkit runs a normalised window (a side wider than the sequence is unbounded; causal
    bounds the right side); a message names the caller's window too, or it would name one the
    caller never wrote."""
    q, k, v = _qkv()
    message = r"window=\(2, -1\) \(given as window=\(2, 1000\); .* unbounded \(-1\)\).*takes no attn_mask"
    with pytest.raises(NotImplementedError, match=message):
        attention(q, k, v, window=(2, 1000), backend="sdpa-flash")
    with pytest.raises(NotImplementedError, match=r"window=\(2, -1\) \(given as window=\(2, 0\); .*causal"):
        attention(q, k, v, window=(2, 0), causal=True, backend="sdpa-flash")


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"embed_dim": 30, "num_heads": 4}, r"embed_dim \(30\) must be a multiple of num_heads \(4\)"),
        (
            {"embed_dim": 32, "num_heads": 4, "num_kv_heads": 3},
            r"num_heads \(4\) must be a multiple of num_kv_heads",
        ),
    ],
)
def test_module_rejects_bad_head_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


def _cudnn_masked_float16_case():
    q, k, v, grad_out = CUDNN_MASKED_FLOAT16.tensors("cuda")
    return (*(x.requires_grad_() for x in (q, k, v)), grad_out)


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.backends.cudnn.is_available()), reason="needs CUDA and cuDNN"
)
@pytest.mark.parametrize(
    ("rows", "mask"),
    [(slice(None), {"window": (0, 0)}), (slice(3, None), {"causal": True})],
    ids=["window", "causal-m-is-n-plus-1"],
)
def test_cudnn_declines_its_masked_float16_backward_before_any_compute(rows, mask):
    """Both ways a mask still reaches cuDNN: a window, and bottom-right causal with M = N + 1
    (63 queries against 64 keys), whose one-key prefix cuDNN declines, so the mask-free split
    does not run (causal 1 < N < M with M - N >= 2 takes no mask: test_split_causal.py)."""
    q, k, v, _ = _cudnn_masked_float16_case()
    q = q[:, :, rows]
    recorder = RecordOps()
    with (
        recorder,
        pytest.raises(NotImplementedError, match=r"'sdpa-cudnn'.*with gradients.*NaN dq in float16"),
    ):
        attention(q, k, v, **mask, backend="sdpa-cudnn")
    assert recorder.ops == [], f"ops ran before the error: {recorder.ops}"
    with torch.no_grad():  # no gradients: no decline (the forward was right on the H100)
        assert torch.isfinite(attention(q, k, v, **mask, backend="sdpa-cudnn")).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch's kernel choice on CUDA")
def test_pytorchs_choice_keeps_cudnn_out_of_masked_float16_backward():
    """PyTorch chose cuDNN for this call (H100, torch 2.11), with NaN in dq; ``sdpa`` leaves it out."""
    q, k, v, grad_out = _cudnn_masked_float16_case()
    out = attention(q, k, v, window=(0, 0), backend="sdpa")
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    assert all(torch.isfinite(x).all() for x in (out, *grads)), "sdpa: NaN/inf in the output or gradients"
