"""Warp-specialized FlashAttention forward for Hopper (sm_90), written in Gluon.

A work item ("tile") is the output rows [m0, m0 + CONSUMERS * BLOCK_M) of one (batch, head)
and their log-sum-exp. A program (CTA) takes the tiles ``pid, pid + programs, ...``: one tile each when
the grid has a program per tile, or a persistent grid of one program per SM that keeps its
barriers, ring and register budget across tiles. Causal tiles run heaviest first (the row
blocks that see the most keys, every head's), which shortens the tail. Each program runs
three partitions (:func:`gluon.language.warp_specialize`):

* a producer (1 warp, few registers) issuing TMA copies: a tile's Q tiles, one per consumer
  (each once its consumer has released the previous tile's), then the K and V tiles of every key block into
  a ring of ``STAGES`` shared-memory slots. Each slot has a
  "ready" mbarrier (the copy engine completes it when the bytes land) and an "empty" one
  (every consumer arrives on it when its wgmma no longer reads the slot). K and V have
  separate barriers so that Q K^T can start while V is still in flight.
* ``CONSUMERS`` (2 or 3) consumer warpgroups (the default partition and 4-warp workers, the
  same code), each owning BLOCK_M query rows. They stream the same key blocks from the ring, compute
  S = Q K^T and O += P V with ``warpgroup_mma`` (Q, K, V read from shared memory, P from
  registers), and keep the online softmax in registers. Independent warpgroups let the
  warp schedulers overlap one group's softmax with the other's matrix products.

Options (constexprs, set from :mod:`.config`): OVERLAP issues block j's Q K^T before block
j - 1's P V (FlashAttention-3's intra-warpgroup overlap); PINGPONG makes the two consumers take
the tensor cores in turn; PERSISTENT loops a program over tiles (else one tile a program).

Register reallocation (``setmaxnreg``): the producer shrinks to ``PRODUCER_REGS`` and the
consumers grow to what the kernel's ``maxnreg`` budget leaves (see :mod:`.config`).

Numerics (the same contract as the portable Triton forward):
* scores live in the log2 domain: ``qk_scale = scale * log2(e)`` is folded into one FMA per
  score and the softmax uses ``exp2``; the launcher requires ``scale > 0`` so that the row
  max of scaled scores is the scaled row max and a masked ``-inf`` stays ``-inf``;
* a row that has seen no key keeps max = -inf; its exp2 terms are taken against 0, so no
  ``-inf - -inf = NaN`` appears; it outputs 0 and stores lse = +inf;
* P is rounded to the input dtype for the tensor-core product; accumulators are float32;
* the stored log-sum-exp is natural log, (B, H, N) float32 contiguous.

Masks: key block j needs one only from ``free_end`` on (the blocks crossing the causal
diagonal, bottom-right aligned: row i sees key j iff ``j <= i + M - N``, and the ragged end
of the keys); the earlier blocks are seen by every row of the CTA and run bare. Both
consumers walk the CTA's whole block list (the later rows' range), so the ring's slots are
released by both in the same order; the earlier rows mask what they must not see. Ring
positions and barrier phases count on across a program's tiles.

Addressing: Q, K and V are read through 2-D TMA descriptors over (B * H * rows, D). A tile
that runs past a head's last row reads the next head's rows (or zeros past the tensor):
those keys are masked and those query rows are never stored. O and the log-sum-exp are
stored with masked pointer stores (rows past N are dropped).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from attnkit.triton.gluon.schedule import query_tile

LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


@gluon.jit
def _producer(
    args, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr,
    CONSUMERS: gl.constexpr, WG: gl.constexpr,
):  # fmt: skip
    """TMA loads: per tile, the consumers' two Q tiles, then K and V of every key block into
    the ring."""
    n_tiles = args[20]
    if PERSISTENT:
        it = 0  # key blocks loaded so far: the ring position and its phase
        t = 0  # tiles so far: the Q buffers' phase
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            it = _produce_tile(args, tile, it, t, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS)
            t += 1  # noqa: SIM113 -- Gluon loops have no enumerate
    else:
        _produce_tile(args, gl.program_id(0), 0, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONSUMERS)


@gluon.jit
def _produce_tile(
    args, tile, it, t, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr,
):  # fmt: skip
    """One tile's loads; ``it`` key blocks and ``t`` tiles came before. Returns the new ``it``."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
     _turn, _out_ptr, _lse_ptr, q_len, kv_len, causal_offset, n_bh, n_mblocks, _n_tiles,
     _qk_scale) = args  # fmt: skip
    bh, m0, _free_end, n_blocks = query_tile(
        tile, n_bh, n_mblocks, q_len, kv_len, causal_offset, BLOCK_M * CONSUMERS, BLOCK_N, CAUSAL
    )
    q_row = bh * q_len + m0
    for wg in gl.static_range(CONSUMERS):
        # A fresh mbarrier counts as having completed the phase before phase 0: waiting
        # on parity 1 passes at once, so the first fills do not wait.
        mbarrier.wait(q_empty.index(wg), (t & 1) ^ 1)
        mbarrier.expect(q_ready.index(wg), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [q_row + wg * BLOCK_M, 0], q_ready.index(wg), q_smem.index(wg)
        )
    kv_row = bh * kv_len
    for j in range(n_blocks):
        g = it + j
        stage = g % STAGES
        phase = ((g // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(stage), phase)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [kv_row + j * BLOCK_N, 0], k_ready.index(stage), k_smem.index(stage)
        )
        mbarrier.wait(v_empty.index(stage), phase)
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            v_desc, [kv_row + j * BLOCK_N, 0], v_ready.index(stage), v_smem.index(stage)
        )
    return it + n_blocks


