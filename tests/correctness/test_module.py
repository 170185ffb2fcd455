"""MultiHeadAttention: projections around attnkit.attention, checked in two independent parts:
the wiring exactly (the same attention call composed by hand gives the same bits), and the
attention inside against the oracle by the one tolerance rule."""

from __future__ import annotations

import pytest
import torch

from attnkit import BackendUnavailableError, MultiHeadAttention, UnsupportedProblemError, attention
from attnkit.testing import assert_close_to_reference, compare_to_reference


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "causal"), [(4, 4, False), (4, 2, True), (4, 1, True)])
def test_layer_is_projections_around_attention(backend, num_heads, num_kv_heads, causal, device):
    torch.manual_seed(0)
    layer = MultiHeadAttention(64, num_heads, num_kv_heads, causal=causal, backend=backend, device=device)
    x = torch.randn(2, 11, 64, device=device)
    try:
        out = layer(x)
    except UnsupportedProblemError:
        pytest.skip(f"{backend} declines float32 here")
    d = 64 // num_heads

    def heads(t, h):  # (B, N, H*D) -> (B, H, N, D), written apart from the layer's own helper
        return t.reshape(2, 11, h, d).permute(0, 2, 1, 3)

    # Composed by hand under the layer's own grad mode: a path may compile or choose another kernel
    # for a call that records a backward (flex, auto's training order), and the wiring is what
    # is compared here, not two kernels.
    q, k, v = (
        heads(layer.q_proj(x), num_heads),
        heads(layer.k_proj(x), num_kv_heads),
        heads(layer.v_proj(x), num_kv_heads),
    )
    inner = attention(q, k, v, causal=causal, backend=backend)
    expected = layer.out_proj(inner.permute(0, 2, 1, 3).reshape(2, 11, 64)).detach()
    q, k, v = (t.detach() for t in (q, k, v))
    # The same ops on the same values: a swapped head, a wrong transpose or a missing projection
    # changes bits, any correct wiring does not (every path is deterministic in the forward).
    differing = (out != expected).sum().item()
    assert differing == 0, (
        f"{backend}: layer output differs from projections + attention in {differing} elements "
        f"(max {(out - expected).abs().max().item():.3e})"
    )
    grad_out = torch.randn(2, num_heads, 11, d, device=device)
    checks = compare_to_reference(
        lambda a, b, c: attention(a, b, c, causal=causal, backend=backend),
        q, k, v, causal=causal, scale=None, grad_out=grad_out,
    )  # fmt: skip
    assert_close_to_reference(f"{backend} inside the layer", checks)
    out.sum().backward()
    missing = [
        name for name, p in layer.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()
    ]
    assert not missing, f"{backend}: no finite gradient for {missing}"


@pytest.mark.device_independent
def test_layer_rejects_wrong_input_rank():
    with pytest.raises(ValueError, match=r"x: expected \(batch, seq_len, embed_dim\), got shape \(11, 64\)"):
        MultiHeadAttention(64, 4)(torch.randn(11, 64))


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"backend": "bogus"}, ValueError, "got 'bogus'"),
        ({"window": 5}, TypeError, "window: expected None or a"),
        ({"causal": "yes"}, TypeError, "causal: expected a bool"),
        ({"backend": "sdpa-cudnn", "device": "cpu"}, BackendUnavailableError, "sdpa-cudnn"),
    ],
    ids=["unknown-backend", "window", "causal", "backend-not-on-device"],
)
def test_layer_checks_its_arguments_when_made(kwargs, error, message):
    """Not at the first forward, maybe hours into a job: when the layer is made."""
    with pytest.raises(error, match=message):
        MultiHeadAttention(64, num_heads=4, **kwargs)
