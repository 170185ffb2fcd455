"""The tiled path: FlashAttention-2 in plain PyTorch.

This is the readable twin of the Triton kernels: the same loops, the same online softmax, the
same causal and sliding-window block bounds (key blocks wholly outside the band are skipped,
blocks crossing its edges are masked) and the same two-pass backward (a dK/dV pass over key blocks, a dQ
pass over query blocks). Each loop iteration is vectorised over batch and heads.

Tile sizes come from a memory budget (:func:`tile_shape`), not a fixed block: a tile holds at
most as many scores per head as one head of q or k holds values, ``block_m * block_n <=
max(N, M) * max(D, Dv)``. Big tiles are what make this path usable: each loop iteration is a
handful of large batched matmuls and elementwise ops instead of thousands of small launches.

Workspace bound: besides inputs, outputs and the log-sum-exp (O(N)), at most two
(B, Hq, block_m, block_n) tiles in the accumulator dtype are alive at a time (the scores,
turned into probabilities in place, and in the backward their gradient, computed in place
too), plus a boolean (block_m, block_n) mask on diagonal tiles and O(block * D) row blocks.
Each tile is no larger than q (or k) upcast to the accumulator dtype, so the workspace is at
most about twice that: O(N * D), never O(N^2), in forward and backward.

GQA: q is viewed as (B, Hkv, G, N, D), so one key/value block serves its whole query-head
group and dK/dV are summed over the group, as the kernels do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnkit.flash_autograd import PATHS, flash_attention
from attnkit.inputs import AttentionProblem


@dataclass(frozen=True)
class TiledConfig:
    """Tile sizes of the tiled path (query rows and key columns per tile); None: sized to the
    memory budget by :func:`tile_shape`."""

    block_m: int | None = None
    block_n: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"TiledConfig.{name}: expected a positive int or None, got {value!r}")


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


def tile_shape(problem: AttentionProblem, config: TiledConfig | None = None) -> tuple[int, int]:
    """(block_m, block_n): the configured sizes, or the largest powers of two whose tile fits
    the budget ``block_m * block_n <= max(N, M) * max(D, Dv)`` (see the module docstring),
    square-ish with the query side larger, and no larger than the problem."""
    config = config or TiledConfig()
    p = problem
    budget = max(p.q_len, p.kv_len) * max(p.head_dim, p.value_dim)
    rows_cap, cols_cap = _pow2_ceil(p.q_len), _pow2_ceil(p.kv_len)
    side = _pow2_floor(int(budget**0.5))
    block_m = config.block_m or min(rows_cap, side * 2 if side * side * 2 <= budget else side)
    block_n = config.block_n or min(cols_cap, _pow2_floor(budget // block_m))
    if config.block_m is None:  # keys capped by a short M: give the rows what is left
        block_m = min(rows_cap, max(block_m, _pow2_floor(budget // block_n)))
    return block_m, block_n


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Scores and running sums are kept in float32 (float64 for float64 inputs)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def key_range_for_rows(problem: AttentionProblem, row_start: int, row_end: int) -> tuple[int, int]:
    """[start, end): the keys some query row in [row_start, row_end) sees (the forward's and the
    dQ pass's loop bounds). Keys outside the band are never touched; an empty range is a block
    of rows that sees no key."""
    lower, upper = problem.key_band
    start = 0 if lower is None else min(problem.kv_len, max(0, row_start + lower))
    end = problem.kv_len if upper is None else min(problem.kv_len, max(0, row_end - 1 + upper + 1))
    return start, max(start, end)


def row_range_for_keys(problem: AttentionProblem, key_start: int, key_end: int) -> tuple[int, int]:
    """[start, end): the query rows that see some key in [key_start, key_end) (the dK/dV pass's
    loop bounds), the mirror of :func:`key_range_for_rows`."""
    lower, upper = problem.key_band
    start = 0 if upper is None else min(problem.q_len, max(0, key_start - upper))
    end = problem.q_len if lower is None else min(problem.q_len, max(0, key_end - 1 - lower + 1))
    return start, max(start, end)


def _mask_tile(scores: torch.Tensor, problem: AttentionProblem, row0: int, col0: int) -> torch.Tensor:
    """Set scores of keys a row must not see to -inf. Only tiles crossing an edge of the band
    need it: the causal diagonal (or the window's right edge), the window's left edge."""
    rows, cols = scores.shape[-2], scores.shape[-1]
    lower, upper = problem.key_band
    # The tile's top-right corner is the first to cross the upper edge, its bottom-left corner
    # the first to cross the lower edge.
    crosses_upper = upper is not None and col0 + cols - 1 > row0 + upper
    crosses_lower = lower is not None and col0 < row0 + rows - 1 + lower
    if not (crosses_upper or crosses_lower):
        return scores
    r = torch.arange(row0, row0 + rows, device=scores.device)[:, None]
    c = torch.arange(col0, col0 + cols, device=scores.device)[None, :]
    if crosses_upper:
        scores = scores.masked_fill_(c > r + upper, float("-inf"))
    if crosses_lower:
        scores = scores.masked_fill_(c < r + lower, float("-inf"))
    return scores


class TiledImplementation:
    """Forward and backward loops; see :class:`attnkit.flash_autograd.FlashImplementation`."""

    def __init__(self, config: TiledConfig | None = None) -> None:
        self.op_name = "tiled" if config is None else None
        self.config = config or TiledConfig()

    @staticmethod
    def lse_dtype(dtype: torch.dtype) -> torch.dtype:
        return accumulator_dtype(dtype)

    def _group_view(self, x: torch.Tensor, problem: AttentionProblem) -> torch.Tensor:
        # (B, Hq, N, X) -> (B, Hkv, G, N, X); splitting one dimension is always a view.
        return x.unflatten(1, (problem.kv_heads, problem.group_size))

    def forward(self, q, k, v, problem):
        p, cfg = problem, TiledConfig(*tile_shape(problem, self.config))
        acc = accumulator_dtype(p.dtype)
        qg = self._group_view(q, p)
        out = torch.empty(p.batch, p.q_heads, p.q_len, p.value_dim, dtype=p.dtype, device=q.device)
        out_g = self._group_view(out, p)
        lse = torch.empty(p.batch, p.kv_heads, p.group_size, p.q_len, dtype=acc, device=q.device)
        for m0 in range(0, p.q_len, cfg.block_m):
            m1 = min(m0 + cfg.block_m, p.q_len)
            # The scale is folded into q (N x D multiplies, not N x M), as the kernels fold it.
            q_tile = qg[..., m0:m1, :].to(acc) * p.scale
            row_max = torch.full(q_tile.shape[:-1], float("-inf"), dtype=acc, device=q.device)
            row_sum = torch.zeros_like(row_max)
            acc_tile = torch.zeros(*q_tile.shape[:-1], p.value_dim, dtype=acc, device=q.device)
            kv_start, kv_end = key_range_for_rows(p, m0, m1)
            # Key blocks start on the block grid, as in the kernels: the window's left edge
            # falls inside the first block and is masked there.
            for n0 in range((kv_start // cfg.block_n) * cfg.block_n, kv_end, cfg.block_n):
                n1 = min(n0 + cfg.block_n, p.kv_len)
                k_tile = k[:, :, None, n0:n1, :].to(acc)
                v_tile = v[:, :, None, n0:n1, :].to(acc)
                scores = _mask_tile(q_tile @ k_tile.transpose(-1, -2), p, m0, n0)
                new_max = torch.maximum(row_max, scores.amax(dim=-1))
                # Rows that have seen no key yet keep max -inf; shifting by 0 instead keeps
                # exp() finite (exp(-inf) = 0) rather than producing inf - inf = NaN.
                shift = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
                probs = scores.sub_(shift[..., None]).exp_()  # in place: tiles are the workspace
                rescale = torch.exp(row_max - shift)
                row_sum = row_sum * rescale + probs.sum(dim=-1)
                acc_tile = acc_tile * rescale[..., None] + probs @ v_tile
                row_max = new_max
            seen = row_sum > 0
            out_g[..., m0:m1, :] = (acc_tile / torch.where(seen, row_sum, 1.0)[..., None]).to(p.dtype)
            # +inf for rows that saw nothing: exp(s - lse) is then 0 in the backward.
            lse[..., m0:m1] = torch.where(seen, row_max + torch.log(row_sum), float("inf"))
        return out, lse.flatten(1, 2)

    def backward(self, grad_out, q, k, v, out, lse, problem):
        p, cfg = problem, TiledConfig(*tile_shape(problem, self.config))
        acc = accumulator_dtype(p.dtype)
        qg, dog = self._group_view(q, p), self._group_view(grad_out, p)
        lse_g = lse.unflatten(1, (p.kv_heads, p.group_size))
        # delta_i = sum_d dO_id * O_id = rowsum(P * dP), the softmax-gradient correction term.
        delta = self._group_view((grad_out.to(acc) * out.to(acc)).sum(dim=-1), p)

        def tile(m0, m1, n0, n1):
            """Recompute the probabilities of one tile from the saved log-sum-exp."""
            q_tile = qg[..., m0:m1, :].to(acc)
            k_tile = k[:, :, None, n0:n1, :].to(acc)
            scores = _mask_tile((q_tile * p.scale) @ k_tile.transpose(-1, -2), p, m0, n0)
            probs = scores.sub_(lse_g[..., m0:m1, None]).exp_()
            do_tile = dog[..., m0:m1, :].to(acc)
            dprobs = do_tile @ v[:, :, None, n0:n1, :].to(acc).transpose(-1, -2)
            # dS / scale: the scale multiplies the finished dK and dQ blocks instead (D columns,
            # not M), as in the kernels.
            dscores = dprobs.sub_(delta[..., m0:m1, None]).mul_(probs)
            return q_tile, k_tile, probs, do_tile, dscores

        # Pass 1, dK and dV: each key block owns its gradient; loop over the query blocks that
        # see it and sum over the query-head group.
        dk = k.new_empty(k.shape)
        dv = v.new_empty(v.shape)
        for n0 in range(0, p.kv_len, cfg.block_n):
            n1 = min(n0 + cfg.block_n, p.kv_len)
            dk_tile = torch.zeros(p.batch, p.kv_heads, n1 - n0, p.head_dim, dtype=acc, device=q.device)
            dv_tile = torch.zeros(p.batch, p.kv_heads, n1 - n0, p.value_dim, dtype=acc, device=q.device)
            row_start, row_end = row_range_for_keys(p, n0, n1)
            for m0 in range((row_start // cfg.block_m) * cfg.block_m, row_end, cfg.block_m):
                m1 = min(m0 + cfg.block_m, p.q_len)
                q_tile, _, probs, do_tile, dscores = tile(m0, m1, n0, n1)
                dv_tile += (probs.transpose(-1, -2) @ do_tile).sum(dim=2)
                dk_tile += (dscores.transpose(-1, -2) @ q_tile).sum(dim=2)
            dk[:, :, n0:n1] = (dk_tile * p.scale).to(k.dtype)
            dv[:, :, n0:n1] = dv_tile.to(v.dtype)

        # Pass 2, dQ: each query block owns its gradient; loop over the keys it sees.
        dq = q.new_empty(q.shape)
        dq_g = self._group_view(dq, p)
        for m0 in range(0, p.q_len, cfg.block_m):
            m1 = min(m0 + cfg.block_m, p.q_len)
            dq_tile = torch.zeros(*qg[..., m0:m1, :].shape, dtype=acc, device=q.device)
            kv_start, kv_end = key_range_for_rows(p, m0, m1)
            for n0 in range((kv_start // cfg.block_n) * cfg.block_n, kv_end, cfg.block_n):
                n1 = min(n0 + cfg.block_n, p.kv_len)
                _, k_tile, _, _, dscores = tile(m0, m1, n0, n1)
                dq_tile += dscores @ k_tile
            dq_g[..., m0:m1, :] = (dq_tile * p.scale).to(q.dtype)
        return dq, dk, dv


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: AttentionProblem,
    config: TiledConfig | None = None,
) -> torch.Tensor:
    """Tiled FlashAttention-2 with a recomputing backward. Shapes as in :func:`attnkit.attention`."""
    return flash_attention(TiledImplementation(config), q, k, v, problem)


PATHS["tiled"] = TiledImplementation
