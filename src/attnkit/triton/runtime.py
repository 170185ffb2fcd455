"""The Triton internals a direct launch (:mod:`attnkit.triton.fast_launch`) reads, found once:
the option knobs and launch hooks, the current device and stream, the compiled launcher's
parts. Only Triton versions whose ``JITFunction.run`` and specialisation were read
(:data:`VERIFIED_TRITON`) on a CUDA build qualify; anywhere else :func:`find_runtime` is None
and every launch takes Triton's normal path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: Triton versions whose ``JITFunction.run`` and specialisation were read for the direct launches.
VERIFIED_TRITON = ((3, 6), (3, 9))
#: Set to ``0`` before import to launch every kernel through ``kernel[grid]``.
DISABLE_ENV = "ATTNKIT_FAST_LAUNCH"


@dataclass(frozen=True)
class TritonRuntime:
    """The Triton internals a direct launch reads, found once by :func:`find_runtime`."""

    knobs: Any  # triton.knobs
    current_device: Callable[[], int]
    current_stream: Callable[[int], int]
    jit_function: type
    descriptor: type | None  # triton.tools.tensor_descriptor.TensorDescriptor
    #: triton 3.6's TMA encoder and its device-to-host dtype codes; None elsewhere.
    fill_tma: Callable | None = None
    tma_dtype_codes: dict | None = None
    #: The compiled launcher packs arguments as triton 3.6's does
    #: (:func:`attnkit.triton.native_launch.native_launch`).
    native_launches: bool = False

    def options(self) -> tuple | None:
        """The launch options Triton reads from its knobs on every call (part of its key), or
        None when a launch hook or a pipeline inspection hook is set (the normal path then)."""
        runtime, compilation = self.knobs.runtime, self.knobs.compilation
        if (
            _hook_active(runtime.launch_enter_hook)
            or _hook_active(runtime.launch_exit_hook)
            or getattr(runtime, "add_stages_inspection_hook", None) is not None
        ):
            return None
        return (
            runtime.debug,
            compilation.instrumentation_mode,
            getattr(compilation, "fpsan_homomorphic_casts", None),
        )


def _hook_active(hook) -> bool:
    """A launch hook is set: a callable, or Triton's ``HookChain`` (3.6+) with hooks in it."""
    return hook is not None and bool(getattr(hook, "calls", True))


def find_runtime() -> TritonRuntime | None:
    """The Triton internals, or None where any is missing or unverified (then every launch
    takes the normal path)."""
    if os.environ.get(DISABLE_ENV) == "0":
        return None
    try:
        import triton
        from triton import knobs
        from triton.runtime.driver import driver
        from triton.runtime.jit import JITFunction

        version = tuple(int(part) for part in triton.__version__.split(".")[:2])
        if version not in VERIFIED_TRITON or knobs.runtime.interpret:
            return None
        if not torch.cuda.is_available() or torch.version.hip is not None:
            return None
        active = driver.active
        if active.get_current_target().backend != "cuda":
            return None
        from triton.tools.tensor_descriptor import TensorDescriptor  # in every verified version

        fill_tma, dtype_codes = None, None
        if version == (3, 6):
            from triton.backends.nvidia import driver as nvidia_driver

            fill_tma = active.utils.fill_tma_descriptor
            dtype_codes = dict(nvidia_driver.TMA_DTYPE_DEVICE_TO_HOST)
        runtime = TritonRuntime(
            knobs=knobs,
            current_device=active.get_current_device,
            current_stream=active.get_current_stream,
            jit_function=JITFunction,
            descriptor=TensorDescriptor,
            fill_tma=fill_tma,
            tma_dtype_codes=dtype_codes,
            native_launches=version == (3, 6),
        )
        runtime.options()  # every knob it reads exists
        return runtime
    except Exception:  # any missing piece: the normal path, which Triton keeps working
        return None
