"""Builds, finds and loads the compiled fast path (``csrc/fast_calls.cpp``; see
:mod:`attnkit.fastpath`). A build's directory names the torch version, the Python ABI and a hash
of the source, so a build is never loaded against another torch or an edited source; a finished
build is loaded as it is, without asking the build tool.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import torch

from attnkit.cache import cache_root

SOURCE = Path(__file__).with_name("csrc") / "fast_calls.cpp"
#: The format of what the source reads off a :class:`~attnkit.prepared.PreparedRun`: its
#: ``run``, ``plain_sdpa_call`` (:class:`~attnkit.prepared.PlainSdpaCall`) and the
#: :class:`~attnkit.prepared.NativeProgram` its ``native_forward`` returns.
SPEC_FORMAT = 3
MODES = ("auto", "build", "off")


def _mode() -> str:
    mode = os.environ.get("ATTNKIT_FAST_CALLS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"ATTNKIT_FAST_CALLS: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


def build_location() -> tuple[str, Path]:
    """(module name, build directory) for this torch, this Python and this source."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    name = f"attnkit_fast_calls_{digest}"
    tag = f"torch-{torch.__version__}-{sys.implementation.cache_tag}".replace("+", "_")
    return name, cache_root() / tag / name


def _built_file(name: str, directory: Path) -> Path:
    return directory / f"{name}.so"


def _checked(module, path):
    if getattr(module, "SPEC_FORMAT", None) != SPEC_FORMAT:
        raise ImportError(
            f"{path}: spec format {getattr(module, 'SPEC_FORMAT', None)}, expected {SPEC_FORMAT}"
        )
    return module


def _import(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return _checked(module, path)


def build(verbose: bool = False):
    """Build the extension for this torch into the cache (if not built yet) and load it."""
    from torch.utils import cpp_extension

    name, directory = build_location()
    directory.mkdir(parents=True, exist_ok=True)
    # The build compiles a copy inside its directory (named by the source's hash, so any copy
    # there is this source): every checkout then writes the same build file, and the build tool
    # finds the work done instead of redoing it for another source path. Written once, whole.
    source = directory / SOURCE.name
    if not source.exists():
        partial = directory / f"{SOURCE.name}.{os.getpid()}"
        partial.write_bytes(SOURCE.read_bytes())
        os.replace(partial, source)
    module = cpp_extension.load(
        name=name,
        sources=[str(source)],
        build_directory=str(directory),
        extra_cflags=["-O2"],
        verbose=verbose,
        is_python_module=True,
    )
    return _checked(module, _built_file(name, directory))


def _load():
    """(module or None, why not) under ``ATTNKIT_FAST_CALLS``."""
    mode = _mode()
    if mode == "off":
        return None, "off: ATTNKIT_FAST_CALLS=off"
    if sys.implementation.name != "cpython":
        return None, f"off: a CPython extension, and this is {sys.implementation.name}"
    if mode == "auto" and not SOURCE.exists():
        return None, f"off: {SOURCE} is not installed"
    name, directory = build_location()
    path = _built_file(name, directory)
    # A build of this source for this torch is used as it is: the build tool would compile it
    # again for the same source at another path (another checkout, the gate's copies of base
    # and head), each process in turn. cpp_extension's lock file is there while one builds.
    lock = directory / "lock"
    finished = path.exists() and not lock.exists()
    if mode == "build" and not finished:
        return build(), f"on: {path}"
    if lock.exists():
        return None, f"off: a build is under way, or was stopped (then remove {lock})"
    if not finished:
        return None, f"off: not built for torch {torch.__version__} (python -m attnkit.fastpath build)"
    try:
        return _import(name, path), f"on: {path}"
    except ImportError as err:
        return None, f"off: {path} did not load: {err}"


#: The loaded extension (None: the Python memo alone), and a line saying which and why.
memo, status = _load()
