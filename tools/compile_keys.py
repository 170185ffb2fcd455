"""pytest plugin: how many distinct Triton compilations a test run asks for, and where.

    TRITON_INTERPRET=1 ATTNKIT_TEST_DEVICE=cpu HYPOTHESIS_PROFILE=ci PYTHONPATH=src:tools \
        pytest tests/correctness -p compile_keys -p no:cacheprovider      # one process (no -n)

Every launch through :class:`attnkit.triton.fast_launch.KernelLaunch` is keyed the way Triton
3.x keys its compilations: the kernel, its constexpr keywords, and per positional argument
what Triton specialises on (a tensor's dtype and 16-byte alignment, an int's being 1 or a
multiple of 16, except for the kernel's ``do_not_specialize`` ints). Int widths (i32 / i64)
are not keyed. On the GPU each distinct key is one compilation (seconds) unless Triton's cache
holds it, which is what sets the correctness step's time on a fresh machine. Writes
``$ATTNKIT_COMPILE_KEYS_OUT`` (default ``compile_keys.json``): the number of distinct keys,
per kernel, per test file (where each key was first asked for) and per test.
"""

from __future__ import annotations

import collections
import json
import os

import torch

from attnkit.triton import fast_launch

_KEYS: dict[str, set] = collections.defaultdict(set)
_CURRENT = ["(outside a test)"]
_launch = fast_launch.KernelLaunch.__call__


def _specialisation(arg, specialised: bool) -> tuple:
    if isinstance(arg, torch.Tensor):
        return ("tensor", str(arg.dtype), arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool):
        return ("bool", arg)
    if isinstance(arg, int):
        return ("int", arg == 1, arg % 16 == 0) if specialised else ("int",)
    if isinstance(arg, float):
        return ("float",)
    block = getattr(arg, "block_shape", None)
    return (type(arg).__name__, None if block is None else tuple(block))


def _unspecialised(kernel) -> set[str]:
    """The names of ``kernel``'s ``do_not_specialize`` parameters (a JITFunction keeps them as
    ``do_not_specialize``, the interpreter's InterpretedFunction in its ``kwargs``)."""
    names = getattr(kernel, "do_not_specialize", None)
    if names is None:
        names = (getattr(kernel, "kwargs", None) or {}).get("do_not_specialize")
    arg_names = getattr(kernel, "arg_names", [])
    return {arg_names[n] if isinstance(n, int) else n for n in names or ()}


def _recording_launch(self, grid, *args):
    kernel = getattr(self.kernel, "fn", self.kernel)
    name = getattr(kernel, "__name__", type(kernel).__name__)  # tests launch stand-in kernels too
    constexprs = tuple(sorted((k, repr(v)) for k, v in self.kwargs.items()))
    positional = [n for n in getattr(self.kernel, "arg_names", []) if n not in self.kwargs]
    unspecialised = _unspecialised(self.kernel)
    keys = tuple(
        _specialisation(arg, i >= len(positional) or positional[i] not in unspecialised)
        for i, arg in enumerate(args)
    )
    _KEYS[_CURRENT[0]].add((name, constexprs, keys))
    return _launch(self, grid, *args)


fast_launch.KernelLaunch.__call__ = _recording_launch


def pytest_runtest_setup(item) -> None:
    _CURRENT[0] = item.nodeid


def pytest_sessionfinish(session) -> None:
    first_asked: dict[tuple, str] = {}
    for node, keys in _KEYS.items():
        for key in keys:
            first_asked.setdefault(key, node)
    report = {
        "distinct": len(first_asked),
        "per_kernel": collections.Counter(key[0] for key in first_asked),
        "per_file": collections.Counter(node.split("::")[0] for node in first_asked.values()),
        "per_test": dict(sorted(((n, len(k)) for n, k in _KEYS.items()), key=lambda item: -item[1])),
    }
    path = os.environ.get("ATTNKIT_COMPILE_KEYS_OUT", "compile_keys.json")
    with open(path, "w") as out:
        json.dump(report, out, indent=1)
    print(f"\ncompile keys: {report['distinct']} distinct, {dict(report['per_kernel'])}; wrote {path}")
