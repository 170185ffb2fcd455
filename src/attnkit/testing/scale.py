"""The scale tier: a fixed list of large problems for the installed suite
(:mod:`attnkit.suite.test_scale`), sized for the device it runs on.

The suite's drawn problems stay below N = 160, where a test costs milliseconds; a kernel that
switches code paths at larger sizes (a Gluon forward from N = 4096, a split-KV forward for long
caches, a scheduler chosen by batch size) is then only ever tested on its small-shape path. The
tier runs, judged by the same tolerance rule (its oracle computed in blocks,
:mod:`attnkit.testing.blocked_oracle`):

* a **ladder** of sequence lengths spread log-uniformly up to the device's largest (16K, 32K
  where the GPU has the memory; 1024 on a CPU), each causal with N = M, causal with N != M, and
  not causal with N != M, cycling head dims, dtypes and GQA;
* **every head dim** of :data:`attnkit.testing.strategies.HEAD_DIMS` (3 to 256) at one
  moderately large length;
* **long-KV decode** (few queries, M >= 128K on a GPU), **windows** at scale, and **B * H past
  65,535** (the limit of a CUDA grid's second and third dimensions);
* both sides of every **dispatch boundary** the backend declares (:mod:`attnkit.boundaries`):
  just below, at, and just above.

Each list is explicit (no random huge draws): the same problems every run, their cost bounded
by :attr:`ScaleLimits.max_scores` per problem. A list never silently shrinks: what the
device's limits leave out is returned with its reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from attnkit.boundaries import DispatchBoundary
from attnkit.testing.strategies import HEAD_DIMS, AttentionCase


@dataclass(frozen=True)
class ScaleLimits:
    """How far the tier reaches on one device.

    ``max_len``: the longest N = M of the ladder; ``decode_kv_len``: M of the long-KV decode
    problems; ``dims_len``: N = M of the head-dim sweep; ``wide_grid``: whether B * H past
    65,535 runs (a CUDA grid's limit: on a CPU there is none to cross); ``max_scores``: the
    most score elements (B * Hq * N * M) of any one problem (boundary problems past it are left
    out, with the reason); ``repeats``: how often the determinism test repeats the backward;
    ``dtypes``: the 16-bit (or wider) dtypes the tier cycles through; ``ladder_steps``: how
    many lengths the ladder has."""

    label: str
    max_len: int
    decode_kv_len: int
    dims_len: int
    wide_grid: bool
    max_scores: int
    repeats: int
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
    ladder_steps: int = 6


#: A GPU: N = M up to 16K (32K with :data:`LONG_MEMORY_GIB` of memory), M = 128K + 37 for decode.
GPU_LIMITS = ScaleLimits("cuda", 16384, 2**17 + 37, 2048, True, 2**31, 10)
LONG_MEMORY_GIB = 40
#: A CPU running a compiled (not interpreted) backend: the ladder reaches N = M = 1024, a few
#: seconds per backend on two cores. bfloat16 and float32, not float16: PyTorch's CPU matmul in
#: float16 has no fast kernel (~90x slower than bfloat16 at 1024 x 128 x 1024), and the
#: yardstick of the rule computes in the input dtype.
CPU_LIMITS = ScaleLimits("cpu", 1024, 2048 + 37, 64, False, 2**21, 3, (torch.bfloat16, torch.float32), 4)
#: A backend interpreted on the CPU (Triton under TRITON_INTERPRET=1, ~1000x slower than on a
#: GPU): a token ladder to N = M = 96; on a GPU the same backend runs the full tier.
INTERPRETED_LIMITS = dataclasses.replace(CPU_LIMITS, label="cpu, interpreted", max_len=96, decode_kv_len=640,
                                         dims_len=32, max_scores=2**13, repeats=2)  # fmt: skip


def scale_limits(device: torch.device, interpreted: bool = False) -> ScaleLimits:
    """The tier's limits on ``device``; ``interpreted``: the backend runs through an interpreter
    there (Triton on the CPU)."""
    if device.type == "cuda":
        memory_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
        if memory_gib >= LONG_MEMORY_GIB:
            return dataclasses.replace(GPU_LIMITS, max_len=32768)
        return GPU_LIMITS
    return INTERPRETED_LIMITS if interpreted else CPU_LIMITS


def ladder_lengths(max_len: int, steps: int = 6) -> list[int]:
    """``steps`` lengths spread log-uniformly from ~3 to ``max_len`` (included), every other one
    made odd (a length that divides by no block size)."""
    lengths = []
    for i in range(1, steps + 1):
        n = round(max_len ** (i / steps))
        lengths.append(n if i == steps or i % 2 == 0 else n - 1 + n % 2)
    return sorted(set(max(2, n) for n in lengths))


def ladder(limits: ScaleLimits) -> list[AttentionCase]:
    """Three problems per length of :func:`ladder_lengths`: causal N = M; causal with fewer
    queries than keys (bottom-right); not causal with more queries than keys. Head dims, dtypes
    and GQA cycle along the ladder."""
    cases = []
    # The longest length takes D = 64 and one head: the others cover wide heads and GQA.
    dims = (96, 256, 128, 80, 128, 64)
    lengths = ladder_lengths(limits.max_len, limits.ladder_steps)
    for i, n in enumerate(lengths):
        dim, dtype = dims[i - len(lengths)], limits.dtypes[i % len(limits.dtypes)]
        kv_heads, q_heads = (2, 4) if (len(lengths) - i) % 2 == 0 else (1, 1)
        common = {"head_dim": dim, "dtype": dtype, "q_heads": q_heads, "kv_heads": kv_heads, "seed": i}
        shorter = max(1, n // 3)
        cases += [
            AttentionCase.make(q_len=n, kv_len=n, causal=True, **common),
            AttentionCase.make(q_len=shorter, kv_len=n, causal=True, **common),
            AttentionCase.make(q_len=n, kv_len=max(1, n - n // 4 - 1), causal=False, **common),
        ]
    return [_within(case, limits) for case in cases]


def head_dim_sweep(limits: ScaleLimits) -> list[AttentionCase]:
    """Every head dim of :data:`HEAD_DIMS` at N = M = ``limits.dims_len`` (causal for every
    other one), and D != Dv at the largest."""
    n, dtypes = limits.dims_len, limits.dtypes
    cases = [
        AttentionCase.make(q_len=n, kv_len=n + 7, head_dim=d, causal=i % 2 == 0, dtype=dtypes[i % 2], seed=i)
        for i, d in enumerate(HEAD_DIMS)
    ]
    cases.append(
        AttentionCase.make(
            q_len=n, kv_len=n, head_dim=256, value_dim=128, causal=True, dtype=dtypes[0], seed=99
        )
    )
    return cases


def long_problems(limits: ScaleLimits) -> list[AttentionCase]:
    """Long-KV decode (1 and 16 queries, GQA 4:1 and 8:1), windows at scale, and B * H past
    65,535 (by heads and by batch) where ``limits.wide_grid``."""
    m, n = limits.decode_kv_len, limits.max_len // 2 if limits.wide_grid else limits.max_len // 4
    gqa = {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": torch.bfloat16}
    if limits.max_scores < GPU_LIMITS.max_scores:
        gqa = {"q_heads": 8, "kv_heads": 1, "head_dim": 64, "dtype": torch.bfloat16}
    cases = [
        AttentionCase.make(q_len=1, kv_len=m, **gqa, seed=1),
        AttentionCase.make(q_len=16, kv_len=m, causal=True, batch=2, **gqa, seed=2),
        AttentionCase.make(
            q_len=n, kv_len=n, causal=True, window=(n // 16, 0), head_dim=128, dtype=limits.dtypes[-1], seed=3
        ),
        AttentionCase.make(
            q_len=n - 5,
            kv_len=n,
            window=(n // 8, n // 8 + 3),
            head_dim=64,
            q_heads=4,
            kv_heads=2,
            dtype=torch.bfloat16,
            seed=4,
        ),
    ]
    if limits.wide_grid:
        cases += [
            AttentionCase.make(q_len=5, kv_len=9, q_heads=65537, head_dim=32, causal=True, seed=5),
            AttentionCase.make(q_len=3, kv_len=7, batch=65537, head_dim=16, dtype=torch.bfloat16, seed=6),
        ]
    return [_within(case, limits) for case in cases]


def tier(limits: ScaleLimits) -> list[AttentionCase]:
    """Every problem of the tier except the dispatch boundaries."""
    return ladder(limits) + head_dim_sweep(limits) + long_problems(limits)


def boundary_cases(boundary: DispatchBoundary) -> list[AttentionCase]:
    """The problems just below, at and just above ``boundary`` (distinct ones; for products of
    sizes, the closest each side reaches)."""
    fields = dict(boundary.problem)
    window = fields.pop("window", None)
    base = {"head_dim": 64, "dtype": torch.float16, **fields}
    at, axis = boundary.at, boundary.axis
    if axis == "scores":
        per_key = base.get("batch", 1) * base.get("q_heads", 1) * base.get("q_len", 16)
        first = -(-at // per_key)  # the fewest keys reaching ``at`` score elements
        sizes = [{"kv_len": first - 1}, {"kv_len": first}, {"kv_len": first + 1}]
    elif axis == "batch_heads":
        heads = base.get("q_heads", 1)
        first = -(-at // heads)
        sizes = [{"batch": first - 1}, {"batch": first}, {"batch": first + 1}]
    elif axis == "seq_len":
        sizes = [{"q_len": n, "kv_len": n} for n in (at - 1, at, at + 1)]
    elif axis == "head_dim":
        sizes = [{"head_dim": d, "value_dim": d} for d in (at - 1, at, at + 1)]
    else:
        sizes = [{axis: n} for n in (at - 1, at, at + 1)]
    cases = []
    for i, size in enumerate(sizes):
        shape = {**base, **size}
        shape.setdefault("kv_len", shape.get("q_len", 16))
        cases.append(AttentionCase.make(**shape, window=window, seed=i))
    return cases


def scores(case: AttentionCase) -> int:
    """B * Hq * N * M: what a problem costs, in score elements (FLOPs are this x 2(D + Dv),
    x ~3.5 with the backward)."""
    p = case.problem
    return p.batch * p.q_heads * p.q_len * p.kv_len


def too_large(case: AttentionCase, limits: ScaleLimits) -> str | None:
    """Why ``case`` is beyond ``limits`` (None if it is within)."""
    if scores(case) > limits.max_scores:
        return f"{scores(case):,} score elements > {limits.max_scores:,} on {limits.label}"
    if not limits.wide_grid and case.problem.batch * case.problem.q_heads > 2**16 - 1:
        return f"B * H past 65,535 is left out on {limits.label}"
    return None


def _within(case: AttentionCase, limits: ScaleLimits) -> AttentionCase:
    """``case`` with its batch reduced until it fits ``limits.max_scores`` (never below 1)."""
    p = case.problem
    batch = max(1, min(p.batch, limits.max_scores // max(1, p.q_heads * p.q_len * p.kv_len)))
    return case if batch == p.batch else case.replace(batch=batch)


def describe_cost(cases: list[AttentionCase]) -> str:
    """Total score elements and forward TFLOPs of ``cases``, for a test's report."""
    flops = sum(2 * scores(c) * (c.problem.head_dim + c.problem.value_dim) for c in cases)
    return (
        f"{len(cases)} problems, {sum(map(scores, cases)):,} score elements, {flops / 1e12:.3g} forward TFLOP"
    )
