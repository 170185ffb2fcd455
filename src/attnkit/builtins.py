"""attnkit's own backends, each described once, here, by what it declares (:class:`attnkit.Backend`:
its functions and every property the dispatchers, the suite and the perf gate read), and
registered through the same door as a plugin's (:func:`attnkit.register_backend`, in its advanced
form with ``run``, ``device_support`` and ``prepare``). Imported once, by the package: the
registry defines the door, this module walks through it, and what it registered is what
:func:`builtin_names` calls attnkit's own.
"""

from __future__ import annotations

from functools import partial

from attnkit.errors import BackendUnavailableError
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

#: The names registered here, in order.
_OWN: list[str] = []


def _register(name: str, **declarations) -> None:
    _OWN.append(register_backend(name, **declarations).name)


def builtin_names() -> tuple[str, ...]:
    """The names of attnkit's own backends: those this module registered, in order (every other
    registered name came from a plugin: an entry point, or a program's own
    :func:`~attnkit.register_backend`)."""
    return tuple(_OWN)


def _unavailable(name: str, reason: str) -> dict:
    """The declarations of a backend that cannot run in this install: unavailable on every
    device, saying why (a name attnkit owns resolves to that reason, not to a plugin)."""

    def run(q, k, v, problem):
        raise BackendUnavailableError(f"backend {name!r} is unavailable: {reason}")

    return {"run": run, "device_support": lambda device: reason, "description": f"unavailable: {reason}"}


# auto_rank: where backend="auto" falls back when no measured table decides: the portable paths,
# fastest first (triton, sdpa, tiled, naive), ranked ten apart so that a plugin can rank itself
# between two of them.

# naive and tiled are made of ATen ops in a fixed order per (batch, head), with no atomics and no
# index_add (the gradients of the K and V a query-head group shares are sums over the group): on
# the CPU and on CUDA the same shapes give the same bits on every call. Batch-invariant on the CPU only: there
# a sequence's matmuls run the same loops whatever the batch around it, while on CUDA cuBLAS picks
# its kernel (tiles, split-K) by the batch size, so a sequence alone and in a batch of three
# differ in the last bits (measured on an H200: out and dv, bf16, N = 2048).
_ATEN_DEVICES = ("cpu", "cuda")
_register(
    "naive",
    run=naive_attention,
    description="materialised score matrix; float64-capable oracle",
    deterministic=_ATEN_DEVICES,
    batch_invariant=("cpu",),
    auto_rank=40,
)
_register(
    "tiled",
    run=tiled_attention,
    description="FlashAttention-2 in pure PyTorch (online softmax, O(N) memory)",
    deterministic=_ATEN_DEVICES,
    batch_invariant=("cpu",),
    auto_rank=30,
)
# SDPA's math path is the same kind of ATen graph as naive's (GQA through repeat_interleave,
# whose backward is a sum). PyTorch's flash and memory-efficient backwards, and its own choice
# (which never takes cuDNN there), are deterministic once torch.use_deterministic_algorithms(True)
# is on without warn_only; cuDNN's backward never is. auto falls back to PyTorch's own choice.
_SDPA_DECLARATIONS = {
    "sdpa-math": {"deterministic": _ATEN_DEVICES},
    "sdpa": {"deterministic_when_enforced": _ATEN_DEVICES, "auto_rank": 20},
    "sdpa-flash": {"deterministic_when_enforced": _ATEN_DEVICES},
    "sdpa-efficient": {"deterministic_when_enforced": _ATEN_DEVICES},
}
for _name in SDPA_BACKENDS:
    _register(
        _name,
        run=partial(sdpa_attention, _name),
        description="torch SDPA"
        + (f", forced to {SDPA_BACKENDS[_name].name}" if SDPA_BACKENDS[_name] else ""),
        device_support=partial(sdpa_device_support, _name),
        supports=partial(sdpa_problem_support, _name),
        prepare=partial(sdpa_prepare, _name),
        **_SDPA_DECLARATIONS.get(_name, {}),
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
except ImportError as err:  # no usable triton in this install: the name says why, everywhere
    _register(
        "triton",
        auto_rank=10,  # auto still lists it first, with why it is passed over
        **_unavailable("triton", f"the Triton path cannot be imported ({err}); install triton"),
    )
else:
    _register(
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
        auto_rank=10,
        cache_forward=cache_forward,
    )

_register(
    "flex",
    run=flex_run,
    description="PyTorch FlexAttention (torch.compile), masks as block masks",
    device_support=flex_device_support,
    supports=flex_problem_support,
    forward_only=("cpu",),  # FlexAttention computes no gradients on the CPU (torch 2.13)
    # Each problem class compiles its kernels: 10-80 s on an H200, ~15 s per shape on a CPU.
    compiled_per_class=("cpu", "cuda"),
)
