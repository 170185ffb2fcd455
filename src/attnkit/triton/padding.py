"""Head dims padded with zeros before the Triton kernels run, instead of declined.

Two kinds of problem went wrong compiled on the H100 (triton 3.6) while the interpreter was exact:

* rows that are not a whole number of 16-byte vectors (D = 59 in fp16: 118 bytes; D = 111 with
  Dv = 17 or 3 gave wrong outputs);
* 16-bit problems whose value tile is narrower than the key tile (D = 40, Dv = 24: tiles of 64
  and 32 columns) read out of bounds: wrong rows or an illegal memory access.

So the run zero-pads D (q and k) and Dv (v) to whole 16-byte rows, and widens Dv until its tile
is the key tile's (:func:`padded_dims`), runs the kernels on the padded problem and cuts the
output back to Dv (:func:`padded_attention`). Zero columns change nothing below Dv: every score
``q . k`` only gains ``0 * 0`` terms, and the extra columns of V only make extra output columns.
The scale is the problem's, already resolved (the caller's, or ``1 / sqrt(D)`` of the unpadded
D), and the padded problem carries it unchanged. The pad is ``torch.nn.functional.pad`` outside
the autograd function, so autograd cuts dq, dk and dv back to the caller's shapes, and a
compiled graph traces it like any other op.

The rule depends on the dtype only, not on the device: the CPU interpreter runs the same padded
problem a GPU runs. Padded widths never change the kernels' tiles (a power of two of at least
16 is a multiple of every row step), except where Dv is widened to D's tile.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F

from attnkit.flash_autograd import FlashImplementation, flash_attention
from attnkit.inputs import AttentionProblem
from attnkit.triton.config import padded_dim

#: The byte multiple a row of q, k, v (and of the output and its gradient) must be.
ROW_BYTES = 16


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def padded_dims(head_dim: int, value_dim: int, dtype: torch.dtype) -> tuple[int, int]:
    """(D', Dv'): the head dims the kernels run for ``head_dim`` D and ``value_dim`` Dv in
    ``dtype``. Each is rounded up to a whole number of 16-byte rows (8 elements in 16-bit, 4 in
    float32); for 16-bit inputs Dv' is then raised, if needed, to the smallest such width whose
    tile (:func:`~attnkit.triton.config.padded_dim`) is D''s, since a narrower value tile read
    out of bounds. ``(D, Dv)`` itself when nothing is padded."""
    step = max(1, ROW_BYTES // dtype.itemsize)
    head, value = _round_up(head_dim, step), _round_up(value_dim, step)
    if dtype in (torch.float16, torch.bfloat16) and padded_dim(value) < padded_dim(head):
        # Tiles are powers of two of at least 16: a width above half of D's tile has D's tile.
        value = _round_up(padded_dim(head) // 2 + 1, step)
    return head, value


@functools.lru_cache(maxsize=4096)
def padded_problem(problem: AttentionProblem) -> AttentionProblem | None:
    """The problem the kernels run for ``problem``: its head dims padded (:func:`padded_dims`),
    every other field, the resolved scale included, unchanged; None when nothing is padded.
    Memoised: a call pays one lookup."""
    head, value = padded_dims(problem.head_dim, problem.value_dim, problem.dtype)
    if (head, value) == (problem.head_dim, problem.value_dim):
        return None
    return dataclasses.replace(problem, head_dim=head, value_dim=value)


def pad_operands(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, padded: AttentionProblem
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, Hq, N, D), k (B, Hkv, M, D), v (B, Hkv, M, Dv) with zero columns appended up to
    ``padded``'s D' and Dv' (contiguous copies; an operand already that wide is returned as it
    is). Differentiable: the gradients flow back cut to D and Dv."""

    def pad(x: torch.Tensor, width: int) -> torch.Tensor:
        return x if x.shape[-1] == width else F.pad(x, (0, width - x.shape[-1]))

    return pad(q, padded.head_dim), pad(k, padded.head_dim), pad(v, padded.value_dim)


def padded_attention(
    impl: FlashImplementation,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: AttentionProblem,
    padded: AttentionProblem,
    forward_only=None,
) -> torch.Tensor:
    """:func:`~attnkit.flash_autograd.flash_attention` of ``impl`` on the operands padded to
    ``padded`` (``padded_problem(problem)``), its output cut back to ``problem``'s Dv: (B, Hq,
    N, Dv), a view of the padded (B, Hq, N, Dv') result. ``forward_only``: as in
    ``flash_attention``, for the padded problem."""
    q, k, v = pad_operands(q, k, v, padded)
    out = flash_attention(impl, q, k, v, padded, forward_only=forward_only)
    return out[..., : problem.value_dim]
