"""Split-KV forward kernels of the Triton path (flash-decoding): few query rows, many keys.

With N <= 16 query rows the regular forward launches B x Hq programs of mostly empty
(BLOCK_M, D) tiles, each streaming the whole cache: 32 programs on 132 SMs at B1 Hq32, and every
key/value row read once per query head of its group. Decoding is bound by reading K and V, so
here:

* one program takes one (batch, kv head, split) and *all* query rows that read that head: the
  G = Hq / Hkv query heads of the group times the N queries, stacked as G*N rows of one tile
  (row r is query ``r % N`` of head ``kv_head * G + r // N``). K and V are read once per kv head;
* the keys of a sequence are cut into ``num_splits`` chunks of ``chunk`` keys (a multiple of
  BLOCK_N), one per program along grid axis 0, so B x Hkv x splits programs fill the GPU;
* each program writes its partial output, normalised, and its log-sum-exp (log2 domain, -inf
  when it saw no key); :func:`_decode_combine_kernel` merges the splits of a row by their
  log-sum-exp (the merge is exact: ``out = sum_s 2^(lse_s - lse) o_s``);
* ``PDL`` (Hopper and later): the combine is a programmatic dependent launch. The split
  programs allow it to start as soon as they have all started, so its launch and scheduling
  overlap their memory-bound loop instead of following their last store; each combine program
  waits (``griddepcontrol.wait``) for the whole split grid to finish, with its stores visible,
  before it reads a partial result.

Keys are addressed either in a contiguous (B, Hkv, M, D) tensor or through a block table into a
paged pool (num_blocks, Hkv, block_size, D): key j of sequence b lives in page
``table[b, j // block_size]`` at row ``j % block_size``. Per-sequence lengths (``SEQLENS``) make
row r see keys ``j < L_b`` and, causally, ``j <= i + L_b - N`` (bottom-right per sequence).
Scores are scaled before masking (any scale sign, 0 included), in the log2 domain as in
:mod:`attnkit.triton.forward_kernels`, whose tile helpers these kernels share.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from attnkit.triton.forward_kernels import LN2, _dot, _load_tile, _visible
from attnkit.triton.softmax import _online_softmax_step

#: Runtime ints Triton must not specialise (a value of 1 would become a compile-time constant).
DECODE_DYNAMIC_INTS = ["q_len", "kv_len", "group_size", "kv_heads", "chunk", "block_size", "lse_offset"]


@triton.jit
def _kv_rows(
    TABLE, stride_tb, batch, start, cols, kv_len, stride_b, stride_n, block_size,
    PAGED: tl.constexpr, PAGE_ALIGNED: tl.constexpr,
):  # fmt: skip
    """int64 offset of key row ``cols`` (= ``start`` + 0..BLOCK_N-1) of sequence ``batch``
    (before the head offset). PAGE_ALIGNED: ``block_size`` is a multiple of BLOCK_N, so the
    whole key block lies in one page and one table entry is read, not one per key (the key
    loads then wait on a single scalar load)."""
    if PAGED:
        if PAGE_ALIGNED:
            page = tl.load(TABLE + batch.to(tl.int64) * stride_tb + start // block_size)
            rows = (
                page.to(tl.int64) * stride_b
                + (cols - (start // block_size) * block_size).to(tl.int64) * stride_n
            )
        else:
            page = tl.load(
                TABLE + batch.to(tl.int64) * stride_tb + cols // block_size, mask=cols < kv_len, other=0
            )
            rows = page.to(tl.int64) * stride_b + (cols % block_size).to(tl.int64) * stride_n
    else:
        rows = batch.to(tl.int64) * stride_b + cols.to(tl.int64) * stride_n
    return rows


@triton.jit(do_not_specialize=DECODE_DYNAMIC_INTS)
def _decode_split_kernel(
    Q, K, V, PARTS, SEQLENS, TABLE,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_tb,
    q_len, kv_len, group_size, kv_heads, chunk, block_size, lse_offset, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, VALUE_DIM: tl.constexpr, VALUE_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, PAGED: tl.constexpr, PAGE_ALIGNED: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Grid (num_splits, B * Hkv). Q: (B, Hq, N, D); K, V: (B, Hkv, M, D|Dv) or, PAGED, pools
    (num_blocks, Hkv, block_size, D|Dv) read through TABLE (B, max_blocks) int32.
    SEQLENS: (B,) int32 key counts (else ``kv_len`` for all). Writes the partial results into
    PARTS, one float32 buffer (one allocation per call, not two): the outputs
    (B, Hkv, G*N, splits, Dv) from element 0, the log-sum-exps (B, Hkv, G*N, splits) from
    element ``lse_offset``, both contiguous."""
    if PDL:  # the combine may launch now; it waits for this grid's end before reading
        gdc_launch_dependents()
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    num_splits = tl.num_programs(0)
    batch = pid_bh // kv_heads
    kv_head = pid_bh % kv_heads
    if HAS_SEQLENS:  # noqa: SIM108 (a constexpr branch, kept a statement for the Triton compiler)
        seq_len = tl.load(SEQLENS + batch)
    else:
        seq_len = kv_len
    causal_offset = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_PAD)
    offs_dv = tl.arange(0, VALUE_PAD)
    n_rows = group_size * q_len
    row_ok = offs_m < n_rows
    query = offs_m % q_len  # position of row r among the N queries
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
    # Causal or not, no row sees a key past the sequence (the last row sees j <= L - 1).
    end_n = tl.minimum(start_n + chunk, seq_len)
    for start in range(start_n, end_n, BLOCK_N):
        cols = start + offs_n
        col_ok = cols < end_n
        k_rows = _kv_rows(
            TABLE, stride_tb, batch, start, cols, end_n, stride_kb, stride_kn, block_size, PAGED, PAGE_ALIGNED
        )
        # Row masks only (constant along the head dim, so loads stay vectorised); the head-dim
        # mask only where D is padded.
        k = _load_tile(
            k_base + k_rows[:, None] + offs_d[None, :] * stride_kd,
            cols,
            end_n,
            offs_d,
            HEAD_DIM,
            HEAD_PAD,
            True,
        )
        qk = _dot(q, tl.trans(k), None, DOT_PRECISION)
        # Keys of this chunk and of the sequence, rows of the group; causally, the forward's band
        # (no window) with the sequence's own offset.
        visible = col_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            visible = visible & _visible(
                query[:, None], cols[None, :], 0, causal_offset, 0, False, True, False
            )
        p, alpha, m_new, l_i = _online_softmax_step(qk, qk_scale, visible, m_i, l_i, True)
        v_rows = _kv_rows(
            TABLE, stride_tb, batch, start, cols, end_n, stride_vb, stride_vn, block_size, PAGED, PAGE_ALIGNED
        )
        v = _load_tile(
            v_base + v_rows[:, None] + offs_dv[None, :] * stride_vd,
            cols,
            end_n,
            offs_dv,
            VALUE_DIM,
            VALUE_PAD,
            True,
        )
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], DOT_PRECISION)
        m_i = m_new

    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    part = (pid_bh.to(tl.int64) * n_rows + offs_m) * num_splits + split
    tl.store(
        PARTS + part[:, None] * VALUE_DIM + offs_dv[None, :],
        out,
        mask=row_ok[:, None] & (offs_dv[None, :] < VALUE_DIM),
    )
    tl.store(PARTS + lse_offset + part, lse, mask=row_ok)


