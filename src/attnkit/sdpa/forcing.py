"""Forcing one SDPA kernel: SDPA's enable-flags set to exactly a choice of kernels for one call,
each put back as it was afterwards, whatever happens.

Why not ``torch.nn.attention.sdpa_kernel``: it costs ~17 us per call on CPU (torch 2.13; a
generator and list work per call, and ``SDPBackend`` comparisons); a loop over prebuilt (getter,
setter) pairs ~0.55 us, and on an H100 host (torch 2.11) its 15 flag calls and loops cost a
forced flash call +7.7 us with gradients. Written out over the five flags, with nothing built per
call, the same calls take ~0.3 us on CPU. The flags are private names of torch
(``torch._C._set_sdp_use_*``): where they moved, :data:`FORCERS` is None and ``sdpa_kernel`` is
used instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnkit.sdpa.support import SDPA_BACKENDS

#: The choice of kernels SDPA is given for the calls cuDNN gets wrong
#: (:mod:`attnkit.sdpa.semantics`): every kernel but cuDNN. A label beside the backend names in
#: :data:`KERNELS`.
WITHOUT_CUDNN = "sdpa without cuDNN"

#: What each choice lets SDPA pick from: an attnkit backend name (one forced kernel, or None:
#: PyTorch chooses), or :data:`WITHOUT_CUDNN`. Calls name their choice by its label, never by
#: its kernels: an SDPBackend comparison or hash is a pybind call (~0.3 us each, CPU).
KERNELS: dict[str, tuple[SDPBackend, ...] | None] = {
    **{name: None if backend is None else (backend,) for name, backend in SDPA_BACKENDS.items()},
    WITHOUT_CUDNN: tuple(
        kernel
        for kernel in SDPBackend.__members__.values()
        if kernel not in (SDPBackend.CUDNN_ATTENTION, SDPBackend.ERROR)
    ),
}


def kernel_forcers():
    """For each restricted choice of :data:`KERNELS`, a function ``forced(call, *args)`` that
    returns ``call(*args)`` with SDPA's enable-flags set to exactly the choice's kernels, each
    flag put back as it was afterwards, whatever happens. None if the private names moved, or
    are not the five flags of torch 2.11 and 2.13 (module docstring)."""
    names = getattr(torch.nn.attention, "_backend_names", None)
    try:
        getters = tuple(getattr(torch._C, f"_get_{flag}_sdp_enabled") for flag in names)
        setters = tuple(getattr(torch._C, f"_set_sdp_use_{flag}") for flag in names)
        members = tuple(getattr(SDPBackend, member) for member in names.values())
    except (AttributeError, TypeError):
        return None
    if len(members) != 5:
        return None
    (get0, get1, get2, get3, get4), (set0, set1, set2, set3, set4) = getters, setters

    def forcer(kernels: tuple[SDPBackend, ...]):
        on0, on1, on2, on3, on4 = (member in kernels for member in members)

        def forced(call, *args):
            was0, was1, was2, was3, was4 = get0(), get1(), get2(), get3(), get4()
            try:
                set0(on0)
                set1(on1)
                set2(on2)
                set3(on3)
                set4(on4)
                return call(*args)
            finally:
                set0(was0)
                set1(was1)
                set2(was2)
                set3(was3)
                set4(was4)

        return forced

    return {choice: forcer(kernels) for choice, kernels in KERNELS.items() if kernels is not None}


FORCERS = kernel_forcers()


def restricted_sdpa(choice, q, k, v, scale, is_causal, mask=None):
    """SDPA restricted to the kernels of ``choice`` (a key of :data:`KERNELS`), or PyTorch's full
    choice; the enable-flags are restored afterwards, whatever happens."""
    kernels = KERNELS[choice]
    if kernels is None:
        return _scaled_dot_product(q, k, v, scale, is_causal, mask)
    if FORCERS is None or torch.compiler.is_compiling():  # dynamo traces sdpa_kernel, not the flags
        with sdpa_kernel(list(kernels)):
            return _scaled_dot_product(q, k, v, scale, is_causal, mask)
    return FORCERS[choice](_scaled_dot_product, q, k, v, scale, is_causal, mask)


def _scaled_dot_product(q, k, v, scale, is_causal, mask):
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True
    )
