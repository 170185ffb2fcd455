"""The SDPA path: ``torch.nn.functional.scaled_dot_product_attention``, optionally forcing one
of its kernels, with attnkit's semantics on top (backends ``sdpa``, ``sdpa-flash``,
``sdpa-efficient``, ``sdpa-cudnn``, ``sdpa-math``).

Layers, one module each, each importing only those above it:

* ``support``: the backends and the checks the registry asks before dispatch;
* ``layout``: which operands the fused kernels read as they are, and the copies of the others;
* ``forcing``: one kernel forced through SDPA's enable-flags;
* ``calls``: one SDPA call, with PyTorch's reasons in attnkit's error when a kernel declines;
* ``split_causal`` / ``lower_right``: bottom-right causal with fewer queries than keys on the
  kernels whose own mode is top-left;
* ``semantics``: :func:`sdpa_attention`, attnkit's rules (causal alignment, windows, scales) on
  SDPA;
* ``prepare``: :func:`sdpa_prepare`, the prepared run made once per call signature.
"""

from attnkit.sdpa.prepare import sdpa_prepare
from attnkit.sdpa.semantics import sdpa_attention
from attnkit.sdpa.support import (
    SDPA_BACKENDS,
    WINDOW_MASK_KERNELS,
    sdpa_device_support,
    sdpa_problem_support,
)

__all__ = [
    "SDPA_BACKENDS",
    "WINDOW_MASK_KERNELS",
    "sdpa_attention",
    "sdpa_device_support",
    "sdpa_prepare",
    "sdpa_problem_support",
]
