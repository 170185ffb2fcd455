"""Benchmark cases: one description of "what is timed", shared by the perf suite, the
performance grid and the report.

A :class:`BenchCase` names a backend, a pass (forward, backward, or both) and a shape;
:func:`build_runner` turns it into a zero-argument callable on fresh random inputs, and the
derived metrics (FLOPs, the minimum bytes a pass must write) are defined here once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from attnkit.api import attention

PASSES = ("fwd", "bwd", "fwd+bwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

#: FLOPs of a pass as a multiple of the forward's: the backward does 2.5x the forward's matmul
#: work (5 matmuls against 2, as in FlashAttention's accounting).
_PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


@dataclass(frozen=True)
class BenchCase:
    """One timed configuration. Sequence length is the same for queries and keys."""

    backend: str
    pass_name: str
    batch: int
    q_heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    causal: bool
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.pass_name not in PASSES:
            raise ValueError(f"pass_name: expected one of {PASSES}, got {self.pass_name!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {tuple(DTYPES)}, got {self.dtype!r}")

    @property
    def shape_label(self) -> str:
        """Shape without the backend, e.g. ``bf16-B4-H16-N4096-D128-causal``."""
        heads = f"H{self.q_heads}" if self.kv_heads == self.q_heads else f"H{self.q_heads}kv{self.kv_heads}"
        mask = "-causal" if self.causal else ""
        return f"{self.dtype}-B{self.batch}-{heads}-N{self.seq_len}-D{self.head_dim}{mask}"

    @property
    def name(self) -> str:
        """Benchmark name, e.g. ``fwd[triton-bf16-B4-H16-N4096-D128-causal]``."""
        return f"{self.pass_name}[{self.backend}-{self.shape_label}]"

    @property
    def group(self) -> str:
        """Benchmarks of one group differ only in backend, so tables put peers side by side."""
        return f"{self.pass_name} {self.shape_label}"

    @property
    def flops(self) -> float:
        """4*B*H*N^2*D for the forward, halved when causal, scaled per pass."""
        forward = 4.0 * self.batch * self.q_heads * self.seq_len**2 * self.head_dim
        if self.causal:
            forward /= 2
        return forward * _PASS_FLOP_FACTOR[self.pass_name]

    @property
    def min_bytes(self) -> int:
        """Fewest bytes the pass must allocate: its outputs (O and the float32 log-sum-exp for
        the forward, dQ/dK/dV for the backward). Peak memory over this is overhead."""
        item = torch.finfo(DTYPES[self.dtype]).bits // 8
        out = self.batch * self.q_heads * self.seq_len * self.head_dim * item
        lse = self.batch * self.q_heads * self.seq_len * 4
        kv = self.batch * self.kv_heads * self.seq_len * self.head_dim * item
        grads = out + 2 * kv
        return {"fwd": out + lse, "bwd": grads, "fwd+bwd": out + lse + grads}[self.pass_name]

    def as_dict(self) -> dict:
        return asdict(self)


def make_inputs(case: BenchCase, device: torch.device | str, seed: int = 0):
    """Random (never zero) q, k, v and grad_out for ``case`` on ``device``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = DTYPES[case.dtype]

    def rand(heads):
        shape = (case.batch, heads, case.seq_len, case.head_dim)
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)

    return rand(case.q_heads), rand(case.kv_heads), rand(case.kv_heads), rand(case.q_heads)


def build_runner(case: BenchCase, device: torch.device | str, seed: int = 0) -> Callable[[], object]:
    """A zero-argument callable that runs ``case`` once.

    * ``fwd``: the forward with no tensor requiring grad (inference).
    * ``bwd``: the backward alone: the forward runs once here, each call then recomputes
      dQ, dK, dV from the saved graph (``retain_graph``), without accumulating into ``.grad``.
    * ``fwd+bwd``: a training step's attention: forward, then all three gradients.
    """
    q, k, v, grad_out = make_inputs(case, device, seed)

    def forward():
        return attention(q, k, v, causal=case.causal, backend=case.backend)

    if case.pass_name == "fwd":
        return forward
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    if case.pass_name == "bwd":
        out = forward()
        return lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
    return lambda: torch.autograd.grad(forward(), (q, k, v), grad_out)
