"""The layout rule: which operands SDPA's fused kernels may read as they are, and the copies
made of the others. Any strides are accepted by attnkit; these are the ones a kernel is handed.

* CUDA. PyTorch's CUDA flash kernel (torch 2.11) reads rows with 16-byte vector loads and faults
  with "misaligned address" (poisoning the CUDA context) when a row stride is not a multiple of
  16 bytes (e.g. every other row of a (.., 2N, D + 3) buffer); the memory-efficient backward and
  cuDNN have their own limits (:func:`aligned_for_fused_kernels`). Such operands are copied to
  row-major memory first; aligned strided views pass through untouched.
* CPU. PyTorch's CPU flash kernel declines an operand whose last dimension is not contiguous
  ("All fused kernels require the last dimension of the input to have stride 1"); forced flash
  gets a contiguous copy of such an operand (:func:`for_fused_kernels`).

Math (``sdpa-math``) takes any layout and never goes through this rule
(:data:`attnkit.sdpa.support.ANY_LAYOUT`). Eager only: under torch.compile the tensors are
symbolic (no data pointer), and Inductor's SDPA lowering enforces the same 16-byte alignment.
The compiled fast path applies the same CUDA rule in C++ (``layout_passes`` in
``attnkit/fastpath/csrc/fast_calls.cpp``); a parity test holds the two together.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from attnkit.inputs import AttentionProblem
from attnkit.sdpa.support import SDPA_BACKENDS


def aligned_for_fused_kernels(x: torch.Tensor, item: int, last_dim: int) -> torch.Tensor:
    """``x`` (a CUDA tensor of ``item``-byte elements whose last dimension is ``last_dim``: the
    problem's, so no per-call size queries), or a contiguous copy if its layout would misalign
    CUDA fused kernels' loads or broadcast a dimension through a zero stride."""
    if x.data_ptr() % 16:
        return packed(x)
    if (last_dim * item) % 16:
        # Rows no layout can align: PyTorch pads the head dim itself; a copy only makes them dense.
        return x.contiguous()
    # Every stride, size-1 dimensions' included: is_contiguous ignores those, the memory-efficient
    # backward does not (on the H100, torch 2.11, a (1, 1, 1, 16) fp16 key viewed with a row
    # stride of 38 elements had "no kernel found to launch"). A zero stride (an expanded tensor)
    # is materialised too: cuDNN (torch 2.11) crashed the process with a segmentation fault on
    # operands expanded along the batch. The item size (2, 4 or 8 bytes) divides 16, so each
    # stride is a whole number of 16-byte steps iff its low bits are zero, which their OR tests
    # at once (x is 4-D: validated).
    batch, heads, rows, last = x.stride()
    aligned = last == 1 and 0 not in (batch, heads, rows) and ((batch | heads | rows) * item) % 16 == 0
    return x if aligned else packed(x)


def for_fused_kernels(name: str, q, k, v, problem: AttentionProblem):
    """q, k, v laid out for backend ``name``'s kernels (module docstring): on CUDA
    :func:`aligned_for_fused_kernels` on each; on the CPU, for forced flash, rows of stride 1;
    otherwise as they are."""
    if q.is_cuda:
        return fused_layout(q, k, v, problem)
    if SDPA_BACKENDS[name] is SDPBackend.FLASH_ATTENTION:
        return unit_rows(q, k, v, problem)
    return q, k, v


def unit_rows(q, k, v, problem: AttentionProblem):
    """q, k, v with rows of stride 1, as PyTorch's CPU flash kernel reads them: an operand
    whose last dimension is strided is copied (module docstring), the others pass as they are.
    Checked before every call, so no kernel call fails (and prints PyTorch's warnings) first;
    ``is_contiguous()`` first, as it costs a third of ``stride(3)`` (~75 ns, CPU)."""
    if q.is_contiguous() and k.is_contiguous() and v.is_contiguous():
        return q, k, v
    if q.stride(3) == 1 and k.stride(3) == 1 and v.stride(3) == 1:
        return q, k, v
    return tuple(x if x.stride(3) == 1 else packed(x) for x in (q, k, v))


def fused_layout(q, k, v, problem: AttentionProblem):
    """:func:`aligned_for_fused_kernels` applied to q, k and v, whatever their device."""
    item = problem.dtype.itemsize
    return (
        aligned_for_fused_kernels(q, item, problem.head_dim),
        aligned_for_fused_kernels(k, item, problem.head_dim),
        aligned_for_fused_kernels(v, item, problem.value_dim),
    )


def layout_memo():
    """The fused-kernel layout rule for the calls of one problem, as a function
    ``(q, k, v, problem) -> (q, k, v)`` that remembers the strides it last passed untouched. The
    rule reads only the data pointers' 16-byte alignment and the strides (the shapes are the
    problem's), so operands with those strides and aligned pointers pass as they are without the
    rule's arithmetic on each (~0.5 us less per call, measured on CPU tensors); any other call
    runs the rule. A closure, not an object with ``__call__``: calling one is cheaper."""
    passed = [None]  # the strides of q, k, v the rule last passed untouched

    def laid_out(q, k, v, problem: AttentionProblem):
        strides = (q.stride(), k.stride(), v.stride())
        if strides == passed[0] and not (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16:
            return q, k, v
        result = fused_layout(q, k, v, problem)
        if result[0] is q and result[1] is k and result[2] is v:
            passed[0] = strides
        return result

    return laid_out


def packed(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` with the row-major strides of its shape, size-1 dimensions included
    (``x.contiguous()`` returns ``x`` itself when only size-1 dimensions have odd strides)."""
    return torch.empty_like(x, memory_format=torch.contiguous_format).copy_(x)
