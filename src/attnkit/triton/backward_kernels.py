"""Backward kernels of the Triton path: a preprocess, a dK/dV pass and a dQ pass.

FlashAttention-2's backward, split so that every output element is owned by one program and
written once: no atomics, so two runs give bitwise-identical gradients.

* ``_attn_bwd_preprocess``: delta_i = sum_d dO_id * O_id (= rowsum(P * dP)), float32.
* ``_attn_bwd_dkdv_kernel``: one program per (key block, batch, kv head). It keeps K, V and the
  dK, dV accumulators on chip and streams, for each query head of its GQA group in turn, the
  query blocks that see its keys. The group sum is a plain loop, so its order is fixed.
* ``_attn_bwd_dq_kernel``: one program per (query block, batch, query head), streaming the key
  blocks the rows see, exactly like the forward.

Both recompute P = exp2(s * log2(e) - lse * log2(e)) from the saved log-sum-exp; rows that saw
no key have lse = +inf and so P = 0 and zero gradient. The scores are recomputed twice (once per
pass): 7 matmuls instead of 5, the price of determinism without a dQ reduction buffer.

Row phases of the dK/dV pass (for key block [n0, n0 + BLOCK_N)), the mirror of the forward's
key phases: query blocks from the first row that sees key n0 up to the first row that sees the
whole block are masked (the causal diagonal, or the window's right edge); whole blocks after
that run bare; the blocks crossing the window's left edge (rows that no longer see key n0) and
the ragged end of the queries are masked again; rows past the last one that sees the block's
last key are never loaded. Rows past N load lse = +inf, dO = 0 and so contribute nothing.
The dQ pass uses the forward's key phases. The band and its offsets are the forward's
(:mod:`attnkit.triton.forward_kernels`).

Addressing: each pass streams one pair of tensors (dK/dV: Q and dO; dQ: K and V) and keeps the
other on chip. On Hopper the streamed pair is read through TMA descriptors where the launcher
allows it (``TMA``), exactly as the forward reads K and V; the tiles loaded once per program,
and the per-row log-sum-exp and delta, stay on pointers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnkit.triton.forward_kernels import (
    DYNAMIC_INTS,
    LOG2E,
    _dot,
    _head_rows_tile,
    _key_phases,
    _load_tile,
    _phase_bounds,
    _program_coords,
    _store_tile,
    _visible,
)


@triton.jit(do_not_specialize=["q_len", "q_heads"])
def _attn_bwd_preprocess(
    O, DO, DELTA,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    q_len, q_heads,
    VALUE_DIM: tl.constexpr, VALUE_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(N, BLOCK_M) * B * Hq,). O, DO: (B, Hq, N, Dv); DELTA: (B, Hq, N) float32."""
    pid_m, pid_bh = _program_coords(q_len, BLOCK_M, False)
    batch = (pid_bh // q_heads).to(tl.int64)
    head = (pid_bh % q_heads).to(tl.int64)
    m0 = (pid_m * BLOCK_M).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, VALUE_PAD)
    rows = pid_m * BLOCK_M + offs_m
    o_ptrs = O + batch * stride_ob + head * stride_oh + m0 * stride_om
    o = _load_tile(o_ptrs + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
                   rows, q_len, offs_dv, VALUE_DIM, VALUE_PAD, True)  # fmt: skip
    do_ptrs = DO + batch * stride_dob + head * stride_doh + m0 * stride_dom
    do = _load_tile(do_ptrs + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                    rows, q_len, offs_dv, VALUE_DIM, VALUE_PAD, True)  # fmt: skip
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * q_len + rows, delta, mask=rows < q_len)


