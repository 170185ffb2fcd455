"""Native launches: a Triton kernel launch bound by :mod:`attnkit.triton.fast_launch`, described
as data (:class:`~attnkit.prepared.NativeLaunch`) for the compiled fast path to make from C++
with no Python launcher in between.

Where the compiled launcher is triton 3.6's (read in ``backends/nvidia/driver.py``:
``make_launcher``, ``_launch``), a launch is the kernel's CUDA function, grid, block, shared
memory and launch attributes, and its parameters as ``_launch`` packs them: each argument the
compiled signature keeps, in order (pointers as 64-bit addresses, ``i32`` / ``i64`` as they
are, ``fp32`` as the bits of a C float), then the two scratch pointers, null. A
:class:`~attnkit.prepared.NativeProgram` is a call's launches with the tensors they read and
allocate (the Triton path builds one per layout: ``LaunchSetup.native_forward_only``,
``decode_native_forward_only``). Every call still asks the bound launch's ``ready()`` first, so
a changed Triton knob, hook or kernel global sends it back to the normal path as it does a bound
call. That check is Python (the knobs, hooks and globals are Python objects that can change
between any two calls), so a native call goes C++ -> Python (``ready``) -> C++.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnkit.prepared import NativeLaunch

#: The scalar kinds a native launch packs, and the Python types a bound argument of each may have.
_NATIVE_SCALARS = {"i32": (int,), "i64": (int,), "u64": (int,), "fp32": (float,)}


def native_layout(compiled: Any, native_launches: bool) -> tuple | None:
    """What :func:`native_launch` needs of a compiled Triton kernel, read once when its launch is
    first made: ``(the compiled signature's types, one per kernel parameter, warps, shared
    bytes, pdl, cooperative)``; None where its launch is not the one :func:`native_launch`
    describes: another launcher than triton 3.6's (``native_launches`` False), clusters
    (``num_ctas`` > 1), or scratch memory its launcher would allocate."""
    if not native_launches:
        return None
    try:
        metadata = compiled.metadata
        if (
            metadata.num_ctas != 1
            or metadata.global_scratch_size
            or metadata.profile_scratch_size
            or tuple(compiled.packed_metadata) != (metadata.num_warps, 1, metadata.shared)
        ):
            return None
        return (
            tuple(compiled.src.signature.values()),
            metadata.num_warps,
            metadata.shared,
            bool(metadata.launch_pdl),
            bool(metadata.launch_cooperative_grid),
        )
    except (AttributeError, TypeError, ValueError):  # an unexpected shape of Triton's objects
        return None


def native_launch(bound, slots: Sequence[int]) -> NativeLaunch | None:
    """``bound`` (a :class:`~attnkit.triton.fast_launch.BoundLaunch`) as data, its leading
    tensors read from the program's tensor ``slots`` (one per leading tensor); None where the
    compiled launcher is not triton 3.6's, or an argument is of a kind it does not pack."""
    layout = bound.entry.native_layout
    if layout is None or len(slots) != len(bound.leading_key):
        return None
    types, warps, shared, pdl, cooperative = layout
    fixed = bound.launch_tail  # the bound positional arguments, then the constexprs' values
    if len(types) != len(slots) + len(fixed):
        return None
    params = []
    for position, kind in enumerate(types):
        if position < len(slots):
            if not kind.startswith("*"):
                return None
            params.append(("tensor", slots[position], bound.leading_key[position][1]))
        elif kind == "constexpr":  # declared so, or specialised (an int equal to 1)
            continue
        elif type(value := fixed[position - len(slots)]) in _NATIVE_SCALARS.get(kind, ()):
            params.append((kind, value))
        else:
            return None
    params += [("ptr", 0), ("ptr", 0)]  # global and profile scratch: none (native_layout)
    return NativeLaunch(
        ready=bound.ready,
        function=bound.entry.function,
        grid=bound.launch_head,
        block=32 * warps,
        shared=shared,
        pdl=pdl,
        cooperative=cooperative,
        params=tuple(params),
    )
