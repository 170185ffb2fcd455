"""Gluon kernels for Hopper (sm_90): a warp-specialized FlashAttention forward.

Optional: needs ``triton.experimental.gluon`` (triton 3.6) and an sm_90 GPU. Importing this
package never fails; :func:`available` says whether :func:`forward` can run here and
:func:`unavailable_reason` why not. The Triton path (backend ``"triton"``) runs its forward on
this kernel where it can (:mod:`attnkit.triton.gluon_route`).

Modules: ``hopper_forward`` (the kernel and its partitions), ``config`` (tiles and register
budgets by head dim), ``launch`` (input checks, descriptors, grid: :func:`forward`).
"""

from __future__ import annotations

import os

try:
    from attnkit.gluon.launch import forward
except Exception as error:  # ImportError, or a Gluon API this code does not know
    forward = None
    _IMPORT_ERROR: Exception | None = error
else:
    _IMPORT_ERROR = None

__all__ = ["GLUON_API_VERSION", "available", "forward", "unavailable_reason"]

#: The triton release whose (experimental) Gluon API the kernel is written against.
GLUON_API_VERSION = "3.6."


def unavailable_reason() -> str | None:
    """Why :func:`forward` cannot run on the current CUDA device, or None if it can."""
    if _IMPORT_ERROR is not None:
        return f"triton.experimental.gluon (Hopper) not importable: {_IMPORT_ERROR!r}"
    import triton

    if not triton.__version__.startswith(GLUON_API_VERSION):
        # Gluon is experimental: 3.9 already renamed the TMA copies this kernel calls.
        return (
            f"the kernel is written against triton {GLUON_API_VERSION}x's Gluon API, "
            f"found triton {triton.__version__}"
        )
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "Gluon kernels do not run under the Triton interpreter (TRITON_INTERPRET is set)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    capability = torch.cuda.get_device_capability()
    if capability != (9, 0):
        return f"needs sm_90 (Hopper), the current device is sm_{capability[0]}{capability[1]}"
    return None


def available() -> bool:
    """Whether :func:`forward` can run on the current CUDA device."""
    return unavailable_reason() is None
