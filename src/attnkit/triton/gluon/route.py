"""Which problems the Triton path runs on the Gluon Hopper kernels, and the routed launch.

On an H100/H200 the Gluon forward and backward are faster than the plain Triton ones in the
cells where they measured so (the GPU's table, :mod:`attnkit.triton.gluon.config`); everything
else keeps the plain kernels. A pass (``forward`` or ``backward``) is routed when:

* the pass's kernel takes the problem (:data:`attnkit.triton.gluon.support.PASS_SUPPORT`);
* :func:`preferred`: the problem is in a routed cell (head dim, causal) from the cell's N on,
  and has at least :data:`GLUON_MIN_SCORES` score pairs;
* :func:`switch`: ``$ATTNKIT_GLUON`` is not ``0`` and the kernels can run on the device
  (:func:`attnkit.triton.gluon.support.device_support`).

:mod:`attnkit.triton.plan` asks :func:`routed` once per problem; per call, a layout the kernel
does not read as it is (:func:`attnkit.triton.gluon.support.layout_ok`) falls back to the
plain kernels rather than paying a copy.

The Gluon forward returns the log-sum-exp exactly as the plain forward stores it ((B, H, N)
float32, contiguous, natural log, +inf for rows that see no key), so either backward consumes
either forward's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from attnkit.inputs import AttentionProblem
from attnkit.triton.gluon.config import device_section, routed_cells
from attnkit.triton.gluon.support import PASS_SUPPORT, device_support

#: Set to ``0`` to run every pass on the plain Triton kernels (for A/B runs and bisecting).
ENV_SWITCH = "ATTNKIT_GLUON"

#: Problems with fewer (query, key) score pairs than this (B * H * N * M) keep the plain
#: kernels: they run in tens of microseconds, where building the Gluon kernel's three TMA
#: descriptors in Python costs more host time than the plain path's bound (or native) launch.
GLUON_MIN_SCORES = 2**24


def preferred(problem: AttentionProblem, cells: Mapping[tuple[int, bool], int]) -> bool:
    """Whether ``problem`` (one the kernels take) is in one of ``cells`` ((head dim, causal) ->
    smallest N, :func:`attnkit.triton.gluon.config.routed_cells`) and large enough."""
    p = problem
    scores = p.batch * p.q_heads * p.q_len * p.kv_len
    min_q_len = cells.get((p.head_dim, p.causal))
    return min_q_len is not None and p.q_len >= min_q_len and scores >= GLUON_MIN_SCORES


def switch(device: torch.device) -> str | None:
    """None if passes on ``device`` may run on the Gluon kernels, else why not: the
    ``$ATTNKIT_GLUON`` switch, then whether the kernels can run there."""
    if os.environ.get(ENV_SWITCH, "1").strip() == "0":
        return f"${ENV_SWITCH}=0"
    return device_support(device)


def routed(problem: AttentionProblem, pass_name: str) -> bool:
    """Whether ``problem``'s ``pass_name`` pass runs on the Gluon kernel (for layouts it reads
    as they are). The device's cells are read from its table here: a GPU without measured
    cells routes nothing."""
    return (
        PASS_SUPPORT[pass_name](problem) is None
        and switch(problem.device) is None
        and preferred(problem, routed_cells(device_section(problem.device), pass_name))
    )


def gluon_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gluon forward of ``problem`` (one :func:`routed` accepts; q, k, v passing
    :func:`~attnkit.triton.gluon.support.layout_ok`). q: (B, H, N, D), k, v: (B, H, M, D).
    Returns out (B, H, N, D) in q's dtype and lse (B, H, N) float32, as
    :func:`attnkit.triton.launch.attention_forward`."""
    # The unchecked launch: the plan and the layout rule have checked what forward() would.
    from attnkit.triton.gluon.forward_launch import launch

    return launch(q, k, v, problem.causal, problem.scale)


def gluon_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    problem: AttentionProblem,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Gluon backward of ``problem`` (one :func:`routed` accepts for ``"backward"``; q, k, v,
    out, grad_out passing :func:`~attnkit.triton.gluon.support.layout_ok`, lse contiguous).
    Returns (dq, dk, dv) as :func:`attnkit.triton.launch.attention_backward`."""
    # The unchecked launch: the plan and the layout rule have checked what backward() would.
    from attnkit.triton.gluon.backward_launch import launch

    return launch(q, k, v, out, grad_out, lse, problem)
