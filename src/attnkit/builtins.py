"""attnkit's own backends, registered through the same door as a plugin's
(:func:`attnkit.register_backend`, in its advanced form with ``run``, ``device_support`` and
``prepare``). Imported once, by the package: the registry defines the door, this module walks
through it."""

from __future__ import annotations

from functools import partial

from attnkit.flex import flex_device_support, flex_problem_support, flex_run
from attnkit.reference import naive_attention
from attnkit.registry import register_backend
from attnkit.sdpa import (
    SDPA_BACKENDS,
    sdpa_attention,
    sdpa_device_support,
    sdpa_prepare,
    sdpa_problem_support,
)
from attnkit.tiled import tiled_attention

# naive and tiled are made of ATen ops in a fixed order per (batch, head), with no atomics and no
# index_add (the gradients of the K and V a query-head group shares are sums over the group): on
# the CPU and on CUDA the same shapes give the same bits on every call. Batch-invariant on the CPU only: there
# a sequence's matmuls run the same loops whatever the batch around it, while on CUDA cuBLAS picks
# its kernel (tiles, split-K) by the batch size, so a sequence alone and in a batch of three
# differ in the last bits (measured on an H200: out and dv, bf16, N = 2048).
_ATEN_DEVICES = ("cpu", "cuda")
register_backend(
    "naive",
    run=naive_attention,
    description="materialised score matrix; float64-capable oracle",
    deterministic=_ATEN_DEVICES,
    batch_invariant=("cpu",),
)
register_backend(
    "tiled",
    run=tiled_attention,
    description="FlashAttention-2 in pure PyTorch (online softmax, O(N) memory)",
    deterministic=_ATEN_DEVICES,
    batch_invariant=("cpu",),
)
# SDPA's math path is the same kind of ATen graph as naive's (GQA through repeat_interleave,
# whose backward is a sum). PyTorch's flash and memory-efficient backwards, and its own choice
# (which never takes cuDNN there), are deterministic once torch.use_deterministic_algorithms(True)
# is on without warn_only; cuDNN's backward never is.
_SDPA_DETERMINISM = {
    "sdpa-math": {"deterministic": _ATEN_DEVICES},
    "sdpa": {"deterministic_when_enforced": _ATEN_DEVICES},
    "sdpa-flash": {"deterministic_when_enforced": _ATEN_DEVICES},
    "sdpa-efficient": {"deterministic_when_enforced": _ATEN_DEVICES},
}
for _name in SDPA_BACKENDS:
    register_backend(
        _name,
        run=partial(sdpa_attention, _name),
        description="torch SDPA"
        + (f", forced to {SDPA_BACKENDS[_name].name}" if SDPA_BACKENDS[_name] else ""),
        device_support=partial(sdpa_device_support, _name),
        supports=partial(sdpa_problem_support, _name),
        prepare=partial(sdpa_prepare, _name),
        **_SDPA_DETERMINISM.get(_name, {}),
    )

try:
    from attnkit.triton import (
        cache_forward,
        dispatch_boundaries,
        prepare,
        run_after_support_check,
        triton_device_support,
        triton_problem_support,
    )
except ImportError:  # no triton in this install: the backend is simply not registered
    pass
else:
    register_backend(
        "triton",
        run=run_after_support_check,
        description="fused Triton FlashAttention-2 kernels, deterministic backward",
        device_support=triton_device_support,
        supports=triton_problem_support,
        prepare=prepare,
        dispatch_boundaries=dispatch_boundaries(),
        # Every gradient element is written by one program in a fixed order, no atomics: compiled
        # on CUDA, and through the interpreter on the CPU, which runs the programs one by one.
        deterministic=("cpu", "cuda"),
        interpreted_on=("cpu",),
        cache_forward=cache_forward,
    )

register_backend(
    "flex",
    run=flex_run,
    description="PyTorch FlexAttention (torch.compile), masks as block masks",
    device_support=flex_device_support,
    supports=flex_problem_support,
)
