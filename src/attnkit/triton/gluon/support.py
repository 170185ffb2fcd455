"""What the Gluon Hopper kernels take, written once: the problem rule, the layout rule and the
device check. The Triton path asks them before routing a problem (:mod:`attnkit.triton.plan`),
and :func:`attnkit.triton.gluon.forward` and
:func:`attnkit.triton.gluon.backward_launch.backward` before launching on a caller's tensors.

Nothing here imports ``triton.experimental``: the problem and layout rules are pure, so they are
tested on any machine, and the device check learns whether the Gluon API imported from the
package (:mod:`attnkit.triton.gluon`).
"""

from __future__ import annotations

import functools
import os

import torch

from attnkit.inputs import AttentionProblem

#: What the Gluon kernels take.
GLUON_HEAD_DIMS = (64, 128)
GLUON_DTYPES = (torch.float16, torch.bfloat16)
#: TMA row coordinates into (B * H * rows, D) are int32.
MAX_ROWS = 2**31 - 1
#: The compute capability the kernels are written for (wgmma, setmaxnreg, TMA).
HOPPER = (9, 0)
#: The triton release whose (experimental) Gluon API the kernels are written against.
GLUON_API_VERSION = "3.6."


def problem_support(problem: AttentionProblem) -> str | None:
    """None if the Gluon forward takes ``problem`` (whatever the device), else why not."""
    p = problem
    if p.q_heads != p.kv_heads:
        return f"grouped heads ({p.q_heads} query heads, {p.kv_heads} key/value heads): no GQA"
    return _shared_support(p) or _rows_support(p.batch * p.q_heads * max(p.q_len, p.kv_len))


def backward_problem_support(problem: AttentionProblem) -> str | None:
    """None if the Gluon backward takes ``problem`` (whatever the device), else why not: the
    forward's rule, grouped heads (GQA, MQA) included."""
    p = problem
    return _shared_support(p) or _rows_support(p.batch * max(p.q_heads * p.q_len, p.kv_heads * p.kv_len))


def _shared_support(p: AttentionProblem) -> str | None:
    if p.dtype not in GLUON_DTYPES:
        return f"dtype {p.dtype} (float16 or bfloat16 only)"
    if p.head_dim != p.value_dim or p.head_dim not in GLUON_HEAD_DIMS:
        return f"head dims D={p.head_dim}, Dv={p.value_dim} (D = Dv in {GLUON_HEAD_DIMS} only)"
    if p.has_window:
        return f"sliding window {p.window}"
    if not p.scale > 0:
        # The kernels fold the scale into the row max, which needs a positive scale.
        return f"scale {p.scale} (must be > 0)"
    if p.q_len < 1 or p.kv_len < 1:
        return f"empty problem (N={p.q_len}, M={p.kv_len})"
    return None


def _rows_support(rows: int) -> str | None:
    if rows > MAX_ROWS:
        return f"B * H * rows = {rows} exceeds the int32 TMA coordinates"
    return None


#: The problem rule of each pass that has a Gluon kernel.
PASS_SUPPORT = {"forward": problem_support, "backward": backward_problem_support}


def layout_ok(*tensors: torch.Tensor) -> bool:
    """Whether the kernels read ``tensors`` as they are: contiguous (B, H, rows, D), 16-byte
    aligned bases (TMA). Another layout runs the plain kernels rather than paying a copy."""
    return all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in tensors)


def device_support(device: torch.device) -> str | None:
    """None if the Gluon kernels can run on ``device``, else why not: the Gluon API imported
    (and is the release the kernels are written against), no interpreter, CUDA sm_90."""
    if device.type != "cuda":
        return f"device {device}: a Gluon kernel runs on CUDA sm_{HOPPER[0]}{HOPPER[1]}"
    if device.index is not None:
        return _cuda_support(device.index)
    return _cuda_support(torch.cuda.current_device() if torch.cuda.is_available() else 0)


@functools.cache
def _cuda_support(index: int) -> str | None:
    from attnkit.triton import gluon  # the package that imports the API, never failing

    if gluon.IMPORT_ERROR is not None:
        return f"triton.experimental.gluon (Hopper) not importable: {gluon.IMPORT_ERROR!r}"
    import triton

    if not triton.__version__.startswith(GLUON_API_VERSION):
        # Gluon is experimental: 3.9 already renamed the TMA copies these kernels call.
        return (
            f"the kernels are written against triton {GLUON_API_VERSION}x's Gluon API, "
            f"found triton {triton.__version__}"
        )
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "Gluon kernels do not run under the Triton interpreter (TRITON_INTERPRET is set)"
    if not torch.cuda.is_available():
        return "no CUDA device"
    capability = torch.cuda.get_device_capability(index)
    if capability != HOPPER:
        return f"needs sm_{HOPPER[0]}{HOPPER[1]} (Hopper), cuda:{index} is sm_{capability[0]}{capability[1]}"
    return None
