"""Bottom-right causal attention with N < M on one fused SDPA kernel (flash, cuDNN, efficient) as
a merge of partial attentions, forward and backward, at the cost of the N x M problem.

**Split.** With offset P = M - N, every query row sees the keys [0, P); row i sees the trailing
keys [P, M) up to P + i, so the trailing N x N block is top-left causal, which is what SDPA's
``is_causal`` computes. Two calls on the kernel's private ops (:mod:`attnkit.sdpa_private_ops`):

* **prefix**: keys [0, S), S <= P, non-causal. Every row sees the same keys, so the query-head
  group folds into the rows, (B, Hq, N, D) -> (B, Hkv, G*N, D): GQA needs no key/value copy.
  The keys may be cut into C chunks run as the batch of the same call (:class:`PrefixChunking`);
* **tail**: keys [S, M), with R = P - S < C zero query rows prepended: an (N+R)^2 top-left causal
  call whose first R rows are dropped (the full square detour would prepend M - N rows). The
  tail's N+R keys are repeated per query head (a copy of N+R rows, not M).

**Merge.** ``lse = logsumexp_p(lse_p)``, ``out = sum_p exp(lse_p - lse) out_p``, accumulated in
float32 and rounded once: exact up to rounding.

**Backward.** For keys split into disjoint sets, dS = P o (dP - rowsum(dO o O)) with
P = exp(s - lse) needs only the *merged* out and lse: each part's private backward, called with
them, computes its own keys' dk, dv and its share of dq exactly. dq is the sum of the shares,
dk and dv the concatenation (the tail's summed over the query-head group). Rows prepended to
the tail get dO = 0, so they contribute nothing whatever their out.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend

from attnkit.errors import UnsupportedProblemError
from attnkit.inputs import AttentionProblem
from attnkit.sdpa_private_ops import PrivateKernel, lse_for_backward, lse_rows, private_kernel

#: Query rows per CTA of each kernel's forward at D <= 128 on sm80/sm90 (FlashAttention-2's
#: kBlockM; the efficient kernel's kQueriesPerBlock; cuDNN taken as flash): enough to count CTAs.
QUERY_TILE = {"FLASH_ATTENTION": 128, "CUDNN_ATTENTION": 128, "EFFICIENT_ATTENTION": 64}


@torch.compiler.assume_constant_result
def _device_sms(device: torch.device) -> int | None:
    """SMs of a CUDA device (None elsewhere); a constant to torch.compile."""
    if device.type != "cuda":
        return None
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


_SMS: dict[torch.device, int] = {}


@dataclass(frozen=True)
class PrefixChunking:
    """How many key chunks the prefix call runs, so that it launches enough CTAs to fill the GPU.

    Folding the query-head group into rows gives the prefix call B * Hkv * ceil(G*N / tile)
    query tiles (CTAs): 32 for decode-like B 4, Hkv 8, G*N 64, where the non-causal GQA call
    has B * Hq = 128, on an H100's 132 SMs; a quarter of the GPU would stream all the keys.
    C chunks of the keys, run as the batch of the same call, give C times the CTAs, each
    streaming 1/C of the keys; the merge adds C partial outputs (C*B*Hq*N*Dv floats).

    The rule is FlashAttention-2's split-KV heuristic (``num_splits_heuristic``): no chunks when
    the tiles fill ``fill_fraction`` of the SMs; else the smallest C whose wave efficiency
    (C * tiles / SMs over its ceiling) is within ``efficiency_slack`` of the best C up to
    ``max_chunks``, each chunk keeping at least ``min_chunk_keys`` keys (a CTA must stream
    enough keys to pay for loading its queries and writing a partial output). The CPU kernels
    parallelise over threads, not CTAs: no chunks unless ``sm_count`` is given (tests).
    """

    fill_fraction: float = 0.8
    efficiency_slack: float = 0.85
    min_chunk_keys: int = 512
    max_chunks: int = 16
    sm_count: int | None = None  # None: the device's

    def chunks(self, problem: AttentionProblem, backend: SDPBackend) -> int:
        p = problem
        sms = self.sm_count if self.sm_count is not None else _device_sms(p.device)
        if not sms:
            return 1
        tiles = p.batch * p.kv_heads * math.ceil(p.group_size * p.q_len / QUERY_TILE.get(backend.name, 128))
        most = min(self.max_chunks, p.causal_offset // self.min_chunk_keys)
        if tiles >= self.fill_fraction * sms or most <= 1:
            return 1

        def efficiency(c: int) -> float:
            waves = c * tiles / sms
            return waves / math.ceil(waves)

        best = max(efficiency(c) for c in range(1, most + 1))
        return next(c for c in range(1, most + 1) if efficiency(c) >= self.efficiency_slack * best)


DEFAULT_CHUNKING = PrefixChunking()


def _batch_heads_mergeable(x: torch.Tensor) -> bool:
    """Whether (B, Hkv) of a key/value tensor is one strided dimension, so that chunks of its
    rows can be a batch dimension in front (the everyday (B, H, M, D) cache, or a slice of one
    along M, is; a (B, M, H, D) cache is not and runs unchunked)."""
    return x.shape[0] == 1 or x.shape[1] == 1 or x.stride(0) == x.shape[1] * x.stride(1)


@dataclass(frozen=True)
class SplitLayout:
    """Where the parts' operands come from and where their results go; one object for forward
    and backward. Tensors with rows are (B, Hq, N, ...) on the query side."""

    problem: AttentionProblem
    chunks: int

    @property
    def chunk_len(self) -> int:
        return self.problem.causal_offset // self.chunks

    @property
    def prefix_len(self) -> int:
        return self.chunks * self.chunk_len

    @property
    def pad_rows(self) -> int:
        return self.problem.causal_offset - self.prefix_len

    def prefix_rows(self, t: torch.Tensor) -> torch.Tensor:
        """(B, Hq, N, *rest) contiguous -> the prefix call's rows: (B, Hkv, G*N, *rest), or
        (C, B*Hkv, G*N, *rest) chunked (the rows copied per chunk: N is small there)."""
        p = self.problem
        if self.chunks == 1:
            return t.reshape(p.batch, p.kv_heads, p.group_size * p.q_len, *t.shape[3:])
        rows = t.reshape(1, p.batch * p.kv_heads, p.group_size * p.q_len, *t.shape[3:])
        return rows.expand(self.chunks, *rows.shape[1:]).contiguous()

    def prefix_keys(self, x: torch.Tensor) -> torch.Tensor:
        """(B, Hkv, M, X) -> keys [0, S): (B, Hkv, S, X), or (C, B*Hkv, L, X) chunked (a view)."""
        if self.chunks == 1:
            return x[:, :, : self.prefix_len]
        p, length = self.problem, self.chunk_len
        heads_stride = x.stride(1) if p.kv_heads > 1 else x.stride(0)
        return x.as_strided(
            (self.chunks, p.batch * p.kv_heads, length, x.shape[3]),
            (length * x.stride(2), heads_stride, x.stride(2), x.stride(3)),
            x.storage_offset(),
        )

    def prefix_parts(self, t: torch.Tensor) -> torch.Tensor:
        """A prefix call's result (rows first as in :meth:`prefix_rows`) -> (C, B, Hkv, G, N, *rest)."""
        p = self.problem
        if self.chunks == 1:
            return t.unflatten(2, (p.group_size, p.q_len)).unsqueeze(0)
        return t.unflatten(1, (p.batch, p.kv_heads)).unflatten(3, (p.group_size, p.q_len))

    def prefix_key_grad(self, t: torch.Tensor) -> torch.Tensor:
        """A prefix call's key gradient -> (B, Hkv, S, X)."""
        if self.chunks == 1:
            return t
        p = self.problem
        return t.transpose(0, 1).reshape(p.batch, p.kv_heads, self.prefix_len, t.shape[3])

    def tail_rows(self, t: torch.Tensor) -> torch.Tensor:
        """(B, Hq, N, X) -> the tail call's (B, Hq, R+N, X): R zero rows in front."""
        if self.pad_rows == 0:
            return t
        return torch.cat([t.new_zeros(*t.shape[:2], self.pad_rows, t.shape[3]), t], dim=2)

    def tail_keys(self, x: torch.Tensor) -> torch.Tensor:
        """(B, Hkv, M, X) -> keys [S, M) per query head: (B, Hq, R+N, X)."""
        tail = x[:, :, self.prefix_len :]
        return (
            tail if self.problem.group_size == 1 else tail.repeat_interleave(self.problem.group_size, dim=1)
        )

    def tail_part(self, t: torch.Tensor) -> torch.Tensor:
        """A tail call's result (B, Hq, R+N, *rest) -> its real rows as (B, Hkv, G, N, *rest)."""
        return t[:, :, self.pad_rows :].unflatten(1, (self.problem.kv_heads, self.problem.group_size))


