"""Host launcher of the split-KV forward (flash-decoding), and when the Triton path uses it.

:func:`decode_forward` runs :mod:`attnkit.triton.decode_kernels`: B x Hkv x splits programs
write partial results, one combine program per query row merges them. It returns the output
and the log-sum-exp of :func:`attnkit.triton.launch.attention_forward`'s contract, so the
regular backward kernels differentiate it exactly. :func:`use_split_kv` is the dispatch rule:
few query rows per kv head (decode, speculative decoding, short chunks) against many keys, or
any such problem whose B x Hq programs would leave most SMs idle. :func:`merge_pair` is the
combine step alone for two parts that come from another kernel (the cuDNN split of
:mod:`attnkit.sdpa.split_causal`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
import triton

from attnkit.inputs import AttentionProblem
from attnkit.prepared import NativeProgram
from attnkit.triton.config import next_power_of_2, padded_dim
from attnkit.triton.decode_kernels import _decode_combine_kernel, _decode_split_kernel, _merge_pair_kernel
from attnkit.triton.fast_launch import KernelLaunch
from attnkit.triton.launch import _capability, _dot_precision
from attnkit.triton.native_launch import native_launch


@dataclass(frozen=True)
class DecodeConfig:
    """Tile and split policy of the split-KV forward.

    ``max_rows``: most query rows (G x N) one program holds, the eligibility limit.
    ``programs_per_sm`` x SMs is the grid the split count aims for (FA3 splits when
    batch x heads < 0.8 x SMs: the GPU would not be filled). A split holds at least
    ``min_keys_per_split`` keys (below that the combine costs more than the parallelism gains)
    and there are at most ``max_splits``. ``min_keys_per_row`` makes any problem with that many
    keys per query row count as decode-shaped even on a full GPU. ``pdl``: launch the combine
    as a programmatic dependent launch where the GPU has it (compute capability 9.0 and later;
    see :mod:`attnkit.triton.decode_kernels`).

    The tile (32 keys, 4 warps, 3 stages, 2 programs per SM) is the one closest to the best on
    every shape of ``python -m attnkit_tools.pages.decode_table --sweep``: 48 configs timed from CUDA
    graph replays on an H100 80GB HBM3 (torch 2.11, triton 3.6) over 8 shapes of B 1..8,
    N 1..16, M 4K..128K (Hq 32, Hkv 8, D 128, bf16), it took x1.019 of each shape's best time
    on geometric mean. A 64-key, 2-stage tile took x1.071 and read 64% of the copy bandwidth at
    B4 N16 M16384, where this tile reads 79%.
    """

    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 3
    max_rows: int = 64
    programs_per_sm: int = 2
    min_keys_per_split: int = 256
    max_splits: int = 128
    min_keys_per_row: int = 64
    fill_fraction: float = 0.8
    pdl: bool = True


DEFAULT_DECODE_CONFIG = DecodeConfig()
#: The tile through a block table: a key block there waits on its page's table entry, which
#: favours longer blocks and more programs than the contiguous cache. Closest to the best of
#: ``python -m attnkit_tools.pages.decode_table --sweep-paged`` on the H100 (x1.036 of the best on
#: average); the contiguous tile took x1.10 there.
DEFAULT_PAGED_DECODE_CONFIG = DecodeConfig(block_n=64, num_stages=2, programs_per_sm=4)


def decode_config(paged: bool) -> DecodeConfig:
    """The split-KV config :func:`decode_forward` runs by default, through a block table or not."""
    return DEFAULT_PAGED_DECODE_CONFIG if paged else DEFAULT_DECODE_CONFIG


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; 1 for the CPU interpreter."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


#: Head dims the split-KV kernel is used for (D == Dv).
_VALIDATED_HEAD_DIMS = (16, 32, 64, 128, 256)


def use_split_kv(problem: AttentionProblem, config: DecodeConfig = DEFAULT_DECODE_CONFIG) -> bool:
    """Whether the Triton path runs ``problem``'s forward split-KV: the G x N query rows of a
    kv head fit one program, the keys make more than one split on any GPU, and either there are
    many keys per row or B x Hq programs would not fill the GPU; never with a sliding window.
    Only for ``D == Dv`` with a power-of-two head dim: the shapes validated on the H100 (with
    ``Dv != D`` it returned wrong rows there, and an odd D faulted)."""
    p = problem
    if p.kv_len < 2 * config.min_keys_per_split:
        # One split (split_count): its combine would only copy the rows out; the regular
        # forward computes them in one launch instead of two, and allocates no partial results.
        return False
    if p.has_window:
        # The split kernel has no window bounds; the regular forward skips the key blocks
        # outside the band, so a windowed decode reads about ``left`` keys per row anyway.
        return False
    if p.head_dim != p.value_dim or p.head_dim not in _VALIDATED_HEAD_DIMS:
        return False
    if p.group_size * p.q_len > config.max_rows:
        return False
    few_programs = p.batch * p.q_heads < config.fill_fraction * sm_count(p.device)
    return few_programs or p.kv_len >= config.min_keys_per_row * p.q_len


def split_count(batch: int, kv_heads: int, kv_len: int, device: torch.device, config: DecodeConfig) -> int:
    """Splits per (batch, kv head): enough programs for ``programs_per_sm`` per SM, no split
    under ``min_keys_per_split`` keys."""
    wanted = triton.cdiv(config.programs_per_sm * sm_count(device), batch * kv_heads)
    by_length = max(1, kv_len // config.min_keys_per_split)
    return max(1, min(wanted, by_length, config.max_splits))


def dense_plan(problem: AttentionProblem) -> _DecodePlan:
    """The plan of a dense call with the default config and no ``seqlens`` (memoised)."""
    return _decode_plan(problem, DEFAULT_DECODE_CONFIG, None, False, False, False)


def decode_forward_only(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: AttentionProblem,
    plan: _DecodePlan | None = None,
) -> torch.Tensor:
    """:func:`decode_forward`'s output for a dense call (no ``seqlens``, default config) that
    no backward follows: no log-sum-exp, and from a layout's second call on both launches go
    through :class:`~attnkit.triton.fast_launch.BoundLaunch` objects, as in
    :meth:`attnkit.triton.launch.LaunchSetup.forward_only`. Their fixed arguments follow from
    the plan and the strides of q, k and v that they are kept by: the partial results (one
    buffer) and the output are allocated here, contiguous, with the plan's sizes. ``plan``: the
    problem's :func:`dense_plan`, looked up here when not given."""
    p = problem
    if plan is None:
        plan = dense_plan(p)
    device = q.device
    # Sizes as separate ints: a torch.Size argument cost ~0.5 us more per allocation (CPU).
    parts = torch.empty(plan.part_elements, dtype=torch.float32, device=device)
    out = torch.empty(p.batch, p.q_heads, p.q_len, p.value_dim, dtype=p.dtype, device=device)
    key = (q.stride(), k.stride(), v.stride())
    bound = plan.bound.get(key)
    # q stands in for the unused seqlens and block-table pointers, out for the log-sum-exp.
    if bound and bound[0](q, k, v, parts, q, q):
        if not bound[1](parts, out, out):
            plan.combine_out(plan.combine_grid, *_combine_args(plan, parts, out, out, p))
        return out
    split_args = _split_args(plan, q, k, v, parts, q, q, p, paged=False)
    combine_args = _combine_args(plan, parts, out, out, p)
    plan.split(plan.split_grid, *split_args)
    plan.combine_out(plan.combine_grid, *combine_args)
    split = plan.split.bind(plan.split_grid, split_args, 6)
    combine = plan.combine_out.bind(plan.combine_grid, combine_args, 3)
    if split is not None and combine is not None:  # else not launched directly (yet)
        if len(plan.bound) >= 64:  # a bound for programs that sweep layouts
            plan.bound.clear()
        plan.bound[key] = (split, combine)
    return out


