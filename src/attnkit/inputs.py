"""Validation of attention inputs, done once before any backend runs.

Every backend receives an :class:`AttentionProblem` describing shapes, dtype, device, scale and
masking, so shape logic lives here and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: dtypes any path may accept; individual backends narrow this further.
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class AttentionProblem:
    """The shape of one attention call.

    ``q``: (batch, q_heads, q_len, head_dim); ``k``: (batch, kv_heads, kv_len, head_dim);
    ``v``: (batch, kv_heads, kv_len, value_dim); output: (batch, q_heads, q_len, value_dim).
    """

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    value_dim: int
    causal: bool
    scale: float
    dtype: torch.dtype
    device: torch.device

    @property
    def group_size(self) -> int:
        """Query heads sharing one key/value head (1 for MHA, q_heads for MQA)."""
        return self.q_heads // self.kv_heads

    @property
    def causal_offset(self) -> int:
        """Bottom-right alignment: query row i sees key j iff ``j <= i + causal_offset``."""
        return self.kv_len - self.q_len

    def describe(self) -> str:
        return (
            f"B={self.batch} Hq={self.q_heads} Hkv={self.kv_heads} N={self.q_len} "
            f"M={self.kv_len} D={self.head_dim} Dv={self.value_dim} causal={self.causal} "
            f"dtype={str(self.dtype).removeprefix('torch.')}"
        )


def _check_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(
            f"{name}: expected a 4-D tensor (batch, heads, seq_len, head_dim), "
            f"got {x.dim()}-D with shape {tuple(x.shape)}"
        )
    if x.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise TypeError(f"{name}: expected a floating dtype ({names}), got {x.dtype}")
    return x


def check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None
) -> AttentionProblem:
    """Check every argument and return the problem; raise before any compute on bad input."""
    q, k, v = (_check_tensor(n, x) for n, x in (("q", q), ("k", k), ("v", v)))
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {x.dtype} differs from q's dtype {q.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name}: device {x.device} differs from q's device {q.device}")
    (batch, q_heads, q_len, head_dim) = q.shape
    (k_batch, kv_heads, kv_len, k_dim) = k.shape
    (v_batch, v_heads, v_len, value_dim) = v.shape
    if k_batch != batch or v_batch != batch:
        raise ValueError(f"batch size mismatch: q has {batch}, k has {k_batch}, v has {v_batch}")
    if v_heads != kv_heads:
        raise ValueError(f"head count mismatch: k has {kv_heads} heads, v has {v_heads}")
    if k_dim != head_dim:
        raise ValueError(f"head_dim mismatch: q has D={head_dim}, k has D={k_dim}")
    if v_len != kv_len:
        raise ValueError(f"key/value length mismatch: k has M={kv_len}, v has M={v_len}")
    for name, size in (("q", q_len), ("k", kv_len), ("head_dim", head_dim), ("value_dim", value_dim)):
        if size == 0:
            raise ValueError(f"{name}: every dimension must be non-empty, got size 0")
    if kv_heads == 0 or q_heads % kv_heads != 0:
        raise ValueError(
            f"q has {q_heads} heads, which is not a multiple of k/v's {kv_heads} heads (GQA needs "
            "Hq % Hkv == 0)"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")
    elif not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite float, got {scale}")
    return AttentionProblem(
        batch=batch,
        q_heads=q_heads,
        kv_heads=kv_heads,
        q_len=q_len,
        kv_len=kv_len,
        head_dim=head_dim,
        value_dim=value_dim,
        causal=causal,
        scale=float(scale),
        dtype=q.dtype,
        device=q.device,
    )
