"""Hypothesis strategies for attention calls, built on :class:`attnkit.AttentionProblem`.

A drawn :class:`AttentionCase` is a problem (shapes, dtype, causal, the normalised window and
the resolved scale: the object every backend receives) plus what a test needs to make the call:
the ``scale`` and ``window`` arguments as a caller writes them, the memory layouts and
magnitudes of the tensors, and a seed. Use it in your own tests::

    from hypothesis import given
    from attnkit.testing import assert_close_to_reference, compare_to_reference
    from attnkit.testing.strategies import problems

    @given(case=problems(dtypes=(torch.float16,)))
    def test_my_kernel(case):
        q, k, v, grad_out = case.tensors("cuda")
        checks = compare_to_reference(my_attention, q, k, v, grad_out=grad_out, **case.kwargs)
        assert_close_to_reference(f"my kernel on {case}", checks)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from attnkit.boundaries import SHAPE_FIELDS
from attnkit.inputs import AttentionProblem, check_inputs
from attnkit.testing import LAYOUTS, MAGNITUDES, make_tensor

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: Head dims: powers of two, the awkward ones real models use (24, 40, 80, 96, ...), and ones
#: that are not multiples of 8 (3, 17, 59, 111: fp16 rows of 6, 34, 118, 222 bytes are not
#: 16-byte aligned, the layout class that crashed Triton 3.6's causal forward before).
HEAD_DIMS = (3, 16, 17, 24, 32, 40, 59, 64, 80, 96, 111, 128, 160, 256)

_DEFAULTS = {
    "batch": 1,
    "q_heads": 1,
    "kv_heads": 1,
    "q_len": 16,
    "kv_len": 16,
    "head_dim": 32,
    "causal": False,
}
_META = torch.device("meta")


def attention_problem(
    *, scale: float | None = None, window: tuple[int, int] | None = None, device="meta", **fields
) -> AttentionProblem:
    """The :class:`AttentionProblem` that :func:`attnkit.attention` makes for tensors of these
    shapes, without tensors: the window normalised, a None scale resolved to 1/sqrt(D).

    ``fields``: AttentionProblem's ``batch, q_heads, kv_heads, q_len, kv_len, head_dim,
    value_dim, causal, dtype``; omitted ones default to 1, 1, 1, 16, 16, 32, head_dim, False,
    float32.
    """
    unknown = set(fields) - set(SHAPE_FIELDS)
    if unknown:
        raise TypeError(
            f"attention_problem: unknown fields {sorted(unknown)}; expected some of {SHAPE_FIELDS}"
        )
    f = {**_DEFAULTS, "dtype": torch.float32, **fields}
    f.setdefault("value_dim", f["head_dim"])
    spec = {"dtype": f["dtype"], "device": _META}
    q = torch.empty(f["batch"], f["q_heads"], f["q_len"], f["head_dim"], **spec)
    k = torch.empty(f["batch"], f["kv_heads"], f["kv_len"], f["head_dim"], **spec)
    v = torch.empty(f["batch"], f["kv_heads"], f["kv_len"], f["value_dim"], **spec)
    # The scale is applied after the checks: on meta tensors there is no data to check |scale| > 1
    # against (attention() checks it on the real tensors).
    problem = check_inputs(q, k, v, f["causal"], None, window)
    resolved = problem.scale if scale is None else float(scale)
    return dataclasses.replace(problem, scale=resolved, device=torch.device(device))


@dataclass(frozen=True)
class AttentionCase:
    """One attention call for a test: ``problem`` (on the meta device: :meth:`tensors` places
    the case on a device), the ``scale`` and ``window`` arguments as passed to
    :func:`attnkit.attention` (None scale: the default; a window side may be unnormalised, e.g.
    past every key), the memory layouts of q and of k/v (:data:`attnkit.testing.LAYOUTS`), the
    magnitude of the values (:data:`attnkit.testing.MAGNITUDES`) and the seed of the data."""

    problem: AttentionProblem
    scale: float | None = None
    window: tuple[int, int] | None = None
    q_layout: str = "contiguous"
    kv_layout: str = "contiguous"
    magnitude: str = "unit"
    seed: int = 0

    @classmethod
    def make(cls, *, scale=None, window=None, q_layout="contiguous", kv_layout="contiguous", magnitude="unit",
             seed=0, **fields) -> AttentionCase:  # fmt: skip
        """A case from AttentionProblem's shape fields (see :func:`attention_problem`) and the
        call's arguments."""
        problem = attention_problem(scale=scale, window=window, **fields)
        return cls(problem, scale, window, q_layout, kv_layout, magnitude, seed)

    def replace(self, **changes) -> AttentionCase:
        """This case with some shape fields or arguments changed (the problem made anew)."""
        own = {name: changes.pop(name) for name in list(changes) if name in _CASE_FIELDS}
        shape = {name: getattr(self.problem, name) for name in SHAPE_FIELDS}
        args = {name: getattr(self, name) for name in _CASE_FIELDS}
        return AttentionCase.make(**{**shape, **changes, **args, **own})

    @property
    def kwargs(self) -> dict:
        """``causal``, ``scale`` and ``window`` as keyword arguments of :func:`attnkit.attention`."""
        return {"causal": self.problem.causal, "scale": self.scale, "window": self.window}

    def tensors(self, device):
        """q (B, Hq, N, D), k (B, Hkv, M, D), v (B, Hkv, M, Dv) and a gradient for the output
        (B, Hq, N, Dv) on ``device``, the same for the same case on every run."""
        p = self.problem
        gen = torch.Generator().manual_seed(self.seed)
        common = {"dtype": p.dtype, "device": device, "generator": gen, "magnitude": self.magnitude}
        q = make_tensor((p.batch, p.q_heads, p.q_len, p.head_dim), layout=self.q_layout, **common)
        # Large logits come from q alone: large k too would overflow the scores of every path.
        common["magnitude"] = "unit" if self.magnitude == "large" else self.magnitude
        k = make_tensor((p.batch, p.kv_heads, p.kv_len, p.head_dim), layout=self.kv_layout, **common)
        v = make_tensor((p.batch, p.kv_heads, p.kv_len, p.value_dim), layout=self.kv_layout, **common)
        grad_out = torch.randn(p.batch, p.q_heads, p.q_len, p.value_dim, generator=gen)
        return q, k, v, grad_out.to(device=device, dtype=p.dtype)

    def fit_to_interpreter(self) -> AttentionCase:
        """Shrunk for backends interpreted on the CPU, keeping odd lengths odd and awkward head
        dims awkward (e.g. 129 -> 33, 80 -> 40, 111 -> 55)."""

        def length(n: int) -> int:
            return n if n <= 48 else 32 + n % 17

        def dim(d: int) -> int:
            return d if d <= 64 else max(16, d // 2 if d // 2 <= 64 else 64 - 8 * (d % 3))

        p = self.problem
        sizes = {"q_len": length(p.q_len), "kv_len": length(p.kv_len)}
        return self.replace(batch=1, head_dim=dim(p.head_dim), value_dim=dim(p.value_dim), **sizes)

    def __str__(self) -> str:
        given = ", ".join(f"{name}={getattr(self, name)!r}" for name in _CASE_FIELDS)
        return f"{self.problem.describe()} (as called: {given})"

    def __repr__(self) -> str:
        # What hypothesis prints for a failing example: the call that makes it again, without the
        # meta device the problem is described on (the test's device is the run's).
        return self.as_code()

    def as_code(self) -> str:
        """A Python expression that makes this case again (``torch`` and :class:`AttentionCase`
        imported): the same problem, arguments and seed, so the same tensors."""
        p = self.problem
        fields = [f"{name}={getattr(p, name)!r}" for name in SHAPE_FIELDS]
        fields += [f"{name}={getattr(self, name)!r}" for name in _CASE_FIELDS]
        return f"AttentionCase.make({', '.join(fields)})"


_CASE_FIELDS = tuple(f.name for f in dataclasses.fields(AttentionCase) if f.name != "problem")


def lengths(max_len: int):
    """Sequence lengths that break tiled code: 1, primes, values just around powers of two
    (block sizes); plus anything in 1..max_len."""
    edges = [
        n for n in (1, 2, 3, 7, 13, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 255, 257) if n <= max_len
    ]
    return st.one_of(st.sampled_from(edges), st.integers(1, max_len))


@st.composite
def problems(draw, *, max_len: int = 160, max_dim: int = 128, dtypes=DTYPES, max_batch_heads: int = 8):
    """Draw an :class:`AttentionCase`: MHA/GQA/MQA, N != M, odd head dims, any scale (0 and
    negative included), causal or not, every layout and magnitude."""
    # Drawn in a fixed order (the ci profile's derandomised examples depend on it).
    kv_heads = draw(st.integers(1, 3))
    q_heads = kv_heads * draw(st.sampled_from([1, 1, 2, 3]))
    batch = draw(st.integers(1, max(1, max_batch_heads // q_heads)))
    q_len = draw(lengths(max_len))
    kv_len = draw(st.one_of(st.just(q_len), lengths(max_len)))
    dims = [d for d in HEAD_DIMS if d <= max_dim]
    head_dim = draw(st.sampled_from(dims))
    value_dim = draw(st.one_of(st.just(head_dim), st.sampled_from(dims)))
    scaled = st.floats(-2.0, 2.0, allow_nan=False).map(lambda s: s / math.sqrt(head_dim))
    scale = draw(st.one_of(st.none(), st.just(0.0), scaled))
    return AttentionCase.make(
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
    case = draw(problems(**kwargs))
    return case.replace(window=draw(windows(case.problem.q_len, case.problem.kv_len)))
