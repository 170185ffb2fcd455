"""``MultiHeadAttention``: a drop-in layer over :func:`attnkit.attention`."""

from __future__ import annotations

import torch
from torch import nn

from attnkit.api import attention
from attnkit.errors import BackendUnavailableError
from attnkit.inputs import check_causal, check_window
from attnkit.registry import get_backend, unavailable_reason


class MultiHeadAttention(nn.Module):
    """Self-attention with q/k/v/out projections: (B, N, E) -> (B, N, E).

    Args:
        embed_dim: E, the model width; must be divisible by ``num_heads``.
        num_heads: query heads; head_dim = E // num_heads.
        num_kv_heads: key/value heads (GQA); default ``num_heads``; must divide ``num_heads``.
        causal: apply the causal mask.
        window: sliding window ``(left, right)`` (-1: unbounded side) or None, as in
            :func:`attnkit.attention`.
        bias: add a bias to every projection.
        backend: attention backend name, as in :func:`attnkit.attention`: an unknown name is a
            ValueError here, and with ``device`` given, a backend that cannot run there a
            BackendUnavailableError (whether it takes the problem is known at the first forward).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        causal: bool = False,
        window: tuple[int, int] | None = None,
        bias: bool = True,
        backend: str = "auto",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be a multiple of num_heads ({num_heads})")
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        # The call's own arguments, checked now rather than at the first forward.
        check_causal(causal)
        check_window(window)
        if backend != "auto":
            get_backend(backend)  # an unknown name: the ValueError listing the valid ones
            reason = None if device is None else unavailable_reason(backend, device)
            if reason is not None:
                raise BackendUnavailableError(f"backend {backend!r} is unavailable: {reason}")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.causal, self.window, self.backend = causal, window, backend
        kv_dim = num_kv_heads * self.head_dim
        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(embed_dim, kv_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(embed_dim, kv_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError(f"x: expected (batch, seq_len, embed_dim), got shape {tuple(x.shape)}")
        if x.shape[-1] != self.q_proj.in_features:
            raise ValueError(
                f"x: expected last dimension embed_dim={self.q_proj.in_features}, got {x.shape[-1]} "
                f"(shape {tuple(x.shape)})"
            )
        batch, seq_len, _ = x.shape

        # (B, N, H*D) -> (B, H, N, D) as a strided view: attnkit accepts any strides.
        def heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
            return t.view(batch, seq_len, n_heads, self.head_dim).transpose(1, 2)

        q = heads(self.q_proj(x), self.num_heads)
        k = heads(self.k_proj(x), self.num_kv_heads)
        v = heads(self.v_proj(x), self.num_kv_heads)
        out = attention(q, k, v, causal=self.causal, window=self.window, backend=self.backend)
        return self.out_proj(out.transpose(1, 2).reshape(batch, seq_len, -1))