def _merge(layout: SplitLayout, out_p, lse_p, out_t, lse_t):
    """Merged (out (B, Hq, N, Dv) in the input dtype, lse (B, Hq, N) float32)."""
    p = layout.problem
    prefix = layout.prefix_parts(lse_rows(lse_p, p.group_size * p.q_len))
    tail = layout.tail_part(lse_rows(lse_t, layout.pad_rows + p.q_len))
    lse_parts = torch.cat([prefix, tail[None]]).float()
    lse = torch.logsumexp(lse_parts, dim=0)
    weights = torch.exp(lse_parts - lse).unsqueeze(-1)
    outs = layout.prefix_parts(out_p)
    acc = outs[0] * weights[0] if layout.chunks == 1 else (outs * weights[:-1]).sum(0)
    acc.addcmul_(layout.tail_part(out_t), weights[-1])
    return acc.to(out_p.dtype).flatten(1, 2), lse.flatten(1, 2)


class _SplitAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kernel: PrivateKernel, layout: SplitLayout, fallback):
        scale = layout.problem.scale
        q = q.contiguous()
        out_p, lse_p, saved_p = kernel.forward(
            layout.prefix_rows(q), layout.prefix_keys(k), layout.prefix_keys(v), False, scale
        )
        out_t, lse_t, saved_t = kernel.forward(
            layout.tail_rows(q), layout.tail_keys(k), layout.tail_keys(v), True, scale
        )
        out, lse = _merge(layout, out_p, lse_p, out_t, lse_t)
        ctx.kernel, ctx.layout, ctx.fallback = kernel, layout, fallback
        ctx.parts = (len(saved_p), len(saved_t))
        ctx.save_for_backward(q, k, v, out, lse, lse_p, lse_t, *saved_p, *saved_t)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, lse_p, lse_t, *saved = ctx.saved_tensors
        saved_p, saved_t = saved[: ctx.parts[0]], saved[ctx.parts[0] :]
        try:
            grads = _split_backward(
                ctx.kernel, ctx.layout, grad_out, q, k, v, out, lse, lse_p, lse_t, saved_p, saved_t
            )
        except (RuntimeError, TypeError) as err:  # a kernel declines its backward: use the fallback
            warnings.warn(
                f"{ctx.kernel.name} declined the backward of {ctx.layout.problem.describe()} split as "
                f"prefix + causal tail ({err}); differentiating the fallback path instead",
                stacklevel=2,
            )
            with torch.enable_grad():
                leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                grads = torch.autograd.grad(ctx.fallback(*leaves), leaves, grad_out)
        return (*grads, None, None, None)


