"""The order in which the Gluon kernels walk their query tiles, shared by the forward and the
backward's dQ pass (both stream every key block a tile of query rows sees).

A tile is ``TILE_M`` query rows of one (batch x query head); ``n_mblocks`` = cdiv(N, TILE_M).
Causal: the row blocks that see the most keys run first, every head's, then the next lighter
ones, which shortens the tail of a grid whose programs do unequal work. Not causal: a head's
row blocks run back to back, so they share its K and V in L2.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def query_tile(tile, n_bh, n_mblocks, q_len, kv_len, causal_offset, TILE_M: gl.constexpr,
               BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):  # fmt: skip
    """(bh, m0, free_end, n_blocks) of work item ``tile``: its (batch x head) index and first
    row, the key index up to which every row of the tile sees whole blocks, and the number of
    key blocks it streams."""
    if CAUSAL:
        # Row blocks that see the most keys first, for every head, then the next lighter ones.
        m0 = (n_mblocks - 1 - tile // n_bh) * TILE_M
        bh = tile % n_bh
        kv_end = gl.minimum(kv_len, gl.maximum(m0 + TILE_M + causal_offset, 0))
        # Row m0 sees keys j <= m0 + causal_offset, and every later row sees at least those.
        free_end = gl.minimum(kv_len, gl.maximum(m0 + causal_offset + 1, 0))
    else:
        # A head's row blocks back to back: they share its K and V in L2.
        m0 = (tile % n_mblocks) * TILE_M
        bh = tile // n_mblocks
        kv_end = kv_len
        free_end = kv_len
    free_end = (free_end // BLOCK_N) * BLOCK_N
    return bh, m0, free_end, gl.cdiv(kv_end, BLOCK_N)
