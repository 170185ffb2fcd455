"""Experimental split-KV kernel whose last program per (batch, kv head) merges the splits
(no combine kernel), and a pure-read kernel: the floor of streaming K and V in the same grid."""
import triton
import triton.language as tl

from attnkit.triton.decode_kernels import DECODE_DYNAMIC_INTS, _kv_rows
from attnkit.triton.forward_kernels import LN2, _dot, _load_tile


@triton.jit(do_not_specialize=DECODE_DYNAMIC_INTS)
def fused_split_kernel(
    Q, K, V, O_PART, LSE_PART, O, LSE, COUNTER,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    q_len, kv_len, group_size, kv_heads, chunk, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, VALUE_DIM: tl.constexpr, VALUE_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SPLIT_PAD: tl.constexpr,
):  # fmt: skip
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    num_splits = tl.num_programs(0)
    batch = pid_bh // kv_heads
    kv_head = pid_bh % kv_heads
    seq_len = kv_len
    causal_offset = seq_len - q_len
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_PAD)
    offs_dv = tl.arange(0, VALUE_PAD)
    n_rows = group_size * q_len
    row_ok = offs_m < n_rows
    query = offs_m % q_len
    head = kv_head * group_size + offs_m // q_len
    q_ptrs = Q + batch.to(tl.int64) * stride_qb + head[:, None].to(tl.int64) * stride_qh
    q_ptrs += query[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = _load_tile(q_ptrs, offs_m, n_rows, offs_d, HEAD_DIM, HEAD_PAD, True)
    k_base = K + kv_head.to(tl.int64) * stride_kh
    v_base = V + kv_head.to(tl.int64) * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, VALUE_PAD], dtype=tl.float32)
    start_n = split * chunk
    end_n = tl.minimum(start_n + chunk, seq_len)
    for start in range(start_n, end_n, BLOCK_N):
        cols = start + offs_n
        col_ok = cols < end_n
        k_rows = batch.to(tl.int64) * stride_kb + cols.to(tl.int64) * stride_kn
        k = _load_tile(k_base + k_rows[:, None] + offs_d[None, :] * stride_kd, cols, end_n, offs_d, HEAD_DIM, HEAD_PAD, True)
        s = _dot(q, tl.trans(k), None, "ieee") * qk_scale
        visible = col_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            visible = visible & (cols[None, :] <= query[:, None] + causal_offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_rows = batch.to(tl.int64) * stride_vb + cols.to(tl.int64) * stride_vn
        v = _load_tile(v_base + v_rows[:, None] + offs_dv[None, :] * stride_vd, cols, end_n, offs_dv, VALUE_DIM, VALUE_PAD, True)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], "ieee")
        m_i = m_new
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    row_base = (pid_bh.to(tl.int64) * n_rows + offs_m) * num_splits
    dv_ok = offs_dv[None, :] < VALUE_DIM
    tl.store(O_PART + (row_base + split)[:, None] * VALUE_DIM + offs_dv[None, :], out, mask=row_ok[:, None] & dv_ok)
    tl.store(LSE_PART + row_base + split, lse, mask=row_ok)
    tl.debug_barrier()
    ticket = tl.atomic_add(COUNTER + pid_bh, 1, sem="acq_rel")
    if ticket == num_splits - 1:
        offs_s = tl.arange(0, SPLIT_PAD)
        lse_s = tl.load(LSE_PART + row_base[:, None] + offs_s[None, :],
                        mask=row_ok[:, None] & (offs_s[None, :] < num_splits), other=float("-inf"), cache_modifier=".cg")
        m = tl.max(lse_s, 1)
        seen = m > float("-inf")
        m_safe = tl.where(seen, m, 0.0)
        total = tl.sum(tl.exp2(lse_s - m_safe[:, None]), 1)
        acc = tl.zeros([BLOCK_M, VALUE_PAD], dtype=tl.float32)
        for s in range(0, num_splits):
            w = tl.exp2(tl.load(LSE_PART + row_base + s, mask=row_ok, other=float("-inf"), cache_modifier=".cg") - m_safe)
            o_s = tl.load(O_PART + (row_base + s)[:, None] * VALUE_DIM + offs_dv[None, :], mask=row_ok[:, None] & dv_ok,
                          other=0.0, cache_modifier=".cg")
            acc += w[:, None] * o_s
        res = acc / tl.where(seen, total, 1.0)[:, None]
        o_ptrs = O + batch.to(tl.int64) * stride_ob + head[:, None].to(tl.int64) * stride_oh + query[:, None].to(tl.int64) * stride_om
        tl.store(o_ptrs + offs_dv[None, :] * stride_od, res.to(O.dtype.element_ty), mask=row_ok[:, None] & dv_ok)
        lse_out = tl.where(seen, (m_safe + tl.log2(tl.where(seen, total, 1.0))) * LN2, float("inf"))
        tl.store(LSE + (batch * group_size * kv_heads + head) * q_len + query, lse_out, mask=row_ok)
        tl.atomic_xchg(COUNTER + pid_bh, 0)


@triton.jit(do_not_specialize=["chunk", "kv_len", "kv_heads"])
def read_kernel(K, V, OUT, stride_kb, stride_kh, stride_kn, chunk, kv_len, kv_heads,
                BLOCK_N: tl.constexpr, D: tl.constexpr):
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // kv_heads
    h = bh % kv_heads
    base = b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    acc = tl.zeros([BLOCK_N, D], tl.float32)
    start = split * chunk
    end = tl.minimum(start + chunk, kv_len)
    for s in range(start, end, BLOCK_N):
        rows = s + offs_n
        ptr = base + rows[:, None].to(tl.int64) * stride_kn + offs_d[None, :]
        ok = rows[:, None] < end
        acc += tl.load(K + ptr, mask=ok, other=0.0).to(tl.float32)
        acc += tl.load(V + ptr, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + split * tl.num_programs(1) + bh, tl.sum(acc))