@triton.jit
def _dkdv_inner(
    dk, dv, k, v, q_src, q_offs, do_src, do_offs, lse_head, delta_head, stride_qm, stride_dom, batch, head,
    start_m, end_m, offs_m, keys, offs_d, offs_dv, q_len, causal_offset, lower_offset, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, VALUE_DIM: tl.constexpr, VALUE_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """Accumulate query rows [start_m, end_m) into dK, dV. Q and dO tiles come from
    :func:`_head_rows_tile` (``*_src``: descriptors with TMA, else pointers at row 0 of the
    query head). Works on transposed tiles (keys x rows) so dK, dV accumulate without
    transposing them."""
    for start in range(start_m, end_m, BLOCK_M):
        rows = start + offs_m
        q = _head_rows_tile(
            q_src, q_offs, stride_qm, batch, head, start, rows, q_len, offs_d,
            HEAD_DIM, HEAD_PAD, BLOCK_M, MASKED, TMA,
        )  # fmt: skip
        do = _head_rows_tile(
            do_src, do_offs, stride_dom, batch, head, start, rows, q_len, offs_dv,
            VALUE_DIM, VALUE_PAD, BLOCK_M, MASKED, TMA,
        )  # fmt: skip
        if MASKED:
            lse = tl.load(lse_head + rows, mask=rows < q_len, other=float("inf"))
            delta = tl.load(delta_head + rows, mask=rows < q_len, other=0.0)
        else:
            lse = tl.load(lse_head + rows)
            delta = tl.load(delta_head + rows)
        s_t = _dot(k, tl.trans(q), None, DOT_PRECISION) * qk_scale
        p_t = tl.exp2(s_t - (lse * LOG2E)[None, :])
        # Hidden keys may score above the row's lse (they are not in its sum): zero them. Keys
        # past M need no mask: they load as 0 and their dK, dV rows are never stored. One edge
        # at a time (two selects, as many instructions as one and-ed mask and one select), which
        # keeps this loop's schedule and register use as they were tuned.
        if MASKED and CAUSAL:
            p_t = tl.where(
                _visible(rows[None, :], keys[:, None], 0, causal_offset, 0, False, True, False), p_t, 0.0
            )
        if MASKED and WINDOW:
            p_t = tl.where(
                _visible(rows[None, :], keys[:, None], 0, 0, lower_offset, False, False, True), p_t, 0.0
            )
        dv = _dot(p_t.to(do.dtype), do, dv, DOT_PRECISION)
        dp_t = _dot(v, tl.trans(do), None, DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = _dot(ds_t.to(q.dtype), q, dk, DOT_PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=DYNAMIC_INTS)
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    q_len, kv_len, q_heads, kv_heads, group_size, causal_offset, lower_offset, qk_scale, scale,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, VALUE_DIM: tl.constexpr, VALUE_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(M, BLOCK_N) * B * Hkv,). DK like K, DV like V; LSE, DELTA: (B, Hq, N) float32.
    With TMA, Q and DO (the streamed tensors) are descriptors of their (B, Hq, N, dim) shapes
    with blocks (1, 1, BLOCK_M, padded dim), as the forward's K and V are."""
    pid_n, pid_bh = _program_coords(kv_len, BLOCK_N, False)
    batch32 = pid_bh // kv_heads
    batch = batch32.to(tl.int64)
    kv_head = pid_bh % kv_heads
    n0 = pid_n * BLOCK_N
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_PAD)
    offs_dv = tl.arange(0, VALUE_PAD)
    keys = n0 + offs_n

    k_ptrs = K + batch * stride_kb + kv_head.to(tl.int64) * stride_kh + n0.to(tl.int64) * stride_kn
    k = _load_tile(k_ptrs + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                   keys, kv_len, offs_d, HEAD_DIM, HEAD_PAD, True)  # fmt: skip
    v_ptrs = V + batch * stride_vb + kv_head.to(tl.int64) * stride_vh + n0.to(tl.int64) * stride_vn
    v = _load_tile(v_ptrs + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                   keys, kv_len, offs_dv, VALUE_DIM, VALUE_PAD, True)  # fmt: skip
    dk = tl.zeros([BLOCK_N, HEAD_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, VALUE_PAD], dtype=tl.float32)

    # Row phases [lo, top_end) masked, [mid, full_end) bare, [tail, row_end) masked.
    if CAUSAL:
        # First row that sees key n0, rounded down to the block grid ...
        lo = (tl.maximum(n0 - causal_offset, 0) // BLOCK_M) * BLOCK_M
        # ... and the first block start from which every row sees the whole key block.
        all_visible = n0 + BLOCK_N - 1 - causal_offset
        mid = lo + tl.cdiv(tl.maximum(all_visible - lo, 0), BLOCK_M) * BLOCK_M
        full_end = (q_len // BLOCK_M) * BLOCK_M
        tail = tl.maximum(mid, full_end)
        top_end = tl.minimum(mid, q_len)
    else:
        lo = 0
        mid = 0
        full_end = (q_len // BLOCK_M) * BLOCK_M
        tail = full_end
        top_end = 0
    row_end = q_len
    if WINDOW:
        # Row i sees key j only if j >= i + lower_offset: rows after n0 + BLOCK_N - 1 - lower_offset
        # see none of the block and are never loaded ...
        row_end = tl.minimum(q_len, tl.maximum(n0 + BLOCK_N - lower_offset, 0))
        if CAUSAL:
            top_end = tl.minimum(top_end, row_end)
            mid = top_end
        # ... and rows up to n0 - lower_offset see all of it: bare up to that row's block. A band
        # narrower than a block leaves no bare rows between the two masked phases.
        full_end = tl.minimum(full_end, (tl.maximum(n0 - lower_offset + 1, 0) // BLOCK_M) * BLOCK_M)
        full_end = tl.maximum(full_end, mid)
        tail = full_end

    q_offs = offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    do_offs = offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod
    # GQA: the group's query heads are summed in a fixed order, so dK, dV are deterministic.
    for g in range(group_size):
        head32 = kv_head * group_size + g
        head = head32.to(tl.int64)
        if TMA:
            q_src, do_src = Q, DO
        else:
            q_src = Q + batch * stride_qb + head * stride_qh
            do_src = DO + batch * stride_dob + head * stride_doh
        lse_head = LSE + (batch * q_heads + head) * q_len
        delta_head = DELTA + (batch * q_heads + head) * q_len
        # Phases: 0 = causal diagonal / right edge (masked), 1 = whole blocks (bare), 2 = the
        # window's left edge and the ragged end (masked).
        for phase in tl.static_range(3):
            if phase == 0:
                start_m = lo
                end_m = top_end
            elif phase == 1:
                start_m = mid
                end_m = full_end
            else:
                start_m = tail
                end_m = row_end
            if CAUSAL or phase != 0:
                dk, dv = _dkdv_inner(
                    dk, dv, k, v, q_src, q_offs, do_src, do_offs, lse_head, delta_head,
                    stride_qm, stride_dom, batch32, head32, start_m, end_m, offs_m, keys, offs_d, offs_dv,
                    q_len, causal_offset, lower_offset, qk_scale,
                    HEAD_DIM, HEAD_PAD, VALUE_DIM, VALUE_PAD, BLOCK_M, phase != 1, CAUSAL, WINDOW,
                    DOT_PRECISION, TMA,
                )  # fmt: skip

    dk_ptrs = DK + batch * stride_dkb + kv_head.to(tl.int64) * stride_dkh + n0.to(tl.int64) * stride_dkn
    _store_tile(dk_ptrs + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
                dk * scale, keys, kv_len, offs_d, HEAD_DIM)  # fmt: skip
    dv_ptrs = DV + batch * stride_dvb + kv_head.to(tl.int64) * stride_dvh + n0.to(tl.int64) * stride_dvn
    _store_tile(dv_ptrs + offs_n[:, None] * stride_dvn + offs_dv[None, :] * stride_dvd,
                dv, keys, kv_len, offs_dv, VALUE_DIM)  # fmt: skip


@triton.jit
def _dq_inner(
    dq, q, do, lse2, delta, k_src, k_offs, v_src, v_offs, stride_kn, stride_vn, batch, kv_head,
    start_n, end_n, rows, offs_n, offs_d, offs_dv, kv_len, causal_offset, lower_offset, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, VALUE_DIM: tl.constexpr, VALUE_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """Accumulate keys [start_n, end_n) into dQ; K and V tiles as in the forward's loop."""
    for start in range(start_n, end_n, BLOCK_N):
        cols = start + offs_n
        k = _head_rows_tile(
            k_src, k_offs, stride_kn, batch, kv_head, start, cols, kv_len, offs_d,
            HEAD_DIM, HEAD_PAD, BLOCK_N, MASKED, TMA,
        )  # fmt: skip
        v = _head_rows_tile(
            v_src, v_offs, stride_vn, batch, kv_head, start, cols, kv_len, offs_dv,
            VALUE_DIM, VALUE_PAD, BLOCK_N, MASKED, TMA,
        )  # fmt: skip
        s = _dot(q, tl.trans(k), None, DOT_PRECISION) * qk_scale
        p = tl.exp2(s - lse2[:, None])
        if MASKED:
            visible = _visible(
                rows[:, None], cols[None, :], kv_len, causal_offset, lower_offset, True, CAUSAL, WINDOW
            )
            p = tl.where(visible, p, 0.0)
        dp = _dot(do, tl.trans(v), None, DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = _dot(ds.to(k.dtype), k, dq, DOT_PRECISION)
    return dq


@triton.jit(do_not_specialize=DYNAMIC_INTS)
def _attn_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    q_len, kv_len, q_heads, kv_heads, group_size, causal_offset, lower_offset, qk_scale, scale,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, VALUE_DIM: tl.constexpr, VALUE_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(N, BLOCK_M) * B * Hq,). DQ like Q; LSE, DELTA: (B, Hq, N) float32. With TMA,
    K and V (the streamed tensors) are descriptors, as in the forward."""
    pid_m, pid_bh = _program_coords(q_len, BLOCK_M, CAUSAL)
    batch32 = pid_bh // q_heads
    batch = batch32.to(tl.int64)
    head = pid_bh % q_heads
    kv_head32 = head // group_size
    kv_head = kv_head32.to(tl.int64)
    head = head.to(tl.int64)
    m0 = pid_m * BLOCK_M
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_PAD)
    offs_dv = tl.arange(0, VALUE_PAD)
    rows = m0 + offs_m

    q_ptrs = Q + batch * stride_qb + head * stride_qh + m0.to(tl.int64) * stride_qm
    q = _load_tile(q_ptrs + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                   rows, q_len, offs_d, HEAD_DIM, HEAD_PAD, True)  # fmt: skip
    do_ptrs = DO + batch * stride_dob + head * stride_doh + m0.to(tl.int64) * stride_dom
    do = _load_tile(do_ptrs + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                    rows, q_len, offs_dv, VALUE_DIM, VALUE_PAD, True)  # fmt: skip
    row_ptrs = pid_bh.to(tl.int64) * q_len + rows
    lse2 = tl.load(LSE + row_ptrs, mask=rows < q_len, other=float("inf")) * LOG2E
    delta = tl.load(DELTA + row_ptrs, mask=rows < q_len, other=0.0)

    if TMA:
        k_src, v_src, k_offs, v_offs = K, V, 0, 0
    else:
        k_src = K + batch * stride_kb + kv_head * stride_kh
        k_offs = offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
        v_src = V + batch * stride_vb + kv_head * stride_vh
        v_offs = offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd
    dq = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    start, left_end, free_end, kv_end = _key_phases(
        m0, kv_len, causal_offset, lower_offset, BLOCK_M, BLOCK_N, CAUSAL, WINDOW
    )
    # The forward's phases: left edge (masked, only with a window), bare, upper edge (masked).
    for phase in tl.static_range(3):
        start_n, end_n = _phase_bounds(start, left_end, free_end, kv_end, phase)
        if WINDOW or phase != 0:
            dq = _dq_inner(
                dq, q, do, lse2, delta, k_src, k_offs, v_src, v_offs, stride_kn, stride_vn,
                batch32, kv_head32, start_n, end_n, rows, offs_n, offs_d, offs_dv, kv_len, causal_offset,
                lower_offset, qk_scale, HEAD_DIM, HEAD_PAD, VALUE_DIM, VALUE_PAD, BLOCK_N, phase != 1,
                CAUSAL, WINDOW, DOT_PRECISION, TMA,
            )  # fmt: skip

    dq_ptrs = DQ + batch * stride_dqb + head * stride_dqh + m0.to(tl.int64) * stride_dqm
    _store_tile(dq_ptrs + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
                dq * scale, rows, q_len, offs_d, HEAD_DIM)  # fmt: skip
