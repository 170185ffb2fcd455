"""PyTorch's FlexAttention as the ``flex`` backend, registered through the public API
(:func:`attnkit.register_backend`, by :mod:`attnkit.builtins`) like any external kernel.

``torch.nn.attention.flex_attention.flex_attention`` is compiled with :func:`torch.compile`, once
per problem class (dtype, heads, head dims, scale, mask), so no class ever runs uncompiled;
attnkit's masking rule (bottom-right causal and the sliding window,
:attr:`attnkit.AttentionProblem.key_band`) becomes its block mask, and GQA its ``enable_gqa``.
A row that sees no key comes out of FlexAttention as zeros with zero gradients, attnkit's rule,
so no fix-up runs after it (the installed suite checks it: ``pytest --pyargs attnkit.suite
--attnkit-backend flex``).

On the CPU (torch 2.13) FlexAttention computes no gradients and compiles each new shape for
~15 s on two cores, too slow for a property-based suite that draws dozens of shapes: the backend
declines the CPU unless ``ATTNKIT_FLEX_CPU=1``, and there declines calls that need gradients.
There its forward matches the oracle, but NaN does not propagate as attnkit's rule says: a NaN
in a query row gives a row of zeros, and of the rows that see a NaN key only some are NaN (the
suite's ``test_contract`` reports both). attnkit does not patch this up after the kernel: that
would cost every call a pass over q, k and v.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable

import torch

from attnkit.inputs import AttentionProblem, records_backward

#: The environment variable that lets the ``flex`` backend run (forward only) on the CPU.
CPU_OPT_IN = "ATTNKIT_FLEX_CPU"


def _functions():
    """(flex_attention, create_block_mask), or the ImportError of a torch without them."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    return flex_attention, create_block_mask


#: The torch.compile backend of eager calls (tests count Dynamo's compilations with "eager").
COMPILE_BACKEND = "inductor"


def _call_flex(flex, q, k, v, block_mask, scale, enable_gqa):
    """The frame each problem class compiles: a copy of this code object per class."""
    return flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


@functools.cache
def _compiled(problem_class: tuple) -> Callable:
    """flex_attention compiled for one class of problems (:func:`_problem_class`); eager calls go
    through it. Dynamo specialises FlexAttention on the dtype, the head counts and dims, the scale,
    the mask's presence and gradients, and keeps at most ``recompile_limit`` (8) compilations per
    code object: past them it runs the frame uncompiled, which for FlexAttention is an unfused
    reference that materialises the scores (and cannot be captured in a CUDA graph). One code
    object shared by every call would reach that limit in any process that sees nine classes, so
    each class compiles a code object of its own; within one, only B, N and M vary, which Dynamo
    makes dynamic after one recompilation."""
    name = f"flex_attention_class_{_compiled.cache_info().currsize}"
    frame = types.FunctionType(_call_flex.__code__.replace(co_name=name), _call_flex.__globals__, name)
    return torch.compile(frame, backend=COMPILE_BACKEND)


def _problem_class(problem: AttentionProblem, needs_grad: bool) -> tuple:
    """What Dynamo specialises a FlexAttention call on, less B, N and M (dynamic after one
    recompilation): the key of :func:`_compiled`."""
    lower, upper = problem.key_band
    return (
        problem.device,
        problem.dtype,
        problem.q_heads,
        problem.kv_heads,
        problem.head_dim,
        problem.value_dim,
        problem.scale,
        lower is None,
        upper is None,
        needs_grad,
    )


def flex_device_support(device: torch.device) -> str | None:
    """Why FlexAttention cannot run on ``device``, or None."""
    try:
        _functions()
    except ImportError as err:
        return f"this torch ({torch.__version__}) has no torch.nn.attention.flex_attention: {err}"
    if device.type == "cuda":
        return None
    if device.type == "cpu":
        if os.environ.get(CPU_OPT_IN) == "1":
            return None
        return (
            "on the CPU, FlexAttention computes no gradients and compiles each shape for ~15 s; "
            f"set {CPU_OPT_IN}=1 to run its forward there"
        )
    return f"attnkit runs FlexAttention on CUDA (and the CPU on request), not on {device.type}"


def flex_problem_support(problem: AttentionProblem) -> str | None:
    """Why FlexAttention declines ``problem``, or None."""
    if problem.dtype == torch.float64:
        return "FlexAttention takes fp16, bf16 and fp32, not float64 (use 'naive' or 'tiled')"
    if problem.device.type == "cuda" and min(problem.head_dim, problem.value_dim) < 16:
        dims = f"D={problem.head_dim} Dv={problem.value_dim}"
        return f"FlexAttention's CUDA kernels need head dims >= 16, got {dims}"
    if problem.device.type == "cuda" and problem.group_size > 1 and problem.q_len < _DECODING_BELOW:
        # FlexAttention takes these to its decoding kernel; on the H100 (torch 2.11) Inductor found
        # no kernel for one (Hq=4 Hkv=1 N=M=33 bf16 with gradients: NoValidChoicesError).
        return (
            f"FlexAttention's decoding kernel (GQA with fewer than {_DECODING_BELOW} queries) failed to "
            "compile for such shapes on CUDA (torch 2.11)"
        )
    return None


#: Queries below which FlexAttention runs grouped-query problems through its decoding kernel.
_DECODING_BELOW = 128


def _band_mask(q_len: int, kv_len: int, lower: int | None, upper: int | None, device: torch.device):
    """The block mask of the band ``i + lower <= j <= i + upper`` (None: unbounded side),
    shared by every batch and head."""

    def band(b, h, q_idx, kv_idx):
        visible = kv_idx >= 0  # all True, of the index tensors' shape
        if upper is not None:
            visible = visible & (kv_idx <= q_idx + upper)
        if lower is not None:
            visible = visible & (kv_idx >= q_idx + lower)
        return visible

    return _functions()[1](band, None, None, q_len, kv_len, device=device)


#: Eager calls reuse a problem's block mask (made once per N, M, band and device).
_cached_band_mask = functools.lru_cache(maxsize=256)(_band_mask)


def flex_run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem) -> torch.Tensor:
    """FlexAttention on validated q (B, Hq, N, D), k (B, Hkv, M, D), v (B, Hkv, M, Dv):
    the (B, Hq, N, Dv) output. Traced by torch.compile, FlexAttention and its block mask are
    traced in place (the caller's compilation fuses them); eagerly, the compiled kernel runs."""
    if problem.device.type == "cpu":
        # Forward-only there (declared in attnkit.builtins: a call recording a backward never gets
        # here). FlexAttention's CPU path refuses inputs that require grad even under
        # torch.no_grad(), where no graph is recorded: what it gets then are their detached views.
        q, k, v = q.detach(), k.detach(), v.detach()
    tracing = torch.compiler.is_compiling()
    lower, upper = problem.key_band
    mask = None
    if lower is not None or upper is not None:
        make = _band_mask if tracing else _cached_band_mask
        mask = make(problem.q_len, problem.kv_len, lower, upper, problem.device)
    enable_gqa = problem.group_size > 1
    if tracing:
        return _functions()[0](q, k, v, block_mask=mask, scale=problem.scale, enable_gqa=enable_gqa)
    needs_grad = records_backward(q, k, v)
    run = _compiled(_problem_class(problem, needs_grad))
    return run(_functions()[0], q, k, v, mask, problem.scale, enable_gqa)
