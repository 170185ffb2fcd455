"""Tile and register configuration of the Gluon Hopper kernels, and the cells they are routed
in, as per-GPU data: the ``gluon`` section of the Triton config table
(``attnkit/triton/configs/<gpu_key>.json``, :mod:`attnkit.triton.config`), written by
``python -m attnkit_tools.tune.configs --gluon`` on that GPU and committed.

The section holds, per pass (``forward``, ``backward``), one config per
cell (:func:`cell_key`: head dim and causal, e.g. ``d128-causal``), and under ``routed`` the
smallest N (queries) from which the Gluon kernel of that pass measured faster than the plain
Triton one on this GPU; a cell absent from ``routed`` keeps the plain kernel. A GPU with no
section runs no Gluon kernel from the Triton path (:mod:`attnkit.triton.gluon.route`).
``provenance`` says where the section was measured; a pass measured apart from it (another
run, or a recorded measurement) has its own under ``provenance_of``.

The backward's configs are :class:`BackwardConfig`; the rest of this docstring is the forward's.

What a config means: each consumer warpgroup owns ``block_m`` query rows (a CTA covers
``consumers * block_m``); key blocks are ``block_n`` rows; ``stages`` K/V slots form the
shared-memory ring. Registers: a CTA of two consumer warpgroups runs 12 warps (two 4-warp
consumer warpgroups and the producer's warp, rounded up to a warpgroup), so one CTA per SM may
use 65536 / 384 = 170 registers a thread: ``maxnreg`` is that rounded down to a multiple of 8.
``setmaxnreg`` then moves registers from the producer (``producer_regs``) to the consumers
(``consumer_regs``), keeping 4 * 32 * (consumers * consumer_regs + producer_regs) <= threads *
maxnreg. Shared memory per CTA: consumers * block_m * D (Q) + 2 * stages * block_n * D (K, V)
elements plus barriers and layout-conversion scratch; at most 227 KiB on an H100 or H200.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import torch

from attnkit.triton.config import CONFIG_DIR, CONFIG_ENV, gpu_table, load_table

#: The key of the Gluon kernels' section in a config table.
SECTION = "gluon"
#: The passes a section may configure and route.
PASSES = ("forward", "backward")


@dataclass(frozen=True)
class HopperForwardConfig:
    block_m: int
    block_n: int
    stages: int
    #: Issue block j's Q K^T before block j - 1's P V (FlashAttention-3's intra-warpgroup
    #: overlap); False runs each block's two products back to back.
    overlap: bool
    #: With ``overlap``: the two consumer warpgroups take the tensor cores in turn (an
    #: mbarrier pair), so one's softmax runs while the other's products do.
    pingpong: bool
    #: One program per SM looping over the tiles (else one program per tile).
    persistent: bool
    consumer_regs: int
    producer_regs: int
    maxnreg: int
    #: Consumer warpgroups, each ``block_m`` rows of the tile: 2, or 3 without ``pingpong``
    #: (16 warps: ``maxnreg`` 128, e.g. 160 registers a consumer thread and 32 the producer's).
    consumers: int = 2

    def __post_init__(self) -> None:
        if self.consumers not in (2, 3) or (self.pingpong and self.consumers != 2):
            raise ValueError(
                f"HopperForwardConfig: {self.consumers} consumers (2, or 3 without pingpong), "
                f"pingpong={self.pingpong}"
            )

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> HopperForwardConfig:
        return cls(**data)


#: What a GPU without a measured section runs when :func:`attnkit.triton.gluon.forward` is
#: called directly: two consumer warpgroups of 64 rows, 128-key blocks, two stages, which
#: compiles without spills at both head dims. Not tuned; the Triton path routes nothing there.
UNTUNED_FORWARD = HopperForwardConfig(
    block_m=64, block_n=128, stages=2, overlap=True, pingpong=False, persistent=False,
    consumer_regs=240, producer_regs=24, maxnreg=168,
)  # fmt: skip


@dataclass(frozen=True)
class BackwardConfig:
    """Tiles of the Gluon backward's two passes (:mod:`attnkit.triton.gluon.backward_launch`).
    dK/dV: each of ``consumers`` warpgroups owns ``block_n`` keys (a program owns ``consumers *
    block_n``); query blocks of ``block_m`` rows stream through a ring of ``stages`` Q/dO slots.
    dQ (``gluon_dq``; False: the plain Triton dQ pass): each of ``dq_consumers`` warpgroups owns
    ``dq_block_m`` query rows; key blocks of ``dq_block_n`` stream through ``dq_stages`` K/V
    slots. Three consumers fit D = 64 only (their registers:
    :data:`attnkit.triton.gluon.backward_launch.REGISTERS`)."""

    block_m: int = 64
    block_n: int = 64
    stages: int = 2
    consumers: int = 2
    #: Causal: the masked row blocks in a loop of their own (else one loop, masking by a
    #: runtime branch).
    split_masked: bool = False
    gluon_dq: bool = True
    dq_block_m: int = 64
    dq_block_n: int = 64
    dq_stages: int = 2
    dq_consumers: int = 2

    def __post_init__(self) -> None:
        for name in ("consumers", "dq_consumers"):
            if getattr(self, name) not in (2, 3):
                raise ValueError(f"BackwardConfig.{name}: expected 2 or 3, got {getattr(self, name)!r}")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> BackwardConfig:
        return cls(**data)


#: What a cell without a measured backward config runs when
#: :func:`attnkit.triton.gluon.backward_launch.backward` is called directly. Not tuned.
UNTUNED_BACKWARD = BackwardConfig()


def cell_key(head_dim: int, causal: bool) -> str:
    """A cell of the section, e.g. ``d128-causal``."""
    return f"d{head_dim}-{'causal' if causal else 'full'}"


def parse_cell(key: str) -> tuple[int, bool]:
    """(head dim, causal) of a :func:`cell_key`."""
    dim, _, mask = key.partition("-")
    if not dim.startswith("d") or not dim[1:].isdigit() or mask not in ("full", "causal"):
        raise ValueError(f"Gluon cell {key!r}: expected 'd<head dim>-full' or 'd<head dim>-causal'")
    return int(dim[1:]), mask == "causal"


def section_of(table: Mapping | None) -> Mapping:
    """A table's Gluon section ({} when it has none)."""
    return {} if table is None else table.get(SECTION, {})


