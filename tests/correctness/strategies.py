"""Hypothesis strategies for attention problems."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from attnkit.testing import LAYOUTS, MAGNITUDES, make_tensor

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: Head dims: powers of two, the awkward ones real models use (24, 40, 80, 96, ...), and ones
#: that are not multiples of 8 (3, 17, 59, 111: fp16 rows of 6, 34, 118, 222 bytes are not
#: 16-byte aligned, the layout class that crashed Triton 3.6's causal forward before).
HEAD_DIMS = (3, 16, 17, 24, 32, 40, 59, 64, 80, 96, 111, 128, 160, 256)


@dataclass(frozen=True)
class Problem:
    """A drawn attention problem; ``tensors()`` materialises it deterministically from ``seed``."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    value_dim: int
    causal: bool
    dtype: torch.dtype
    scale: float | None
    q_layout: str
    kv_layout: str
    magnitude: str
    seed: int
    #: Sliding window (left, right), -1 for an unbounded side, or None.
    window: tuple[int, int] | None = None

    @property
    def group_size(self) -> int:
        return self.q_heads // self.kv_heads

    def tensors(self, device):
        gen = torch.Generator().manual_seed(self.seed)
        common = {"dtype": self.dtype, "device": device, "generator": gen, "magnitude": self.magnitude}
        q = make_tensor((self.batch, self.q_heads, self.q_len, self.head_dim), layout=self.q_layout, **common)
        common["magnitude"] = "unit" if self.magnitude == "large" else self.magnitude
        kv_shape = (self.batch, self.kv_heads, self.kv_len)
        k = make_tensor((*kv_shape, self.head_dim), layout=self.kv_layout, **common)
        v = make_tensor((*kv_shape, self.value_dim), layout=self.kv_layout, **common)
        grad_out = torch.randn(self.batch, self.q_heads, self.q_len, self.value_dim, generator=gen)
        return q, k, v, grad_out.to(device=device, dtype=self.dtype)


#: Found on the H100 by the thorough profile (torch 2.11): a one-key window over 64 keys, 66
#: float16 queries with large logits (|q| ~ 30). cuDNN's backward returned NaN in dq on every
#: run; sdpa-cudnn declines it, sdpa leaves cuDNN out of PyTorch's choice.
CUDNN_MASKED_FLOAT16 = Problem(
    batch=1, q_heads=1, kv_heads=1, q_len=66, kv_len=64, head_dim=16, value_dim=16, causal=False,
    dtype=torch.float16, scale=None, q_layout="contiguous", kv_layout="contiguous", magnitude="large",
    seed=0, window=(0, 0),
)  # fmt: skip


def _lengths(max_len: int):
    # Lengths that break tiled code: 1, primes, and values just around powers of two (block
    # sizes); plus anything in range.
    edges = [
        n for n in (1, 2, 3, 7, 13, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 255, 257) if n <= max_len
    ]
    return st.one_of(st.sampled_from(edges), st.integers(1, max_len))


@st.composite
def problems(draw, *, max_len: int = 160, max_dim: int = 128, dtypes=DTYPES, max_batch_heads: int = 8):
    """Draw a problem: MHA/GQA/MQA, N != M, odd head dims, any scale, layouts, magnitudes."""
    kv_heads = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    q_heads = kv_heads * group
    batch = draw(st.integers(1, max(1, max_batch_heads // q_heads)))
    q_len = draw(_lengths(max_len))
    kv_len = draw(st.one_of(st.just(q_len), _lengths(max_len)))
    dims = [d for d in HEAD_DIMS if d <= max_dim]
    head_dim = draw(st.sampled_from(dims))
    value_dim = draw(st.one_of(st.just(head_dim), st.sampled_from(dims)))
    scale = draw(
        st.one_of(
            st.none(),
            st.just(0.0),
            st.floats(-2.0, 2.0, allow_nan=False).map(lambda s: s / math.sqrt(head_dim)),
        )
    )
    return Problem(
        batch=batch,
        q_heads=q_heads,
        kv_heads=kv_heads,
        q_len=q_len,
        kv_len=kv_len,
        head_dim=head_dim,
        value_dim=value_dim,
        causal=draw(st.booleans()),
        dtype=draw(st.sampled_from(dtypes)),
        scale=scale,
        q_layout=draw(st.sampled_from(LAYOUTS)),
        kv_layout=draw(st.sampled_from(LAYOUTS)),
        magnitude=draw(st.sampled_from(MAGNITUDES)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def fit_to_interpreter(problem: Problem) -> Problem:
    """Shrink a problem for backends interpreted on the CPU, keeping its odd lengths odd and
    its awkward head dims awkward (e.g. 129 -> 33, 80 -> 40, 111 -> 55)."""

    def length(n: int) -> int:
        return n if n <= 48 else 32 + n % 17

    def dim(d: int) -> int:
        return d if d <= 64 else max(16, d // 2 if d // 2 <= 64 else 64 - 8 * (d % 3))

    return dataclasses.replace(
        problem,
        batch=1,
        q_len=length(problem.q_len),
        kv_len=length(problem.kv_len),
        head_dim=dim(problem.head_dim),
        value_dim=dim(problem.value_dim),
    )


@st.composite
def windows(draw, q_len: int, kv_len: int):
    """A (left, right) window for an N x M problem: sides of 0, 1, in range, or past every key
    (>= max(N, M)); symmetric or not; left-only or right-only (the other side -1)."""
    span = max(q_len, kv_len)
    side = st.one_of(st.just(0), st.just(1), st.integers(0, span), st.integers(span, span + 8))
    kind = draw(st.sampled_from(("both", "both", "left-only", "right-only")))
    left = -1 if kind == "right-only" else draw(side)
    right = -1 if kind == "left-only" else draw(side)
    return left, right


@st.composite
def windowed_problems(draw, **kwargs):
    """:func:`problems` with a window drawn by :func:`windows` (causal or not, N != M, GQA)."""
    problem = draw(problems(**kwargs))
    return dataclasses.replace(problem, window=draw(windows(problem.q_len, problem.kv_len)))


@st.composite
def split_causal_problems(draw, *, max_len: int = 160, max_dim: int = 128):
    """Causal problems the mask-free cuDNN split takes (:func:`attnkit.sdpa.split_causal.splits`:
    1 < N and M - N >= 2), otherwise drawn as :func:`problems` (GQA, dtypes, layouts, magnitudes),
    with Dv = D (the CPU flash kernel, the split's CPU twin, takes no other) and a positive scale
    (zero, negative and tiny scales are translated before any kernel runs: :mod:`attnkit.sdpa.semantics`)."""
    problem = draw(problems(max_len=max_len, max_dim=max_dim))
    kv_len = draw(_lengths(max_len).filter(lambda m: m >= 4))
    # N = 2 (the smallest square), M - N = 2 (the smallest prefix), and anything between.
    q_len = draw(st.one_of(st.just(2), st.just(kv_len - 2), st.integers(2, kv_len - 2)))
    scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0).map(lambda s: s / math.sqrt(problem.head_dim))))
    return dataclasses.replace(
        problem, causal=True, q_len=q_len, kv_len=kv_len, value_dim=problem.head_dim, scale=scale
    )
