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

Fallbacks to ``kernel[grid](...)`` (the normal path, always correct):

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

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: Triton versions whose ``JITFunction.run`` and specialisation were read for this module.
VERIFIED_TRITON = ((3, 6), (3, 9))
#: Entries per :class:`KernelLaunch` before its cache is cleared (a program sweeping layouts).
MAX_ENTRIES = 256
#: Set to ``0`` before import to launch every kernel through ``kernel[grid]``.
DISABLE_ENV = "ATTNKIT_FAST_LAUNCH"

#: Keyword argument values keyed as they are (with their types).
_PLAIN = frozenset({int, float, bool, str, type(None)})
_MISSING = object()


class _Uncacheable(Exception):
    """An argument this module does not key: the call takes the normal path."""


@dataclass(frozen=True)
class TritonRuntime:
    """The Triton internals a direct launch reads, found once by :func:`find_runtime`."""

    knobs: Any  # triton.knobs
    current_device: Callable[[], int]
    current_stream: Callable[[int], int]
    jit_function: type
    descriptor: type | None  # triton.tools.tensor_descriptor.TensorDescriptor

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

        runtime = TritonRuntime(
            knobs=knobs,
            current_device=active.get_current_device,
            current_stream=active.get_current_stream,
            jit_function=JITFunction,
            descriptor=TensorDescriptor,
        )
        runtime.options()  # every knob it reads exists
        return runtime
    except Exception:  # any missing piece: the normal path, which Triton keeps working
        return None


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

    def globals_unchanged(self) -> bool:
        return all(scope.get(name, _MISSING) is value for scope, name, value in self.kernel_globals)


class KernelLaunch:
    """``kernel`` with fixed keyword arguments; ``launch(grid, *args)`` runs
    ``kernel[grid](*args, **kwargs)``, directly on a known key (module docstring)."""

    def __init__(self, kernel, **kwargs) -> None:
        self.kernel = kernel
        self.kwargs = kwargs
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
            kernel[grid](*args, **self.kwargs)
            return
        device = runtime.current_device()
        try:
            key = (device, options, kernel.debug, launch_key(args, runtime.descriptor))
        except _Uncacheable:
            kernel[grid](*args, **self.kwargs)
            return
        entry = self._entries.get(key)
        if entry is None or not entry.globals_unchanged():
            self._launch_and_remember(key, grid, args)
            return
        entry.launcher(
            grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
            runtime.current_stream(device), entry.function, entry.packed_metadata,
            None, None, None,  # launch metadata and enter / exit hooks: none set (checked above)
            *args, *entry.constexprs,
        )  # fmt: skip

    def _launch_and_remember(self, key: tuple, grid: tuple, args: tuple) -> None:
        compiled = self.kernel[grid](*args, **self.kwargs)
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
        return entry