def forward_configs(section: Mapping) -> dict[tuple[int, bool], HopperForwardConfig]:
    """The section's forward configs by (head dim, causal)."""
    return {
        parse_cell(key): HopperForwardConfig.from_dict(entry)
        for key, entry in section.get("forward", {}).items()
    }


def backward_configs(section: Mapping) -> dict[tuple[int, bool], BackwardConfig]:
    """The section's backward configs by (head dim, causal)."""
    return {
        parse_cell(key): BackwardConfig.from_dict(entry) for key, entry in section.get("backward", {}).items()
    }


def routed_cells(section: Mapping, pass_name: str = "forward") -> dict[tuple[int, bool], int]:
    """(head dim, causal) -> the smallest N routed to the Gluon kernel of ``pass_name``."""
    if pass_name not in PASSES:
        raise ValueError(f"pass_name: expected one of {PASSES}, got {pass_name!r}")
    return {parse_cell(key): int(n) for key, n in section.get("routed", {}).get(pass_name, {}).items()}


def device_section(device: torch.device) -> Mapping:
    """The Gluon section of ``device``'s table ({} for the CPU or a GPU without one)."""
    return section_of(gpu_table(device))


def packaged_section(gpu_key: str) -> Mapping:
    """The Gluon section of the packaged table of ``gpu_key`` ({} if none): what a GPU of that
    model runs, readable on any machine (tests, tools)."""
    path = CONFIG_DIR / f"{gpu_key}.json"
    return section_of(load_table(str(path)) if path.exists() else None)


def forward_config(device: torch.device, head_dim: int, causal: bool) -> HopperForwardConfig:
    """The forward config of ``device``'s table for a (head dim, causal) cell, else
    :data:`UNTUNED_FORWARD`. Looked up once per (device, table, cell): a launch asks it."""
    return _forward_config(_cuda_index(device), os.environ.get(CONFIG_ENV), head_dim, causal)


@functools.cache
def _forward_config(cuda_index: int | None, override: str | None, head_dim: int, causal: bool):
    return forward_configs(device_section(_device(cuda_index))).get((head_dim, causal), UNTUNED_FORWARD)


def backward_config(device: torch.device, head_dim: int, causal: bool) -> BackwardConfig:
    """The backward config of ``device``'s table for a (head dim, causal) cell, else
    :data:`UNTUNED_BACKWARD`. Looked up once per (device, table, cell)."""
    return _backward_config(_cuda_index(device), os.environ.get(CONFIG_ENV), head_dim, causal)


@functools.cache
def _backward_config(cuda_index: int | None, override: str | None, head_dim: int, causal: bool):
    return backward_configs(device_section(_device(cuda_index))).get((head_dim, causal), UNTUNED_BACKWARD)


def _cuda_index(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def _device(cuda_index: int | None) -> torch.device:
    return torch.device("cpu") if cuda_index is None else torch.device("cuda", cuda_index)