def decode_native_forward_only(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem, plan: _DecodePlan
) -> NativeProgram | None:
    """:func:`decode_forward_only` for q, k and v's layout as a
    :class:`~attnkit.prepared.NativeProgram` (as
    :meth:`attnkit.triton.launch.LaunchSetup.native_forward_only`): the partial results and the
    output allocated, then the bound split and combine launches; None until they are bound."""
    bound = plan.bound.get((q.stride(), k.stride(), v.stride()))
    if not bound:
        return None
    # Slots: q, k, v, parts, out. q stands in for seqlens and the block table, out for the lse.
    split, combine = native_launch(bound[0], (0, 1, 2, 3, 0, 0)), native_launch(bound[1], (3, 4, 4))
    if split is None or combine is None:
        return None
    p = problem
    parts = ((plan.part_elements,), torch.float32)
    output = ((p.batch, p.q_heads, p.q_len, p.value_dim), p.dtype)
    return NativeProgram(
        device=bound[0].device, allocations=(parts, output), launches=(split, combine), result=4
    )


def _split_args(plan, q, k, v, parts, seqlens, table, p: AttentionProblem, paged: bool) -> tuple:
    """The split kernel's positional arguments (``seqlens`` and ``table`` any pointer when unused)."""
    return (
        q, k, v, parts, seqlens, table,
        *q.stride(), *k.stride(), *v.stride(), table.stride(0),
        p.q_len, p.kv_len, p.group_size, p.kv_heads, plan.chunk, k.shape[2] if paged else 1,
        plan.lse_offset, plan.qk_scale,
    )  # fmt: skip


