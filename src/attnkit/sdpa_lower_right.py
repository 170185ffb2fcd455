"""Bottom-right causal attention with fewer queries than keys (N < M) on SDPA's kernels, at the
cost of the N x M problem (no M x M detour).

SDPA's ``is_causal`` is aligned top-left, so N < M needs a translation. By kernel:

* **N = 1** (in :mod:`attnkit.sdpa`): the one query row sees every key: the plain non-causal
  call (exact, any kernel).
* **Prefix + tail merged by log-sum-exp** (:mod:`attnkit.sdpa_split`), forward and backward,
  for the fused kernels: flash and cuDNN (which take no mask), the efficient kernel, and, on
  CUDA, ``sdpa`` (PyTorch chooses) when PyTorch's choice for the causal problem is one of them.
  It reads no (N, M) mask and copies no K/V for GQA (the efficient kernel's public GQA path
  repeats all of K and V per query head), and it keeps PyTorch's choice: a lower-right mask
  would turn ``sdpa`` from flash (its pick for a causal call on CUDA) to the efficient kernel
  (its pick for a masked one).
* **A lower-right mask** where the split cannot run or does not pay: ``sdpa-math`` (which
  materialises the N x M scores anyway, so the mask costs nothing extra in order); ``sdpa``
  when PyTorch would pick math, and ``sdpa`` on the CPU, where PyTorch's choice with the mask
  is still its flash kernel at the N x M cost (on par with the split: 0.8-1.2x on two threads,
  torch 2.13), so PyTorch's own path stays; shapes or dtypes the private ops do not take
  (head dims that are not multiples of 8, D != Dv, float64). Forward and backward are
  PyTorch's own.
* **The square detour** (in :mod:`attnkit.sdpa`: M - N zero query rows prepended) for flash
  and cuDNN where the split cannot run; it is exact, and the forced kernel's own error says
  when it cannot run either.

If a kernel declines the split at run time (a private op raises), the call falls back to the
mask or the square, warns once per problem with the reason, and later calls with the same
signature go straight to the fallback.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import AttentionProblem
from attnkit.sdpa_private_ops import private_kernel
from attnkit.sdpa_split import split_attention

#: Kernels that accept ``attn_mask`` (None: PyTorch chooses among those that do).
MASK_KERNELS = (None, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)

#: Signatures (name, problem) whose split a kernel declined: they go to the fallback. Bounded.
_DECLINED: set[tuple] = set()


def lower_right_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """(N, M) bool, True where query i sees key j (``j <= i + M - N``)."""
    rows = torch.arange(q_len, device=device)[:, None]
    return torch.arange(kv_len, device=device)[None, :] <= rows + (kv_len - q_len)


def split_supported(backend: SDPBackend | None, problem: AttentionProblem) -> bool:
    """Whether :func:`attnkit.sdpa_split.split_attention` can run: a kernel with private ops on
    this device, and the dtypes / head dims those ops take directly (the public API pads head
    dims to a multiple of 8 for flash; the private ops do not)."""
    p = problem
    if private_kernel(backend, p.device) is None or p.causal_offset <= 0 or p.q_len < 2:
        return False
    if p.head_dim != p.value_dim or p.head_dim % 8 != 0:
        return False
    if p.device.type == "cuda":
        fp32 = backend == SDPBackend.EFFICIENT_ATTENTION and p.dtype == torch.float32
        return fp32 or p.dtype in (torch.float16, torch.bfloat16)
    return p.dtype in (torch.float32, torch.bfloat16, torch.float16)


def pytorch_choice(q, k, v, problem: AttentionProblem) -> SDPBackend | None:
    """The kernel PyTorch's dispatcher picks for this problem as a causal call without a mask
    (honouring the enabled backends), or None if it cannot say."""
    try:
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, True, scale=problem.scale, enable_gqa=True)
        return SDPBackend(choice)
    except (AttributeError, TypeError, ValueError, RuntimeError):  # private API moved
        return None


def lower_right_attention(name, backend, q, k, v, problem: AttentionProblem, square):
    """Bottom-right causal N < M (N >= 2) on ``backend`` (None: PyTorch chooses); shapes as in
    :func:`attnkit.attention`. ``square(q, k, v)`` is the square detour of :mod:`attnkit.sdpa`."""
    fallback = square
    if backend in MASK_KERNELS:
        fallback = lambda a, b, c: masked_attention(name, backend, a, b, c, problem)
    if torch.compiler.is_compiling():  # traced once: no host-side memo, no warnings machinery
        # Dynamo cannot trace PyTorch's choice (an int from a C function): the mask keeps
        # ``sdpa`` traceable, with PyTorch choosing among the kernels that take one.
        if backend is None or not split_supported(backend, problem):
            return fallback(q, k, v)
        return split_attention(name, backend, q, k, v, problem, fallback)
    kernel = backend
    if backend is None:  # on the CPU PyTorch's flash kernel takes the mask at the N x M cost
        kernel = pytorch_choice(q, k, v, problem) if problem.device.type == "cuda" else None
    if not split_supported(kernel, problem):
        return fallback(q, k, v)
    key = (name, problem)
    if key in _DECLINED:
        return fallback(q, k, v)
    try:
        return split_attention(name, kernel, q, k, v, problem, fallback)
    except UnsupportedProblemError as err:
        declined = err
    out = fallback(q, k, v)  # raises the forced kernel's own error if it cannot run either
    if len(_DECLINED) >= 4096:
        _DECLINED.clear()
    _DECLINED.add(key)
    warnings.warn(
        f"{declined}; ran the {'mask' if fallback is not square else 'square'} path instead", stacklevel=2
    )
    return out


def masked_attention(
    name: str,
    backend: SDPBackend | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: AttentionProblem,
) -> torch.Tensor:
    """Bottom-right causal through a lower-right ``attn_mask``; shapes as in :func:`attnkit.attention`.
    Differentiable (PyTorch's forward and backward of the kernel)."""
    mask = lower_right_mask(problem.q_len, problem.kv_len, q.device)
    scale = problem.scale
    call = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    if torch.compiler.is_compiling():  # dynamo cannot trace the warnings machinery
        if backend is None:
            return call()
        with sdpa_kernel([backend]):
            return call()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if backend is None:
                return call()
            with sdpa_kernel([backend]):
                return call()
        except RuntimeError as err:
            reasons = "; ".join(str(w.message).strip() for w in caught) or str(err)
            raise UnsupportedProblemError(
                f"backend {name!r} cannot run {problem.describe()} on {problem.device} with a lower-right "
                f"causal mask: {reasons}"
            ) from err
