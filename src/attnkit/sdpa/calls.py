"""One SDPA call with attnkit's errors: the operands laid out for the kernel, the kernel forced,
and, when a kernel declines, PyTorch's reasons in the :class:`UnsupportedProblemError` attnkit
raises. PyTorch raises a generic "no available kernel" error and explains why only in warnings;
those are recorded (and not printed) on a signature's first call, and gathered again whenever a
later call is declined."""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable

import torch

from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import AttentionProblem, records_backward
from attnkit.sdpa.forcing import KERNELS, WITHOUT_CUDNN, restricted_sdpa
from attnkit.sdpa.layout import for_fused_kernels
from attnkit.sdpa.support import ANY_LAYOUT

#: Signatures (backend, problem, is_causal, choice) SDPA has already run: their calls skip
#: recording warnings (~5 us). A new signature runs once under ``catch_warnings``, so a kernel that
#: declines it explains why in attnkit's error and prints no stray warnings. Bounded.
_ACCEPTED: set[tuple] = set()

#: Where a PyTorch warning was raised in PyTorch's own build tree ("(Triggered internally at
#: /__w/pytorch/.../sdp_utils_cpp.h:546.)"): a path on PyTorch's build machine, not a reason.
_BUILD_LOCATION = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?")


def warnings_of(call: Callable[[], object]) -> list:
    """The warnings ``call()`` emits, its RuntimeError suppressed: PyTorch gives a kernel's
    reasons for declining only as warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.suppress(RuntimeError):
            call()
    return caught


def reasons_of(caught: list) -> str:
    """PyTorch's warnings as one line of reasons, without its build locations."""
    texts = (_BUILD_LOCATION.sub("", str(w.message)).strip() for w in caught)
    return "; ".join(text for text in texts if text)


def declined(
    name: str, problem: AttentionProblem, err: RuntimeError, caught: list
) -> UnsupportedProblemError:
    """The error for backend ``name`` declining ``problem``: PyTorch's reasons (``caught``
    warnings), or its error's text where it gave none."""
    reasons = reasons_of(caught) or _BUILD_LOCATION.sub("", str(err)).strip()
    return UnsupportedProblemError(
        f"backend {name!r} cannot run {problem.describe()} on {problem.device}: {reasons}"
    )


def float16_backward_on_cuda(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem
) -> bool:
    """Whether this call is float16 on CUDA and will need a backward: with a mask, the calls
    cuDNN gets wrong (:mod:`attnkit.sdpa.semantics`)."""
    return problem.dtype == torch.float16 and q.is_cuda and records_backward(q, k, v)


def call_sdpa(name, q, k, v, problem: AttentionProblem, is_causal: bool, mask=None):
    """SDPA on q, k, v with backend ``name``'s kernels and the problem's scale (``mask``: a
    boolean ``attn_mask``, or None); raises :class:`UnsupportedProblemError` with PyTorch's
    reasons when the kernel declines."""
    choice = name
    if KERNELS[name] is None and mask is not None and float16_backward_on_cuda(q, k, v, problem):
        choice = WITHOUT_CUDNN
    if torch.compiler.is_compiling():  # a traced graph has no warnings to record
        return restricted_sdpa(choice, q, k, v, problem.scale, is_causal, mask)
    if name not in ANY_LAYOUT:
        q, k, v = for_fused_kernels(name, q, k, v, problem)
    # The mask, if any, follows from the problem (its window), so it needs no place in the key.
    key = (name, problem, is_causal, choice)
    if key in _ACCEPTED:
        try:
            return restricted_sdpa(choice, q, k, v, problem.scale, is_causal, mask)
        except RuntimeError as err:  # the same shapes in another state: gather the reasons
            caught = warnings_of(lambda: restricted_sdpa(choice, q, k, v, problem.scale, is_causal, mask))
            raise declined(name, problem, err, caught) from err
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = restricted_sdpa(choice, q, k, v, problem.scale, is_causal, mask)
        except RuntimeError as err:
            raise declined(name, problem, err, caught) from err
    if len(_ACCEPTED) >= 4096:
        _ACCEPTED.clear()
    _ACCEPTED.add(key)
    return out