@triton.jit
def _decode_combine_kernel(
    PARTS, O, LSE,
    stride_ob, stride_oh, stride_om, stride_od,
    q_len, q_heads, num_splits, lse_offset,
    VALUE_DIM: tl.constexpr, VALUE_PAD: tl.constexpr, SPLIT_PAD: tl.constexpr, PDL: tl.constexpr,
    STORE_LSE: tl.constexpr,
):  # fmt: skip
    """Grid (B * Hq * N,): merge one row's splits, read from PARTS as the split kernel wrote
    them. O: (B, Hq, N, Dv) in the output dtype, any
    strides; LSE: (B, Hq, N) float32 natural log, +inf for a row that saw no key (the shared
    autograd contract: the backward's exp(s - lse) is then exactly 0), written only with
    STORE_LSE (a call no backward follows passes any pointer)."""
    row = tl.program_id(0)  # = (b * Hq + head) * N + query = (b * Hkv + kv_head) * G*N + r
    query = row % q_len
    bh = row // q_len
    batch = bh // q_heads
    head = bh % q_heads
    offs_s = tl.arange(0, SPLIT_PAD)
    offs_dv = tl.arange(0, VALUE_PAD)
    base = row.to(tl.int64) * num_splits
    if PDL:  # launched while the split grid runs: wait until its partial results are complete
        gdc_wait()
    LSE_PART = PARTS + lse_offset
    lse_s = tl.load(LSE_PART + base + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    m = tl.max(lse_s, 0)
    seen = m > float("-inf")
    m_safe = tl.where(seen, m, 0.0)
    weights = tl.exp2(lse_s - m_safe)
    total = tl.sum(weights, 0)
    acc = tl.zeros([VALUE_PAD], dtype=tl.float32)
    for s in range(0, num_splits):
        w = tl.exp2(tl.load(LSE_PART + base + s) - m_safe)
        o_s = tl.load(PARTS + (base + s) * VALUE_DIM + offs_dv, mask=offs_dv < VALUE_DIM, other=0.0)
        acc += w * o_s
    out = acc / tl.where(seen, total, 1.0)
    o_ptrs = (
        O + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh + query.to(tl.int64) * stride_om
    )
    tl.store(o_ptrs + offs_dv * stride_od, out.to(O.dtype.element_ty), mask=offs_dv < VALUE_DIM)
    if STORE_LSE:
        lse = tl.where(seen, (m_safe + tl.log2(tl.where(seen, total, 1.0))) * LN2, float("inf"))
        tl.store(LSE + row, lse)


@triton.jit
def _merge_pair_kernel(
    O1, L1, O2, L2, O, L,
    s1_b, s1_h, s1_m, s1_d, s2_b, s2_h, s2_m, s2_d, so_b, so_h, so_m, so_d,
    l1_b, l1_h, l1_m, l2_b, l2_h, l2_m, l_b, l_h, l_m,
    q_len, q_heads,
    VALUE_DIM: tl.constexpr, VALUE_PAD: tl.constexpr,
):  # fmt: skip
    """Grid (B * Hq * N,): one row of two partial results over disjoint keys, merged by their
    log-sum-exp (natural log, finite: each part saw a key). O1, O2, O: (B, Hq, N, Dv), L1, L2,
    L: (B, Hq, N) per-row log-sum-exp, float32, any strides each; computed in float32, O rounded
    once to its dtype."""
    row = tl.program_id(0)
    query = (row % q_len).to(tl.int64)
    bh = row // q_len
    batch = (bh // q_heads).to(tl.int64)
    head = (bh % q_heads).to(tl.int64)
    lse1 = tl.load(L1 + batch * l1_b + head * l1_h + query * l1_m)
    lse2 = tl.load(L2 + batch * l2_b + head * l2_h + query * l2_m)
    m = tl.maximum(lse1, lse2)
    w1 = tl.exp(lse1 - m)
    w2 = tl.exp(lse2 - m)
    total = w1 + w2
    offs = tl.arange(0, VALUE_PAD)
    ok = offs < VALUE_DIM
    o1 = tl.load(O1 + batch * s1_b + head * s1_h + query * s1_m + offs * s1_d, mask=ok, other=0.0)
    o2 = tl.load(O2 + batch * s2_b + head * s2_h + query * s2_m + offs * s2_d, mask=ok, other=0.0)
    out = (w1 * o1.to(tl.float32) + w2 * o2.to(tl.float32)) / total
    tl.store(O + batch * so_b + head * so_h + query * so_m + offs * so_d, out.to(O.dtype.element_ty), mask=ok)
    tl.store(L + batch * l_b + head * l_h + query * l_m, m + tl.log(total))
