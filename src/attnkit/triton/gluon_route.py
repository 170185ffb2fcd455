"""Which forwards of the Triton path run on the warp-specialized Gluon kernel (:mod:`attnkit.gluon`).

On an H100/H200 the Gluon forward is faster than the plain Triton one on the problems it
supports; everything else keeps the plain kernels. The decision has three parts:

* :func:`gluon_problem_support`: the problem (shapes, dtype, masking) is one the kernel takes;
  pure, no device query, so it is tested on any machine;
* :func:`gluon_preferred`: the problem is in a cell where the Gluon kernel measured faster than
  the plain one (:data:`ROUTED_CELLS`, by head dim, causal and N), and large enough
  (:data:`GLUON_MIN_SCORES`);
* :func:`gluon_switch`: ``$ATTNKIT_GLUON`` is not ``0`` and the kernel can run here (sm_90,
  triton's Gluon API, not the interpreter); read when a problem's setup is built, i.e. once per
  problem signature in a process;
* :func:`gluon_layout_ok`: per call, q, k and v are laid out as the kernel reads them
  (contiguous (B, H, rows, D), 16-byte aligned bases for TMA); another layout falls back to the
  plain kernels rather than paying a copy.

The Gluon forward returns the log-sum-exp exactly as the plain forward stores it ((B, H, N)
float32, contiguous, natural log, +inf for rows that see no key), so the Triton backward
consumes either.
"""

from __future__ import annotations

import functools
import os

import torch

from attnkit.inputs import AttentionProblem

#: Set to ``0`` to run every forward on the plain Triton kernels (for A/B runs and bisecting).
ENV_SWITCH = "ATTNKIT_GLUON"

#: What the Gluon forward takes (see :mod:`attnkit.gluon.launch`).
GLUON_HEAD_DIMS = (64, 128)
GLUON_DTYPES = (torch.float16, torch.bfloat16)
#: TMA row coordinates into (B * H * rows, D) are int32.
_MAX_ROWS = 2**31 - 1

#: (head dim, causal) -> the smallest N (queries) whose forward runs on the Gluon kernel: the
#: cells and lengths where it measured faster than the plain Triton forward on an H100 (bf16,
#: B*H*D = 4*2048, N = 1024, 4096, 8192 and 16384, ``do_bench`` medians of both in one run).
#: At N = 1024 the plain kernel was faster in every cell (causal D=128 by 2.7x: its few key
#: blocks per tile do not fill the Gluon kernel's pipeline). D=64 causal stays on the plain
#: kernel: at N = 8192 the Gluon kernel measured 7% faster in one run and 3% slower in another.
ROUTED_CELLS: dict[tuple[int, bool], int] = {(64, False): 4096, (128, False): 4096, (128, True): 4096}

#: Problems with fewer (query, key) score pairs than this (B * H * N * M) keep the plain
#: forward: they run in tens of microseconds, where building the Gluon kernel's three TMA
#: descriptors in Python costs more host time than the plain path's bound (or native) launch.
GLUON_MIN_SCORES = 2**24


def gluon_problem_support(problem: AttentionProblem) -> str | None:
    """None if the Gluon forward takes ``problem`` (whatever the device), else why not."""
    p = problem
    if p.dtype not in GLUON_DTYPES:
        return f"dtype {p.dtype} (float16 or bfloat16 only)"
    if p.head_dim != p.value_dim or p.head_dim not in GLUON_HEAD_DIMS:
        return f"head dims D={p.head_dim}, Dv={p.value_dim} (D = Dv in {GLUON_HEAD_DIMS} only)"
    if p.q_heads != p.kv_heads:
        return f"grouped heads ({p.q_heads} query heads, {p.kv_heads} key/value heads)"
    if p.has_window:
        return f"sliding window {p.window}"
    if not p.scale > 0:
        # The kernel folds the scale into the row max, which needs a positive scale.
        return f"scale {p.scale} (must be > 0)"
    if p.q_len < 1 or p.kv_len < 1:
        return f"empty problem (N={p.q_len}, M={p.kv_len})"
    if p.batch * p.q_heads * max(p.q_len, p.kv_len) > _MAX_ROWS:
        return "B * H * rows exceeds the int32 TMA coordinates"
    return None


def gluon_preferred(problem: AttentionProblem) -> bool:
    """Whether the Gluon kernel is the faster forward for ``problem`` (one it supports)."""
    p = problem
    scores = p.batch * p.q_heads * p.q_len * p.kv_len
    min_q_len = ROUTED_CELLS.get((p.head_dim, p.causal))
    return min_q_len is not None and p.q_len >= min_q_len and scores >= GLUON_MIN_SCORES


def gluon_switch(device: torch.device) -> str | None:
    """None if forwards on ``device`` may run on the Gluon kernel, else why not: the
    ``$ATTNKIT_GLUON`` switch, then whether the kernel can run there."""
    if os.environ.get(ENV_SWITCH, "1").strip() == "0":
        return f"${ENV_SWITCH}=0"
    if device.type != "cuda":
        return f"device {device} (the Gluon kernel runs on CUDA sm_90)"
    return _device_reason(device)


@functools.cache
def _device_reason(device: torch.device) -> str | None:
    import attnkit.gluon as gluon  # the optional package: importing it never fails

    reason = gluon.unavailable_reason()
    if reason is None and torch.cuda.get_device_capability(device) != (9, 0):
        return f"device {device} is not sm_90"
    return reason


def use_gluon(problem: AttentionProblem) -> bool:
    """Whether ``problem``'s forward runs on the Gluon kernel (for layouts that pass
    :func:`gluon_layout_ok`)."""
    return (
        gluon_problem_support(problem) is None
        and gluon_preferred(problem)
        and gluon_switch(problem.device) is None
    )


def gluon_layout_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the Gluon kernel reads q, k, v as they are: contiguous, 16-byte aligned bases."""
    return all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (q, k, v))


def gluon_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gluon forward of ``problem`` (one :func:`use_gluon` accepts; q, k, v passing
    :func:`gluon_layout_ok`). q: (B, H, N, D), k, v: (B, H, M, D). Returns out (B, H, N, D) in
    q's dtype and lse (B, H, N) float32, as :func:`attnkit.triton.launch.attention_forward`."""
    # The unchecked launch: use_gluon and gluon_layout_ok have checked what forward() would.
    from attnkit.gluon.launch import launch

    return launch(q, k, v, problem.causal, problem.scale)
