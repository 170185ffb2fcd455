"""Kernel configuration of the Triton path: block sizes, warps and pipeline stages.

Configuration is data. ``configs/<gpu_key>.json`` holds, per *shape family* (dtype class, padded
head dim, causal or not), the tile shape of each of the three kernels; the table is written by
``python -m attnkit_tools.tune.configs`` on that GPU and committed. At run time the table is read once
(no autotuning at import or per call), so a perf gate always times the same kernels. A GPU with
no table, or a family missing from it, gets :func:`default_config`, which only promises to fit
in ~96 KB of shared memory and to be correct.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attnkit.device import gpu_key

CONFIG_DIR = Path(__file__).parent / "configs"

#: Environment variable naming a JSON table to use instead of the packaged one.
CONFIG_ENV = "ATTNKIT_TRITON_CONFIG"

_WARPS = (1, 2, 4, 8, 16)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def padded_dim(dim: int) -> int:
    """Head dims are padded (with masked loads) to a power of two of at least 16, the
    smallest inner size ``tl.dot`` takes."""
    return max(16, next_power_of_2(dim))


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters of one kernel: a (block_m query rows) x (block_n key rows) tile."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 16 or value > 256 or value & (value - 1):
                raise ValueError(
                    f"KernelConfig.{name}: expected a power of two in 16..256 (tl.dot needs >= 16), "
                    f"got {value!r}"
                )
        if self.num_warps not in _WARPS:
            raise ValueError(f"KernelConfig.num_warps: expected one of {_WARPS}, got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"KernelConfig.num_stages: expected an int in 1..8, got {self.num_stages!r}")


@dataclass(frozen=True)
class AttentionConfig:
    """Configs of the forward, the backward's dK/dV pass and its dQ pass."""

    fwd: KernelConfig
    dkdv: KernelConfig
    dq: KernelConfig

    def as_dict(self) -> dict:
        return {name: asdict(getattr(self, name)) for name in ("fwd", "dkdv", "dq")}

    @classmethod
    def from_dict(cls, data: dict) -> AttentionConfig:
        missing = {"fwd", "dkdv", "dq"} - set(data)
        if missing:
            raise ValueError(f"AttentionConfig: missing kernel(s) {sorted(missing)} in {data!r}")
        return cls(**{name: KernelConfig(**data[name]) for name in ("fwd", "dkdv", "dq")})


def family_key(dtype: torch.dtype, head_dim: int, value_dim: int, causal: bool) -> str:
    """Shape family, e.g. ``16bit-d128-causal``: problems that share one tuned config."""
    width = "fp32" if dtype == torch.float32 else "16bit"
    return f"{width}-d{padded_dim(max(head_dim, value_dim))}-{'causal' if causal else 'full'}"


def table_key(device: torch.device) -> str:
    """File stem of the device's table: its :func:`attnkit.device.gpu_key`; ``interpreter`` on CPU."""
    return gpu_key(device) if device.type == "cuda" else "interpreter"


#: float32 inputs run IEEE dots, which Triton lowers to FMAs unrolled in every thread, so the
#: compile time (ptxas) grows with block_m x block_n x padded dim; 16-bit dots use tensor cores
#: and do not. Compiled ahead of time for sm_90 with Triton's ptxas, the dK/dV kernel of dim 64
#: took 28 s with 64 x 64 tiles and 5 s with 32 x 32, and every new specialisation pays it again.
#: The capped tiles also run faster on the H100 (the kernels timed side by side, causal, N=4096): at dim 128
#: the forward 7.5x and dK/dV 7.9x, at dim 64 dK/dV 6.1x; only dQ at dim 64 is 1.17x slower.
FP32_TILE_VOLUME = 32 * 32 * 64


def default_config(
    dtype: torch.dtype, head_dim: int, value_dim: int, interpreted: bool = False
) -> AttentionConfig:
    """A safe config for any GPU: tiles shrink until one pipeline stage of the largest kernel
    fits in ~96 KB of shared memory, and float32 tiles until a dot unrolls into at most
    :data:`FP32_TILE_VOLUME` multiply-adds. Under the interpreter, small unequal tiles (32 x 16)
    make tiny test shapes cross block edges and the causal diagonal in every loop phase."""
    if interpreted:
        small = KernelConfig(32, 16, 4, 1)
        return AttentionConfig(small, KernelConfig(16, 32, 4, 1), small)
    item = 4 if dtype == torch.float32 else 2
    dim = padded_dim(max(head_dim, value_dim))
    block_m, block_n = 64, 64

    def too_large(block_m: int, block_n: int) -> bool:
        # The dK/dV pass keeps K, V (block_n rows) and streams Q, dO (block_m rows): ~2 tiles each.
        shared = (2 * block_m + 2 * block_n) * dim * item
        unrolled = block_m * block_n * dim if dtype == torch.float32 else 0
        return shared > 96 * 1024 or unrolled > FP32_TILE_VOLUME

    while too_large(block_m, block_n) and max(block_m, block_n) > 16:
        if block_n >= block_m:
            block_n //= 2
        else:
            block_m //= 2
    stages = 2 if (block_m + 2 * block_n) * dim * item * 2 <= 160 * 1024 else 1
    cfg = KernelConfig(block_m, block_n, 4, stages)
    return AttentionConfig(cfg, cfg, cfg)


@functools.cache
def load_table(path: str) -> dict:
    with open(path) as f:
        table = json.load(f)
    if "families" not in table:
        raise ValueError(f"{path}: not a kernel-config table (no 'families' key)")
    return table


def table_path(device: torch.device) -> Path | None:
    """The table used for ``device``: $ATTNKIT_TRITON_CONFIG if set, else the packaged one."""
    override = os.environ.get(CONFIG_ENV)
    if override:
        return Path(override)
    path = CONFIG_DIR / f"{table_key(device)}.json"
    return path if path.exists() else None


def get_config(
    device: torch.device, dtype: torch.dtype, head_dim: int, value_dim: int, causal: bool
) -> AttentionConfig:
    """The committed config of this GPU and shape family, or :func:`default_config`.

    Looked up once per (device, table, family): it runs on every call, and for short sequences
    the host time of a call is as long as the kernels'."""
    if device.type != "cuda":
        return _lookup_config(None, None, dtype, head_dim, value_dim, causal)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _lookup_config(index, os.environ.get(CONFIG_ENV), dtype, head_dim, value_dim, causal)


def gpu_table(device: torch.device) -> dict | None:
    """The whole config table of ``device`` (:func:`table_path`; the Gluon kernels' section
    included, :mod:`attnkit.triton.gluon.config`), or None: the CPU, or a GPU with no table.
    Read once per (device, override)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    path = table_path(torch.device("cuda", index))
    return None if path is None else load_table(str(path))


@functools.cache
def _lookup_config(
    cuda_index: int | None,
    override: str | None,
    dtype: torch.dtype,
    head_dim: int,
    value_dim: int,
    causal: bool,
) -> AttentionConfig:
    interpreted = cuda_index is None
    path = None if interpreted else table_path(torch.device("cuda", cuda_index))
    if path is not None:
        entry = load_table(str(path))["families"].get(family_key(dtype, head_dim, value_dim, causal))
        if entry is not None:
            return AttentionConfig.from_dict(entry)
    return default_config(dtype, head_dim, value_dim, interpreted)
