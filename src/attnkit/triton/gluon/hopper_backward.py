"""Warp-specialized dK/dV and dQ passes of the attention backward for Hopper (sm_90), in Gluon.

One program owns a key block of ``CONSUMERS * BLOCK_N`` keys of one (batch, kv head) and its
dK and dV, accumulated in registers and written once, so the pass is deterministic: the
query heads of a GQA group and the query blocks of each head are summed in a fixed order.
Partitions (:func:`gluon.language.warp_specialize`):

* a producer (1 warp) issuing TMA copies: each consumer's K and V rows once, then Q and dO of
  every query block the keys see, into a ring of ``STAGES`` shared-memory slots. Each slot
  has a "ready" mbarrier (the copy engine completes it when both tiles land) and an "empty"
  one (every consumer arrives once its products no longer read the slot);
* ``CONSUMERS`` consumer warpgroups (the default partition and 4-warp workers, the same
  code), each owning ``BLOCK_N`` keys. Per query block, with the key-major (transposed)
  products of the portable kernel (:mod:`attnkit.triton.backward_kernels`), all on
  ``warpgroup_mma``:

      S^T = K Q^T                          (K, Q from shared memory)
      P^T = exp2(S^T * qk_scale - lse2)    (lse2 = lse * log2(e), per query row)
      dV += P^T dO                         (P^T from registers)
      dP^T = V dO^T
      dS^T = P^T * (dP^T - delta)          (delta = rowsum(dO * O), per query row)
      dK += dS^T Q                         (dS^T from registers)

  then dK * scale and dV are stored with masked pointer stores (keys past M are dropped).

The dQ pass is the second kernel of this module, :func:`_gluon_bwd_dq_kernel`: one program per
tile of query rows (the forward's walk, :mod:`attnkit.triton.gluon.schedule`) streams every key
block the rows see and writes its dQ once, so every gradient element is owned by one program
and the backward stays deterministic. Which pass runs in Gluon and which in the portable
kernels (:mod:`attnkit.triton.backward_kernels`) is the kernel plan's choice per cell.

Masks: rows that see no key of the block are never loaded (the causal start); a block of rows
whose first row does not see the block's last key is masked (the causal diagonal: by a
runtime branch in the one loop, or with SPLIT_MASKED in a loop of its own); rows past N
load lse = +inf and delta = 0, so P = dS = 0 for them, whatever their Q and dO tiles hold
(TMA reads the next head's rows there, or zeros past the tensor). Keys past M read the next
head's keys: their dK, dV rows are never stored.

Addressing: Q, dO through 2-D TMA descriptors over (B * Hq * N, D) with (BLOCK_M, D) blocks;
K, V over (B * Hkv * M, D) with (BLOCK_N, D) blocks; lse and delta ((B, Hq, N) float32) and
dK, dV ((B, Hkv, M, D) contiguous) through pointers.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from attnkit.triton.gluon.schedule import query_tile

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@gluon.jit
def _rows_range(n0, q_len, causal_offset, KEYS: gl.constexpr, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
    """(first row block start, end, first start whose rows see all ``KEYS`` keys from n0):
    rows before the first never see key n0 (causal); blocks from the third on need no mask."""
    if CAUSAL:
        lo = (gl.maximum(n0 - causal_offset, 0) // BLOCK_M) * BLOCK_M
        bare = n0 + KEYS - 1 - causal_offset
    else:
        lo = q_len * 0
        bare = q_len * 0
    return lo, q_len, bare


@gluon.jit
def _producer(
    args, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, SPLIT_MASKED: gl.constexpr, WG: gl.constexpr,
):  # fmt: skip
    """TMA loads: K and V of each consumer's keys, then Q and dO of every query block."""
    (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, ready, empty,
     _lse_ptr, _delta_ptr, _dk_ptr, _dv_ptr, q_len, kv_len, q_heads, kv_heads, group_size,
     causal_offset, _qk_scale, _scale) = args  # fmt: skip
    n_blocks = gl.cdiv(kv_len, CONSUMERS * BLOCK_N)
    pid = gl.program_id(0)
    n0 = (pid % n_blocks) * (CONSUMERS * BLOCK_N)
    bh = pid // n_blocks
    kv_row = bh * kv_len + n0
    for wg in gl.static_range(CONSUMERS):
        bar = kv_ready.index(wg)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + wg * BLOCK_N, 0], bar, k_smem.index(wg))
        tma.async_copy_global_to_shared(v_desc, [kv_row + wg * BLOCK_N, 0], bar, v_smem.index(wg))
    lo, hi, _bare = _rows_range(n0, q_len, causal_offset, CONSUMERS * BLOCK_N, BLOCK_M, CAUSAL)
    batch = bh // kv_heads
    kv_head = bh % kv_heads
    it = 0
    for g in range(group_size):
        q_row0 = (batch * q_heads + kv_head * group_size + g) * q_len
        for m0 in range(lo, hi, BLOCK_M):
            stage = it % STAGES
            # A fresh mbarrier counts as having completed the phase before phase 0.
            mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [q_row0 + m0, 0], bar, q_smem.index(stage))
            tma.async_copy_global_to_shared(do_desc, [q_row0 + m0, 0], bar, do_smem.index(stage))
            it += 1


