"""What one call of a benchmark runs on the GPU, as data: every kernel it launches, in order, with
its launch configuration, every device copy and fill with its size, and the machine code of each
compiled Triton or Gluon kernel among them.

Paired mode compares the two sides' fingerprints before it times anything
(:mod:`attnkit_perf.decide.identity`): both sides run in one environment (one torch, Triton,
driver and GPU), so a call that launches the same binaries with the same grids, blocks and shared
memory, and copies the same bytes, does the same GPU work, and timing it could only measure
noise. This is the benchmark-level form of a SASS diff: NVIDIA's CCCL plans to run only the
benchmarks whose machine code changed.

The launches are read from the profiler's trace (CUPTI through Kineto), which sees every kernel,
attnkit's own, cuDNN's or an inductor graph's, however it was launched: Triton's launcher,
attnkit's bound fast launch, its compiled fast path or a CUDA graph replay. A kernel of a library
(cuDNN, cuBLAS, ATen) is named by its symbol; the library's code is the environment's, the same
on both sides. A Triton or Gluon kernel's symbol is its function's name, shared by every
specialisation, so its binary is named too: the digest of each binary of that name compiled in
the process (``CompiledKernel.kernel``, the cubin, from each ``JITFunction``'s caches) whose
registers and shared memory are those of the call's launches of that name. The digest covers the
binary's machine code and its metadata, not its debug sections: Triton's line table names the
source file's absolute path, which differs between the base's checkout and the head's, so the
same code compiled from two folders would otherwise differ (:func:`machine_code_digest`).

Scalar arguments are not part of the fingerprint: a change that passes other values to the same
binary with the same launch shape (a loop bound, say) is not seen here. Such a change alters the
results as well, which the correctness suite compares; a row is timed whenever the fingerprint
differs or cannot be taken (no CUDA device, a profiler that records no kernel).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Callable

#: Trace categories (Kineto's names) that are GPU work, and the arguments of each that shape it.
_KERNEL_ARGS = ("grid", "block", "shared memory", "registers per thread")
_COPY_CATEGORIES = ("gpu_memcpy", "gpu_memset")


def launch_fingerprint(call: Callable[[], object], device) -> dict | None:
    """The fingerprint of one ``call()`` on ``device`` (the module docstring), or None where it
    cannot be taken (not a CUDA device, or the trace held no GPU work). ``call`` must have been
    run before (compiled, warmed up): the first call's compilation is no part of the answer.

    ``{"launches": [[kind, name, {arg: value}], ...], "binaries": {name: [digest, ...]}}``:
    ``kind`` is "kernel", "gpu_memcpy" or "gpu_memset" (copies carry their bytes)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return None
    torch.cuda.synchronize(device)
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        call()
        torch.cuda.synchronize(device)
    with tempfile.TemporaryDirectory(prefix="attnkit-trace-") as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    launches = gpu_work(trace.get("traceEvents", []))
    if not launches:
        return None
    return {"launches": launches, "binaries": compiled_binaries(launched_shapes(launches))}


def launched_shapes(launches: list[list]) -> dict[str, set[tuple]]:
    """Per kernel name, the (registers per thread, shared memory) of each of its launches."""
    shapes: dict[str, set[tuple]] = {}
    for kind, name, shape in launches:
        if kind == "kernel":
            shapes.setdefault(name, set()).add(
                (shape.get("registers per thread"), shape.get("shared memory"))
            )
    return shapes


def gpu_work(events: list[dict]) -> list[list]:
    """``[kind, name, args]`` of each GPU event of a Chrome trace, in the order they started."""
    work = []
    for event in events:
        category = event.get("cat")
        if category != "kernel" and category not in _COPY_CATEGORIES:
            continue
        args = event.get("args", {})
        if category == "kernel":
            shape = {key: args[key] for key in _KERNEL_ARGS if key in args}
        else:
            shape = {"bytes": args.get("bytes")}
        work.append((event.get("ts", 0), [category, event.get("name", ""), shape]))
    work.sort(key=lambda item: item[0])
    return [item for _, item in work]


