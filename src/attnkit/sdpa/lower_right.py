"""Bottom-right causal attention with fewer queries than keys (N < M) on SDPA's kernels, at the
cost of the N x M problem: no kernel is handed M - N extra query rows.

SDPA's public ``is_causal`` is aligned top-left, so N < M needs a translation. Two CUDA kernels
have a bottom-right causal mode of their own, reachable through PyTorch's private ops (the same
calls PyTorch makes for ``torch.nn.attention.bias.causal_lower_right``):

* **flash**: ``aten._scaled_dot_product_flash_attention`` reads ``is_causal`` bottom-right when
  N != M (FlashAttention-2's convention; the public API refuses causal N != M on flash for that
  reason). One call, forward and backward, with the query-head group handled by the kernel.
* **efficient**: ``aten._efficient_attention_forward`` with ``custom_mask_type`` bottom-right:
  the kernel's own mask, no mask tensor, and key blocks above the diagonal skipped.

**cuDNN** (``sdpa-cudnn``), whose causal mode PyTorch aligns top-left, runs as two calls with no
mask (:mod:`attnkit.sdpa.split_causal`): the M - N prefix keys every row sees, non-causal, and
the last N keys, an N x N square with cuDNN's own causal mask, merged by their log-sum-exp. A
prefix of one key (M = N + 1), which cuDNN declines, keeps the mask, as does a traced call.

PyTorch's choice (``sdpa``) tries flash, then efficient, as PyTorch itself does for
``causal_lower_right``; cuDNN is not added to it: flash admits the problems cuDNN admits
(fp16 / bf16, head dims up to 256), in one call where cuDNN takes two and a merge. Every other
kernel (math and the CPU kernels) takes the (N, M) visibility matrix as a mask:
:func:`attnkit.sdpa.semantics.sdpa_attention` does that when :func:`native_bottom_right` returns None.
(``causal_lower_right`` itself is not used: it picks its kernel ignoring a forced backend.)

Before a private op runs, PyTorch's own admission check for the kernel (with the alignment
ours: no mask; for cuDNN each part as it is called) decides; a forced kernel it declines raises
:class:`UnsupportedProblemError` with PyTorch's reasons, so no private op sees inputs its
public entry would refuse.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.backends.cuda import (
    SDPAParams,
    can_use_cudnn_attention,
    can_use_efficient_attention,
    can_use_flash_attention,
)
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import AttentionProblem, records_backward
from attnkit.sdpa import split_causal
from attnkit.sdpa.calls import reasons_of, warnings_of

#: The efficient kernel's ``custom_mask_type`` for causal aligned bottom-right (0: none,
#: 1: top-left), PyTorch's ``CausalVariant.LOWER_RIGHT``.
_EFFICIENT_BOTTOM_RIGHT = 2

#: The head-dim multiple the flash kernel needs; PyTorch's public entry pads to it, and so do we.
_FLASH_HEAD_DIM_MULTIPLE = 8


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem) -> torch.Tensor:
    pad = -problem.head_dim % _FLASH_HEAD_DIM_MULTIPLE
    if pad:  # zero columns add nothing to q.k and are cut off the output
        q, k, v = (F.pad(x, (0, pad)) for x in (q, k, v))
    flash = torch.ops.aten._scaled_dot_product_flash_attention
    out = flash(q, k, v, 0.0, True, False, scale=problem.scale)[0]  # is_causal: bottom-right here
    return out[..., : problem.value_dim] if pad else out


def _efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem) -> torch.Tensor:
    # The kernel takes (B, N, H, D); it saves its log-sum-exp only when a backward will need it.
    wants_grad = records_backward(q, k, v)
    out = torch.ops.aten._efficient_attention_forward(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        None,
        None,
        None,
        None,
        None,
        0.0,
        _EFFICIENT_BOTTOM_RIGHT,
        wants_grad,
        scale=problem.scale,
    )[0]
    return out.transpose(1, 2)


#: Kernels with a bottom-right causal mode: SDPA backend -> (PyTorch's admission check, the call).
_NATIVE: dict[SDPBackend, tuple[Callable, Callable]] = {
    SDPBackend.FLASH_ATTENTION: (can_use_flash_attention, _flash),
    SDPBackend.EFFICIENT_ATTENTION: (can_use_efficient_attention, _efficient),
}


def _params(q, k, v, problem: AttentionProblem, is_causal: bool = False) -> SDPAParams:
    """What PyTorch's admission checks read: no mask, and non-causal unless the call itself is
    top-left causal (the alignment is ours)."""
    return SDPAParams(q, k, v, None, 0.0, is_causal, problem.kv_heads != problem.q_heads)


def _reasons(check: Callable, backend: SDPBackend, params: SDPAParams, scale: float) -> str:
    """PyTorch's reasons for refusing ``params`` to ``backend``, whose admission check is
    ``check``: its debug mode's warnings, or, where it gives none (cuDNN's logs them through C++
    on torch 2.11), the public entry's, restricted to ``backend``: it declines before any
    compute and gives its reasons as warnings."""
    caught = warnings_of(lambda: check(params, True))  # debug=True: each refusal as a warning
    if not caught:

        def public_entry():
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(
                    params.query, params.key, params.value, is_causal=params.is_causal,
                    scale=scale, enable_gqa=params.enable_gqa,
                )  # fmt: skip

        caught = warnings_of(public_entry)
    return reasons_of(caught) or "PyTorch's admission check declines it"


def cudnn_runs_split(problem: AttentionProblem) -> bool:
    """Whether :func:`native_bottom_right` runs causal N < M on cuDNN as the split, without a
    mask: eager (a traced call keeps the mask: the admission checks are not traced), with a
    prefix cuDNN takes (:func:`attnkit.sdpa.split_causal.splits`)."""
    return split_causal.splits(problem) and not torch.compiler.is_compiling()


def _cudnn(name: str, q, k, v, problem: AttentionProblem) -> torch.Tensor:
    """The split on cuDNN (:mod:`attnkit.sdpa.split_causal`), once PyTorch admits both calls."""
    p = problem.causal_offset
    parts = (
        ("its non-causal N x (M - N) prefix", k[:, :, :p], v[:, :, :p], False),
        ("its causal N x N square", k[:, :, p:], v[:, :, p:], True),
    )
    for label, k_part, v_part, is_causal in parts:
        params = _params(q, k_part, v_part, problem, is_causal)
        if not can_use_cudnn_attention(params, False):
            raise UnsupportedProblemError(
                f"backend {name!r} cannot run {problem.describe()} on {problem.device} "
                f"(bottom-right causal, N < M, run as a split: {label}): "
                f"{_reasons(can_use_cudnn_attention, SDPBackend.CUDNN_ATTENTION, params, problem.scale)}"
            )
    return split_causal.split_causal_attention(split_causal.CUDNN, q, k, v, problem)


def native_bottom_right(
    name: str,
    backend: SDPBackend | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: AttentionProblem,
) -> torch.Tensor | None:
    """Bottom-right causal N < M on a kernel's own mask or, for cuDNN, as the split (module
    docstring); None where neither applies and the visibility mask is the way. q: (B, Hq, N, D),
    k: (B, Hkv, M, D), v: (B, Hkv, M, Dv), laid out for fused kernels; returns (B, Hq, N, Dv).

    Raises UnsupportedProblemError when ``backend`` is forced and PyTorch declines the inputs."""
    if q.device.type != "cuda":
        return None
    if torch.compiler.is_compiling():
        # Traced, only flash (its private op traces forward and backward; dynamo cannot guard
        # on a dict keyed by SDPBackend, so no _NATIVE lookup here). Otherwise the mask: the
        # admission checks are not traced, and the efficient kernel's backward has no fake
        # implementation that matches its schema (torch 2.13: the meta function lacks ``out``).
        return _flash(q, k, v, problem) if backend == SDPBackend.FLASH_ATTENTION else None
    if backend is None:  # PyTorch's choice: its own order, then the mask (no reasons needed)
        params = _params(q, k, v, problem)
        for check, run in _NATIVE.values():
            if check(params, False):
                return run(q, k, v, problem)
        return None
    if backend == SDPBackend.CUDNN_ATTENTION:
        return _cudnn(name, q, k, v, problem) if split_causal.splits(problem) else None
    if backend not in _NATIVE:
        return None
    check, run = _NATIVE[backend]
    params = _params(q, k, v, problem)
    if not check(params, False):
        raise UnsupportedProblemError(
            f"backend {name!r} cannot run {problem.describe()} on {problem.device} "
            f"(bottom-right causal, N < M): {_reasons(check, backend, params, problem.scale)}"
        )
    return run(q, k, v, problem)