@gluon.jit
def _dkdv_block(
    q_smem, do_smem, k_buf, v_buf, ready, empty, lse_ptr, delta_ptr, head_rows, m0, it, keys, s_init, dk, dv,
    q_len, causal_offset, bare, qk_scale, col_s: gl.constexpr, op_layout: gl.constexpr, BLOCK_M: gl.constexpr,
    STAGES: gl.constexpr, MASK: gl.constexpr,
):  # fmt: skip
    """dK, dV += query rows [m0, m0 + BLOCK_M), the ring's ``it``-th block; releases its slot.
    ``MASK`` 1 zeroes P^T where row i does not see key j (j > i + causal_offset); 2 does so
    when the block starts before ``bare`` (a runtime branch); 0 never."""
    dtype: gl.constexpr = q_smem.dtype
    stage = it % STAGES
    rows = m0 + gl.arange(0, BLOCK_M, layout=col_s)
    in_range = rows < q_len
    lse2 = gl.load(lse_ptr + head_rows + rows, mask=in_range, other=float("inf")) * LOG2E
    delta = gl.load(delta_ptr + head_rows + rows, mask=in_range, other=0.0)
    mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
    q_buf = q_smem.index(stage)
    do_buf = do_smem.index(stage)
    s_t = warpgroup_mma(k_buf, q_buf.permute((1, 0)), s_init, use_acc=False, is_async=True)
    dp_t = warpgroup_mma(v_buf, do_buf.permute((1, 0)), s_init, use_acc=False, is_async=True)
    s_t = warpgroup_mma_wait(1, deps=(s_t,))
    p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
    if MASK == 1:
        p_t = gl.where(keys[:, None] <= rows[None, :] + causal_offset, p_t, 0.0)
    if MASK == 2:  # noqa: SIM102 -- a compile-time branch around a runtime one
        if m0 < bare:
            p_t = gl.where(keys[:, None] <= rows[None, :] + causal_offset, p_t, 0.0)
    dv = warpgroup_mma(gl.convert_layout(p_t.to(dtype), op_layout), do_buf, dv, is_async=True)
    dp_t = warpgroup_mma_wait(1, deps=(dp_t,))
    ds_t = p_t * (dp_t - delta[None, :])
    dk = warpgroup_mma(gl.convert_layout(ds_t.to(dtype), op_layout), q_buf, dk, is_async=True)
    dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
    # Every product that read the slot has retired: the producer may refill it.
    mbarrier.arrive(empty.index(stage), count=1)
    return dk, dv