def _combine_args(plan, parts, out, lse, p: AttentionProblem) -> tuple:
    """The combine kernel's positional arguments."""
    return (parts, out, lse, *out.stride(), p.q_len, p.q_heads, plan.num_splits, plan.lse_offset)


def decode_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: AttentionProblem,
    *,
    seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
    config: DecodeConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-KV attention forward.

    q: (B, Hq, N, D). Dense: k (B, Hkv, M, D), v (B, Hkv, M, Dv). Paged (``block_table``
    (B, max_blocks) int32 given): k (num_blocks, Hkv, block_size, D), v (num_blocks, Hkv,
    block_size, Dv) pools, key j of sequence b at page ``block_table[b, j // block_size]``.
    ``seqlens`` (B,) int32: keys per sequence (default: ``problem.kv_len`` for every one);
    causal is bottom-right per sequence. ``problem.kv_len`` is the key capacity (it sets the
    split length). ``config`` defaults to :func:`decode_config`. Inputs are validated by the
    caller. Returns out (B, Hq, N, Dv) in q's dtype and lse (B, Hq, N) float32 (natural log,
    +inf for rows that see no key).
    """
    p = problem
    paged = block_table is not None
    if config is None:
        config = decode_config(paged)
    # A page holding whole key blocks is looked up once per block, not once per key.
    page_aligned = paged and k.shape[2] % config.block_n == 0
    plan = _decode_plan(p, config, num_splits, paged, page_aligned, seqlens is not None)
    # The partial results never leave the kernels: one allocation holds both kinds.
    parts = torch.empty(plan.part_elements, dtype=torch.float32, device=q.device)
    table = block_table if paged else q  # an unused pointer argument when not paged
    seqlens_arg = q if seqlens is None else seqlens  # likewise
    plan.split(plan.split_grid, *_split_args(plan, q, k, v, parts, seqlens_arg, table, p, paged))
    out = torch.empty(p.batch, p.q_heads, p.q_len, p.value_dim, dtype=p.dtype, device=q.device)
    lse = torch.empty(p.batch, p.q_heads, p.q_len, dtype=torch.float32, device=q.device)
    plan.combine(plan.combine_grid, *_combine_args(plan, parts, out, lse, p))
    return out, lse


@dataclass(frozen=True)
class _DecodePlan:
    """What :func:`decode_forward` derives from a call's signature, built once per signature."""

    num_splits: int
    chunk: int  # keys per split, a multiple of the key block
    qk_scale: float
    #: The float32 buffer of partial results: outputs from element 0, log-sum-exps from
    #: ``lse_offset`` (16-byte aligned), ``part_elements`` in all.
    lse_offset: int
    part_elements: int
    split_grid: tuple[int, int]
    combine_grid: tuple[int]
    split: KernelLaunch
    combine: KernelLaunch
    #: The combine without the log-sum-exp (:func:`decode_forward_only`).
    combine_out: KernelLaunch
    #: :func:`decode_forward_only`'s bound launches (split, combine), by the strides of q, k, v.
    bound: dict = field(default_factory=dict, compare=False, repr=False)


