"""Facts about the device a call runs on, computed in one place: the default device and the GPU
key that names per-GPU data (the Triton config table, the perf baselines)."""

from __future__ import annotations

import platform
import re

import torch


def default_device() -> torch.device:
    """CUDA when PyTorch sees a GPU, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def gpu_key(device: torch.device | str | None = None) -> str:
    """The device model as a file name, e.g. ``nvidia-h100-80gb-hbm3``; ``cpu-<arch>`` on the CPU.

    Per-GPU data is kept per *model*, never per host: two H100 SXM cards share one key, an H100
    and an H200 do not.
    """
    device = default_device() if device is None else torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu-{platform.machine()}"
    return re.sub(r"[^a-z0-9_]+", "-", name.lower()).strip("-")
