"""Tile and register configuration of the Gluon Hopper forward, as data, by head dim and causal.

Each consumer warpgroup owns ``block_m`` query rows (a CTA covers ``2 * block_m``); key
blocks are ``block_n`` rows; ``stages`` K/V slots form the shared-memory ring.

Registers: a CTA runs 12 warps (two 4-warp consumer warpgroups and the producer's warp,
rounded up to a warpgroup), so one CTA per SM may use 65536 / 384 = 170 registers a thread:
``maxnreg`` is that rounded down to a multiple of 8. ``setmaxnreg`` then moves registers
from the producer (``producer_regs``) to the consumers (``consumer_regs``), keeping
4 * 32 * (2 * consumer_regs + producer_regs) <= 384 * maxnreg.

The layout each key block streams through: with ``overlap``, block j's scores are computed
while block j - 1's P V is in flight, so three P/S tiles are live at once.

Shared memory per CTA: 2 * block_m * D (Q) + 2 * stages * block_n * D (K, V) elements plus
barriers and layout-conversion scratch; at most 227 KiB on an H100.

Chosen by measurement on an H100 (bf16, B=4, H*D=2048, N = 4096, 8192 and 16384, ``do_bench``
medians, cuDNN timed in the same rows): the variant of each (head dim, causal) cell fastest at
all three lengths among those that compile for sm_90 without register spills (ptxas ``-v``).
At D=64 three consumer warpgroups won in both cells (1.06-1.25x cuDNN without the mask); at
D=128 causal the plain grid beat ping-pong and the persistent kernel, which spills (its
consumers need more than the 240 registers a thread the budget allows).
"""

from __future__ import annotations

from dataclasses import dataclass


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


def _config(block_m=64, block_n=128, stages=2, pingpong=False, persistent=False) -> HopperForwardConfig:
    """A config of two consumer warpgroups (12 warps, one CTA per SM)."""
    return HopperForwardConfig(
        block_m=block_m,
        block_n=block_n,
        stages=stages,
        overlap=True,
        pingpong=pingpong,
        persistent=persistent,
        consumer_regs=240,
        producer_regs=24,
        maxnreg=168,
    )


def _three_warpgroups(stages: int) -> HopperForwardConfig:
    """Three consumer warpgroups of 64 rows (192 a CTA, FlashAttention-3's D=64 shape): 16
    warps, so 128 registers a thread on average, 3 x 160 for the consumers and 32 for the
    producer."""
    return HopperForwardConfig(
        block_m=64,
        block_n=128,
        stages=stages,
        overlap=True,
        pingpong=False,
        persistent=False,
        consumer_regs=160,
        producer_regs=32,
        maxnreg=128,
        consumers=3,
    )


#: By (head dim (Dv = D), causal).
CONFIGS: dict[tuple[int, bool], HopperForwardConfig] = {
    (64, False): _three_warpgroups(stages=3),
    (64, True): _three_warpgroups(stages=3),
    (128, False): _config(pingpong=True, persistent=True),
    (128, True): _config(),
}

SUPPORTED_HEAD_DIMS = tuple(sorted({d for d, _ in CONFIGS}))


def get_config(head_dim: int, causal: bool) -> HopperForwardConfig:
    """The config of a (head dim, causal) cell; ``head_dim`` in :data:`SUPPORTED_HEAD_DIMS`."""
    return CONFIGS[head_dim, causal]