@functools.lru_cache(maxsize=1024)
def _decode_plan(
    p: AttentionProblem,
    config: DecodeConfig,
    num_splits: int | None,
    paged: bool,
    page_aligned: bool,
    has_seqlens: bool,
) -> _DecodePlan:
    rows = p.group_size * p.q_len
    if num_splits is None:
        num_splits = split_count(p.batch, p.kv_heads, p.kv_len, p.device, config)
    chunk = triton.cdiv(triton.cdiv(p.kv_len, num_splits), config.block_n) * config.block_n
    num_splits = triton.cdiv(p.kv_len, chunk)  # no split starts past the capacity
    head_pad, value_pad = padded_dim(p.head_dim), padded_dim(p.value_dim)
    partial_rows = p.batch * p.kv_heads * rows * num_splits
    lse_offset = -(-partial_rows * p.value_dim // 4) * 4  # float32: 4 to 16 bytes
    pdl = config.pdl and p.device.type == "cuda" and _capability(p.device)[0] >= 9
    split = KernelLaunch(
        _decode_split_kernel,
        HEAD_DIM=p.head_dim, HEAD_PAD=head_pad, VALUE_DIM=p.value_dim, VALUE_PAD=value_pad,
        BLOCK_M=max(16, next_power_of_2(rows)), BLOCK_N=config.block_n, CAUSAL=p.causal,
        DOT_PRECISION=_dot_precision(p), HAS_SEQLENS=has_seqlens, PAGED=paged,
        PAGE_ALIGNED=page_aligned, PDL=pdl,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    combine_kwargs = dict(
        VALUE_DIM=p.value_dim, VALUE_PAD=value_pad, SPLIT_PAD=max(2, next_power_of_2(num_splits)), PDL=pdl,
        num_warps=1, **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    return _DecodePlan(
        num_splits=num_splits,
        chunk=chunk,
        qk_scale=p.scale * math.log2(math.e),
        lse_offset=lse_offset,
        part_elements=lse_offset + partial_rows,
        split_grid=(num_splits, p.batch * p.kv_heads),
        combine_grid=(p.batch * p.q_heads * p.q_len,),
        split=split,
        combine=KernelLaunch(_decode_combine_kernel, **combine_kwargs, STORE_LSE=True),
        combine_out=KernelLaunch(_decode_combine_kernel, **combine_kwargs, STORE_LSE=False),
    )


def merge_pair(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial attention results over disjoint key sets merged by their log-sum-exp, in one
    kernel (the combine step of a split over two parts, for kernels that return their own
    log-sum-exp: :mod:`attnkit.sdpa.split_causal` on cuDNN). o1, o2: (B, Hq, N, Dv), lse1, lse2:
    (B, Hq, N) or (B, Hq, N, 1) float32, natural log, finite; any strides. Returns (out, lse)
    laid out as o1 and lse1 (``empty_like``)."""
    out, lse = torch.empty_like(o1), torch.empty_like(lse1)
    if o1.is_meta:  # shapes only (the split traced on meta tensors)
        return out, lse
    batch, heads, q_len, value_dim = o1.shape
    rows = (lse1, lse2, lse)
    _merge_pair_kernel[(batch * heads * q_len,)](
        o1, lse1, o2, lse2, out, lse,
        *o1.stride(), *o2.stride(), *out.stride(), *(s for x in rows for s in x.stride()[:3]),
        q_len, heads, VALUE_DIM=value_dim, VALUE_PAD=next_power_of_2(value_dim),
    )  # fmt: skip
    return out, lse
