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

# naive and tiled are made of ATen ops in a fixed order per (batch, head): deterministic, and a
# sequence's result does not depend on the batch around it.
register_backend(
    "naive",
    run=naive_attention,
    description="materialised score matrix; float64-capable oracle",
    deterministic=True,
    batch_invariant=True,
)
register_backend(
    "tiled",
    run=tiled_attention,
    description="FlashAttention-2 in pure PyTorch (online softmax, O(N) memory)",
    deterministic=True,
    batch_invariant=True,
)
for _name in SDPA_BACKENDS:
    register_backend(
        _name,
        run=partial(sdpa_attention, _name),
        description="torch SDPA"
        + (f", forced to {SDPA_BACKENDS[_name].name}" if SDPA_BACKENDS[_name] else ""),
        device_support=partial(sdpa_device_support, _name),
        supports=partial(sdpa_problem_support, _name),
        prepare=partial(sdpa_prepare, _name),
    )

try:
    from attnkit.triton import (
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
        deterministic=True,
    )

register_backend(
    "flex",
    run=flex_run,
    description="PyTorch FlexAttention (torch.compile), masks as block masks",
    device_support=flex_device_support,
    supports=flex_problem_support,
)