@gluon.jit
def _scores(q_buf, k_smem, k_ready, k_empty, s_init, g, STAGES: gl.constexpr):
    """S = Q K^T for the program's g-th key block, synchronously; releases K's ring slot."""
    stage = g % STAGES
    mbarrier.wait(k_ready.index(stage), (g // STAGES) & 1)
    qk = warpgroup_mma(q_buf, k_smem.index(stage).permute((1, 0)), s_init, use_acc=False, is_async=True)
    qk = warpgroup_mma_wait(0, deps=(qk,))
    # The wgmma is complete for the whole warpgroup: the K slot may be refilled.
    mbarrier.arrive(k_empty.index(stage), count=1)
    return qk


@gluon.jit
def _pv(p_op, v_smem, v_ready, v_empty, acc, g, STAGES: gl.constexpr):
    """acc += P V for the program's g-th key block, synchronously; releases V's ring slot."""
    stage = g % STAGES
    mbarrier.wait(v_ready.index(stage), (g // STAGES) & 1)
    acc = warpgroup_mma(p_op, v_smem.index(stage), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(v_empty.index(stage), count=1)
    return acc


@gluon.jit
def _mask(qk, j, rows, free_end, kv_len, causal_offset, col_layout: gl.constexpr, BLOCK_N: gl.constexpr,
          CAUSAL: gl.constexpr):  # fmt: skip
    """Key block j's scores with unseen keys at -inf; blocks before ``free_end`` are seen
    whole by every row and pass untouched (a runtime branch, no mask built)."""
    start_n = j * BLOCK_N
    if start_n + BLOCK_N > free_end:
        cols = start_n + gl.arange(0, BLOCK_N, layout=col_layout)
        visible = cols[None, :] < kv_len
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
        qk = gl.where(visible, qk, float("-inf"))
    return qk


@gluon.jit
def _softmax_step(qk, m_i, l_i, qk_scale):
    """Online softmax over one block of raw scores: (p, alpha, m_new, l_new), with p the
    block's unnormalised weights and alpha the factor that rescales what came before."""
    # qk_scale > 0: the max of the scaled scores is the scaled max, and scaling and
    # shifting a score is one FMA.
    m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
    # A row with nothing visible so far keeps max -inf: shift by 0 so exp2 gives 0, not NaN.
    shift = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(qk * qk_scale - shift[:, None])
    alpha = gl.exp2(m_i - shift)
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@gluon.jit
def _overlapped_step(
    q_buf, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn, s_init, p_op, acc, m_i, l_i,
    it, j, c, rows, free_end, kv_len, causal_offset, qk_scale, col_s: gl.constexpr, row_o: gl.constexpr,
    p_layout: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    PINGPONG: gl.constexpr, WG: gl.constexpr, MASKED: gl.constexpr,
):  # fmt: skip
    """Key block j (>= 1) of the overlapped loop: issue its Q K^T and block j - 1's P V, then
    its softmax while P V runs. Returns the carried (p_op, acc, m_i, l_i). ``MASKED`` False
    compiles the block without any mask arithmetic (a block every row sees whole)."""
    dtype: gl.constexpr = p_op.dtype
    g = it + j
    stage = g % STAGES
    prev = (g - 1) % STAGES
    mbarrier.wait(k_ready.index(stage), (g // STAGES) & 1)
    mbarrier.wait(v_ready.index(prev), ((g - 1) // STAGES) & 1)
    if PINGPONG:
        # Take the tensor cores in turn with the other warpgroup (FlashAttention-3's
        # ping-pong): its softmax then runs while our products do. Both groups take
        # the same number of turns; a fresh barrier passes a parity-1 wait, so
        # warpgroup 0 goes first.
        mbarrier.wait(turn.index(WG), (c + j + WG) & 1)
    qk = warpgroup_mma(q_buf, k_smem.index(stage).permute((1, 0)), s_init, use_acc=False, is_async=True)
    acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG), count=1)
    # wgmma groups retire in issue order: one left pending retires Q K^T, not P V.
    qk = warpgroup_mma_wait(1, deps=(qk,))
    mbarrier.arrive(k_empty.index(stage), count=1)
    if MASKED:
        qk = _mask(qk, j, rows, free_end, kv_len, causal_offset, col_s, BLOCK_N, CAUSAL)
    p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, qk_scale)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(v_empty.index(prev), count=1)
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    return p_op, acc, m_i, l_i


@gluon.jit
def _consumer(
    args, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr,
    CONSUMERS: gl.constexpr, WG: gl.constexpr,
):  # fmt: skip
    """One warpgroup: per tile, rows [m0 + WG * BLOCK_M, + BLOCK_M), online softmax over the
    ring, then O and the log-sum-exp stored."""
    n_tiles = args[20]
    if PERSISTENT:
        it = 0  # key blocks consumed so far: the ring position and its phase
        t = 0  # tiles so far: the Q buffer's phase
        c = 0  # tensor-core turns taken so far (PINGPONG): the turn barrier's phase
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            it, c = _consume_tile(
                args, tile, it, t, c, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG,
                CONSUMERS, WG,
            )  # fmt: skip
            t += 1  # noqa: SIM113 -- Gluon loops have no enumerate
    else:
        _consume_tile(
            args, gl.program_id(0), 0, 0, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG,
            CONSUMERS, WG,
        )  # fmt: skip


@gluon.jit
def _consume_tile(
    args, tile, it, t, c, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
    CONSUMERS: gl.constexpr, WG: gl.constexpr,
):  # fmt: skip
    """One tile of one warpgroup; ``it`` key blocks, ``t`` tiles and ``c`` tensor-core turns
    came before. Returns the new (``it``, ``c``)."""
    (q_desc, _k_desc, _v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
     turn, out_ptr, lse_ptr, q_len, kv_len, causal_offset, n_bh, n_mblocks, _n_tiles,
     qk_scale) = args  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    # wgmma accumulator layouts of one warpgroup (4 warps along M, 16 rows each per
    # instruction); the instruction's N is the whole tile width.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    # P feeds the second product from registers: the accumulator's rows already sit where
    # the A operand wants them, so this conversion is a register repack, not a shared trip.
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    q_buf = q_smem.index(WG)

    bh, m0, free_end, n_blocks = query_tile(
        tile, n_bh, n_mblocks, q_len, kv_len, causal_offset, BLOCK_M * CONSUMERS, BLOCK_N, CAUSAL
    )
    row0 = m0 + WG * BLOCK_M
    rows = row0 + gl.arange(0, BLOCK_M, layout=row_s)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    mbarrier.wait(q_ready.index(WG), t & 1)
    if OVERLAP:
        # FlashAttention-3's intra-warpgroup overlap: block j's Q K^T is issued before
        # block j - 1's P V, so the softmax of block j runs on the CUDA cores while the
        # tensor cores do P V. wgmma groups retire in issue order: waiting until one group
        # is left pending retires Q K^T and leaves P V running.
        p_op = gl.zeros([BLOCK_M, BLOCK_N], dtype, layout=p_layout)
        if n_blocks > 0:
            qk = _scores(q_buf, k_smem, k_ready, k_empty, s_init, it, STAGES)
            qk = _mask(qk, 0, rows, free_end, kv_len, causal_offset, col_s, BLOCK_N, CAUSAL)
            p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, qk_scale)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
        # Blocks before ``free_end`` are seen whole by every row: their loop builds no mask.
        # The blocks crossing the diagonal (or the keys' ragged end) follow with it.
        n_free = gl.maximum(gl.minimum(free_end // BLOCK_N, n_blocks), 1)
        for j in range(1, n_free):
            p_op, acc, m_i, l_i = _overlapped_step(
                q_buf, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn, s_init, p_op, acc, m_i, l_i,
                it, j, c, rows, free_end, kv_len, causal_offset, qk_scale, col_s, row_o, p_layout,
                BLOCK_N, STAGES, CAUSAL, PINGPONG, WG, False,
            )  # fmt: skip
        for j in range(n_free, n_blocks):
            p_op, acc, m_i, l_i = _overlapped_step(
                q_buf, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, turn, s_init, p_op, acc, m_i, l_i,
                it, j, c, rows, free_end, kv_len, causal_offset, qk_scale, col_s, row_o, p_layout,
                BLOCK_N, STAGES, CAUSAL, PINGPONG, WG, True,
            )  # fmt: skip
        if n_blocks > 0:
            acc = _pv(p_op, v_smem, v_ready, v_empty, acc, it + n_blocks - 1, STAGES)
    else:
        for j in range(n_blocks):
            qk = _scores(q_buf, k_smem, k_ready, k_empty, s_init, it + j, STAGES)
            qk = _mask(qk, j, rows, free_end, kv_len, causal_offset, col_s, BLOCK_N, CAUSAL)
            p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, qk_scale)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            acc = _pv(p_op, v_smem, v_ready, v_empty, acc, it + j, STAGES)
    # Every wgmma that read Q has retired: the producer may load the next tile's Q.
    mbarrier.arrive(q_empty.index(WG), count=1)

    # Every row that saw a key has l_i >= 1 (its max term is exp2(0)); l_i == 0 means none.
    seen = l_i > 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    out = acc / gl.convert_layout(l_safe, row_o)[:, None]
    rows_o = row0 + gl.arange(0, BLOCK_M, layout=row_o)
    cols_o = gl.arange(0, HEAD_DIM, layout=col_o)
    # int64 before the multiply by D: B * H * N * D may pass 2**31.
    o_offs = (bh * q_len + rows_o).to(gl.int64)[:, None] * HEAD_DIM + cols_o[None, :]
    o_mask = (rows_o[:, None] < q_len) & (cols_o[None, :] < HEAD_DIM)
    gl.store(out_ptr + o_offs, out.to(dtype), mask=o_mask)
    lse = gl.where(seen, (m_i + gl.log2(l_safe)) * LN2, float("inf"))
    gl.store(lse_ptr + bh.to(gl.int64) * q_len + rows, lse, mask=rows < q_len)
    # The overlapped loop takes n_blocks - 1 tensor-core turns (see PINGPONG).
    return it + n_blocks, c + gl.maximum(n_blocks - 1, 0)


#: Sizes stay runtime values: a size of 1 would otherwise compile a kernel of its own.
_DYNAMIC_INTS = ["q_len", "kv_len", "causal_offset", "n_bh"]


@gluon.jit(do_not_specialize=_DYNAMIC_INTS)
def _gluon_fwd_kernel(
    q_desc, k_desc, v_desc, out_ptr, lse_ptr, q_len, kv_len, causal_offset, n_bh, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr,
    CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
):  # fmt: skip
    """Grid: any number of programs up to the tile count cdiv(N, CONSUMERS * BLOCK_M) * B * H (one
    program per tile, or one per SM for a persistent grid). q_desc: (B * H * N, D) with
    (BLOCK_M, D) blocks; k_desc, v_desc: (B * H * M, D) with (BLOCK_N, D) blocks; out_ptr:
    (B, H, N, D) contiguous; lse_ptr: (B, H, N) float32 contiguous; ``n_bh = B * H``.
    ``qk_scale = scale * log2(e) > 0``; ``causal_offset = M - N`` (bottom-right diagonal), used
    with CAUSAL. Launched with num_warps=4 (the first consumer warpgroup); the partitions add
    5 warps (9 with three consumers). PINGPONG needs CONSUMERS = 2."""
    n_mblocks = gl.cdiv(q_len, CONSUMERS * BLOCK_M)
    n_tiles = n_mblocks * n_bh

    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        # Released by every consumer.
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)

    args = (
        q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
        turn, out_ptr, lse_ptr, q_len, kv_len, causal_offset, n_bh, n_mblocks, n_tiles, qk_scale,
    )  # fmt: skip
    # The partitions' constexprs after ``args``; the last one is the partition's warpgroup.
    if CONSUMERS == 3:
        gl.warp_specialize(
            [
                (_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG, PERSISTENT,
                             3, 0)),
                (_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG, PERSISTENT,
                             3, 1)),
                (_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG, PERSISTENT,
                             3, 2)),
                (_producer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG, PERSISTENT,
                            3, 3)),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG, PERSISTENT,
                             2, 0)),
                (_consumer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG, PERSISTENT,
                             2, 1)),
                (_producer, (args, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG, PERSISTENT,
                            2, 2)),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip
