"""Attention as a ``torch.library`` op: the form torch.compile and CUDA graphs see.

``attnkit::flash_forward(q, k, v, causal, scale, path, window_left=-1, window_right=-1)
-> (out, lse)`` and ``attnkit::flash_backward(grad_out, q, k, v, out, lse, causal, scale, path,
window_left=-1, window_right=-1) -> (dq, dk, dv)`` run a FlashAttention-style path (``path``: a
key of :data:`attnkit.flash_autograd.PATHS`, ``"tiled"`` or ``"triton"``) with its default
config; the window is
:func:`attnkit.attention`'s, as two ints (-1: unbounded side), since an op schema takes no
optional tuples. Each has a fake implementation (shapes,
dtypes and strides without compute), so the compiler traces through them, and the backward is
registered as the forward's autograd formula, so a compiled training step keeps the paths'
O(N)-memory recomputing backward.

Why ``custom_op`` and not ``triton_op``/``wrap_triton`` for the Triton path: the launcher
decides per call from the tensors' data pointers (16-byte alignment, TMA eligibility), builds
host-side TMA descriptors and reads the per-GPU config table; none of that can run on the fake
tensors ``triton_op`` traces its body with. As an opaque op the launcher runs as it does in
eager mode, CUDA-graph capture included (it allocates through PyTorch and never synchronises).

The SDPA and naive paths need no op: they are made of ATen ops (``scaled_dot_product_attention``
and its ``sdpa_kernel`` selection included) that the compiler traces and differentiates itself.

Eager calls do not go through these ops (see :mod:`attnkit.flash_autograd`): the dispatcher
costs host time on every call, and eager mode gains nothing from it.
"""

from __future__ import annotations

import contextlib

import torch

from attnkit import tiled  # noqa: F401  (registers the "tiled" path)
from attnkit.flash_autograd import PATHS
from attnkit.inputs import check_inputs

with contextlib.suppress(ImportError):  # without triton installed the op serves "tiled" only
    from attnkit import triton as _triton  # noqa: F401  (registers the "triton" path)


def _path(name: str):
    if name not in PATHS:
        raise ValueError(f"path: expected one of {sorted(PATHS)}, got {name!r}")
    return PATHS[name]


def _window(window_left: int, window_right: int) -> tuple[int, int] | None:
    return None if window_left == -1 and window_right == -1 else (window_left, window_right)


@torch.library.custom_op("attnkit::flash_forward", mutates_args=())
def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    path: str,
    window_left: int = -1,
    window_right: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: (B, Hq, N, D), k: (B, Hkv, M, D), v: (B, Hkv, M, Dv). Returns out (B, Hq, N, Dv) in q's
    dtype and lse (B, Hq, N) in the path's accumulator dtype, both contiguous."""
    problem = check_inputs(q, k, v, causal, scale, _window(window_left, window_right))
    return _path(path)().forward(q, k, v, problem)


@flash_forward.register_fake
def _(q, k, v, causal, scale, path, window_left=-1, window_right=-1):
    batch, q_heads, q_len, _ = q.shape
    out = q.new_empty(batch, q_heads, q_len, v.shape[-1])
    lse = q.new_empty(batch, q_heads, q_len, dtype=_path(path).lse_dtype(q.dtype))
    return out, lse


@torch.library.custom_op("attnkit::flash_backward", mutates_args=())
def flash_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
    path: str,
    window_left: int = -1,
    window_right: int = -1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """grad_out, out: (B, Hq, N, Dv); lse from :func:`flash_forward`. Returns dq, dk, dv shaped
    like q, k, v, contiguous."""
    problem = check_inputs(q, k, v, causal, scale, _window(window_left, window_right))
    return _path(path)().backward(grad_out, q, k, v, out, lse, problem)


@flash_backward.register_fake
def _(grad_out, q, k, v, out, lse, causal, scale, path, window_left=-1, window_right=-1):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, *args = inputs  # causal, scale, path, window_left, window_right
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.mark_non_differentiable(lse)
    ctx.args = tuple(args)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = flash_backward(grad_out, q, k, v, out, lse, *ctx.args)
    return dq, dk, dv, *(None for _ in ctx.args)


flash_forward.register_autograd(_backward, setup_context=_setup_context)