def _split_backward(kernel, layout: SplitLayout, grad_out, q, k, v, out, lse, lse_p, lse_t, saved_p, saved_t):
    p = layout.problem
    grad_out = grad_out.contiguous()
    lse_prefix = lse_for_backward(lse_p, layout.prefix_rows(lse))
    dq_p, dk_p, dv_p = kernel.backward(
        layout.prefix_rows(grad_out), layout.prefix_rows(q), layout.prefix_keys(k), layout.prefix_keys(v),
        layout.prefix_rows(out), lse_prefix, saved_p, False, p.scale,
    )  # fmt: skip
    # The tail's prepended rows keep their own lse (finite weights times dO = 0).
    pad_lse = lse_rows(lse_t, layout.pad_rows)
    lse_tail = lse_for_backward(lse_t, torch.cat([pad_lse, lse], dim=2))
    dq_t, dk_t, dv_t = kernel.backward(
        layout.tail_rows(grad_out), layout.tail_rows(q), layout.tail_keys(k), layout.tail_keys(v),
        layout.tail_rows(out), lse_tail, saved_t, True, p.scale,
    )  # fmt: skip
    dq = layout.prefix_parts(dq_p).sum(0, dtype=torch.float32).add_(layout.tail_part(dq_t))
    dk_t, dv_t = (
        x.unflatten(1, (p.kv_heads, p.group_size)).sum(2, dtype=torch.float32).to(x.dtype)
        if p.group_size > 1
        else x
        for x in (dk_t, dv_t)
    )
    dk = torch.cat([layout.prefix_key_grad(dk_p), dk_t], dim=2)
    dv = torch.cat([layout.prefix_key_grad(dv_p), dv_t], dim=2)
    return dq.to(q.dtype).flatten(1, 2), dk, dv


def split_attention(
    name: str,
    backend: SDPBackend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: AttentionProblem,
    fallback,
    chunking: PrefixChunking = DEFAULT_CHUNKING,
) -> torch.Tensor:
    """Bottom-right causal N < M on ``backend`` as prefix + tail (module docstring); differentiable.

    q: (B, Hq, N, D), k: (B, Hkv, M, D), v: (B, Hkv, M, D); returns (B, Hq, N, D) in q's dtype.
    ``fallback(q, k, v)`` is differentiated instead if the kernel declines a backward. Raises
    UnsupportedProblemError if the kernel declines the forward, chunked and unchunked.
    """
    kernel = private_kernel(backend, problem.device)
    chunks = chunking.chunks(problem, backend) if all(map(_batch_heads_mergeable, (k, v))) else 1
    for count in dict.fromkeys((chunks, 1)):
        try:
            return _SplitAttention.apply(q, k, v, kernel, SplitLayout(problem, count), fallback)
        except (RuntimeError, TypeError) as err:  # TypeError: a private op's arguments changed
            declined = err
    raise UnsupportedProblemError(
        f"backend {name!r} cannot run {problem.describe()} on {problem.device} as prefix + causal tail: "
        f"{declined}"
    ) from declined
