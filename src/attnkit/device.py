"""Facts about the device a call runs on, computed in one place: the default device, the device
tests and benchmarks run on, and the GPU key that names per-GPU data (the Triton config table,
the perf baselines)."""

from __future__ import annotations

import os
import platform
import re

import torch


def default_device() -> torch.device:
    """CUDA when PyTorch sees a GPU, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def absent_reason(device: torch.device) -> str | None:
    """Why ``device`` is not on this machine (no CUDA device, an index past the count, no MPS), or
    None: no backend can run there, whatever it declares."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = (
                "this torch is built without CUDA"
                if torch.version.cuda is None
                else "no CUDA device is visible"
            )
            return f"{device}: {build} (torch.cuda.is_available() is False)"
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            return f"{device}: {count} CUDA device(s) visible (cuda:0 to cuda:{count - 1})"
    if device.type == "mps" and not torch.backends.mps.is_available():
        return f"{device}: no MPS device here (torch.backends.mps.is_available() is False)"
    return None


#: Names the device the test suites and the perf gate run on (``cpu``, ``cuda:1``).
TEST_DEVICE_ENV = "ATTNKIT_TEST_DEVICE"


def named_test_device() -> str | None:
    """The device :data:`TEST_DEVICE_ENV` names, or None when it is unset or empty."""
    return os.environ.get(TEST_DEVICE_ENV) or None


def test_device() -> torch.device:
    """The device the test suites and the perf gate run on: the one :data:`TEST_DEVICE_ENV`
    names, else :func:`default_device`."""
    return torch.device(named_test_device() or default_device())


test_device.__test__ = False  # a helper, not a test, although its name starts with "test"


def gpu_key(device: torch.device | str | None = None) -> str:
    """The device model as a file name, e.g. ``nvidia-h100-80gb-hbm3``; ``cpu-<arch>`` on the CPU.

    Per-GPU data is kept per *model*, never per host: two H100 SXM cards share one key, an H100
    and an H200 do not.
    """
    device = default_device() if device is None else torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu-{platform.machine()}"
    return re.sub(r"[^a-z0-9_]+", "-", name.lower()).strip("-")
