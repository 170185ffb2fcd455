"""Gluon kernels for Hopper (sm_90): a warp-specialized FlashAttention forward and backward.

Optional: needs ``triton.experimental.gluon`` (triton 3.6) and an sm_90 GPU. Importing this
package never fails; :func:`available` says whether :func:`forward` can run here and
:func:`unavailable_reason` why not. The Triton path (backend ``"triton"``) runs its forward and
its backward on these kernels where its plan says so (:mod:`attnkit.triton.plan`).

Modules: ``support`` (what the kernels take: problems, layouts, devices; the one rule),
``config`` (tiles and routed cells, per GPU, from the config table), ``route`` (which problems
the Triton path runs here), ``schedule`` (the walk over query tiles the forward and the dQ pass
share), ``hopper_forward`` (the kernel and its partitions), ``forward_launch`` (input checks,
descriptors, grid: :func:`forward`), ``hopper_backward`` (the backward's dK/dV and dQ passes)
and ``backward_launch`` (their launcher).
"""

from __future__ import annotations

import torch

from attnkit.triton.gluon.support import GLUON_API_VERSION, device_support

try:
    from attnkit.triton.gluon.forward_launch import forward
except Exception as error:  # ImportError, or a Gluon API this code does not know
    forward = None
    IMPORT_ERROR: Exception | None = error
else:
    IMPORT_ERROR = None

__all__ = ["GLUON_API_VERSION", "available", "forward", "unavailable_reason"]


def unavailable_reason() -> str | None:
    """Why :func:`forward` cannot run on the current CUDA device, or None if it can."""
    return device_support(torch.device("cuda"))


def available() -> bool:
    """Whether :func:`forward` can run on the current CUDA device."""
    return unavailable_reason() is None