@gluon.jit
def _consumer(
    args, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, SPLIT_MASKED: gl.constexpr, WG: gl.constexpr,
):  # fmt: skip
    """One warpgroup: keys [n0 + WG * BLOCK_N, + BLOCK_N), their dK and dV over every query
    block of the ring, then stored."""
    (q_desc, _do_desc, _k_desc, _v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, ready, empty,
     lse_ptr, delta_ptr, dk_ptr, dv_ptr, q_len, kv_len, q_heads, kv_heads, group_size,
     causal_offset, qk_scale, scale) = args  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    # Accumulator layouts of one warpgroup (4 warps along the keys, 16 rows each).
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16]
    )
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    # P^T and dS^T feed dV and dK from registers: the rows already sit where the A operand
    # wants them, a register repack rather than a trip through shared memory.
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_a: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_a: gl.constexpr = gl.SliceLayout(0, acc_layout)

    n_blocks = gl.cdiv(kv_len, CONSUMERS * BLOCK_N)
    pid = gl.program_id(0)
    n0 = (pid % n_blocks) * (CONSUMERS * BLOCK_N)
    bh = pid // n_blocks
    batch = bh // kv_heads
    kv_head = bh % kv_heads
    keys = n0 + WG * BLOCK_N + gl.arange(0, BLOCK_N, layout=row_s)
    lo, hi, bare = _rows_range(n0, q_len, causal_offset, CONSUMERS * BLOCK_N, BLOCK_M, CAUSAL)

    s_init = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_layout)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=acc_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=acc_layout)
    k_buf = k_smem.index(WG)
    v_buf = v_smem.index(WG)
    mbarrier.wait(kv_ready.index(WG), 0)
    it = 0
    if SPLIT_MASKED and CAUSAL:
        # The masked row blocks (the causal diagonal) in a loop of their own, so that the bare
        # blocks' loop carries no mask arithmetic: faster at D = 128, slower at D = 64.
        mid = gl.minimum(hi, lo + gl.cdiv(gl.maximum(bare - lo, 0), BLOCK_M) * BLOCK_M)
        for g in range(group_size):
            head_rows = (batch * q_heads + kv_head * group_size + g).to(gl.int64) * q_len
            for m0 in range(lo, mid, BLOCK_M):
                dk, dv = _dkdv_block(
                    q_smem, do_smem, k_buf, v_buf, ready, empty, lse_ptr, delta_ptr, head_rows, m0, it, keys,
                    s_init, dk, dv, q_len, causal_offset, bare, qk_scale, col_s, op_layout, BLOCK_M, STAGES,
                    1,
                )  # fmt: skip
                it += 1
            for m0 in range(mid, hi, BLOCK_M):
                dk, dv = _dkdv_block(
                    q_smem, do_smem, k_buf, v_buf, ready, empty, lse_ptr, delta_ptr, head_rows, m0, it, keys,
                    s_init, dk, dv, q_len, causal_offset, bare, qk_scale, col_s, op_layout, BLOCK_M, STAGES,
                    0,
                )  # fmt: skip
                it += 1
    else:
        # One loop; with CAUSAL, blocks before ``bare`` take the mask (a runtime branch).
        MASK: gl.constexpr = 2 if CAUSAL else 0
        for g in range(group_size):
            head_rows = (batch * q_heads + kv_head * group_size + g).to(gl.int64) * q_len
            for m0 in range(lo, hi, BLOCK_M):
                dk, dv = _dkdv_block(
                    q_smem, do_smem, k_buf, v_buf, ready, empty, lse_ptr, delta_ptr, head_rows, m0, it, keys,
                    s_init, dk, dv, q_len, causal_offset, bare, qk_scale, col_s, op_layout, BLOCK_M, STAGES,
                    MASK,
                )  # fmt: skip
                it += 1

    out_keys = n0 + WG * BLOCK_N + gl.arange(0, BLOCK_N, layout=row_a)
    cols = gl.arange(0, HEAD_DIM, layout=col_a)
    offs = (bh.to(gl.int64) * kv_len + out_keys)[:, None] * HEAD_DIM + cols[None, :]
    mask = (out_keys[:, None] < kv_len) & (cols[None, :] < HEAD_DIM)
    gl.store(dk_ptr + offs, (dk * scale).to(dtype), mask=mask)
    gl.store(dv_ptr + offs, dv.to(dtype), mask=mask)


#: Sizes stay runtime values: a size of 1 would otherwise compile a kernel of its own.
_DYNAMIC_INTS = ["q_len", "kv_len", "q_heads", "kv_heads", "group_size", "causal_offset"]