def compiled_binaries(launched: dict[str, set[tuple]]) -> dict[str, list[str]]:
    """Per kernel name of ``launched``, the sorted digests of the binaries of that name that a
    ``JITFunction`` of this process has compiled (Triton's and Gluon's; none for a library's).

    A process holds a binary for every specialisation it compiled, for other rows too; of those,
    the binaries whose registers and shared memory are what the trace recorded for the name's
    launches (``launched``: :func:`launched_shapes`) are the ones this call ran, and only they
    are named. Where a launch matches none (a field the driver reports otherwise, handles not
    loaded), every binary of the name is: the comparison may then differ for another row's sake,
    which times the row, but never hides a binary of the call."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return {}
    found: dict[str, list[tuple[str, tuple]]] = {}
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads __class__, which some lazy modules' objects
        # answer with a deprecation warning.
        if not issubclass(type(obj), JITFunction):
            continue
        for caches in getattr(obj, "device_caches", {}).values():
            for compiled in caches[0].values():
                name = getattr(compiled, "name", None)
                binary = getattr(compiled, "kernel", None)
                if name in launched and isinstance(binary, (bytes, bytearray)):
                    shape = (getattr(compiled, "n_regs", None), _shared_bytes(compiled))
                    found.setdefault(name, []).append((machine_code_digest(bytes(binary)), shape))
    named = {}
    for name, binaries in sorted(found.items()):
        shapes = {shape for _, shape in binaries}
        if launched[name] <= shapes:  # every launch of the name has its binary here
            named[name] = sorted({digest for digest, shape in binaries if shape in launched[name]})
        else:
            named[name] = sorted({digest for digest, _ in binaries})
    return named


#: ELF sections that describe the source, not the code: DWARF's, NVIDIA's line tables and the
#: relocations that patch them.
_DEBUG_SECTIONS = (".debug", ".nv_debug", ".rela.debug", ".rela.nv_debug", ".rel.debug", ".rel.nv_debug")


def machine_code_digest(binary: bytes) -> str:
    """A short digest of a compiled kernel: for a 64-bit little-endian ELF (a CUDA cubin, an AMD
    code object) the name, type, flags and contents of every section but the debug ones
    (:data:`_DEBUG_SECTIONS`), read from the section header table (ELF-64 object file format:
    ``e_shoff`` at byte 0x28, ``e_shentsize``, ``e_shnum``, ``e_shstrndx`` at 0x3A); for
    anything else, or an ELF that does not read as one, the whole binary."""
    digest = hashlib.sha256()
    try:
        if binary[:6] != b"\x7fELF\x02\x01":  # magic, 64-bit, little-endian
            raise ValueError("not a 64-bit little-endian ELF")
        (table,) = struct.unpack_from("<Q", binary, 0x28)
        entry_size, count, names_index = struct.unpack_from("<HHH", binary, 0x3A)
        headers = [struct.unpack_from("<IIQQQQ", binary, table + i * entry_size) for i in range(count)]
        names_at = headers[names_index][4]
        for name_at, kind, flags, _, offset, size in headers:
            end = binary.index(b"\0", names_at + name_at)
            name = binary[names_at + name_at : end]
            if name.decode("ascii", "replace").startswith(_DEBUG_SECTIONS):
                continue
            body = b"" if kind == 8 else binary[offset : offset + size]  # 8: SHT_NOBITS, no contents
            if len(body) != (0 if kind == 8 else size):
                raise ValueError("a section runs past the end of the binary")
            digest.update(struct.pack("<IIQQ", len(name), kind, flags, len(body)) + name + body)
    except (ValueError, struct.error, IndexError):
        digest = hashlib.sha256(binary)
    return digest.hexdigest()[:16]


def _shared_bytes(compiled) -> int | None:
    metadata = getattr(compiled, "metadata", None)
    return getattr(metadata, "shared", None)
