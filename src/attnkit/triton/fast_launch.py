"""Direct launches of compiled Triton kernels: the host cost of a call without ``JITFunction.run``.

Why: ``kernel[grid](*args)`` runs Triton's ``JITFunction.run`` on every call. It binds the
arguments, specialises each one (28 native calls for the forward kernel), builds a string cache
key and looks the compiled kernel up before it launches it. On an H100 host that is about half
of a short attention call (~50 of 103 us at B=1 H=8 N=128 D=64), for a kernel running 4 us.

What: :class:`KernelLaunch` holds one kernel with fixed keyword arguments (its constexprs,
``num_warps``, ``num_stages``). The first call with a given :func:`launch_key` goes through
``kernel[grid]``, which compiles or finds the kernel and returns Triton's ``CompiledKernel``;
later calls with the same key call that kernel's launcher directly, with the arguments
``JITFunction.run`` would pass it.

Invariant (why a hit launches the right binary): equal keys imply equal Triton
specialisations. Read in triton 3.6 and 3.9 (``runtime/jit.py``: ``JITFunction.run``,
``create_function_from_signature``, ``compute_cache_key``; ``python/src/specialize.cc``:
``handle_long_type``, ``handle_tensor``, ``specialize_tensordesc``), Triton's cache key is

* per tensor: its dtype (the pointer type) and, unless the parameter is ``do_not_specialize``,
  whether ``data_ptr() % 16 == 0``;
* per int: i32, i64 or u64 by range and, unless ``do_not_specialize``, whether it equals 1
  (then a compile-time constant) and whether it is divisible by 16;
* per float / bool: only the type (fp32 / u1); ``None``: a constexpr;
* per tensor descriptor: its base's dtype and its block shape (shape, strides and padding are
  runtime arguments of the launcher);
* every constexpr's value, and the options: the keyword arguments that are not parameters
  (``num_warps``, ``num_stages``) plus ``debug`` (the kernel's, or ``knobs.runtime.debug``),
  ``knobs.compilation.instrumentation_mode`` and, in 3.9, ``fpsan_homomorphic_casts``;
* the device: ``JITFunction`` keeps one cache per current device.

:func:`launch_key` keeps ints, floats, bools and ``None`` as they are, each tensor as
``(dtype, 16-byte aligned)`` and each descriptor as ``(dtype, block shape, padding)``, next to
the arguments' types (so ``1``, ``1.0`` and ``True`` never compare equal). That is finer than
Triton's key (a new stride or size is a new entry, one normal launch), never coarser, whatever
the kernel's parameters are: adding an argument to a kernel needs no change here. The
keyword arguments (constexprs and options) are fixed per :class:`KernelLaunch`, whose cache is
its own; the device, the option knobs and ``kernel.debug`` are keyed on every call.

Bound launches. :meth:`KernelLaunch.bind` turns a launch just made into a
:class:`BoundLaunch`: the compiled kernel with every argument after the leading tensors fixed,
for a caller that keeps one per layout (the forward of a call without gradients,
:meth:`attnkit.triton.launch.LaunchSetup.forward_only` and
:func:`attnkit.triton.decode.decode_forward_only`). A call then checks only what can change
with the fixed arguments unchanged (the tensors' dtypes and alignment, the device, the options
and hooks, the kernel's globals) and launches nothing when any did; the caller takes its
normal path.

Native launches. :mod:`attnkit.triton.native_launch` describes a bound launch as data for the
compiled fast path (:func:`attnkit.triton.native_launch.native_launch`); each entry keeps what that
needs of its compiled kernel (``native_layout``).

Tensor descriptors (TMA). A :class:`KernelLaunch` built with ``tensor_descriptors={position:
block shape}`` takes plain tensors at those positions. The normal path wraps each in Triton's
``TensorDescriptor`` (which validates it); Triton's launcher then expands every descriptor
argument on every call (``wrap_handle_tensordesc``: a Python loop over all the arguments, and
the TMA encoding, ``fill_tma_descriptor``). On the H100 host (B4 H16 N1024 D128) that cost a
launch about 35 us of host time against the same launch with pointers, and a backward 97 us;
with the expansion below, 13-23 us and 40 us (triton 3.6, torch 2.11). On a known key the
direct launch makes that expansion itself, for triton 3.6 only: it reads the raw launcher and
each descriptor's encoding parameters (swizzle, element size and type, box) from the compiled
launcher's expansion closure once, then per call encodes each tensor with Triton's own
``fill_tma_descriptor``, as ``make_tensordesc_arg`` does. The strides of the descriptor tensors
are part of the key, so the first call with a new layout takes the normal path, whose
``TensorDescriptor`` validates it. Where that closure is not as read (another Triton version,
scratch memory, a descriptor Triton did not lower to TMA), the direct launch passes
``TensorDescriptor`` objects to the compiled launcher instead.

Fallbacks to ``kernel[grid](...)`` (the normal path, always correct; the Triton internals this
module reads are found by :func:`attnkit.triton.runtime.find_runtime`):

* anything this module relies on is missing or unverified: triton other than 3.6 / 3.9, no
  CUDA, a HIP build (AMD specialises tensors differently), no ``driver.active``
  ``get_current_device`` / ``get_current_stream``, a kernel that is not a plain
  ``JITFunction`` (the CPU interpreter's ``InterpretedFunction``, autotuners), a compiled
  object without ``run`` / ``function`` / ``packed_metadata`` (an async-compile future);
* launch hooks set (``knobs.runtime.launch_enter_hook`` / ``launch_exit_hook`` with hooks in
  them, or replaced by a callable), so profilers such as proton see every launch; a pipeline
  inspection hook, or ``pre_run_hooks`` on the kernel;
* a global the kernel reads was rebound since the entry was made (``JITFunction.run`` would
  raise: the normal path says so);
* an argument of another kind (a tuple, a numpy int, a constexpr passed positionally), a
  callable grid, or ``ATTNKIT_FAST_LAUNCH=0`` in the environment at import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnkit.triton.native_launch import native_layout
from attnkit.triton.runtime import TritonRuntime, find_runtime

#: Entries per :class:`KernelLaunch` before its cache is cleared (a program sweeping layouts).
MAX_ENTRIES = 256

#: Keyword argument values keyed as they are (with their types).
_PLAIN = frozenset({int, float, bool, str, type(None)})
_MISSING = object()


class _Uncacheable(Exception):
    """An argument this module does not key: the call takes the normal path."""


#: Resolved on the first launch (not at import: CUDA initialises lazily). Tests replace it.
_runtime: TritonRuntime | object | None = _MISSING


def _get_runtime() -> TritonRuntime | None:
    global _runtime
    if _runtime is _MISSING:
        _runtime = find_runtime()
    return _runtime


def launch_key(args: Sequence, descriptor: type | None = None) -> tuple:
    """What a call's positional arguments contribute to the key, one item each: an int as it
    is; a tensor as ``(dtype, 16-byte aligned)``; a float or bool as ``(type, value)``;
    ``None``; a tensor descriptor of type ``descriptor`` as ``(type, dtype, block shape,
    padding)``. Items of different kinds never compare equal (``1``, ``(float, 1.0)`` and
    ``(bool, True)`` differ as Triton's types i32, fp32 and u1 do). Raises
    :class:`_Uncacheable` for any other argument. See the module docstring for why equal
    keys imply equal Triton specialisations."""
    # Exact types first, inline: this runs for every argument of every launch.
    return tuple([
        a if type(a) is int
        else (a.dtype, a.data_ptr() % 16 == 0) if type(a) is _Tensor
        else _atom(a, descriptor)
        for a in args
    ])  # fmt: skip


_Tensor = torch.Tensor


def _atom(arg, descriptor: type | None):
    kind = type(arg)
    if kind is float or kind is bool:
        return kind, arg
    if arg is None:
        return None
    if isinstance(arg, torch.Tensor):  # subclasses (nn.Parameter): specialised like tensors
        return arg.dtype, arg.data_ptr() % 16 == 0
    if descriptor is not None and kind is descriptor:
        return kind, arg.base.dtype, tuple(arg.block_shape), getattr(arg, "padding", None)
    raise _Uncacheable(kind.__name__)


@dataclass(frozen=True)
class _Entry:
    """A compiled kernel's launcher and what it is called with besides the call's arguments."""

    launcher: Callable
    function: Any
    packed_metadata: Any
    constexprs: tuple  # the keyword parameters' values, in signature order
    kernel_globals: tuple  # (dict, name, object) of each global the kernel reads
    #: triton 3.6, descriptor arguments: the raw launcher, its (cooperative, pdl) flags and the
    #: (position, swizzle, element size, dtype code, box) of each descriptor (module docstring).
    raw_launch: Callable | None = None
    raw_flags: tuple = ()
    tma_plan: tuple = ()
    #: triton 3.6, no descriptors: :func:`attnkit.triton.native_launch.native_layout`; None elsewhere.
    native_layout: tuple | None = None

    def globals_unchanged(self) -> bool:
        return all(scope.get(name, _MISSING) is value for scope, name, value in self.kernel_globals)


class KernelLaunch:
    """``kernel`` with fixed keyword arguments; ``launch(grid, *args)`` runs
    ``kernel[grid](*args, **kwargs)``, directly on a known key (module docstring).
    ``tensor_descriptors`` maps positions of tensor arguments to the block shape of the TMA
    descriptor the kernel reads them through."""

    def __init__(
        self, kernel, *, tensor_descriptors: dict[int, tuple[int, ...]] | None = None, **kwargs
    ) -> None:
        self.kernel = kernel
        self.kwargs = kwargs
        self.descriptor_blocks = {p: list(block) for p, block in sorted((tensor_descriptors or {}).items())}
        # Fixed for the object's life, so they need no place in its keys; plain values only,
        # so nothing in them can change behind the cache's back.
        self._plain_keywords = all(type(v) in _PLAIN for v in kwargs.values())
        self._entries: dict[tuple, _Entry] = {}

    def __call__(self, grid: tuple, *args) -> None:
        runtime = _runtime if _runtime is not _MISSING else _get_runtime()
        kernel = self.kernel
        options = None
        if (
            runtime is not None
            and self._plain_keywords
            and type(kernel) is runtime.jit_function
            and type(grid) is tuple
            and not kernel.pre_run_hooks
        ):
            options = runtime.options()
        if options is None:
            kernel[grid](*self._with_descriptors(args), **self.kwargs)
            return
        device = runtime.current_device()
        try:
            key = (device, options, kernel.debug, launch_key(args, runtime.descriptor))
            if self.descriptor_blocks:  # a new layout is validated by the normal path first
                key = (*key, *[args[p].stride() for p in self.descriptor_blocks])
        except _Uncacheable:
            kernel[grid](*self._with_descriptors(args), **self.kwargs)
            return
        entry = self._entries.get(key)
        if entry is None or not entry.globals_unchanged():
            self._launch_and_remember(key, grid, args)
            return
        stream = runtime.current_stream(device)
        grid_y, grid_z = grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1
        if entry.raw_launch is not None:
            entry.raw_launch(
                grid[0], grid_y, grid_z, stream, entry.function, *entry.raw_flags,
                None, None,  # global and profile scratch: none (checked when the entry was made)
                entry.packed_metadata, None, None, None,  # launch metadata, enter / exit hooks
                *_expand_descriptors(args, entry.tma_plan, runtime.fill_tma), *entry.constexprs,
            )  # fmt: skip
            return
        entry.launcher(
            grid[0], grid_y, grid_z, stream, entry.function, entry.packed_metadata,
            None, None, None,  # launch metadata and enter / exit hooks: none set (checked above)
            *self._with_descriptors(args), *entry.constexprs,
        )  # fmt: skip

    def bind(self, grid: tuple, args: tuple, leading: int) -> BoundLaunch | None:
        """This kernel as compiled for ``args`` (a call just made with them), for calls that pass
        only the first ``leading`` arguments and keep every later one as in ``args``; None
        where a call with ``args`` would not launch directly (no entry, descriptors, hooks, an
        argument of another kind). See :class:`BoundLaunch` for what each call still checks."""
        runtime = _runtime if _runtime is not _MISSING else _get_runtime()
        if (
            runtime is None
            or self.descriptor_blocks
            or type(grid) is not tuple
            or not all(isinstance(x, torch.Tensor) for x in args[:leading])
        ):
            return None
        options = runtime.options()
        if options is None:
            return None
        device = runtime.current_device()
        try:
            key = (device, options, self.kernel.debug, launch_key(args, runtime.descriptor))
        except _Uncacheable:
            return None
        entry = self._entries.get(key)
        if entry is None or entry.raw_launch is not None:
            return None
        return BoundLaunch(
            entry=entry,
            runtime=runtime,
            device=device,
            options=options,
            debug=self.kernel.debug,
            kernel=self.kernel,
            leading_key=key[3][:leading],
            launch_head=(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1),
            launch_tail=(*args[leading:], *entry.constexprs),
        )

    def _with_descriptors(self, args: tuple) -> tuple:
        """``args`` with the tensors at descriptor positions wrapped in Triton's
        ``TensorDescriptor`` (whole tensor, zero padding), which validates their layout."""
        if not self.descriptor_blocks:
            return args
        from triton.tools.tensor_descriptor import TensorDescriptor

        wrapped = list(args)
        for position, block in self.descriptor_blocks.items():
            x = args[position]
            wrapped[position] = TensorDescriptor(x, list(x.shape), list(x.stride()), block)
        return tuple(wrapped)

    def _launch_and_remember(self, key: tuple, grid: tuple, args: tuple) -> None:
        compiled = self.kernel[grid](*self._with_descriptors(args), **self.kwargs)
        entry = self._entry(compiled, len(args))
        if entry is not None:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[key] = entry

    def _entry(self, compiled, positional: int) -> _Entry | None:
        """What a direct launch of ``compiled`` needs, or None if it cannot be launched directly."""
        kernel = self.kernel
        try:
            params = kernel.params
            if any(p.is_constexpr for p in params[:positional]):
                return None  # a constexpr passed positionally would be keyed as a runtime value
            constexprs = tuple(self.kwargs[p.name] for p in params[positional:])
            launcher = compiled.run  # a property: loads the binary on first use (done by now)
            entry = _Entry(
                launcher=launcher,
                function=compiled.function,
                packed_metadata=compiled.packed_metadata,
                constexprs=constexprs,
                kernel_globals=tuple(
                    (scope, name, scope.get(name, _MISSING))
                    for (name, _), (_, scope) in kernel.used_global_vals.items()
                ),
            )
        except (AttributeError, KeyError, TypeError):  # an unexpected shape of Triton's objects
            return None
        if not callable(launcher) or entry.function is None or hasattr(compiled, "result"):
            return None
        if self.descriptor_blocks:
            raw = _raw_descriptor_launch(launcher, list(self.descriptor_blocks), _get_runtime())
            if raw is not None:
                entry = dataclasses.replace(entry, raw_launch=raw[0], raw_flags=raw[1], tma_plan=raw[2])
        else:
            runtime = _get_runtime()
            layout = native_layout(compiled, runtime is not None and runtime.native_launches)
            entry = dataclasses.replace(entry, native_layout=layout)
        return entry


@dataclass(frozen=True)
class BoundLaunch:
    """A compiled kernel bound to every argument but its leading tensors
    (:meth:`KernelLaunch.bind`): ``bound(*tensors)`` launches it with those and returns True,
    or launches nothing and returns False when the call would not be the bound one. It
    checks what Triton's key reads that can change between calls with the same fixed
    arguments: the tensors' dtypes and 16-byte alignment (keyed as :func:`launch_key` keys a
    tensor), whether the runtime is still the one it was bound with, the current device, the
    launch options and hooks, ``kernel.debug``, the kernel's globals. What it
    saves over :meth:`KernelLaunch.__call__` is keying and hashing the arguments the caller
    fixes: on an H100 host (B=1 H=8 N=128 D=64) a forward launch through
    :meth:`KernelLaunch.__call__` cost 9.6 us more than Triton's compiled launcher alone,
    which took 8.9 us (triton 3.6, torch 2.11). Which arguments are
    fixed is the caller's promise: it binds only arguments that follow from what it keeps the
    bound launch by (for attnkit's launchers, the strides of q, k and v)."""

    entry: _Entry
    runtime: TritonRuntime
    device: int
    options: tuple
    debug: Any
    kernel: Any
    leading_key: tuple
    launch_head: tuple  # the grid's three extents
    launch_tail: tuple  # the fixed arguments, then the keyword parameters' values

    def __call__(self, *tensors) -> bool:
        runtime, entry = self.runtime, self.entry
        if (
            tuple([(x.dtype, x.data_ptr() % 16 == 0) for x in tensors]) != self.leading_key
            or runtime.current_device() != self.device
            or not self.ready()
        ):
            return False
        entry.launcher(
            *self.launch_head, runtime.current_stream(self.device), entry.function, entry.packed_metadata,
            None, None, None,  # launch metadata and enter / exit hooks: none set (options checked)
            *tensors, *self.launch_tail,
        )  # fmt: skip
        return True

    def ready(self) -> bool:
        """Whether a call may still launch the bound kernel as it is, whatever its tensors: the
        runtime is the one it was bound with, and the launch options and hooks, ``kernel.debug``
        and the kernel's globals are as they were."""
        runtime, entry = self.runtime, self.entry
        return not (
            _runtime is not runtime  # replaced (tests) or never found: the caller's normal path
            or runtime.options() != self.options
            or self.kernel.debug != self.debug
            or self.kernel.pre_run_hooks
            or (entry.kernel_globals and not entry.globals_unchanged())
        )


def _raw_descriptor_launch(launcher, positions: list[int], runtime: TritonRuntime | None):
    """(raw launcher, (cooperative, pdl), plan) of a triton 3.6 ``CudaLauncher`` whose
    descriptor arguments are exactly ``positions``, each lowered to a TMA descriptor, with no
    scratch memory; None otherwise (then the compiled launcher expands the descriptors)."""
    if runtime is None or runtime.fill_tma is None:
        return None
    try:
        expand = launcher.launch  # triton 3.6: wrap_handle_tensordesc's ``inner``
        cells = dict(
            zip(expand.__code__.co_freevars, [c.cell_contents for c in expand.__closure__ or ()], strict=True)
        )
        raw, indices, metas = cells["launcher"], cells["tensordesc_indices"], cells["tensordesc_meta"]
        if (
            sorted(indices) != positions
            or len(metas) != len(positions)
            or launcher.global_scratch_size
            or launcher.profile_scratch_size
            or not callable(raw)
        ):
            return None
        plan = []
        for position, meta in zip(positions, metas, strict=True):
            if meta is None or meta["fp4_padded"]:
                return None
            code = runtime.tma_dtype_codes[meta["elem_type"]]
            plan.append((position, meta["swizzle"], meta["elem_size"], code, list(meta["block_size"])))
        flags = (launcher.launch_cooperative_grid, launcher.launch_pdl)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return raw, flags, tuple(plan)


def _expand_descriptors(args: tuple, plan: tuple, fill_tma: Callable) -> list:
    """``args`` with each descriptor tensor replaced by what triton 3.6's launcher takes for a
    TMA descriptor (``make_tensordesc_arg``): the encoded map, then the shape and the strides."""
    expanded = []
    previous = 0
    for position, swizzle, elem_size, dtype_code, box in plan:
        expanded.extend(args[previous:position])
        x = args[position]
        shape, strides = x.shape, x.stride()
        expanded.append(fill_tma(x.data_ptr(), swizzle, elem_size, dtype_code, box, shape, strides, 0))
        expanded.extend(shape)
        expanded.extend(strides)
        previous = position + 1
    expanded.extend(args[previous:])
    return expanded
