"""MultiHeadAttention: projections around attnkit.attention, checked against the oracle."""

from __future__ import annotations

import pytest
import torch
from conftest import backend_params

from attnkit import MultiHeadAttention, UnsupportedProblemError, reference_attention


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "causal"), [(4, 4, False), (4, 2, True), (4, 1, True)])
def test_layer_matches_projections_around_the_oracle(backend, num_heads, num_kv_heads, causal, device):
    torch.manual_seed(0)
    layer = MultiHeadAttention(64, num_heads, num_kv_heads, causal=causal, backend=backend, device=device)
    x = torch.randn(2, 11, 64, device=device)
    try:
        out = layer(x)
    except UnsupportedProblemError:
        pytest.skip(f"{backend} declines float32 here")
    d = 64 // num_heads

    def heads(t, h):
        return t.view(2, 11, h, d).transpose(1, 2).double()

    with torch.no_grad():
        q, k, v = (
            heads(layer.q_proj(x), num_heads),
            heads(layer.k_proj(x), num_kv_heads),
            heads(layer.v_proj(x), num_kv_heads),
        )
        attn = reference_attention(q, k, v, causal=causal).transpose(1, 2).reshape(2, 11, 64)
        expected = layer.out_proj(attn.float())
    assert out.shape == (2, 11, 64)
    error = (out - expected).abs().max().item()
    # This test checks wiring, not kernel accuracy (test_equivalence does that): a swapped head,
    # a wrong transpose or a missing projection moves O(1) activations by O(0.1) or more, while
    # float32 kernels that use TF32 on a GPU stay within ~1e-3 relative.
    assert error < 1e-3, f"{backend}: layer output differs from projections + oracle by {error:.2e}"
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


def test_layer_rejects_wrong_input_rank():
    with pytest.raises(ValueError, match=r"x: expected \(batch, seq_len, embed_dim\), got shape \(11, 64\)"):
        MultiHeadAttention(64, 4)(torch.randn(11, 64))