@gluon.jit(do_not_specialize=_DYNAMIC_INTS)
def _gluon_bwd_dkdv_kernel(
    q_desc, do_desc, k_desc, v_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    q_len, kv_len, q_heads, kv_heads, group_size, causal_offset, qk_scale, scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
    SPLIT_MASKED: gl.constexpr,
):  # fmt: skip
    """Grid (cdiv(M, CONSUMERS * BLOCK_N) * B * Hkv,). q_desc, do_desc: (B * Hq * N, D) with
    (BLOCK_M, D) blocks; k_desc, v_desc: (B * Hkv * M, D) with (BLOCK_N, D) blocks; lse_ptr,
    delta_ptr: (B, Hq, N) float32; dk_ptr, dv_ptr: (B, Hkv, M, D) contiguous, the input dtype.
    ``qk_scale = scale * log2(e) > 0``; ``causal_offset = M - N``. Launched with num_warps=4
    (the first consumer warpgroup); the partitions add the other consumers and the producer."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, BLOCK_N, HEAD_DIM], v_desc.layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(kv_ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        # Released by every consumer.
        mbarrier.init(empty.index(i), count=CONSUMERS)

    args = (
        q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, ready, empty,
        lse_ptr, delta_ptr, dk_ptr, dv_ptr, q_len, kv_len, q_heads, kv_heads, group_size,
        causal_offset, qk_scale, scale,
    )  # fmt: skip
    # The partitions' constexprs after ``args``; the last one is the partition's warpgroup.
    if CONSUMERS == 3:
        gl.warp_specialize(
            [
                (_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, SPLIT_MASKED, 0)),
                (_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, SPLIT_MASKED, 1)),
                (_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, SPLIT_MASKED, 2)),
                (_producer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, SPLIT_MASKED, 3)),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, SPLIT_MASKED, 0)),
                (_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, SPLIT_MASKED, 1)),
                (_producer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, SPLIT_MASKED, 2)),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip


# -- The dQ pass ------------------------------------------------------------------------------
#
# One program owns ``CONSUMERS * BLOCK_M`` query rows of one (batch, query head) and their dQ,
# accumulated in registers and written once (deterministic, no atomics). The producer loads
# each consumer's Q and dO once, then K and V of every key block the rows see into the ring;
# each consumer warpgroup, per key block:
#
#     S = Q K^T,  P = exp2(S * qk_scale - lse2),  dP = dO V^T,  dS = P * (dP - delta),
#     dQ += dS K                                  (dS from registers)
#
# then stores dQ * scale. Masks as in the forward: key blocks before ``free_end`` are seen whole
# by every row of the tile and run bare; the causal diagonal and the keys' ragged end (past M
# the descriptor reads the next head's keys) are masked. Rows past N load lse = +inf and
# delta = 0 (P = dS = 0) and are never stored.


@gluon.jit
def _dq_producer(
    args, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, WG: gl.constexpr,
):  # fmt: skip
    """TMA loads: each consumer's Q and dO, then K and V of every key block into the ring."""
    (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, ready, empty,
     _lse_ptr, _delta_ptr, _dq_ptr, q_len, kv_len, n_bh, q_heads, group_size, causal_offset,
     _qk_scale, _scale) = args  # fmt: skip
    bh, m0, _free_end, n_blocks = query_tile(
        gl.program_id(0),
        n_bh,
        gl.cdiv(q_len, CONSUMERS * BLOCK_M),
        q_len,
        kv_len,
        causal_offset,
        CONSUMERS * BLOCK_M,
        BLOCK_N,
        CAUSAL,
    )
    q_row = bh * q_len + m0
    for wg in gl.static_range(CONSUMERS):
        bar = q_ready.index(wg)
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row + wg * BLOCK_M, 0], bar, q_smem.index(wg))
        tma.async_copy_global_to_shared(do_desc, [q_row + wg * BLOCK_M, 0], bar, do_smem.index(wg))
    kv_head = (bh % q_heads) // group_size
    kv_row = ((bh // q_heads) * (q_heads // group_size) + kv_head) * kv_len
    for j in range(n_blocks):
        stage = j % STAGES
        mbarrier.wait(empty.index(stage), ((j // STAGES) & 1) ^ 1)
        bar = ready.index(stage)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, 0], bar, k_smem.index(stage))
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, 0], bar, v_smem.index(stage))


@gluon.jit
def _dq_consumer(
    args, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, WG: gl.constexpr,
):  # fmt: skip
    """One warpgroup: rows [m0 + WG * BLOCK_M, + BLOCK_M), their dQ over the ring, stored."""
    (q_desc, _do_desc, _k_desc, _v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, ready, empty,
     lse_ptr, delta_ptr, dq_ptr, q_len, kv_len, n_bh, _q_heads, _group_size, causal_offset,
     qk_scale, scale) = args  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_a: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_a: gl.constexpr = gl.SliceLayout(0, acc_layout)

    bh, m0, free_end, n_blocks = query_tile(
        gl.program_id(0),
        n_bh,
        gl.cdiv(q_len, CONSUMERS * BLOCK_M),
        q_len,
        kv_len,
        causal_offset,
        CONSUMERS * BLOCK_M,
        BLOCK_N,
        CAUSAL,
    )
    row0 = m0 + WG * BLOCK_M
    rows = row0 + gl.arange(0, BLOCK_M, layout=row_s)
    in_range = rows < q_len
    head_rows = bh.to(gl.int64) * q_len
    lse2 = gl.load(lse_ptr + head_rows + rows, mask=in_range, other=float("inf")) * LOG2E
    delta = gl.load(delta_ptr + head_rows + rows, mask=in_range, other=0.0)
    s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=acc_layout)
    q_buf = q_smem.index(WG)
    do_buf = do_smem.index(WG)
    mbarrier.wait(q_ready.index(WG), 0)
    for j in range(n_blocks):
        stage = j % STAGES
        mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
        k_buf = k_smem.index(stage)
        s = warpgroup_mma(q_buf, k_buf.permute((1, 0)), s_init, use_acc=False, is_async=True)
        dp = warpgroup_mma(do_buf, v_smem.index(stage).permute((1, 0)), s_init, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s,))
        p = gl.exp2(s * qk_scale - lse2[:, None])
        start_n = j * BLOCK_N
        if start_n + BLOCK_N > free_end:
            cols = start_n + gl.arange(0, BLOCK_N, layout=col_s)
            visible = cols[None, :] < kv_len
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
            p = gl.where(visible, p, 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp,))
        ds = p * (dp - delta[:, None])
        dq = warpgroup_mma(gl.convert_layout(ds.to(dtype), op_layout), k_buf, dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq,))
        mbarrier.arrive(empty.index(stage), count=1)

    out_rows = row0 + gl.arange(0, BLOCK_M, layout=row_a)
    cols_a = gl.arange(0, HEAD_DIM, layout=col_a)
    offs = (head_rows + out_rows)[:, None] * HEAD_DIM + cols_a[None, :]
    mask = (out_rows[:, None] < q_len) & (cols_a[None, :] < HEAD_DIM)
    gl.store(dq_ptr + offs, (dq * scale).to(dtype), mask=mask)


