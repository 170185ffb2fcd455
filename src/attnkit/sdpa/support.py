"""Which SDPA kernels attnkit can force, and what each declines before any call: the registry's
device and problem checks for the ``sdpa*`` backends."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from attnkit.inputs import AttentionProblem

#: attnkit backend name -> the SDPA backend it forces (None: PyTorch chooses).
SDPA_BACKENDS: dict[str, SDPBackend | None] = {
    "sdpa": None,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-math": SDPBackend.MATH,
}

#: Kernels that take a sliding window as an ``attn_mask``: PyTorch's choice, efficient, math, and
#: cuDNN, whose SDPA accepts a mask (PyTorch's ``can_use_cudnn_attention`` checks the mask's
#: shape, ``check_attn_mask_shape``, where ``can_use_flash_attention`` rejects any mask,
#: ``check_for_attn_mask``). A kernel that declines a particular masked call still says why at
#: call time.
WINDOW_MASK_KERNELS = (None, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION)

#: Backends that exist only as CUDA kernels (on CPU PyTorch has flash and math).
CUDA_ONLY = {SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION}

#: Backends that take operands in any layout: math is composite ATen ops (matmuls, softmax),
#: none of which reads rows with the fused kernels' vector loads, so the layout rule
#: (:func:`attnkit.sdpa.layout.for_fused_kernels`) is not applied to it: no copies, and no
#: per-call layout check (on an H100 host every microsecond of Python before the math op cost
#: it ~3.7 us, torch 2.11).
ANY_LAYOUT = frozenset({"sdpa-math"})


def sdpa_device_support(name: str, device: torch.device) -> str | None:
    """Why backend ``name`` cannot run on ``device`` at all, or None if it can."""
    backend = SDPA_BACKENDS[name]
    if backend in CUDA_ONLY and device.type != "cuda":
        return f"{name} is a CUDA kernel; device {device} is not a CUDA device"
    if backend == SDPBackend.CUDNN_ATTENTION and not torch.backends.cudnn.is_available():
        return f"{name} needs cuDNN, which this PyTorch build does not provide"
    return None


def sdpa_problem_support(name: str, problem: AttentionProblem) -> str | None:
    """Reasons known before launch; anything subtler comes from PyTorch at call time. A path
    suggested instead is one that runs on the problem's device."""
    backend = SDPA_BACKENDS[name]
    if problem.dtype == torch.float64 and backend not in (None, SDPBackend.MATH):
        return f"{name} does not support float64 on {problem.device.type} (use sdpa-math)"
    if problem.has_window and backend not in WINDOW_MASK_KERNELS:
        takers = [
            other
            for other, kernel in SDPA_BACKENDS.items()
            if kernel in WINDOW_MASK_KERNELS and sdpa_device_support(other, problem.device) is None
        ]
        return (
            f"{name} takes no attn_mask, and a sliding window reaches SDPA only as a mask "
            f"(on {problem.device.type}, use {', '.join(takers)})"
        )
    return None
