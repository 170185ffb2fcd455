"""What every tuner ranks candidates with: the inputs of one tuning point (and the backward's
batch), and the time-over-best rule (:mod:`attnkit_tools.tune.configs`,
:mod:`attnkit_tools.tune.gluon`, :mod:`attnkit_tools.tune.routing`,
:mod:`attnkit_tools.pages.decode_table`)."""

from __future__ import annotations

import math

import torch

from attnkit.inputs import check_inputs


def backward_batch(seq_len: int) -> int:
    """The batch of the backward's timed problems: 4, 2 at N = 16384 and longer."""
    return 2 if seq_len >= 16384 else 4


def tuning_inputs(dtype, head_dim, causal, seq_len, batch=4):
    """q, k, v, dO of one tuning point (H*D = 2048, random, seeded) on the GPU, and their problem."""
    heads = 2048 // head_dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, heads, seq_len, head_dim)
    q, k, v, do = (torch.randn(shape, generator=gen, device="cuda", dtype=dtype) for _ in range(4))
    return q, k, v, do, check_inputs(q, k, v, causal, None)


def time_over_best(times: dict) -> dict:
    """{candidate: geometric mean over the points of its time / the best candidate's time at
    that point} from ``times`` = {candidate: {point: time}}, every candidate timed at the same
    points. The ranking rule of every config choice here and in ``attnkit_tools.pages.decode_table``."""
    points = next(iter(times.values()), {})
    best = {n: min(per_point[n] for per_point in times.values()) for n in points}
    return {
        candidate: math.prod(per_point[n] / best[n] for n in points) ** (1 / len(points))
        for candidate, per_point in times.items()
    }