_DQ_DYNAMIC_INTS = ["q_len", "kv_len", "n_bh", "q_heads", "group_size", "causal_offset"]


@gluon.jit(do_not_specialize=_DQ_DYNAMIC_INTS)
def _gluon_bwd_dq_kernel(
    q_desc, do_desc, k_desc, v_desc, lse_ptr, delta_ptr, dq_ptr,
    q_len, kv_len, n_bh, q_heads, group_size, causal_offset, qk_scale, scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
):  # fmt: skip
    """Grid (cdiv(N, CONSUMERS * BLOCK_M) * B * Hq,). q_desc, do_desc: (B * Hq * N, D) with
    (BLOCK_M, D) blocks; k_desc, v_desc: (B * Hkv * M, D) with (BLOCK_N, D) blocks; lse_ptr,
    delta_ptr: (B, Hq, N) float32; dq_ptr: (B, Hq, N, D) contiguous, the input dtype;
    ``n_bh = B * Hq``. Launched with num_warps=4, as the dK/dV kernel."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, BLOCK_M, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(q_ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONSUMERS)

    args = (
        q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, ready, empty,
        lse_ptr, delta_ptr, dq_ptr, q_len, kv_len, n_bh, q_heads, group_size, causal_offset,
        qk_scale, scale,
    )  # fmt: skip
    # The partitions' constexprs after ``args``; the last one is the partition's warpgroup.
    if CONSUMERS == 3:
        gl.warp_specialize(
            [
                (_dq_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, 0)),
                (_dq_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, 1)),
                (_dq_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, 2)),
                (_dq_producer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, 3)),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (_dq_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, 0)),
                (_dq_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, 1)),
                (_dq_producer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS, 2)),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip
