"""Which machine a benchmark ran on: the GPU key that names its baseline, and the provenance
stored in pytest-benchmark's ``machine_info``.

Baselines are kept per GPU *model* (``baselines/<gpu_key>/``), never per host; the key is the
library's :func:`attnkit.device.gpu_key` (e.g. ``nvidia-h100-80gb-hbm3``), the same one that
names the Triton config table.

The provenance block lives under ``machine_info["attnkit"]`` so pytest-benchmark's own fields
stay untouched; its keys are documented in :func:`provenance`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

import torch

import attnkit
from attnkit.device import default_device, gpu_key

#: Software whose version changes kernel speed; a baseline recorded under other versions is
#: flagged (not rejected: a torch upgrade is a legitimate reason to refresh the baseline).
VERSION_KEYS = ("torch", "cuda", "triton", "cudnn", "driver")


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def _driver_version() -> str | None:
    """The NVIDIA driver as nvidia-smi reports it; torch exposes only the CUDA runtime."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def git_commit(cwd: Path | str | None = None) -> str | None:
    """``$ATTNKIT_COMMIT`` when set (a copied tree whose .git, if any, may not be its own);
    else HEAD of the checkout (``+dirty`` when the tree has local changes); outside a git
    checkout ``$GITHUB_SHA``, else None."""
    if os.environ.get("ATTNKIT_COMMIT"):
        return os.environ["ATTNKIT_COMMIT"]
    fallback = os.environ.get("GITHUB_SHA")
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True, cwd=cwd
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
            cwd=cwd,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return fallback
    return head + ("+dirty" if dirty else "")


@functools.cache
def source_digest(package: Path | str) -> str:
    """A digest of the code in the package folder ``package`` (its ``.py`` and ``.json`` files,
    names and bytes): two runs with the same digest ran the same attnkit, whatever their commit
    labels say (a copied tree, an uncommitted change)."""
    root = Path(package)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".json") and p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def provenance(device: torch.device | str | None = None) -> dict:
    """Everything a baseline must carry to be trusted later.

    Keys: ``gpu_key``, ``device_name``, ``capability`` ("9.0"), ``sm_count``, ``l2_bytes``,
    ``total_memory_bytes``, ``driver``, ``cuda``, ``cudnn``, ``torch``, ``triton``, ``commit``,
    ``source`` (:func:`source_digest` of the attnkit imported). GPU fields, CUDA and cuDNN
    included, are None when ``device`` is the CPU: they describe the device that ran the
    benchmarks, not the libraries torch was built with.
    """
    device = torch.device(device) if device is not None else default_device()
    info = {
        "gpu_key": gpu_key(device),
        "device_name": None,
        "capability": None,
        "sm_count": None,
        "l2_bytes": None,
        "total_memory_bytes": None,
        "driver": None,
        "cuda": None,
        "cudnn": None,
        "torch": torch.__version__,
        "triton": _triton_version(),
        "commit": git_commit(),
        "source": source_digest(Path(attnkit.__file__).parent),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            device_name=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            total_memory_bytes=props.total_memory,
            driver=_driver_version(),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        )
    return info


def version_differences(baseline: dict, now: dict) -> dict[str, tuple]:
    """``{key: (baseline_value, now_value)}`` for each of :data:`VERSION_KEYS` that differs."""
    return {
        key: (baseline.get(key), now.get(key))
        for key in VERSION_KEYS
        if baseline.get(key) is not None and baseline.get(key) != now.get(key)
    }


__all__ = ["default_device", "git_commit", "gpu_key", "provenance", "source_digest", "version_differences"]
