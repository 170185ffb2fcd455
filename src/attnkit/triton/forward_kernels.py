"""Forward kernel of the Triton path, and the tile helpers the backward kernels share.

One program computes a (BLOCK_M, Dv) block of the output of one query head and its
log-sum-exp, streaming the key/value blocks the rows can see (FlashAttention-2's loop order,
the same as :class:`attnkit.tiled.TiledImplementation`).

Numerics:
* Scores live in the log2 domain: ``qk_scale = scale * log2(e)`` is folded into one multiply so
  the softmax uses ``exp2`` (one MUFU instruction) instead of ``exp``. The stored log-sum-exp
  is converted back to natural log, as the shared autograd contract requires.
* Rows that see no key (bottom-right causal with N > M, or a window) keep max = -inf and
  sum = 0; every ``exp2`` is then taken against 0 instead of -inf so no ``-inf - -inf = NaN``
  appears; they output 0 and store lse = +inf so the backward's ``exp2(s - lse)`` is exactly 0.
  The max itself stays -inf until a key is seen: a row may see its first key only in a later
  block of a masked phase (the window's left edge), and a max of 0 kept from an empty block
  would underflow its exp2 terms.

The band: row i sees key j iff ``i + lower_offset <= j <= i + causal_offset`` (and j < M).
``CAUSAL`` says the upper edge exists (bottom-right causal, ``causal_offset = M - N``, or a
window's right edge, ``M - N + right``); ``WINDOW`` says the lower edge exists (a window's left
edge, ``lower_offset = M - N - left``). Both offsets are runtime ints (``DYNAMIC_INTS``): a new
window never recompiles, and without a window the kernels compile to the code they had before
windows existed (WINDOW=False removes every lower-edge instruction).

Loop phases (:func:`_key_phases`): key blocks wholly outside the band are never loaded; blocks
crossing the window's left edge run masked; whole blocks every row of the block sees run with
no masks at all (``MASKED=False``); the blocks crossing the causal diagonal or the window's
right edge, and the ragged end of the keys, run masked again.

Scaling: in the unmasked phase the row max is taken over the raw scores and scaled once, and
``s * qk_scale - m`` is one FMA per score (the tutorial's form). That needs ``qk_scale >= 0``:
the launcher passes the scale's magnitude and, for a negative scale, the kernel negates q
(exact). The masked phase scales first, so a masked -inf never meets a zero scale.

Addressing, two paths picked by the launcher (``TMA``):
* Pointers (any GPU, any strides, the interpreter): the (batch, head, block start) part of
  every offset is computed in int64, so tensors past 2**31 elements are safe; the offsets
  inside one tile are int32 (the launcher guarantees ``stride * block < 2**31``).
* TMA tensor descriptors for K and V (Hopper, 16-bit, 16-byte aligned strides): 4-D
  (B, Hkv, M, dim) descriptors; the copy engine does the address arithmetic (64-bit strides)
  and zero-fills reads past the keys or the head dim, so tiles load with no masks, straight
  into shared memory where the tensor-core dots read them (measured on H100: +5-25% TFLOP/s
  over the pointer path at the same tile, more with the deeper pipelines it can afford).
  Q and O, touched once per program, stay on pointers: each descriptor costs host time at
  every launch, which short problems feel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnkit.triton.softmax import _online_softmax_step

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)

#: Integer arguments that must stay runtime values: Triton would otherwise turn a value of 1
#: into a compile-time constant, and the kernels call ``.to(tl.int64)`` on some of them.
DYNAMIC_INTS = ["q_len", "kv_len", "q_heads", "kv_heads", "group_size", "causal_offset", "lower_offset"]


@triton.jit
def _load_tile(ptrs, rows, n_rows, cols, DIM: tl.constexpr, PAD: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """Load a (rows, PAD) tile; rows past ``n_rows`` and columns past ``DIM`` read as 0.
    Masks are only built where needed: interior tiles of a power-of-two head dim load bare."""
    if CHECK_ROWS:
        mask = rows[:, None] < n_rows
        if DIM != PAD:
            mask = mask & (cols[None, :] < DIM)
        x = tl.load(ptrs, mask=mask, other=0.0)
    elif DIM != PAD:
        x = tl.load(ptrs, mask=cols[None, :] < DIM, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr):
    """``a @ b (+ acc)`` in float32. PRECISION "upcast" computes bf16 operands as float32 IEEE
    dots: the interpreter multiplies bf16 bit patterns as integers (triton 3.6-3.9), and a
    bf16 x bf16 product is exact in float32, so this matches the tensor-core result."""
    if PRECISION == "upcast":
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out


@triton.jit
def _store_tile(ptrs, x, rows, n_rows, cols, DIM: tl.constexpr):
    tl.store(ptrs, x.to(ptrs.dtype.element_ty), mask=(rows[:, None] < n_rows) & (cols[None, :] < DIM))


@triton.jit
def _visible(
    rows, cols, kv_len, causal_offset, lower_offset,
    KEY_END: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
):  # fmt: skip
    """The band as a boolean tile: query row ``rows`` sees key ``cols`` iff ``cols < kv_len``
    (with KEY_END), ``cols <= rows + causal_offset`` (with CAUSAL) and
    ``cols >= rows + lower_offset`` (with WINDOW). ``rows`` and ``cols`` come already
    broadcastable ((BLOCK_M, 1) and (1, BLOCK_N), or transposed for the dK/dV pass), so the tile
    has the caller's orientation and no transpose is built. At least one flag is set: the
    callers ask only in their masked phases, and a bare phase builds no mask at all. The
    conditions are and-ed in this order, the order the kernels wrote them out before."""
    if KEY_END:
        visible = cols < kv_len
        if CAUSAL:
            visible = visible & (cols <= rows + causal_offset)
        if WINDOW:
            visible = visible & (cols >= rows + lower_offset)
    elif CAUSAL:
        visible = cols <= rows + causal_offset
        if WINDOW:
            visible = visible & (cols >= rows + lower_offset)
    else:
        visible = cols >= rows + lower_offset
    return visible


@triton.jit
def _key_phases(
    m0, kv_len, causal_offset, lower_offset,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
):  # fmt: skip
    """For query rows [m0, m0 + BLOCK_M): (start, left_end, free_end, kv_end), with
    start <= left_end <= free_end <= kv_end. Keys [start, left_end) cross the window's left
    edge (masked); [left_end, free_end) are whole blocks every row sees (no mask);
    [free_end, kv_end) cross the upper edge or the end of the keys (masked); keys outside
    [start, kv_end) are unseen and never loaded. Without WINDOW, start = left_end = 0."""
    if CAUSAL:
        kv_end = tl.minimum(kv_len, tl.maximum(m0 + BLOCK_M + causal_offset, 0))
        # Row m0 sees keys j <= m0 + causal_offset, and every later row sees at least those.
        free_end = tl.minimum(kv_len, tl.maximum(m0 + causal_offset + 1, 0))
    else:
        kv_end = kv_len
        free_end = kv_len
    free_end = (free_end // BLOCK_N) * BLOCK_N
    if WINDOW:
        # Row m0 has the lowest left edge of the block: key blocks before its own are unseen.
        start = (tl.maximum(m0 + lower_offset, 0) // BLOCK_N) * BLOCK_N
        # From the last row's left edge on, every row sees the keys (the block grid rounds up).
        left_end = tl.cdiv(tl.maximum(m0 + BLOCK_M - 1 + lower_offset, 0), BLOCK_N) * BLOCK_N
        # A band narrower than a block: the edges' masked blocks meet and the middle is empty.
        left_end = tl.minimum(left_end, kv_end)
        free_end = tl.maximum(free_end, left_end)
    else:
        start = 0
        left_end = 0
    return start, left_end, free_end, kv_end


@triton.jit
def _phase_bounds(start, left_end, free_end, kv_end, PHASE: tl.constexpr):
    """Keys [start_n, end_n) of one loop phase of :func:`_key_phases`: 0 = the window's left edge
    (masked), 1 = whole blocks (bare), 2 = the upper edge and the ragged end (masked)."""
    if PHASE == 0:
        start_n = start
        end_n = left_end
    elif PHASE == 1:
        start_n = left_end
        end_n = free_end
    else:
        start_n = free_end
        end_n = kv_end
    return start_n, end_n


@triton.jit
def _head_rows_tile(
    src, offs, stride_row, batch, head, start, rows, n_rows, offs_d,
    DIM: tl.constexpr, PAD: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """Rows [start, start + BLOCK) of one head of a (B, H, rows, DIM) tensor as a (BLOCK, PAD)
    tile: the keys or values a forward or dQ loop streams, the queries or output gradients a
    dK/dV loop streams. ``batch`` and ``head`` are int32 (TMA coordinates are).
    TMA: ``src`` is a (B, H, rows, DIM) descriptor; the copy engine zero-fills rows past the
    end and columns past DIM, so no mask is built. Otherwise ``src`` points at row 0 of the
    head and ``offs`` holds the int32 offsets inside one tile; the pointer tile is rebuilt from
    them each iteration rather than carried through the loop: a carried (BLOCK, D) tile of
    64-bit pointers costs 2 registers an element and made the kernel spill."""
    if TMA:
        x = src.load([batch, head, start, 0]).reshape(BLOCK, PAD)
    else:
        x = _load_tile(
            src + tl.cast(start, tl.int64) * stride_row + offs, rows, n_rows, offs_d, DIM, PAD, MASKED
        )
    return x


@triton.jit
def _program_coords(rows, BLOCK: tl.constexpr, HEAVIEST_FIRST: tl.constexpr):
    """(row block, batch x head) of this program in a 1-D grid of cdiv(rows, BLOCK) * B * H.

    One axis because CUDA caps grid axes 1 and 2 at 65535 and axis 0 at 2**31 - 1: B * H is
    not limited to 65535. The row block varies fastest, the order a (blocks, B * H) 2-D grid
    launched in, so the schedule (and the L2 reuse of one head's K/V) is unchanged. With
    HEAVIEST_FIRST (causal), the blocks lower down, which see more keys, launch first to
    shorten the tail."""
    blocks = tl.cdiv(rows, BLOCK)
    pid = tl.program_id(0)
    pid_m = pid % blocks
    if HEAVIEST_FIRST:
        pid_m = blocks - 1 - pid_m
    return pid_m, pid // blocks


@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q, K, V, k_offs, v_offs, stride_kn, stride_vn, batch, kv_head, start_n, end_n,
    rows, offs_n, offs_d, offs_dv, kv_len, causal_offset, lower_offset, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, VALUE_DIM: tl.constexpr, VALUE_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """Online softmax over keys [start_n, end_n); ``qk_scale >= 0`` (see the kernel)."""
    for start in range(start_n, end_n, BLOCK_N):
        cols = start + offs_n
        k = _head_rows_tile(
            K, k_offs, stride_kn, batch, kv_head, start, cols, kv_len, offs_d,
            HEAD_DIM, HEAD_PAD, BLOCK_N, MASKED, TMA,
        )  # fmt: skip
        qk = _dot(q, tl.trans(k), None, DOT_PRECISION)
        if MASKED:
            visible = _visible(
                rows[:, None], cols[None, :], kv_len, causal_offset, lower_offset, True, CAUSAL, WINDOW
            )
        else:
            visible = None
        p, alpha, m_new, l_i = _online_softmax_step(qk, qk_scale, visible, m_i, l_i, MASKED)
        v = _head_rows_tile(
            V, v_offs, stride_vn, batch, kv_head, start, cols, kv_len, offs_dv,
            VALUE_DIM, VALUE_PAD, BLOCK_N, MASKED, TMA,
        )  # fmt: skip
        # P is rounded to V's dtype for the tensor-core dot (as FlashAttention does); the
        # accumulator stays float32.
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=DYNAMIC_INTS)
def _plain_fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    q_len, kv_len, q_heads, kv_heads, group_size, causal_offset, lower_offset, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, VALUE_DIM: tl.constexpr, VALUE_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, NEGATE_Q: tl.constexpr, STORE_LSE: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(N, BLOCK_M) * B * Hq,), see :func:`_program_coords`. Q: (B, Hq, N, D),
    K: (B, Hkv, M, D), V: (B, Hkv, M, Dv), O: (B, Hq, N, Dv), LSE: (B, Hq, N) float32
    contiguous, written only with STORE_LSE (a call no backward follows passes any pointer).
    With TMA, K and V are tensor descriptors of those shapes with blocks (1, 1, BLOCK_N,
    padded dim) and their strides go unused; otherwise they are pointers.
    ``qk_scale`` is the magnitude of the log2-domain scale; NEGATE_Q says it was negative
    (negating q is exact and keeps the unmasked loop's one-FMA form, which needs a
    non-negative scale)."""
    pid_m, pid_bh = _program_coords(q_len, BLOCK_M, CAUSAL)
    batch = pid_bh // q_heads
    head = pid_bh % q_heads
    kv_head = head // group_size
    m0 = pid_m * BLOCK_M

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_PAD)
    offs_dv = tl.arange(0, VALUE_PAD)
    rows = m0 + offs_m

    # Q and O are read and written once per program: pointers, on both paths.
    q_ptrs = Q + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
    q_ptrs += m0.to(tl.int64) * stride_qm + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = _load_tile(q_ptrs, rows, q_len, offs_d, HEAD_DIM, HEAD_PAD, True)
    if TMA:
        k_src, v_src, k_offs, v_offs = K, V, 0, 0
    else:
        k_src = K + batch.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh
        k_offs = offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
        v_src = V + batch.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh
        v_offs = offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd
    if NEGATE_Q:
        # Through float32: exact, and the interpreter (triton 3.9) gets bf16 negation wrong.
        q = (-q.to(tl.float32)).to(q.dtype)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, VALUE_PAD], dtype=tl.float32)
    start, left_end, free_end, kv_end = _key_phases(
        m0, kv_len, causal_offset, lower_offset, BLOCK_M, BLOCK_N, CAUSAL, WINDOW
    )
    # Phases: 0 = the window's left edge (masked), 1 = whole blocks (bare), 2 = the upper edge
    # and the ragged end (masked). Without a window phase 0 is compiled out.
    for phase in tl.static_range(3):
        start_n, end_n = _phase_bounds(start, left_end, free_end, kv_end, phase)
        if WINDOW or phase != 0:
            acc, l_i, m_i = _attn_fwd_inner(
                acc, l_i, m_i, q, k_src, v_src, k_offs, v_offs, stride_kn, stride_vn, batch, kv_head,
                start_n, end_n, rows, offs_n, offs_d, offs_dv, kv_len, causal_offset, lower_offset, qk_scale,
                HEAD_DIM, HEAD_PAD, VALUE_DIM, VALUE_PAD, BLOCK_N, phase != 1, CAUSAL, WINDOW,
                DOT_PRECISION, TMA,
            )  # fmt: skip

    # Every row that saw a key has l_i >= 1 (its max term is exp2(0)); l_i == 0 means none.
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh
    o_ptrs += m0.to(tl.int64) * stride_om + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od
    _store_tile(o_ptrs, out, rows, q_len, offs_dv, VALUE_DIM)
    if STORE_LSE:
        lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * LN2, float("inf"))
        tl.store(LSE + pid_bh.to(tl.int64) * q_len + rows, lse, mask=rows < q_len)
